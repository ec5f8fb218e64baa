"""Compile an emitted C++ source into a shared library, cached by the hash of its inputs."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import mk
from mk.diagnostics import MkError

CXXFLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Wextra")
_ERROR_LINES = 12


def include_dir() -> Path:
    """The mk runtime headers: `<site-packages>/mk/include` when installed, else the source tree's."""
    package = Path(mk.__file__).resolve().parent
    for candidate in (package / "include", package.parent.parent / "runtime" / "include"):
        if (candidate / "mk" / "cpu_kernels.h").is_file():
            return candidate
    raise MkError(f"cannot find the mk runtime headers (looked under {package})")


def default_cache_dir() -> Path:
    """`$MK_CACHE_DIR/cpu`, else `$XDG_CACHE_HOME/mk/cpu`, else `~/.cache/mk/cpu`."""
    if mk_dir := os.environ.get("MK_CACHE_DIR"):
        return Path(mk_dir) / "cpu"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mk" / "cpu"


def compiler() -> list[str]:
    """The C++ compiler command: `$CXX` (may carry flags) or g++."""
    return shlex.split(os.environ.get("CXX") or "g++")


def extra_flags() -> list[str]:
    """`$MK_CPU_CXXFLAGS`, after CXXFLAGS so that they win: `-O1` builds in about 60 % of the
    time (the test suite's choice), `-g` or a sanitizer debugs the executor's bodies."""
    return shlex.split(os.environ.get("MK_CPU_CXXFLAGS", ""))


def _headers_digest(include: Path) -> str:
    h = hashlib.sha256()
    for path in sorted((include / "mk").glob("*.h")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def library_key(source: str) -> str:
    """Hash of everything the library depends on: source, headers, compiler and flags."""
    include = include_dir()
    h = hashlib.sha256()
    flags = " ".join((*CXXFLAGS, *extra_flags()))
    for part in (source, _headers_digest(include), " ".join(compiler()), flags):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def build_library(source: str, cache_dir: Path | None = None) -> Path:
    """The `.so` of `source`, compiled once per content hash; MkError with the compiler's errors."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    key = library_key(source)
    lib = cache / f"mk_cpu_{key}.so"
    if lib.is_file():
        return lib
    src = cache / f"mk_cpu_{key}.cpp"
    # Write and compile under private names, then rename: concurrent builds of the same
    # program never see a half-written source or library.
    fd, staged = tempfile.mkstemp(prefix=f".mk_cpu_{key}.", suffix=".cpp", dir=cache)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(staged, src)
    fd, tmp = tempfile.mkstemp(prefix=f".mk_cpu_{key}.", suffix=".so", dir=cache)
    os.close(fd)
    cmd = [*compiler(), *CXXFLAGS, *extra_flags(), f"-I{include_dir()}", str(src), "-o", tmp]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise MkError(f"cannot run the C++ compiler '{cmd[0]}': {e.strerror}") from None
    if done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        shown = "\n".join((errors or done.stderr.splitlines())[:_ERROR_LINES])
        raise MkError(f"C++ compilation of {src} failed ({cmd[0]}):\n{shown}")
    os.replace(tmp, lib)
    return lib
