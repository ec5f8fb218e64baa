"""GPU benchmark of the superoptimizer: the kernels it finds against the rule-based lowering.

For each unfused program (RMSNorm spelled out + linear, the gated pair of linears, LoRA) at decode
shapes: compile with the rules and with `search=True` (its search time is reported), check both
against PyTorch, and time both as bench.py times mk (a captured launch, median of CUDA events).
Usage (on the GPU machine): python bench/search_bench.py [--runs 100] [--budget-s 60] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def rms_unfused(b: int, n: int, k: int = 4096) -> str:
    x, y, w = f"tensor<{b}x{k}xf32>", f"tensor<{b}x{n}xf32>", f"tensor<{n}x{k}xf32>"
    col = f"tensor<{b}x1xf32>"
    return f"""func.func @rms_unfused(%x: {x}, %eps: tensor<1xf32>, %g: tensor<{k}xf32>, %w: {w}) -> {y} {{
  %sq = nn.mul %x, %x : ({x}, {x}) -> {x}
  %ms = nn.reduce_mean %sq {{dim = 1 : i64, keepdim = true}} : ({x}) -> {col}
  %me = nn.add %ms, %eps : ({col}, tensor<1xf32>) -> {col}
  %r = nn.rsqrt %me : ({col}) -> {col}
  %xn = nn.mul %x, %r : ({x}, {col}) -> {x}
  %h = nn.mul %xn, %g : ({x}, tensor<{k}xf32>) -> {x}
  %y = nn.linear %h, %w : ({x}, {w}) -> {y}
  func.return %y : {y}
}}"""


def gated(b: int, n: int, k: int = 4096) -> str:
    x, w, m = f"tensor<{b}x{k}xbf16>", f"tensor<{n}x{k}xbf16>", f"tensor<{b}x{n}xbf16>"
    return f"""func.func @gated(%x: {x}, %wg: {w}, %wu: {w}) -> {m} {{
  %g = nn.linear %x, %wg : ({x}, {w}) -> {m}
  %u = nn.linear %x, %wu : ({x}, {w}) -> {m}
  %s = nn.silu %g : ({m}) -> {m}
  %p = nn.mul %s, %u : ({m}, {m}) -> {m}
  func.return %p : {m}
}}"""


def lora(b: int, n: int, k: int = 4096, r: int = 16) -> str:
    x, w, y = f"tensor<{b}x{k}xbf16>", f"tensor<{k}x{n}xbf16>", f"tensor<{b}x{n}xbf16>"
    a, bb, xa = f"tensor<{k}x{r}xbf16>", f"tensor<{r}x{n}xbf16>", f"tensor<{b}x{r}xbf16>"
    return f"""func.func @lora(%x: {x}, %w: {w}, %a: {a}, %b: {bb}) -> {y} {{
  %xw = nn.matmul %x, %w : ({x}, {w}) -> {y}
  %xa = nn.matmul %x, %a : ({x}, {a}) -> {xa}
  %xab = nn.matmul %xa, %b : ({xa}, {bb}) -> {y}
  %y = nn.add %xw, %xab : ({y}, {y}) -> {y}
  func.return %y : {y}
}}"""


def workloads() -> dict[str, str]:
    w: dict[str, str] = {}
    for b in (1, 8):
        w[f"rmsnorm (unfused) + linear B{b} 4096x4096 f32"] = rms_unfused(b, 4096)
        w[f"gated pair B{b} 4096-4096"] = gated(b, 4096)
        w[f"lora B{b} 4096x4096 r16"] = lora(b, 4096)
    return w


def with_positive_eps(text: str, arrays: list[Any]) -> list[Any]:
    """The RMSNorm epsilon (an input of the unfused form) at 1e-6, not random: a negative one
    makes every output NaN."""
    from mk.source import entry_function, load_module

    for i, arg in enumerate(entry_function(load_module(text)).args):
        if arg.name_hint == "eps":
            arrays[i][...] = 1e-6
    return arrays


def kernels(prog: Any) -> int:
    """Kernels of the program's μGraph (graph_defs and library kernels)."""
    ir = prog.ir("mugraph")
    return ir.count("mugraph.graph_def ") + ir.count("mugraph.kernel ")


def bench_one(name: str, text: str, runs: int, budget_s: float) -> dict[str, object]:
    import torch
    from torch_nn import torch_callable

    import mk
    from bench import max_error, median_ms, to_torch
    from mk.inputs import random_inputs
    from mk.models.torch_reference import capture_graph
    from mk.source import entry_function, load_module

    arrays = with_positive_eps(text, random_inputs(entry_function(load_module(text)), seed=0))
    inputs = [to_torch(a) for a in arrays]
    refs = torch_callable(text)(*inputs)
    row: dict[str, object] = {"workload": name}
    for label, search in (("rules", False), ("search", True)):
        start = time.perf_counter()
        prog = mk.compile(
            text, target="cuda", search=search, **({"budget_s": budget_s} if search else {})
        )
        row[f"{label}_compile_s"] = time.perf_counter() - start
        row[f"{label}_kernels"] = kernels(prog)
        outs = prog(*inputs)  # type: ignore[operator]
        row[f"{label}_error"] = max_error(outs, refs)
        row[f"{label}_ms"] = median_ms(
            capture_graph(lambda p=prog, o=outs: p.launch(*inputs, out=o)), runs
        )  # type: ignore[attr-defined]
        prog.check()  # type: ignore[attr-defined]
    torch.cuda.synchronize()
    print(f"  {name}: {row}", flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| workload | kernels (rules → search) | search s | rules ms | search ms | search / rules "
        "| errors (rules, search) |\n|---|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = [
        f"| {r['workload']} | {r['rules_kernels']} → {r['search_kernels']} | "
        f"{r['search_compile_s']:.1f} | {r['rules_ms']:.4f} | {r['search_ms']:.4f} | "
        f"{r['search_ms'] / r['rules_ms']:.2f}× | {r['rules_error']:.1e}, {r['search_error']:.1e} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.runs < 50:
        parser.error("--runs: the method asks for at least 50 timed runs")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    rows = [
        bench_one(n, t, args.runs, args.budget_s) for n, t in workloads().items() if args.only in n
    ]
    md = table(rows)
    print(md)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "search_bench.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
