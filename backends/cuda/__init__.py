"""The CUDA backend: one persistent megakernel per program, emitted, built with nvcc and run."""

from mk.backends.cuda.build import build_cuda, nvcc
from mk.backends.cuda.emit import CudaSource, emit_cuda

__all__ = ["CudaSource", "build_cuda", "emit_cuda", "nvcc"]
