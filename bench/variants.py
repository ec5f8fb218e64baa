"""Whole-model ms/token of several builds in one process, side by side.

Usage (on the GPU machine): python bench/variants.py --model PRESET [--batch B] [--runs N]
                            [--rounds R] VARIANT...
A VARIANT is "" (the defaults) or NAME=VALUE[,NAME=VALUE...] of MK_CUDA_* build switches and
MK_PASS_OPTIONS (pass options as bench.py takes them: MK_PASS_OPTIONS=accumulate_columns=128). The
weights, a 1,000-token prompt and its prefill (PyTorch) are made once; each variant's decode
launch (8 steps, context 1,024: mk-generate's program) is compiled under its switches and timed
in turn, R rounds of N CUDA-graph replays each (CUDA events), so that the variants see one GPU
state and one call's drift. Each variant's first tokens are printed: builds of one program must
generate the same ones. Prebuild the variants first (bench/prebuild.py gen:PRESET:B under each
variant's switches, in parallel): a model's nvcc build takes minutes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

STEPS, CONTEXT, PROMPT = 8, 1024, 1000


def parse_variant(text: str) -> dict[str, str]:
    """The switches of one VARIANT ("" for none)."""
    switches: dict[str, str] = {}
    for item in filter(None, text.split(",")):
        name, eq, value = item.partition("=")
        if not eq or not (name.startswith("MK_CUDA_") or name == "MK_PASS_OPTIONS"):
            raise ValueError(f"variants: {item!r} is not MK_CUDA_NAME=VALUE or MK_PASS_OPTIONS=...")
        switches[name] = value
    return switches


def environment(base: dict[str, str], switches: dict[str, str]) -> dict[str, str]:
    """`base` without its MK_CUDA_* switches and pass options, then `switches`: one variant's
    environment."""
    env = {k: v for k, v in base.items() if not k.startswith(("MK_CUDA_", "MK_PASS_OPTIONS"))}
    env.update(switches)
    return env


def prepare(model: str, batch: int) -> tuple[str, list[Any]]:
    """mk-generate's program text and its device inputs, the prompt prefilled into the caches."""
    from mk.models.build import decode_program
    from mk.models.config import preset
    from mk.models.weights import program_inputs, random_prompt
    from mk.tools import mk_generate as gen

    config = preset(model)
    weights = gen._load_weights(SimpleNamespace(weights=None, seed=0, layers=None), config)
    prompt = random_prompt(config, batch, PROMPT, 0)
    inputs = program_inputs(config, weights, batch, CONTEXT, prompt, prefill=False)
    inputs = gen._device_inputs(inputs)
    gen._prefill_on_gpu(config, weights, prompt, CONTEXT, inputs)
    return decode_program(config, batch, CONTEXT, STEPS), inputs


def first_tokens(outs: Any) -> list[int]:
    first = outs[0] if isinstance(outs, (list, tuple)) else outs
    return first.cpu().flatten()[:STEPS].tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("variants", nargs="+")
    args = parser.parse_args()
    try:
        variants = {v: parse_variant(v) for v in args.variants}
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    import mk
    from bench import pass_options
    from mk.models.torch_reference import capture_graph, event_ms

    text, inputs = prepare(args.model, args.batch)
    base = dict(os.environ)
    progs: dict[str, Any] = {}
    for v, switches in variants.items():
        os.environ.clear()
        os.environ.update(environment(base, switches))
        start = time.perf_counter()
        progs[v] = mk.compile(text, target="cuda", **pass_options())
        print(f"{v or 'default'}: compiled in {time.perf_counter() - start:.1f} s", flush=True)
    os.environ.clear()
    os.environ.update(base)
    times: dict[str, list[float]] = {v: [] for v in variants}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for v, prog in progs.items():
            outs = prog(*inputs)
            tokens[v] = first_tokens(outs)
            launch = capture_graph(lambda prog=prog, outs=outs: prog.launch(*inputs, out=outs))
            times[v].append(event_ms(launch, args.runs, warmup=5, queued=True) / STEPS)
            prog.check()
    print(
        f"{args.model} batch {args.batch}, ms/token ({args.rounds} rounds of {args.runs} replays):"
    )
    for v in variants:
        rounds = " ".join(f"{t:.4f}" for t in times[v])
        print(f"  {v or 'default':<48} {rounds}  tokens {tokens[v]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
