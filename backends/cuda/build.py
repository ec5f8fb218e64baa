"""Build an emitted CUDA source into a shared library with nvcc, cached by content hash."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from mk.backends.cpu.build import include_dir
from mk.backends.cuda.mma_tile import WGMMA_HEADER
from mk.diagnostics import MkError

NVCC_FLAGS = (
    "-O3",
    "-std=c++17",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-shared",
    "-Xcompiler",
    "-fPIC",
    "-Xcompiler=-Wall,-Wextra",  # the host pass of the emitted source and mk's headers
    "--expt-relaxed-constexpr",
    "-Xptxas=-v",  # the megakernel's registers and spills (KernelResources)
)
_ERROR_LINES = 12


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reported for the megakernel entry: one CTA per SM of 256 threads may use 255
    registers a thread, and every body shares them, so a body that needs more spills to local
    memory in every task the dispatcher runs (`spilling` counts the functions that spill).
    `wgmma_serialized`: ptxas serialized the wgmma of some function, whose pipeline a call
    crosses (its note C7510; switches.inline_bodies). `spilled`: which functions spill
    ("megakernel" for the entry, a body by its grid, e.g. "k14_l0_y_acc"). `warnings`: the
    compilers' warning lines (the host pass runs with -Wall -Wextra)."""

    registers: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    spilling: int
    wgmma_serialized: bool = False
    spilled: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for a tool's report: registers, stack, warnings and where it spills."""
        head = f"{self.registers} registers, {self.stack_bytes} B of stack"
        if self.warnings:
            head += f", {len(self.warnings)} compiler warnings"
        if not self.spilling:
            return f"{head}, no spills"
        names = ", ".join(self.spilled) if self.spilled else f"{self.spilling} functions"
        return f"{head}, SPILLS ({self.spill_stores} B stored by the entry) in {names}"


_PROPERTIES = re.compile(
    r"Function properties for (\S+)\s*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
    r"(\d+) bytes spill loads"
)
_ENTRY = re.compile(r"Compiling entry function '(\S*megakernel\S*)'.*?Used (\d+) registers", re.S)


def kernel_resources(ptxas: str) -> KernelResources | None:
    """The megakernel's entry in ptxas -v output (None when it is not there), with the warning
    lines of the whole build's output."""
    frames = {
        m.group(1): tuple(int(x) for x in m.groups()[1:]) for m in _PROPERTIES.finditer(ptxas)
    }
    entry = _ENTRY.search(ptxas)
    if entry is None or entry.group(1) not in frames:
        return None
    stack, stores, loads = frames[entry.group(1)]
    spilled = tuple(
        _function_name(name, entry.group(1)) for name, frame in frames.items() if frame[1] > 0
    )
    serialized = "(C7510)" in ptxas
    warnings = tuple(line for line in ptxas.splitlines() if "warning" in line.lower())
    return KernelResources(
        int(entry.group(2)), stack, stores, loads, len(spilled), serialized, spilled, warnings
    )


_BODY = re.compile(r"task_\d+_(\w+?)EPKN2mk8TaskDesc")


def _function_name(mangled: str, entry: str) -> str:
    """A spilling function as a report names it: the entry, a task body by its grid, else
    ptxas's own name."""
    if mangled == entry:
        return "megakernel"
    body = _BODY.search(mangled)
    return body.group(1) if body else mangled


def resources_path(library: Path) -> Path:
    return library.with_suffix(".resources.json")


def library_resources(library: Path) -> KernelResources | None:
    """What ptxas reported when `library` was built (None for a library built without it)."""
    path = resources_path(library)
    if not path.is_file():
        return None
    fields = json.loads(path.read_text())
    fields["spilled"] = tuple(fields.get("spilled", ()))
    fields["warnings"] = tuple(fields.get("warnings", ()))
    return KernelResources(**fields)


