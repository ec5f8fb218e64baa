"""Command-line tools: mk-opt (pass driver) and mk-run (compile and run)."""
