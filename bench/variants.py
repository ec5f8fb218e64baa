"""Whole-model ms/token of several builds in one process, side by side.

Usage (on the GPU machine): python bench/variants.py --model PRESET [--batch B] [--runs N]
                            [--rounds R] [--instances I] [--in-order] [--kinds N] VARIANT...
A VARIANT is "" (the defaults) or NAME=VALUE[,NAME=VALUE...] of MK_CUDA_* build switches and
MK_PASS_OPTIONS (pass options as bench.py takes them: MK_PASS_OPTIONS=accumulate_columns=128). The
weights, a 1,000-token prompt and its prefill (PyTorch) are made once; each variant's decode
launch (8 steps, context 1,024: mk-generate's program) is compiled under its switches and timed
in turn, R rounds of N CUDA-graph replays each (CUDA events), so that the variants see one GPU
state and one call's drift. Each variant's first tokens are printed: builds of one program must
generate the same ones. Prebuild the variants first (bench/prebuild.py gen:PRESET:B under each
variant's switches, in parallel): a model's nvcc build takes minutes.

One change timed -0.3 % and then +0.7 % against the default in two calls on the H200
(bench/RESULTS.md, session 56): what moves a build's time by that much (where its device state
lands, its turn in a round, where its code lands) is not known. So each variant runs as I
instances (programs of the same build, each with its own device state: the arena, the event
counters), each round takes the (variant, instance) pairs in a seeded shuffled order
(`--in-order`: as given), and a variant's figure is the median over its instances' rounds,
printed with the spread of its instances' medians. With --kinds N each variant's first
instance then records N launches' timelines, and a table gives the mean µs a task of each kind
ran in every variant: which bodies a build moved (a 4-layer timeline of each build, one run
each, moved a kind by up to ~1 µs from run to run).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
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


def schedule(
    variants: list[str], instances: int, rounds: int, shuffled: bool = True
) -> list[list[tuple[str, int]]]:
    """Per round, the (variant, instance) pairs in the order they are timed: every pair once a
    round, shuffled by a seed of the round (the same order on every call) unless `shuffled` is
    false."""
    pairs = [(v, i) for v in variants for i in range(instances)]
    order = []
    for r in range(rounds):
        this = list(pairs)
        if shuffled:
            random.Random(r).shuffle(this)
        order.append(this)
    return order


def summary(runs: list[list[float]]) -> tuple[float, float]:
    """A variant's median over all its instances' rounds, and the spread of its instances'
    medians (max − min) as a fraction of that median."""
    median = statistics.median(t for times in runs for t in times)
    per_instance = [statistics.median(times) for times in runs]
    return median, (max(per_instance) - min(per_instance)) / median


def verdict(median: float, first: float, same: bool) -> str:
    """A variant's line after its time: its change against the first variant's median, and a
    flag where its build generated other ids than the first's (a broken build can look fast).
    Worded so that a `grep -v tokens` of the report keeps it."""
    change = f"{100 * (median / first - 1):+.2f} % against the first"
    return change if same else f"{change}  MISMATCH: its ids differ from the first variant's"


def kind_runs(kinds: list[str], timelines: list[Any]) -> dict[str, float]:
    """Mean µs a task of each kind ran, over the recorded iterations (each [tasks, 2] start and
    end ns; tasks that never started left out)."""
    import numpy as np

    total: dict[str, list[float]] = {}
    for timeline in timelines:
        rows = np.asarray(timeline, dtype=np.float64)
        for task, kind in enumerate(kinds):
            start, end = rows[task, 0], rows[task, 1]
            if start > 0:
                total.setdefault(kind, []).append((end - start) / 1e3)
    return {kind: float(np.mean(t)) for kind, t in total.items()}


def kind_table(runs: dict[str, dict[str, float]], first: str) -> list[str]:
    """Per kind (largest first), each variant's mean µs a task and its change against the
    first variant's: which bodies a build moved."""
    kinds = sorted(runs[first], key=lambda k: -runs[first][k])
    lines = [f"  {'kind':<16}" + "".join(f"{v or 'default':>28}"[:28] for v in runs)]
    for kind in kinds:
        cells = []
        for v in runs:
            us = runs[v].get(kind)
            if us is None:
                cells.append(f"{'—':>28}")
                continue
            delta = "" if v == first else f" ({us - runs[first][kind]:+.2f})"
            cells.append(f"{f'{us:.2f}{delta}':>28}")
        lines.append(f"  {kind:<16}" + "".join(cells))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--instances", type=int, default=2, help="programs per variant")
    parser.add_argument("--in-order", action="store_true", help="no shuffling of the rounds")
    parser.add_argument(
        "--kinds",
        type=int,
        default=0,
        help="after the timing, record N launches of each variant's first instance and print "
        "the mean µs a task of each kind ran (its iterations after the first)",
    )
    parser.add_argument("variants", nargs="+")
    args = parser.parse_args()
    try:
        variants = {v: parse_variant(v) for v in args.variants}
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if args.instances < 1 or args.rounds < 1:
        print("variants: --instances and --rounds must be at least 1", file=sys.stderr)
        return 2
    import mk
    from bench import pass_options
    from mk.models.torch_reference import capture_graph, device_name, event_ms

    text, inputs = prepare(args.model, args.batch)
    base = dict(os.environ)
    progs: dict[tuple[str, int], Any] = {}
    for v, switches in variants.items():
        os.environ.clear()
        os.environ.update(environment(base, switches))
        start = time.perf_counter()
        for i in range(args.instances):  # the build is cached: the later ones only load it
            progs[v, i] = mk.compile(text, target="cuda", **pass_options())
        print(f"{v or 'default'}: compiled in {time.perf_counter() - start:.1f} s", flush=True)
    os.environ.clear()
    os.environ.update(base)
    times: dict[tuple[str, int], list[float]] = {key: [] for key in progs}
    outs = {key: prog(*inputs) for key, prog in progs.items()}  # each its own device state
    tokens = {v: first_tokens(outs[v, 0]) for v in variants}
    for order in schedule(list(variants), args.instances, args.rounds, not args.in_order):
        for key in order:
            prog, out = progs[key], outs[key]
            launch = capture_graph(lambda prog=prog, out=out: prog.launch(*inputs, out=out))
            times[key].append(event_ms(launch, args.runs, warmup=5, queued=True) / STEPS)
            prog.check()
    print(
        f"{args.model} batch {args.batch} on {device_name()}, ms/token ({args.instances} "
        f"instances x {args.rounds} rounds of {args.runs} replays; median, spread of the instances):"
    )
    first = args.variants[0]
    first_median = summary([times[first, i] for i in range(args.instances)])[0]
    for v in variants:
        median, spread = summary([times[v, i] for i in range(args.instances)])
        rounds = " | ".join(
            " ".join(f"{t:.4f}" for t in times[v, i]) for i in range(args.instances)
        )
        mark = verdict(median, first_median, tokens[v] == tokens[first])
        print(
            f"  {v or 'default':<44} {median:.4f} (spread {100 * spread:.2f} %)  {mark}  [{rounds}]"
        )
        print(f"  {'':<44} tokens {tokens[v]}")
    if args.kinds > 0:
        from hops import kind_of, task_grids

        runs: dict[str, dict[str, float]] = {}
        for v in variants:
            prog = progs[v, 0]
            kinds = [kind_of(grid) for grid in task_grids(prog)]
            prog.record_timeline = True
            timelines = []
            for _ in range(args.kinds):
                prog(*inputs)
                timelines.extend(prog.last_timeline[1:])  # the first iteration starts cold
            prog.record_timeline = False
            runs[v] = kind_runs(kinds, timelines)
        print(
            f"mean µs a task ran, by kind ({args.kinds} launches of {STEPS} steps, the first left out):"
        )
        print("\n".join(kind_table(runs, first)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
