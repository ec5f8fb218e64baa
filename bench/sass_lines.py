"""Which source line an address in the megakernel's machine code came from, without a GPU.

Usage: python bench/sass_lines.py (--example NAME | --model PRESET [--layers N] [--batch B])
       [--option NAME=VALUE ...] OFFSET [OFFSET ...]

compute-sanitizer and the profilers name a device function's instruction as `task_12_k12_r(...)
+0xd580`, where the offset counts from the start of the kernel's code (the bodies are functions
inside the kernel's one text section), so it can point past the function it names. This builds
the same program's cubin here with `-lineinfo` (nvcc and readelf on PATH; the machine code is
the module's: line tables do not change it), reads its line table (SASS address -> file:line,
`readelf --debug-dump=decodedline`) and prints, for each OFFSET (hex), the function that holds
it and the source line: the emitted `mk.cu` or one of mk's headers. Build switches (MK_CUDA_*)
in the environment apply, as for the run being explained.
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
    parser.add_argument("offsets", nargs="+", help="addresses in the kernel's code (hex)")
    add_option_flag(parser)
    args = parser.parse_args()
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
        rows = line_table(cubin)
        for offset in offsets:
            found = line_at(rows, offset)
            where = "no line" if found is None else f"{Path(found.path).name}:{found.line}"
            text = "" if found is None else source_text(found, Path(tmp) / "mk.cu")
            print(f"{offset:#x}  {function_at(cubin, offset)}  {where}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
