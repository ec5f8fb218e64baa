"""Warp-stall samples of one megakernel launch per task body: an `ncu --page source
--print-source sass --csv` report mapped onto the functions of the launch's cubin.

Usage: python bench/ncu_bodies.py SASS.csv KERNEL.cubin [--body NAME] [--top K]

The bodies are __noinline__ functions inside the kernel's one code section, so ncu's per-kernel
numbers cannot tell them apart; the cubin's symbol table (readelf, code_size.functions) gives each one's offset and
size, and an instruction's offset is its address less the section's first. The cubin must be
the launch's own (`cuobjdump -xelf all` on the built module, or the same source built with the
same nvcc by bench/code_size.py). With --body, the K instructions of that body with the most
samples, with their two largest stall reasons.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from code_size import functions  # the cubin's functions: offset, size, name

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass
class Body:
    samples: float = 0.0
    executed: float = 0.0
    stalls: Counter[str] = field(default_factory=Counter)
    hot: list[tuple[float, int, str, Counter[str]]] = field(default_factory=list)


def owner(spans: list[tuple[int, int, str]], offset: int) -> str:
    """The function holding `offset`; the kernel itself (the dispatcher) when no body does."""
    inner = [
        name for at, size, name in spans if at <= offset < at + size and "megakernel" not in name
    ]
    return inner[0] if inner else "dispatcher"


def number(text: str) -> float:
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return 0.0


def read_report(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(path.read_text().splitlines()))
    start = next((i for i, row in enumerate(rows) if row[:2] == ["Address", "Source"]), None)
    if start is None:
        raise SystemExit(f"{path}: no per-instruction table (ncu --page source --csv)")
    return rows[start], [r for r in rows[start + 1 :] if r and r[0].startswith("0x")]


def bodies(report: Path, cubin: Path) -> dict[str, Body]:
    header, rows = read_report(report)
    col = {name: i for i, name in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    spans = functions(cubin)
    base = int(rows[0][0], 16)
    out: dict[str, Body] = {}
    for row in rows:
        offset = int(row[0], 16) - base
        body = out.setdefault(owner(spans, offset), Body())
        counts = Counter({s[6:]: number(row[col[s]]) for s in stalls})
        samples = number(row[col[SAMPLES]])
        body.samples += samples
        body.executed += number(row[col[EXECUTED]])
        body.stalls.update(counts)
        body.hot.append((samples, offset, row[1].strip(), counts))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--body", help="list this body's hottest instructions")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    found = bodies(args.report, args.cubin)
    total = sum(b.samples for b in found.values()) or 1.0
    if len([b for b in found.values() if b.samples]) == 1:
        # No body holds any sampled address: the cubin of another module in the same library.
        print(f"{args.cubin}: all samples in one function, not this launch's cubin")
        return 1
    print(f"{'body':28s} {'samples':>8s} {'instr M':>8s}  top stalls")
    for name, b in sorted(found.items(), key=lambda kv: -kv[1].samples):
        if b.samples == 0:
            continue
        top = ", ".join(f"{k} {v / b.samples:.0%}" for k, v in b.stalls.most_common(4) if v)
        print(f"{name:28s} {b.samples / total:8.1%} {b.executed / 1e6:8.2f}  {top}")
    if args.body:
        if args.body not in found:
            raise SystemExit(f"no body {args.body!r}: {', '.join(sorted(found))}")
        print(f"\n{args.body}: hottest instructions (offset, samples, executed by warps)")
        for samples, offset, source, counts in sorted(found[args.body].hot, reverse=True)[
            : args.top
        ]:
            why = " ".join(f"{k}={v:.0f}" for k, v in counts.most_common(2) if v)
            print(f"  {offset:#08x} {samples:6.0f}  {source[:64]:64s} {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
