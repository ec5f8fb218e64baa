"""The μGraph superoptimizer: enumerate, prune, rank and verify fused kernels (`superoptimize`)."""