def nvcc() -> str | None:
    """The nvcc to build with ($NVCC, else on PATH, else /usr/local/cuda/bin), or None."""
    for candidate in (os.environ.get("NVCC"), "nvcc", "/usr/local/cuda/bin/nvcc"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


@cache
def nvcc_version(path: str) -> str:
    done = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "unknown"


def cute_include_dir() -> Path | None:
    """CuTe's headers for the wgmma gemm tile: $CUTLASS_INCLUDE_DIR, else those the
    nvidia-cutlass package ships, else None (the tile then builds as mma.sync)."""
    candidates = [Path(d)] if (d := os.environ.get("CUTLASS_INCLUDE_DIR")) else []
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.origin is not None:
        candidates.append(Path(spec.origin).parent / "source" / "include")
    return next((c for c in candidates if (c / "cute" / "tensor.hpp").is_file()), None)


def _cute_version(source: str) -> str:
    """What of CuTe a build of `source` depends on: its version header, where it is used."""
    if WGMMA_HEADER not in source:
        return ""
    found = cute_include_dir()
    version = found / "cutlass" / "version.h" if found is not None else None
    return version.read_text() if version is not None and version.is_file() else "no CuTe"


def cuda_include_dir() -> Path:
    """The runtime headers a CUDA build compiles against: $MK_CUDA_INCLUDE, another tree's
    `runtime/include`, or the installed ones. The other tree times a change to the device-side
    headers against these in one process (bench/variants.py: `MK_CUDA_INCLUDE=DIR` is a
    variant); the host side stays the installed one, so the tables, launch parameters and
    entry points must match."""
    found = os.environ.get("MK_CUDA_INCLUDE", "")
    if not found:
        return include_dir()
    if not (Path(found) / "mk" / "cuda_megakernel.cuh").is_file():
        raise MkError(f"MK_CUDA_INCLUDE={found}: no mk/cuda_megakernel.cuh there")
    return Path(found)


def headers_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted((cuda_include_dir() / "mk").glob("*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def library_key(source: str, compiler: str) -> str:
    """sha256 of the source, the runtime headers, the compiler's version, the flags and (where
    the source uses it) CuTe's version."""
    digest = hashlib.sha256()
    parts = (source, headers_digest(), nvcc_version(compiler), " ".join(NVCC_FLAGS))
    for part in (*parts, _cute_version(source)):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def build_cuda(source: str, root: Path) -> tuple[Path, bool]:
    """The `.so` of `source` under `root/cuda/` (built on a miss) and whether it was cached."""
    compiler = nvcc()
    if compiler is None:
        raise MkError("nvcc was not found (set $NVCC or put it on PATH)")
    key = library_key(source, compiler)
    entry = root / "cuda" / key[:2]
    lib = entry / f"{key}.so"
    if lib.is_file():
        return lib, True
    entry.mkdir(parents=True, exist_ok=True)
    (entry / f"{key}.cu").write_text(source)
    with tempfile.TemporaryDirectory(prefix="mk-nvcc-") as build:
        src, out = Path(build) / "megakernel.cu", Path(build) / "megakernel.so"
        src.write_text(source)
        cute = cute_include_dir() if WGMMA_HEADER in source else None
        includes = [f"-I{cuda_include_dir()}", *([f"-I{cute}"] if cute is not None else [])]
        cmd = [compiler, *NVCC_FLAGS, *includes, str(src), "-o", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error" in line]
            shown = "\n".join((errors or done.stderr.splitlines())[:_ERROR_LINES])
            raise MkError(f"nvcc failed on {entry / f'{key}.cu'}:\n{shown}")
        found = kernel_resources(done.stdout + done.stderr)
        if found is not None:
            resources_path(lib).write_text(json.dumps(asdict(found), sort_keys=True))
        # Publish by rename so that a concurrent reader never loads half a library.
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".so", dir=entry)
        os.close(fd)
        shutil.copy2(out, tmp)
        os.replace(tmp, lib)
    return lib, False
