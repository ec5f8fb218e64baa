"""mk's prefill program against the PyTorch decoder's one-pass prefill, on the GPU.

Usage (on the GPU machine): python bench/prefill.py --model PRESET [--prompt-len P] [--batch B]
                            [--layers N] [--runs N] [VARIANT...]
Random weights and prompt. mk's prefill (mk.models.prefill_program: the prompt's first P-1
positions in one launch, in as many rows as mk-generate runs them on the GPU:
mk.models.prefill_rows, or --rows) is replayed in a CUDA graph and timed with CUDA events as
device time;
PyTorch's is TorchDecoder.reset, one causal pass over the same positions, timed with CUDA
events as the host drives it. The K/V caches both leave are compared, and each against the same
model run in f32: mk's distance from it must be within twice PyTorch bf16's (exit 1 otherwise).
Each VARIANT (bench/variants.py's form; none: the defaults) is built under its switches and
timed in turn beside the one PyTorch pass. Prints PyTorch's line, then one per variant: its
time, its TFLOP/s on the linears and its caches' differences.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from typing import Any

import numpy as np


def linear_flops(config: Any, tokens: int) -> float:
    """2 · tokens · the layers' linear weights (attention's own products left out)."""
    c = config
    per_layer = c.hidden * (c.q_dim + 2 * c.kv_dim) + c.q_dim * c.hidden
    per_layer += 3 * c.hidden * c.intermediate
    return 2.0 * tokens * c.layers * per_layer


def cache_error(mk_caches: list[Any], torch_caches: list[Any], filled: int) -> float:
    """Largest |mk − torch| over the filled positions, relative to the largest |torch|."""
    worst = 0.0
    for a, b in zip(mk_caches, torch_caches, strict=True):
        a, b = a[:, :, :filled].float(), b[:, :, :filled].float()
        worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item())
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument(
        "--context", type=int, default=None, help="cache positions (default: prompt + 8)"
    )
    parser.add_argument(
        "--rows",
        default="",
        help="positions mk's program runs, comma-separated counts each timed in turn (default: "
        "mk.models.prefill_rows' choice, as mk-generate makes it on the GPU)",
    )
    parser.add_argument(
        "variants",
        nargs="*",
        help='builds of mk\'s prefill to time: "" (the defaults) or NAME=VALUE[,...] of MK_CUDA_* '
        "switches and MK_PASS_OPTIONS, as bench/variants.py takes them",
    )
    args = parser.parse_args()
    if args.runs < 50:
        parser.error("--runs: the method asks for at least 50 timed runs")
    try:
        row_counts: list[int | None] = (
            [int(r) for r in args.rows.split(",")] if args.rows else [None]
        )
    except ValueError:
        parser.error(f"--rows: comma-separated counts, got {args.rows!r}")
    from variants import environment, parse_variant

    from mk.models import preset, program_inputs, random_prompt, random_weights
    from mk.models.torch_reference import TorchDecoder, event_ms

    variants = [(text, parse_variant(text)) for text in args.variants or [""]]
    config = preset(args.model)
    if args.layers is not None:
        config = config.with_(layers=args.layers)
    batch, length = args.batch, args.prompt_len - 1
    context = args.context or args.prompt_len + 8
    if any(r is not None and not length <= r < context for r in row_counts):
        parser.error(
            f"--rows: counts from the prompt's {length} positions below the context {context}"
        )
    weights = random_weights(config, seed=0)
    prompt = random_prompt(config, batch, args.prompt_len, seed=0)
    host = program_inputs(config, weights, batch, context, prompt, prefill=False)
    model = TorchDecoder(config, weights, batch, context)
    torch_ms = event_ms(lambda: model.reset(prompt), args.runs, warmup=2)
    reference = [c for i in range(config.layers) for c in (model.k_cache[i], model.v_cache[i])]
    exact = TorchDecoder(config, weights, batch, context, dtype="float32")
    exact.reset(prompt)
    yardstick = [c for i in range(config.layers) for c in (exact.k_cache[i], exact.v_cache[i])]
    torch_drift = cache_error(reference, yardstick, length)
    print(
        f"{config.name} B{batch} prefill of {length} positions: PyTorch one causal pass "
        f"{torch_ms:.3f} ms, its caches {torch_drift:.1e} from the model in f32"
    )
    base, ok = dict(os.environ), True
    try:
        for (text, switches), asked in itertools.product(variants, row_counts):
            os.environ.clear()
            os.environ.update(environment(base, switches))
            mk_ms, built, caches, rows = time_mk(
                config, host, prompt, (batch, length, context, asked), args.runs
            )
            error = cache_error(caches, reference, length)
            mk_drift = cache_error(caches, yardstick, length)
            ok = ok and within_rounding(mk_drift, torch_drift)
            tflops = linear_flops(config, batch * length) / (mk_ms * 1e-3) / 1e12
            print(
                f"  mk {text or '(defaults)'}, {rows} rows: {mk_ms:.3f} ms ({tflops:.1f} "
                f"TFLOP/s on the linears; built in {built:.1f} s), caches {error:.1e} from "
                f"PyTorch's, {mk_drift:.1e} from the model in f32"
            )
    finally:
        os.environ.clear()
        os.environ.update(base)
    return 0 if ok else 1


def time_mk(
    config: Any, host: list[Any], prompt: Any, sizes: tuple[int, int, int, int | None], runs: int
) -> tuple[float, float, list[Any], int]:
    """(ms of mk's prefill replayed in a CUDA graph, seconds to build it, the K/V caches it
    filled, the positions it ran) under the current environment's switches, on fresh copies of
    the inputs; `sizes`' rows None: prefill_rows' choice for the GPU."""
    import mk
    from bench import pass_options
    from mk.models import prefill_inputs, prefill_program, prefill_rows
    from mk.models.build import arguments
    from mk.models.torch_reference import capture_graph, event_ms, to_torch

    batch, length, context, rows = sizes
    inputs = [to_torch(a, "cuda") for a in host]
    start = time.perf_counter()
    options = pass_options()
    if rows is None:  # as mk-generate runs it
        rows = prefill_rows(config, batch, length, context, "cuda", **options)
    text = prefill_program(config, batch, rows, context)
    prog: Any = mk.compile(text, target="cuda", **options)
    built = time.perf_counter() - start
    values = [
        to_torch(v, "cuda") if isinstance(v, np.ndarray) else v
        for v in prefill_inputs(config, inputs, prompt, context, rows)
    ]
    outs = prog(*values)
    launch = capture_graph(lambda: prog.launch(*values, out=outs))
    mk_ms = event_ms(launch, runs, warmup=3, queued=True)
    prog.check()
    roles = [a.role for a in arguments(config, batch, context)]
    return (
        mk_ms,
        built,
        [v for r, v in zip(roles, inputs, strict=True) if r in ("k_cache", "v_cache")],
        rows,
    )


def within_rounding(mk_drift: float, torch_drift: float) -> bool:
    """Whether mk's caches are as close to the f32 model as two bf16 implementations may be:
    within twice PyTorch bf16's own distance from it (over many layers both drift from it)."""
    return mk_drift <= 2.0 * torch_drift + 1e-3


if __name__ == "__main__":
    sys.exit(main())
