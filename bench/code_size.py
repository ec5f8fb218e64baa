"""How much machine code each task body of a model's megakernel is: the SASS bytes per device
function, from a cubin nvcc builds here (no GPU needed; nvcc and readelf on PATH).

Usage: python bench/code_size.py --model PRESET [--layers N] [--batch B] [--top K]
       [--option NAME=VALUE ...]

A decode step runs each body once per layer per SM, so a body is fetched from a cold
instruction cache; unrolled code a task does not execute still costs cache room. ptxas's
registers and spills are printed too: the bodies are __noinline__ functions sharing the
kernel's one register budget (255 per thread), so one body past it makes every body spill.
Build switches (MK_CUDA_*) in the environment apply, and pass options given with --option
(e.g. attention_fold=2: the folded attention body is 58 KB against 34 KB).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from mk.tools import add_option_flag


def short_name(symbol: str) -> str:
    """A function's name as the tables print it: `task_<grid>_<kind>` for a task body,
    `rows_dot_lanes<1, 24, 1024, 1, 0>` for a mk::gpu helper the kernel calls (the cubin names
    a called function `$<kernel>$<function>`), else the symbol."""
    inner = symbol.split("$")[2] if symbol.startswith("$_ZN2mk10megakernel") else symbol
    if body := re.search(r"(task_\d+_\w+?)EPK", inner):
        return body.group(1)
    if helper := re.match(r"_ZN2mk3gpu\d+(\w+?)I(.*?)EE", inner):
        args = re.findall(r"L[ib](\d+)E", helper.group(2) + "E")
        return f"{helper.group(1)}<{', '.join(args)}>"
    return inner


def functions(cubin: Path) -> list[tuple[int, int, str]]:
    """(offset, bytes, name) of every function in a cubin's symbol table, by offset, named as
    short_name says."""
    out = subprocess.run(["readelf", "-s", "-W", str(cubin)], capture_output=True, text=True)
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[3] == "FUNC":
            name = parts[-1]  # after an optional "[<other>: N]" column
            rows.append((int(parts[1], 16), int(parts[2], 0), short_name(name)))
    return sorted(rows)


def function_sizes(cubin: Path) -> list[tuple[int, str]]:
    """(bytes, name) of every function in a cubin, largest first."""
    return sorted(((size, name) for _, size, name in functions(cubin)), reverse=True)


def layer_bytes(sizes: list[tuple[int, str]]) -> int:
    """The SASS bytes of a decoder layer's bodies: every layer runs the first layer's (their
    names carry `_l0_`), and an SM keeps 128-160 KB of code (bench/icache.py), so a layer whose
    bodies execute more than that fetches some of its code from L2 in every layer."""
    return sum(size for size, name in sizes if "_l0_" in name)


def dispatcher_bytes(sizes: list[tuple[int, str]]) -> int:
    """The kernel's own code, the dispatcher: the kernel's symbol spans its section, which holds
    the functions it calls too."""
    kernel = next((n for n, name in sizes if "megakernel" in name), 0)
    return kernel - sum(n for n, name in sizes if "megakernel" not in name)


def spills(ptxas_log: str) -> dict[str, tuple[int, int, int]]:
    """(stack frame, spill store, spill load bytes) per function from `ptxas -v`'s report; names
    shortened as in function_sizes."""
    found: dict[str, tuple[int, int, int]] = {}
    pattern = (
        r"Function properties for (\S+)\s+(\d+) bytes stack frame, (\d+) bytes spill stores, "
        r"(\d+) bytes spill loads"
    )
    for m in re.finditer(pattern, ptxas_log):
        body = re.search(r"(task_\d+_\w+?)EPK", m.group(1))
        name = body.group(1) if body else m.group(1)
        found[name] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
    return found


def kernel_registers(ptxas_log: str) -> int:
    """Registers per thread of the megakernel (0 when ptxas did not say)."""
    m = re.search(r"Used (\d+) registers", ptxas_log)
    return int(m.group(1)) if m else 0


def build_cubin(source: str, where: Path, extra: tuple[str, ...] = ()) -> Path:
    """nvcc -cubin of an emitted megakernel with the backend's flags and `extra` (a cubin, not a
    module); ptxas's report is left beside it in ptxas.log."""
    from mk.backends.cuda.build import NVCC_FLAGS, cuda_include_dir, cute_include_dir, nvcc
    from mk.backends.cuda.mma_tile import WGMMA_HEADER

    compiler = nvcc()
    if compiler is None:
        raise SystemExit("code_size: nvcc is not on PATH")
    src, cubin = where / "mk.cu", where / "mk.cubin"
    src.write_text(source)
    flags = [f for f in NVCC_FLAGS if f not in ("-shared", "-Xcompiler", "-fPIC")]
    # As the module's build: CuTe's headers where the wgmma tile is used (without them the tile
    # builds as its mma.sync stand-in, another cubin than the module's).
    cute = cute_include_dir() if WGMMA_HEADER in source else None
    if cute is not None:
        flags.append(f"-I{cute}")
    done = subprocess.run(
        [
            compiler,
            *flags,
            f"-I{cuda_include_dir()}",
            "-Xptxas",
            "-v",
            *extra,
            "-cubin",
            str(src),
            "-o",
            str(cubin),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"code_size: nvcc failed:\n{done.stderr[-4000:]}")
    (where / "ptxas.log").write_text(done.stderr)
    return cubin


def emit_source(program: str, options: Mapping[str, object]) -> str:
    """The megakernel's CUDA source for `program`, emitted without building it."""
    import mk
    import mk.backends.cuda as backend
    from mk.backends.cuda import build

    backend_nvcc, build_nvcc = backend.nvcc, build.nvcc
    build.nvcc = backend.nvcc = lambda: None  # emit only; the cubin is built by the caller
    try:
        return mk.compile(program, target="cuda", **options).cuda_source  # type: ignore[attr-defined]
    finally:  # a failed compile must not leave nvcc hidden from the caller
        build.nvcc, backend.nvcc = build_nvcc, backend_nvcc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--top", type=int, default=12)
    add_option_flag(parser)
    args = parser.parse_args()
    if shutil.which("readelf") is None:
        raise SystemExit("code_size: readelf is not on PATH")
    from mk.models import decode_program, preset
    from mk.pipeline import parse_pass_options

    config = preset(args.model).with_(layers=args.layers)
    program = decode_program(config, args.batch, 1024, 1)
    try:
        options = parse_pass_options(args.option)
    except ValueError as e:
        raise SystemExit(f"code_size: {e}") from None
    source = emit_source(program, options)
    with tempfile.TemporaryDirectory() as tmp:
        sizes = function_sizes(build_cubin(source, Path(tmp)))
        log = (Path(tmp) / "ptxas.log").read_text()
    kernel = next((n for n, name in sizes if "megakernel" in name), 0)
    spilled = spills(log)
    frame = max((v[0] for k, v in spilled.items() if "megakernel" in k), default=0)
    print(
        f"{args.model} L{args.layers} B{args.batch}: {kernel / 1024:.0f} KB of SASS in the kernel, "
        f"{kernel_registers(log)} registers per thread, {frame} B kernel stack frame"
    )
    helpers = sum(n for n, name in sizes if "<" in name)
    print(
        f"a layer's bodies: {layer_bytes(sizes) / 1024:.0f} KB (an SM keeps 128-160 KB of code),"
        f" and {helpers / 1024:.1f} KB of mk::gpu helpers the bodies call"
    )
    print(f"the dispatcher: {dispatcher_bytes(sizes) / 1024:.1f} KB (runs at every task)")
    print(f"  {'SASS':>10}  {'spill st/ld B':>14}  body")
    for size, name in [r for r in sizes if "megakernel" not in r[1]][: args.top]:
        _, st, ld = spilled.get(name, (0, 0, 0))
        print(f"  {size / 1024:7.1f} KB  {f'{st}/{ld}':>14}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
