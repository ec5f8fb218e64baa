"""How much machine code each task body of a model's megakernel is: the SASS bytes per device
function, from a cubin nvcc builds here (no GPU needed; nvcc and readelf on PATH).

Usage: python bench/code_size.py --model PRESET [--layers N] [--batch B] [--top K]

A decode step runs each body once per layer per SM, so a body is fetched from a cold
instruction cache; unrolled code a task does not execute still costs cache room.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def function_sizes(cubin: Path) -> list[tuple[int, str]]:
    """(bytes, name) of every function in a cubin's symbol table, largest first; a task body's
    name is shortened to `task_<grid>_<kind>`."""
    out = subprocess.run(["readelf", "-s", "-W", str(cubin)], capture_output=True, text=True)
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[3] == "FUNC":
            name = parts[-1]  # after an optional "[<other>: N]" column
            body = re.search(r"(task_\d+_\w+?)EPK", name)
            rows.append((int(parts[2], 0), body.group(1) if body else name))
    return sorted(rows, reverse=True)


def build_cubin(source: str, where: Path) -> Path:
    """nvcc -cubin of an emitted megakernel with the backend's flags (a cubin, not a module)."""
    from mk.backends.cpu.build import include_dir
    from mk.backends.cuda.build import NVCC_FLAGS, nvcc

    compiler = nvcc()
    if compiler is None:
        raise SystemExit("code_size: nvcc is not on PATH")
    src, cubin = where / "mk.cu", where / "mk.cubin"
    src.write_text(source)
    flags = [f for f in NVCC_FLAGS if f not in ("-shared", "-Xcompiler", "-fPIC")]
    subprocess.run(
        [compiler, *flags, f"-I{include_dir()}", "-cubin", str(src), "-o", str(cubin)], check=True
    )
    return cubin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    if shutil.which("readelf") is None:
        raise SystemExit("code_size: readelf is not on PATH")
    import mk
    import mk.backends.cuda as backend
    from mk.backends.cuda import build
    from mk.models import decode_program, preset

    backend_nvcc, build_nvcc = backend.nvcc, build.nvcc
    build.nvcc = backend.nvcc = lambda: None  # emit only; the cubin is built below
    config = preset(args.model).with_(layers=args.layers)
    source = mk.compile(decode_program(config, args.batch, 1024, 1), target="cuda").cuda_source  # type: ignore[attr-defined]
    build.nvcc, backend.nvcc = build_nvcc, backend_nvcc
    with tempfile.TemporaryDirectory() as tmp:
        sizes = function_sizes(build_cubin(source, Path(tmp)))
    kernel = next((n for n, name in sizes if "megakernel" in name), 0)
    print(
        f"{args.model} L{args.layers} B{args.batch}: {kernel / 1024:.0f} KB of SASS in the kernel"
    )
    for size, name in [r for r in sizes if "megakernel" not in r[1]][: args.top]:
        print(f"  {size / 1024:7.1f} KB  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
