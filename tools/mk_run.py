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

from mk.tools import add_option_flag

if TYPE_CHECKING:
    from xdsl.dialects.builtin import ModuleOp
    from xdsl.dialects.func import FuncOp

_TARGETS = ("cpu", "cuda")
_FIRST_VALUES = 4


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
    import mk
    from mk.compiler import compile, output_error
    from mk.dialects.nn_decode import donated_args
    from mk.inputs import argument_label
    from mk.interp.nn import random_inputs
    from mk.pipeline import parse_pass_options

    if args.target == "cuda" and not _has_gpu():
        print(
            "mk-run: error: running the 'cuda' target needs an NVIDIA GPU and torch with CUDA; "
            "use --target cpu (mk.compile(..., target='cuda') still emits and builds the source)",
            file=sys.stderr,
        )
        return 2
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
    inputs = random_inputs(func, args.seed)
    pristine = [x.copy() for x in inputs]  # donated inputs are updated in place by each run
    start = time.perf_counter()
    outputs = prog(*inputs)
    elapsed = time.perf_counter() - start
    references = mk.reference(module, *pristine, entry=name)
    donated = donated_args(func)
    outputs = (*outputs, *(inputs[i] for i in donated))
    references = (*references, *(pristine[i] for i in donated))
    ok = True
    for i, (out, ref) in enumerate(zip(outputs, references, strict=True)):
        error, bound = output_error(out, ref)
        good = error <= bound
        ok &= good
        n = len(outputs) - len(donated)
        label = (
            None
            if i < n
            else f"donated {argument_label(donated[i - n], func.args[donated[i - n]])}"
        )
        print(_describe(i, out, label))
        print(
            f"  error vs reference {error:.3e} (tolerance {bound:g}): {'ok' if good else 'MISMATCH'}"
        )
    print(f"{args.target} run time: {elapsed * 1e3:.2f} ms")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (the console script exits with it)."""
    args = _parser().parse_args(argv)
    from mk.diagnostics import run_tool

    return run_tool("mk-run", lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())
