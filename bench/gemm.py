"""Compute-bound linears (prefill-shaped: many activation rows) on the GPU: mk against PyTorch.

Usage (on the GPU machine): python bench/gemm.py [--runs 50] [--shapes 256x2048x2048,...]
                                                  [--generic] [--cache DIR [--build-only]]
Each shape MxNxK is y = x · wᵀ in bf16 (x [M, K], w [N, K]). Prints the tile call mk's build
took, the median device time (CUDA events, graph replays queued behind a GPU sleep) of mk's
megakernel and of PyTorch's matmul in a CUDA graph, their TFLOP/s, and mk's largest error
against PyTorch. With --generic mk's body
keeps the generic float loop and product (mk::gpu::matmul_tile) instead of the tensor-core K
loop (mk::gpu::gemm_tile): what the tensor cores gained. MK_PASS_OPTIONS
("tile_m=128+tile_n=64") sets the tiles, as for bench.py, and MK_CUDA_GEMM the instruction
(wgmma or mma). --build-only fills --cache with the builds (no GPU needed), so that several
variants can be built side by side before any is timed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import torch

import mk
from mk.backends.cuda import emit_body
from mk.inputs import random_inputs
from mk.models.torch_reference import capture_graph
from mk.source import entry_function, load_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import max_error, median_ms, pass_options, to_torch  # noqa: E402


def linear(m: int, n: int, k: int) -> str:
    x, w, y = f"tensor<{m}x{k}xbf16>", f"tensor<{n}x{k}xbf16>", f"tensor<{m}x{n}xbf16>"
    return (
        f"func.func @gemm(%x: {x}, %w: {w}) -> {y} {{\n"
        f"  %y = nn.linear %x, %w : ({x}, {w}) -> {y}\n  func.return %y : {y}\n}}"
    )


def shapes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for item in text.split(","):
        m, n, k = (int(v) for v in item.split("x"))
        out.append((m, n, k))
    return out


def tile_call(source: str) -> str:
    """The product's device call in the emitted source (which tile, of what shape)."""
    found = re.search(r"mk::gpu::(\w*(?:gemm|mma|matmul)_tile(?:<[^>]*>)?)", source)
    return found.group(1) if found else "?"


def time_mk(
    text: str, inputs: list[torch.Tensor], runs: int, cache: str
) -> tuple[float, object, str]:
    prog = mk.compile(text, target="cuda", cache_dir=cache, **pass_options())
    outs = prog(*inputs)  # type: ignore[operator]
    ms = median_ms(capture_graph(lambda: prog.launch(*inputs, out=outs)), runs, queued=True)  # type: ignore[attr-defined]
    prog.check()  # type: ignore[attr-defined]
    return ms, prog(*inputs), tile_call(prog.cuda_source)  # type: ignore[operator,attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--shapes", default="256x2048x2048,1024x4096x4096")
    parser.add_argument("--generic", action="store_true")
    parser.add_argument("--cache", help="build cache (default: a temporary directory)")
    parser.add_argument("--build-only", action="store_true")
    args = parser.parse_args()
    if args.runs < 50:
        parser.error("--runs: the method asks for at least 50 timed runs")
    if args.generic:
        emit_body.mma_tile = lambda op, var: None  # type: ignore[assignment]
        emit_body.plan_gemm = lambda op: None  # type: ignore[assignment]
    print(
        "| M x N x K | mk tile | mk ms | mk TFLOP/s | PyTorch + CUDA graph ms | PyTorch TFLOP/s "
        "| mk error |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as temporary:
        cache = args.cache or temporary
        for m, n, k in shapes(args.shapes):
            text = linear(m, n, k)
            if args.build_only:
                mk.compile(text, target="cuda", cache_dir=cache, **pass_options())
                continue
            fn = entry_function(load_module(text))
            inputs = [to_torch(a) for a in random_inputs(fn, seed=0)]
            x, w = inputs
            ref = x @ w.T
            torch_ms = median_ms(capture_graph(lambda x=x, w=w: x @ w.T), args.runs, queued=True)
            mk_ms, outs, tile = time_mk(text, inputs, args.runs, cache)
            flop = 2 * m * n * k
            error = max_error(tuple(outs) if isinstance(outs, tuple) else (outs,), (ref,))  # type: ignore[arg-type]
            print(
                f"| {m}x{n}x{k} | `{tile}` | {mk_ms:.4f} | {flop / mk_ms / 1e9:.1f} | {torch_ms:.4f} | "
                f"{flop / torch_ms / 1e9:.1f} | {error:.1e} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
