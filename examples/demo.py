"""`make demo`: every example through the pipeline that exists so far, checked against the reference.

For each program: parse + verify the nn IR, lower it with nn-to-mugraph, report the mugraph cost model
(kernels, DRAM bytes, estimated H200 time), run the mugraph interpreter block by block on random
inputs and compare it with the nn reference interpreter.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import mk
from mk.dialects import make_context
from mk.interp.mugraph import run_mugraph
from mk.interp.nn import random_inputs
from mk.passes.cost_model import module_cost
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import entry_function, load_module

EXAMPLES = Path(__file__).resolve().parent
# The interpreters are NumPy on one core: programs with more weights than this are only lowered.
MAX_INTERPRETED_ELEMENTS = 5_000_000


def _rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    o, r = out.astype(np.float64), ref.astype(np.float64)
    return float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30))


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
        return True
    t0 = time.perf_counter()
    outputs = run_mugraph(lowered, *inputs)
    ok = True
    for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        if np.issubdtype(ref.dtype, np.integer):
            err, good = float(np.mean(out != ref)), bool(np.array_equal(out, ref))
        else:
            err = _rel_error(out, ref)
            good = err <= (1e-5 if ref.dtype == np.float32 else 2e-2)
        ok &= good
        print(
            f"  out{i} {ref.dtype}{list(ref.shape)}: mugraph vs reference error {err:.2e} "
            f"{'ok' if good else 'MISMATCH'} ({_ms(t0)})"
        )
    return ok


def main() -> int:
    print(
        f"mk {mk.__version__}: nn -> mugraph, interpreted on the CPU "
        "(the task graph, CPU executor and CUDA backend come next)\n"
    )
    results = [run_example(path) for path in sorted(EXAMPLES.glob("*.mlir"))]
    print(f"\n{sum(results)}/{len(results)} examples agree with the reference")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
