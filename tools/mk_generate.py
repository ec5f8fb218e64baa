"""mk-generate: greedy token generation with a decoder model compiled into one mk program."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mk.tools import add_option_flag

_TARGETS = ("cpu", "cuda")
_PROMPT_SHOWN = 8  # the last prompt tokens printed before the generated ones


def _parser() -> argparse.ArgumentParser:
    from mk.models.config import PRESETS

    p = argparse.ArgumentParser(
        prog="mk-generate",
        description="Generate tokens greedily with a decoder model compiled by mk "
        "(random weights unless --weights is given).",
    )
    p.add_argument("--model", required=True, help=f"preset: {', '.join(PRESETS)}")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
    p.add_argument("--steps", type=int, default=8, help="tokens generated per call (default 8)")
    p.add_argument("--context", type=int, default=None, help="KV-cache positions (default: fit)")
    p.add_argument("--target", choices=_TARGETS, default="cpu", help="compilation target")
    p.add_argument("--check", action="store_true", help="compare with the reference model")
    p.add_argument("--bench", action="store_true", help="time repeated runs (median)")
    p.add_argument("--runs", type=int, default=50, help="timed runs of --bench (default 50)")
    p.add_argument(
        "--bench-json",
        default=None,
        help="append --bench's row to this JSON-lines file (bench/baseline.py compares it)",
    )
    p.add_argument("--weights", default=None, help=".safetensors file or directory of shards")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and prompt (default 0)")
    p.add_argument(
        "--layers", type=int, default=None, help="keep only the first N layers (quick checks)"
    )
    p.add_argument(
        "--vocab", type=int, default=None, help="a smaller vocabulary (random weights only)"
    )
    p.add_argument("--prompt-len", type=int, default=1, help="random prompt tokens (default 1)")
    p.add_argument(
        "--prefill",
        choices=("reference", "mk"),
        default="reference",
        help="who fills the K/V caches with the prompt: the reference model (NumPy on the CPU, "
        "PyTorch on the GPU; the default) or mk's prefill program, one call for the whole prompt",
    )
    p.add_argument(
        "--host-loop",
        action="store_true",
        help="compile one step and launch it once per token (logits of every step are checked)",
    )
    p.add_argument(
        "--tie-tol",
        type=float,
        default=0.05,
        help="a token may differ from the reference's when its logit is within this fraction "
        "of the logits' rms of the top one (default 0.05)",
    )
    p.add_argument(
        "--logit-tol", type=float, default=2e-2, help="relative logit tolerance (default 0.02)"
    )
    p.add_argument(
        "--accuracy",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --check, run the reference unrounded too (f64 NumPy / f32 PyTorch) and "
        "accept logits over --logit-tol when mk is at most 1.25x as far from it as the bf16 "
        "reference is (default: only when the logits exceed --logit-tol; --no-accuracy: never)",
    )
    add_option_flag(p)
    p.add_argument("--threads", type=int, default=None, help="CPU executor threads")
    p.add_argument("--cache-dir", default=None, help="compiled-program cache (default ~/.cache/mk)")
    p.add_argument("--emit", default=None, help="also write the nn program to this file")
    return p


@dataclass
class Run:
    """What one generation produced."""

    tokens: np.ndarray  # [batch, steps]
    logits: dict[int, np.ndarray] = field(default_factory=dict)  # step -> [batch, V] float32
    seconds: float = 0.0  # wall time of the generating call(s)
    notes: list[str] = field(default_factory=list)


def _torch() -> Any:
    return importlib.import_module("torch")  # optional: not a dependency of mk


def _has_gpu() -> bool:
    try:
        torch = _torch()
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _check_args(args: argparse.Namespace) -> None:
    for name in ("batch", "steps", "prompt_len", "runs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.context is None:
        args.context = args.prompt_len + args.steps
    if args.prompt_len + args.steps > args.context:
        raise ValueError(
            f"--context {args.context} is too small for a {args.prompt_len}-token prompt and "
            f"{args.steps} steps (at least {args.prompt_len + args.steps})"
        )
    if args.tie_tol < 0 or args.logit_tol < 0:
        raise ValueError("tolerances must be >= 0")


# --------------------------------------------------------------------------- running mk


def _device_inputs(inputs: list[np.ndarray]) -> list[Any]:
    from mk.models.torch_reference import to_torch

    return [to_torch(a, "cuda") for a in inputs]


def _host(value: Any) -> np.ndarray:
    """A NumPy copy of an output (torch bf16 as ml_dtypes.bfloat16)."""
    if isinstance(value, np.ndarray):
        return value
    import ml_dtypes

    torch = _torch()
    if value.dtype == torch.bfloat16:
        return value.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return value.cpu().numpy()


def _run_in_kernel(prog: Any, inputs: list[Any], pos: int, steps: int) -> Run:
    from mk.models.weights import generated_tokens

    start = time.perf_counter()
    tokens, logits = prog(*inputs)
    seconds = time.perf_counter() - start
    tokens, history = _host(tokens), _host(inputs[0])
    run = Run(generated_tokens(tokens, pos, steps), {steps - 1: _host(logits).astype(np.float32)})
    run.seconds = seconds
    if not np.array_equal(tokens, history):
        run.notes.append(
            "the donated token history differs from the returned one (donation not written back)"
        )
    return run


def _run_host_loop(prog: Any, inputs: list[Any], pos: int, steps: int) -> Run:
    """One launch per token: the donated token history and caches carry the state."""
    from mk.models.weights import generated_tokens

    run = Run(np.zeros((0, 0), np.int32))
    base = _host(inputs[1]).copy()
    start = time.perf_counter()
    for t in range(steps):
        if isinstance(inputs[1], np.ndarray):
            inputs[1] = base + t
        else:
            inputs[1].fill_(int(base[0]) + t)
        _, logits = prog(*inputs)
        run.logits[t] = _host(logits).astype(np.float32)
    run.seconds = time.perf_counter() - start
    run.tokens = generated_tokens(_host(inputs[0]), pos, steps)
    if isinstance(inputs[1], np.ndarray):
        inputs[1] = base
    else:
        inputs[1].fill_(int(base[0]))
    return run


def _bench_cpu(call: Callable[[], object], runs: int) -> float:
    call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _prefill_on_gpu(
    config: Any, weights: Any, prompt: np.ndarray, context: int, inputs: list[Any]
) -> None:
    """Fills the device K/V caches with the prompt's positions, computed by the PyTorch decoder
    (the check's reference computes the same ones)."""
    from mk.models.build import arguments
    from mk.models.torch_reference import TorchDecoder

    start = time.perf_counter()
    model = TorchDecoder(config, weights, prompt.shape[0], context)
    model.reset(prompt)
    for arg, value in zip(arguments(config, prompt.shape[0], context), inputs, strict=True):
        if arg.role in ("k_cache", "v_cache"):
            cache = model.k_cache if arg.role == "k_cache" else model.v_cache
            value.copy_(cache[arg.layer or 0])
    _torch().cuda.synchronize()
    print(f"prefill of the prompt (PyTorch): {time.perf_counter() - start:.2f} s")


def _prefill_with_mk(
    args: argparse.Namespace,
    config: Any,
    prompt: np.ndarray,
    inputs: list[Any],
    options: dict[str, Any],
) -> None:
    """Fills the K/V caches in `inputs` with the prompt's first P-1 positions by mk's prefill
    program (mk.models.build.prefill_program), compiled for the same target and options."""
    import mk
    from mk.models.build import prefill_program
    from mk.models.prefill import prefill_rows
    from mk.models.weights import prefill_inputs
    from mk.pipeline import parse_pass_options

    start = time.perf_counter()
    length = args.prompt_len - 1
    # On the GPU the rows that the cost model gives fuller waves (mk.models.prefill_rows).
    model: dict[str, Any] = {}
    if args.target == "cuda":
        model = {"target": "cuda", **parse_pass_options(args.option)}
    rows = prefill_rows(config, args.batch, length, args.context, **model)
    text = prefill_program(config, args.batch, rows, args.context)
    prog = mk.compile(text, target=args.target, **options)
    compiled = time.perf_counter() - start
    values = prefill_inputs(config, inputs, prompt, args.context, rows)
    if args.target == "cuda":
        values = [_device_inputs([v])[0] if isinstance(v, np.ndarray) else v for v in values]
    start = time.perf_counter()
    prog(*values)
    if args.target == "cuda":
        _torch().cuda.synchronize()
    ran = time.perf_counter() - start
    padded = f" as {rows} (mk.models.prefill_rows)" if rows > length else ""
    print(
        f"prefill of the prompt (mk): {length} positions{padded}, compile {compiled:.2f} s, "
        f"run {ran:.3f} s"
    )


# --------------------------------------------------------------------------- reporting


def _print_tokens(prompt: np.ndarray, tokens: np.ndarray) -> None:
    for b in range(tokens.shape[0]):
        shown = prompt[b, -_PROMPT_SHOWN:]
        more = f"{prompt.shape[1] - shown.size} more ... " if prompt.shape[1] > shown.size else ""
        head = more + " ".join(map(str, shown))
        print(f"  sequence {b}: [{head}] {' '.join(map(str, tokens[b]))}")


def _check(
    args: argparse.Namespace, config: Any, weights: Any, prompt: np.ndarray, run: Run
) -> bool:
    from mk.models.reference import compare, reference_generate

    if args.target == "cuda":
        from mk.models.torch_reference import torch_generate

        name = "PyTorch (CUDA graph)"
        ref = torch_generate(
            config, weights, prompt, args.steps, context=args.context, forced=run.tokens
        )
    else:
        name = "NumPy"
        ref = reference_generate(
            config, weights, prompt, args.steps, context=args.context, forced=run.tokens
        )
    result = compare(
        run.tokens, ref.logits, run.logits, tie_tol=args.tie_tol, logit_tol=args.logit_tol
    )
    agree = int(np.sum(run.tokens == ref.tokens))
    print(f"check against the {name} reference (teacher-forced on mk's tokens):")
    print(f"  tokens: {agree} of {run.tokens.size} are the reference's argmax")
    if result.divergence is not None:
        t, b = result.divergence
        print(
            f"  first near-tie choice: step {t}, sequence {b}, {result.divergence_gap:.3g} below "
            "the reference's top logit (allowed: within --tie-tol)"
        )
    steps = ", ".join(map(str, result.compared_steps))
    print(
        f"  logits (step {steps}): max relative error {result.logit_error:.3e}, "
        f"max abs error {result.logit_abs_error:.3e} (tolerance {args.logit_tol:g})"
    )
    logits_ok = result.logits_ok
    if args.accuracy or (args.accuracy is None and not logits_ok):
        logits_ok = _as_accurate(args, config, weights, prompt, run, ref.logits) or logits_ok
    for note in run.notes:
        print(f"  MISMATCH: {note}")
    for problem in result.problems:
        waived = logits_ok and ": logits differ" in problem
        print(f"  {'(within the accuracy bound) ' if waived else 'MISMATCH: '}{problem}")
    ok = result.tokens_ok and logits_ok and not run.notes
    print(f"check: {'ok' if ok else 'FAILED'}")
    return ok


ACCURACY_RATIO = 1.25  # --accuracy: mk's logits at most this much further from exact than bf16's


def _as_accurate(
    args: argparse.Namespace, config: Any, weights: Any, prompt: np.ndarray, run: Run, bf16: Any
) -> bool:
    """Whether mk's logits are about as close to an unrounded run of the reference model (on
    mk's tokens) as the bf16 reference's are: two bf16 implementations drift apart with depth
    even when both are right, so a deep model can exceed --logit-tol without a bug."""
    from mk.models.reference import logit_error, reference_generate

    if args.target == "cuda":
        from mk.models.torch_reference import torch_generate

        exact = torch_generate(
            config, weights, prompt, args.steps, context=args.context, forced=run.tokens,
            dtype="float32",
        )  # fmt: skip
    else:
        exact = reference_generate(
            config, weights, prompt, args.steps, context=args.context, forced=run.tokens,
            dtype=np.float64, round_bf16=False,
        )  # fmt: skip
    mine = logit_error(run.logits, exact.logits)
    theirs = logit_error({t: bf16[t] for t in run.logits}, exact.logits)
    good = mine <= ACCURACY_RATIO * theirs
    print(
        f"  against the unrounded reference: mk {mine:.3e}, the bf16 reference {theirs:.3e} "
        f"({'ok' if good else 'MISMATCH'}: at most {ACCURACY_RATIO:g}x)"
    )
    return good


# --------------------------------------------------------------------------- main flow


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _load_weights(args: argparse.Namespace, config: Any) -> dict[str, np.ndarray]:
    from mk.models.weights import check_weights, load_safetensors, random_weights

    if args.weights is None:
        return random_weights(config, args.seed)
    hf_config = Path(args.weights) / "config.json"
    if hf_config.is_file() and args.layers is None:
        from mk.models.config import check_hf_config

        check_hf_config(config, hf_config)
    return check_weights(config, load_safetensors(Path(args.weights)))


def _generate(args: argparse.Namespace) -> int:
    import mk
    from mk.models.build import decode_program
    from mk.models.config import preset
    from mk.models.weights import program_inputs, random_prompt
    from mk.pipeline import parse_pass_options

    _check_args(args)
    if os.environ.get("MK_PASS_OPTIONS"):
        # bench/ builds take pass options from this variable; a run that means them must say so.
        print(
            "mk-generate: note: MK_PASS_OPTIONS (the benchmarks' variable) is not read here; "
            "give pass options as --option NAME=VALUE",
            file=sys.stderr,
        )
    config = preset(args.model)
    if args.layers is not None:
        if not 1 <= args.layers <= config.layers:
            raise ValueError(f"--layers must be in 1..{config.layers} for {config.name}")
        config = config.with_(
            layers=args.layers, name=f"{config.name} (first {args.layers} layers)"
        )
    if args.vocab is not None:
        if args.weights is not None or args.vocab < 2:
            raise ValueError("--vocab takes a size >= 2 and works with random weights only")
        config = config.with_(vocab=args.vocab, name=f"{config.name} (vocabulary {args.vocab})")
    if args.target == "cuda" and not _has_gpu():
        print(
            "mk-generate: error: the 'cuda' target needs an NVIDIA GPU and torch with CUDA; "
            "use --target cpu",
            file=sys.stderr,
        )
        return 2
    start = time.perf_counter()
    weights = _load_weights(args, config)
    prompt = random_prompt(config, args.batch, args.prompt_len, args.seed)
    mk_prefill = args.prefill == "mk" and args.prompt_len > 1
    gpu_prefill = args.target == "cuda" and args.prompt_len > 1 and not mk_prefill
    inputs: list[Any] = program_inputs(
        config, weights, args.batch, args.context, prompt, prefill=not (gpu_prefill or mk_prefill)
    )
    prepared = time.perf_counter() - start
    per_call = 1 if args.host_loop else args.steps
    text = decode_program(config, args.batch, args.context, per_call)
    if args.emit:
        Path(args.emit).write_text(text)
    source = "random weights" if args.weights is None else args.weights
    print(
        f"{config.name}: {_count(config.parameter_count())} parameters ({source}, seed "
        f"{args.seed}), batch {args.batch}, context {args.context}, {args.steps} steps "
        f"({'one launch per token' if args.host_loop else 'one launch'}), target {args.target}"
    )
    start = time.perf_counter()
    options: dict[str, Any] = {"cache_dir": args.cache_dir}
    if args.target == "cpu" and args.threads is not None:
        options["num_threads"] = args.threads
    options.update(parse_pass_options(args.option))
    prog = mk.compile(text, target=args.target, **options)
    compiled = time.perf_counter() - start
    print(f"weights and inputs: {prepared:.2f} s; compile: {compiled:.2f} s")
    resources = getattr(prog, "cuda_resources", None)
    if resources is not None:
        # Every body shares the megakernel's registers: a spill shows up in every layer's time.
        print(f"megakernel: {resources.summary()}")
    if args.target == "cuda":
        inputs = _device_inputs(inputs)
        if gpu_prefill:
            _prefill_on_gpu(config, weights, prompt, args.context, inputs)
    if mk_prefill:
        _prefill_with_mk(args, config, prompt, inputs, options)
    pos = args.prompt_len - 1
    runner = _run_host_loop if args.host_loop else _run_in_kernel
    run = runner(prog, inputs, pos, args.steps)
    print("tokens ([prompt] generated):")
    _print_tokens(prompt, run.tokens)
    print(
        f"latency: {run.seconds * 1e3 / args.steps:.3f} ms/token "
        f"(wall time of the call{'s' if args.host_loop else ''} / {args.steps} steps)"
    )
    if args.bench:
        _bench(args, prog, inputs, config, weights, prompt)
    ok = _check(args, config, weights, prompt, run) if args.check else True
    return 0 if ok else 1


def _bench(
    args: argparse.Namespace,
    prog: Any,
    inputs: list[Any],
    config: Any,
    weights: dict[str, np.ndarray],
    prompt: np.ndarray,
) -> None:
    """Repeated runs from the same position (each rewrites the same cache and token entries)."""
    calls = 1 if not args.host_loop else args.steps
    per_call = args.steps // calls
    if args.target == "cpu":
        ms = _bench_cpu(lambda: prog(*inputs), args.runs)
        print(f"bench: {ms / per_call:.3f} ms/token (median wall time of {args.runs} calls)")
        _bench_row(args, config, "cpu", ms / per_call, None, None)
        return
    from mk.models.torch_reference import capture_graph, copy_bandwidth, device_name, event_ms

    outs = prog(*inputs)
    try:
        launch, how = capture_graph(lambda: prog.launch(*inputs, out=outs)), "CUDA-graph replays"
    except RuntimeError as e:  # the launch could not be captured: time plain launches
        print(f"bench: mk launch not captured in a CUDA graph ({e}); timing plain launches")
        launch, how = (lambda: prog.launch(*inputs, out=outs)), "launches"
    ms = event_ms(launch, args.runs, warmup=5, queued=True)
    prog.check()
    print(
        f"bench: mk {ms / per_call:.4f} ms/token (median of {args.runs} {how}, CUDA events, device time)"
    )
    bandwidth = copy_bandwidth()
    floor = _floor_bytes(config, args, per_call) / bandwidth * 1e3
    print(f"bench: floor {floor:.4f} ms/token (weights + KV read once ÷ measured copy bandwidth)")
    # The ratio, not the milliseconds, is what compares across cards of other bandwidths.
    print(f"bench: mk / floor {ms / per_call / floor:.2f}x")
    device = device_name()
    print(f"bench: device {device}, copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    from mk.models.torch_reference import TorchDecoder

    model = TorchDecoder(config, weights, args.batch, args.context)
    model.capture()
    model.reset(prompt)
    token, pos = model.token.clone(), model.pos.clone()

    def restart() -> None:
        model.token.copy_(token)
        model.pos.copy_(pos)

    def torch_steps() -> None:
        for _ in range(per_call):
            model.run_step()

    torch_ms = event_ms(torch_steps, args.runs, warmup=5, setup=restart, queued=True)
    print(f"bench: PyTorch + CUDA graph {torch_ms / per_call:.4f} ms/token (same method)")
    _bench_row(args, config, device, ms / per_call, floor, torch_ms / per_call)


def _bench_row(
    args: argparse.Namespace,
    config: Any,
    device: str,
    mk_ms: float,
    floor_ms: float | None,
    graph_ms: float | None,
) -> None:
    """--bench-json: this run as one JSON line, named by everything that sets its time."""
    if args.bench_json is None:
        return
    name = f"{config.name} B{args.batch} steps {args.steps} context {args.context}"
    name += f" prompt {args.prompt_len}" + (" host-loop" if args.host_loop else "")
    name += "".join(f" {k} {v}" for k, v in (("layers", args.layers), ("vocab", args.vocab)) if v)
    name += "".join(f" {o}" for o in args.option)  # pass options and switches change the build
    name += "".join(
        f" {k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MK_CUDA_") and v
    )
    row = {
        "workload": name,
        "device": device,
        "mk_ms": mk_ms,
        "floor_ms": floor_ms,
        "graph_ms": graph_ms,
    }
    with open(args.bench_json, "a") as f:
        f.write(json.dumps(row) + "\n")


def _floor_bytes(config: Any, args: argparse.Namespace, per_call: int) -> float:
    """Bytes one step must move on average: the weights it reads (bf16; of an untied embedding
    table only the batch's rows) and the K/V entries the steps of one call attend to."""
    pos = args.prompt_len - 1
    positions = sum(pos + t + 1 for t in range(per_call)) / per_call
    kv_per_position = config.kv_cache_bytes(args.batch, 1)
    return config.step_weight_bytes(args.batch) + kv_per_position * positions


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (the console script exits with it)."""
    args = _parser().parse_args(argv)
    from mk.diagnostics import run_tool

    return run_tool("mk-generate", lambda: _generate(args), (OSError,))


if __name__ == "__main__":
    sys.exit(main())
