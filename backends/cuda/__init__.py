"""CUDA backend: megakernel emission, nvcc invocation and the target description."""
