"""mk-run: compile an nn program, run it on random inputs and compare it with the reference."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mk.dialects.nn_decode import donated_args
from mk.tools import add_option_flag

if TYPE_CHECKING:
    from xdsl.dialects.builtin import ModuleOp
    from xdsl.dialects.func import FuncOp

    from mk.compiler import Program
    from mk.interp.nn_ties import ArgmaxSteer

_TARGETS = ("cpu", "cuda")
_FIRST_VALUES = 4
_TIE_MARGIN = 0.05  # mk-generate's --tie-tol: in units of the logits' rms
_TIE_RUNS = 32  # reference runs tried with other near-tied choices
_TIE_MARGIN = 0.05  # as mk-generate's --tie-tol: in units of the logits' rms


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mk-run",
        description="Compile an nn program, run it on random inputs, compare with the reference.",
    )
    p.add_argument("file", help="the .mlir program")
    p.add_argument("--reference", action="store_true", help="run the NumPy reference interpreter")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--entry", default=None, help="function to run (default: first public one)")
    p.add_argument("--target", choices=_TARGETS, default="cpu", help="compilation target")
    p.add_argument("--threads", type=int, default=None, help="CPU executor threads")
    p.add_argument("--num-sms", type=int, default=None, help="SM queues of the schedule")
    p.add_argument("--cache-dir", default=None, help="compiled-program cache (default ~/.cache/mk)")
    add_option_flag(p)
    return p


def _describe(index: int, value: np.ndarray, label: str | None = None) -> str:
    data = value.astype(np.float64)
    first = ", ".join(f"{v:.6g}" for v in data.reshape(-1)[:_FIRST_VALUES])
    more = ", ..." if data.size > _FIRST_VALUES else ""
    stats = f"mean {data.mean():.6g} std {data.std():.6g}" if data.size else "empty"
    return (
        f"{label or f'output {index}'}: shape {tuple(value.shape)} dtype {value.dtype.name} "
        f"{stats} first [{first}{more}]"
    )


def _run(args: argparse.Namespace) -> int:
    from mk.inputs import argument_label
    from mk.interp.nn import random_inputs, run_reference
    from mk.source import entry_function, load_module

    module = load_module(Path(args.file))
    func = entry_function(module, args.entry)
    if not args.reference:
        return _run_compiled(args, module, func)
    inputs = random_inputs(func, args.seed)
    print(f"@{func.sym_name.data}: reference interpreter, seed {args.seed}")
    for i, arg in enumerate(func.body.block.args):
        print(f"  {argument_label(i, arg)}: {arg.type}")
    start = time.perf_counter()
    outputs = run_reference(module, *inputs, entry=func.sym_name.data)
    elapsed = time.perf_counter() - start
    for i, out in enumerate(outputs):
        print(_describe(i, out))
    print(f"reference time: {elapsed * 1e3:.1f} ms")
    return 0


def _has_gpu() -> bool:
    try:
        torch = importlib.import_module("torch")  # optional: not a dependency of mk
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _run_compiled(args: argparse.Namespace, module: ModuleOp, func: FuncOp) -> int:
    from mk.interp.nn import random_inputs

    if args.target == "cuda" and not _has_gpu():
        print(
            "mk-run: error: running the 'cuda' target needs an NVIDIA GPU and torch with CUDA; "
            "use --target cpu (mk.compile(..., target='cuda') still emits and builds the source)",
            file=sys.stderr,
        )
        return 2
    prog = _compile(args, module, func)
    inputs = random_inputs(func, args.seed)
    ran = [x.copy() for x in inputs]  # donated inputs are updated in place by each run
    start = time.perf_counter()
    outputs = prog(*ran)
    elapsed = time.perf_counter() - start
    results = (*outputs, *(ran[i] for i in donated_args(func)))
    references = _reference(module, func, inputs, None)
    ok = _print_comparison(func, results, references)
    print(f"{args.target} run time: {elapsed * 1e3:.2f} ms")
    return 0 if ok else _explain_by_near_ties(module, func, inputs, results)


def _compile(args: argparse.Namespace, module: ModuleOp, func: FuncOp) -> Program:
    from mk.compiler import compile
    from mk.pipeline import parse_pass_options

    start = time.perf_counter()
    name = func.sym_name.data
    options: dict[str, Any] = {"num_threads": args.threads} if args.target == "cpu" else {}
    options.update(parse_pass_options(args.option))
    prog = compile(
        module, args.target, num_sms=args.num_sms, entry=name, cache_dir=args.cache_dir, **options
    )
    compiled = time.perf_counter() - start
    cached = "cache hit" if prog.cache_hit else "built"
    threads = f", {prog.num_threads} threads" if args.target == "cpu" else ""
    print(
        f"@{name}: {args.target}, {len(prog.tables.tasks)} tasks on {prog.num_sms} SMs"
        f"{threads}, seed {args.seed}"
    )
    print(f"compile time: {compiled * 1e3:.1f} ms ({cached})")
    return prog


def _reference(
    module: ModuleOp, func: FuncOp, inputs: Sequence[np.ndarray], steer: ArgmaxSteer | None
) -> tuple[np.ndarray, ...]:
    """The reference's outputs, then its donated arguments' final values."""
    from mk.interp.nn import run_reference, run_reference_steered

    want = [x.copy() for x in inputs]
    name = func.sym_name.data
    if steer is None:
        outputs = run_reference(module, *want, entry=name)
    else:
        outputs = run_reference_steered(module, steer, *want, entry=name)
    return (*outputs, *(want[i] for i in donated_args(func)))


def _print_comparison(
    func: FuncOp, results: Sequence[np.ndarray], references: Sequence[np.ndarray]
) -> bool:
    from mk.compiler import output_error
    from mk.inputs import argument_label

    donated = donated_args(func)
    n = len(results) - len(donated)
    ok = True
    for i, (out, ref) in enumerate(zip(results, references, strict=True)):
        error, bound = output_error(out, ref)
        good = error <= bound
        ok &= good
        arg = donated[i - n] if i >= n else -1
        label = f"donated {argument_label(arg, func.args[arg])}" if i >= n else None
        print(_describe(i, out, label))
        print(
            f"  error vs reference {error:.3e} (tolerance {bound:g}): {'ok' if good else 'MISMATCH'}"
        )
    return ok


def _explain_by_near_ties(
    module: ModuleOp, func: FuncOp, inputs: Sequence[np.ndarray], results: Sequence[np.ndarray]
) -> int:
    """Where the reference's nn.argmax meets a near-tie, another summation order may pick another
    of the tied values (and a decode loop then follows that choice). Accept the run only if the
    reference, made to take such choices, matches every output; 1 otherwise."""
    from mk.compiler import output_error
    from mk.interp.nn_ties import search_ties

    def matches(steer: ArgmaxSteer) -> bool:
        references = _reference(module, func, inputs, steer)
        return all(
            error <= bound
            for error, bound in (
                output_error(o, r) for o, r in zip(results, references, strict=True)
            )
        )

    steer = search_ties(matches, _TIE_MARGIN, _TIE_RUNS)
    if steer is None or not steer.forced:
        return 1
    sites = {site.key: site for site in steer.sites}
    for key, index in sorted(steer.forced.items()):
        site = sites[key]
        print(
            f"near-tie: nn.argmax at step {site.step}, row {site.row}: its top two values are "
            f"{site.margin:.3g} x rms apart (tie margin {_TIE_MARGIN:g}); this run chose {index}, "
            f"the reference {site.candidates[0]}"
        )
    print("with the reference taking those choices, every output matches: ok")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (the console script exits with it)."""
    args = _parser().parse_args(argv)
    from mk.diagnostics import run_tool

    return run_tool("mk-run", lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())
