"""Code generation backends."""
