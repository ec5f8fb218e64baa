"""The CPU backend: per-program C++ tile kernels behind the `mk_dispatch` ABI, built with g++."""

from mk.backends.cpu.build import build_library, include_dir
from mk.backends.cpu.emit import emit_source

__all__ = ["build_library", "emit_source", "include_dir"]
