"""Which source line an address in the megakernel's machine code came from, without a GPU.

Usage: python bench/sass_lines.py (--example NAME | --model PRESET [--layers N] [--batch B])
       [--option NAME=VALUE ...] (OFFSET [OFFSET ...] | --lines PART [--top K])

compute-sanitizer and the profilers name a device function's instruction as `task_12_k12_r(...)
+0xd580`, where the offset counts from the start of the kernel's code (the bodies are functions
inside the kernel's one text section), so it can point past the function it names. This builds
the same program's cubin here with `-lineinfo` (nvcc and readelf on PATH; the machine code is
the module's: line tables do not change it), reads its line table (SASS address -> file:line,
`readelf --debug-dump=decodedline`) and prints, for each OFFSET (hex), the function that holds
it and the source line: the emitted `mk.cu` or one of mk's headers. Build switches (MK_CUDA_*)
in the environment apply, as for the run being explained.

With --lines PART it prints instead where the code of the functions whose name contains PART
goes (`l0_` for a model's first layer's bodies, `dispatcher` for the kernel's own code): the
bytes of machine code each source line became, summed over those functions, the K largest
first. Inlined helpers count at their own lines, so a helper inlined into many bodies shows.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from code_size import build_cubin, emit_source, functions

from mk.tools import add_option_flag

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Line:
    address: int
    path: str  # as the line table names it: the emitted mk.cu or a header's full path
    line: int


def line_table(cubin: Path) -> list[Line]:
    """The cubin's line table rows, by address: readelf prints a file's full path on a line of its
    own before that file's rows (file name, line, address), and NVIDIA's inlined-call records as
    'UNKNOWN' lines, skipped here."""
    out = subprocess.run(
        ["readelf", "--debug-dump=decodedline", str(cubin)], capture_output=True, text=True
    ).stdout
    rows: list[Line] = []
    path = ""
    for text in out.splitlines():
        if text.endswith(":") and "/" in text:
            path = text[:-1]
            continue
        row = re.match(r"(\S+)\s+(\d+)\s+(0x[0-9a-f]+|0)\s", text)
        if row and path.endswith(row.group(1)):
            rows.append(Line(int(row.group(3), 16), path, int(row.group(2))))
    return sorted(rows, key=lambda r: r.address)


def line_at(rows: list[Line], address: int) -> Line | None:
    """The row whose address range holds `address` (the last row at or before it)."""
    i = bisect_right([r.address for r in rows], address)
    return rows[i - 1] if i else None


def function_at(cubin: Path, address: int) -> str:
    """The innermost function whose code holds `address` (the kernel's symbol spans them all)."""
    holding = [(n, name) for start, n, name in functions(cubin) if start <= address < start + n]
    if not holding:
        return "?"
    name = min(holding)[1]
    return "megakernel (the dispatcher)" if "megakernel" in name else name


def own_ranges(cubin: Path, part: str) -> list[tuple[int, int]]:
    """[start, end) of the code of each function whose name contains `part`; `dispatcher`: the
    kernel's code outside the functions it holds (the bodies and helpers)."""
    table = functions(cubin)
    if part != "dispatcher":
        return [(s, s + n) for s, n, name in table if part in name and "megakernel" not in name]
    kernels = [(s, s + n) for s, n, name in table if "megakernel" in name]
    inner = sorted((s, s + n) for s, n, name in table if "megakernel" not in name)
    ranges = []
    for start, end in kernels:
        at = start
        for s, e in inner:
            if start <= s < end:
                if s > at:
                    ranges.append((at, s))
                at = max(at, e)
        if at < end:
            ranges.append((at, end))
    return ranges


def bytes_per_line(rows: list[Line], ranges: list[tuple[int, int]]) -> dict[tuple[str, int], int]:
    """Machine-code bytes per (file, line) inside `ranges`: a row's code runs to the next row."""
    sizes: dict[tuple[str, int], int] = {}
    for start, end in ranges:
        inside = [r for r in rows if start <= r.address < end]
        for i, row in enumerate(inside):
            stop = inside[i + 1].address if i + 1 < len(inside) else end
            key = (row.path, row.line)
            sizes[key] = sizes.get(key, 0) + stop - row.address
    return sizes


def print_lines(cubin: Path, emitted: Path, part: str, top: int) -> None:
    ranges = own_ranges(cubin, part)
    if not ranges:
        raise SystemExit(f"sass_lines: no function's name contains {part!r}")
    sizes = bytes_per_line(line_table(cubin), ranges)
    total = sum(end - start for start, end in ranges)
    print(f"{part}: {total / 1024:.1f} KB of code in {len(ranges)} range(s)")
    for (path, line), size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:top]:
        text = source_text(Line(0, path, line), emitted)
        print(f"{size:7d}  {Path(path).name}:{line}  {text[:100]}")


def source_text(line: Line, emitted: Path) -> str:
    """The source line itself, from the emitted file or the header."""
    path = emitted if Path(line.path).name == emitted.name else Path(line.path)
    try:
        return path.read_text().splitlines()[line.line - 1].strip()
    except (OSError, IndexError):
        return ""


def program_text(args: argparse.Namespace) -> str:
    if args.example:
        path = ROOT / "examples" / f"{args.example}.mlir"
        if not path.is_file():
            raise SystemExit(f"sass_lines: no example {args.example!r} in {path.parent}")
        return path.read_text()
    from mk.models import decode_program, preset

    return decode_program(preset(args.model).with_(layers=args.layers), args.batch, 1024, 1)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--example", help="examples/NAME.mlir")
    which.add_argument("--model", help="a model preset's decode step")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("offsets", nargs="*", help="addresses in the kernel's code (hex)")
    parser.add_argument("--lines", metavar="PART", help="code bytes per source line instead")
    parser.add_argument("--top", type=int, default=30)
    add_option_flag(parser)
    args = parser.parse_args()
    if bool(args.offsets) == bool(args.lines):
        raise SystemExit("sass_lines: give OFFSET... or --lines PART (one of the two)")
    if shutil.which("readelf") is None:
        raise SystemExit("sass_lines: readelf is not on PATH")
    try:
        offsets = [int(o, 16) for o in args.offsets]
    except ValueError:
        raise SystemExit(f"sass_lines: offsets are hex numbers, got {args.offsets}") from None
    from mk.pipeline import parse_pass_options

    try:
        options = parse_pass_options(args.option)
    except ValueError as e:
        raise SystemExit(f"sass_lines: {e}") from None
    source = emit_source(program_text(args), options)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = build_cubin(source, Path(tmp), ("-lineinfo",))
        if args.lines:
            print_lines(cubin, Path(tmp) / "mk.cu", args.lines, args.top)
            return 0
        rows = line_table(cubin)
        for offset in offsets:
            found = line_at(rows, offset)
            where = "no line" if found is None else f"{Path(found.path).name}:{found.line}"
            text = "" if found is None else source_text(found, Path(tmp) / "mk.cu")
            print(f"{offset:#x}  {function_at(cubin, offset)}  {where}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
