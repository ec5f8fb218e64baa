"""mk-run: run an nn program on random inputs (today with the NumPy reference interpreter)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_TARGETS = ("cpu", "cuda")
_FIRST_VALUES = 4


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mk-run",
        description="Run an nn program on random inputs and print its outputs' statistics.",
    )
    p.add_argument("file", help="the .mlir program")
    p.add_argument("--reference", action="store_true", help="run the NumPy reference interpreter")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--entry", default=None, help="function to run (default: first public one)")
    p.add_argument("--target", choices=_TARGETS, default="cpu", help="compilation target")
    return p


def _describe(index: int, value: np.ndarray) -> str:
    data = value.astype(np.float64)
    first = ", ".join(f"{v:.6g}" for v in data.reshape(-1)[:_FIRST_VALUES])
    more = ", ..." if data.size > _FIRST_VALUES else ""
    stats = f"mean {data.mean():.6g} std {data.std():.6g}" if data.size else "empty"
    return (
        f"output {index}: shape {tuple(value.shape)} dtype {value.dtype.name} "
        f"{stats} first [{first}{more}]"
    )


def _run(args: argparse.Namespace) -> int:
    from mk.inputs import argument_label
    from mk.interp.nn import random_inputs, run_reference
    from mk.source import entry_function, load_module

    module = load_module(Path(args.file))
    func = entry_function(module, args.entry)
    if not args.reference:
        print(
            f"mk-run: error: the '{args.target}' target is not available yet (compilation is "
            "not implemented); use --reference to run the NumPy reference interpreter",
            file=sys.stderr,
        )
        return 2
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (the console script exits with it)."""
    args = _parser().parse_args(argv)
    from mk.diagnostics import MkError

    try:
        code = _run(args)
    except (MkError, ValueError) as e:
        sys.stdout.flush()
        message = str(e)
        print(message if "error:" in message else f"mk-run: error: {message}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
