"""NumPy interpreters of each IR level."""
