"""GPU benchmark: the gated MLP's two phases, each a program of its own, mk vs PyTorch.

The issue-6 gated MLP (bench.py) is a gate/up grid (with silu·mul) and a down projection; timed
apart, each against PyTorch eager and + CUDA graph and its own floor (bench.bench_one), they say
which of the two a change to the whole moves.
Usage (on the GPU machine): python bench/mlp_parts.py [--runs 60] [--only "down B8" ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_bench import gated  # noqa: E402

from bench import bench_one, copy_bandwidth  # noqa: E402

HIDDEN, INTERMEDIATE = 4096, 14336


def gate_up(b: int) -> str:
    return gated(b, INTERMEDIATE, HIDDEN)  # the pair of linears with silu·mul


def down(b: int) -> str:
    m, w, y = (
        f"tensor<{b}x{INTERMEDIATE}xbf16>",
        f"tensor<{HIDDEN}x{INTERMEDIATE}xbf16>",
        f"tensor<{b}x{HIDDEN}xbf16>",
    )
    return f"""func.func @down(%m: {m}, %w: {w}) -> {y} {{
  %y = nn.linear %m, %w : ({m}, {w}) -> {y}
  func.return %y : {y}
}}"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--only", nargs="*", default=[], help='parts to time, e.g. "down B8"')
    args = ap.parse_args()
    bandwidth = copy_bandwidth(args.runs)
    print(
        "| part | floor ms | mk ms | PyTorch eager ms | PyTorch + CUDA graph ms | mk / floor | mk error |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for b in (1, 8):
        for name, make in (("gate/up", gate_up), ("down", down)):
            part = f"{name} B{b}"
            if args.only and part not in args.only:
                continue
            r = bench_one(part, make(b), bandwidth, args.runs)
            print(row(part, r), flush=True)


def row(part: str, r: dict[str, object]) -> str:
    """One line of the table; "—" where mk could not run."""
    mk_ms, floor, error = r["mk_ms"], r["floor_ms"], r["mk_error"]
    assert isinstance(floor, float)
    ran = isinstance(mk_ms, float)
    cells = [
        part,
        f"{floor:.4f}",
        f"{mk_ms:.4f}" if ran else "—",
        f"{r['eager_ms']:.4f}",
        f"{r['graph_ms']:.4f}",
        f"{mk_ms / floor:.2f}×" if ran else "—",
        f"{error:.1e}" if isinstance(error, float) else "—",
    ]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    main()
