"""`make demo`: every example through the whole pipeline, checked against the reference.

For each program: parse + verify the nn IR, lower it with nn-to-mugraph, report the mugraph cost model
(kernels, DRAM bytes, estimated H200 time), run the mugraph interpreter block by block on random
inputs, then `mk.compile(target="cpu")` it and run it on the CPU executor; both are compared with the
nn reference interpreter. Programs too large for NumPy (the Llama-3 block) are only compiled.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import mk
from mk.compiler import output_error
from mk.dialects import make_context
from mk.interp.mugraph import run_mugraph
from mk.interp.nn import random_inputs
from mk.passes.cost_model import module_cost
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import entry_function, load_module

EXAMPLES = Path(__file__).resolve().parent
# The interpreters are NumPy on one core: programs with more weights than this are only lowered.
MAX_INTERPRETED_ELEMENTS = 5_000_000


def _ms(t0: float) -> str:
    return f"{1e3 * (time.perf_counter() - t0):.0f} ms"


def run_example(path: Path) -> bool:
    t0 = time.perf_counter()
    module = load_module(path)
    fn = entry_function(module)
    n_ops = sum(1 for op in fn.walk() if op.name.startswith("nn."))
    elements = sum(int(np.prod(t.get_shape())) for t in fn.function_type.inputs.data)
    print(
        f"{path.name}: @{fn.sym_name.data}, {n_ops} nn ops, {elements:,} input elements ({_ms(t0)})"
    )
    inputs = None if elements > MAX_INTERPRETED_ELEMENTS else random_inputs(fn, seed=0)
    reference = None if inputs is None else mk.reference(module, *inputs)

    t0 = time.perf_counter()
    lowered = module.clone()
    NnToMugraphPass().apply(make_context(), lowered)
    cost = module_cost(lowered)
    print(
        f"  nn-to-mugraph: {cost.kernels} kernels, {cost.dram_read_bytes:,} B read, "
        f"{cost.dram_write_bytes:,} B written, est. {cost.est_us:.1f} us on an H200 ({_ms(t0)})"
    )
    if inputs is None or reference is None:
        print("  interpreters skipped (too large for NumPy in a demo)")
        run_cpu(path, None, None)
        return True
    t0 = time.perf_counter()
    outputs = run_mugraph(lowered, *inputs)
    ok = report("mugraph", outputs, reference, t0)
    return run_cpu(path, inputs, reference) and ok


def report(
    what: str, outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], t0: float
) -> bool:
    ok = True
    for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        err, bound = output_error(out, ref)
        ok &= err <= bound
        print(
            f"  out{i} {ref.dtype}{list(ref.shape)}: {what} vs reference error {err:.2e} "
            f"{'ok' if err <= bound else 'MISMATCH'} ({_ms(t0)})"
        )
    return ok


def run_cpu(
    path: Path, inputs: Sequence[np.ndarray] | None, reference: Sequence[np.ndarray] | None
) -> bool:
    """mk.compile(target="cpu") and, given inputs, one run on the CPU executor."""
    t0 = time.perf_counter()
    prog = mk.compile(path, target="cpu")
    cached = "cached" if prog.cache_hit else "built"
    print(
        f"  mk.compile cpu: {len(prog.tables.tasks)} tasks on {prog.num_sms} SMs, "
        f"library {cached} ({_ms(t0)})"
    )
    if inputs is None or reference is None:
        return True
    prog(*inputs)  # warm-up: first-touch of the arena and outputs
    t0 = time.perf_counter()
    outputs = prog(*inputs)
    return report(f"cpu executor ({prog.num_threads} threads)", outputs, reference, t0)


def main() -> int:
    print(
        f"mk {mk.__version__}: nn -> mugraph (interpreted) and nn -> mugraph -> task -> C++ "
        "kernels on the CPU executor (the CUDA backend comes next)\n"
    )
    results = [run_example(path) for path in sorted(EXAMPLES.glob("*.mlir"))]
    print(f"\n{sum(results)}/{len(results)} examples agree with the reference")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
