"""`make demo`: every example through the front end (parse, verify, print) and the nn reference interpreter."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import mk
from mk.interp.nn import random_inputs
from mk.source import entry_function, load_module

EXAMPLES = Path(__file__).resolve().parent
# The reference interpreter is NumPy on one core: programs with more weights than this are only checked.
MAX_REFERENCE_ELEMENTS = 50_000_000


def _describe(a: np.ndarray) -> str:
    f = a.astype(np.float64)
    return f"{a.dtype}{list(a.shape)} mean {f.mean():+.4f} std {f.std():.4f} first {f.ravel()[:3].round(4).tolist()}"


def run_example(path: Path) -> None:
    t0 = time.perf_counter()
    module = load_module(path)
    fn = entry_function(module)
    n_ops = sum(1 for op in fn.walk() if op.name.startswith("nn."))
    elements = sum(int(np.prod(t.get_shape())) for t in fn.function_type.inputs.data)
    print(
        f"{path.name}: @{fn.sym_name.data}, {n_ops} nn ops, {elements:,} input elements, "
        f"parsed+verified in {1e3 * (time.perf_counter() - t0):.0f} ms"
    )
    if elements > MAX_REFERENCE_ELEMENTS:
        print("  reference run skipped (too large for the NumPy interpreter in a demo)")
        return
    inputs = random_inputs(fn, seed=0)
    t0 = time.perf_counter()
    outputs = mk.reference(module, *inputs)
    ms = 1e3 * (time.perf_counter() - t0)
    for i, out in enumerate(outputs):
        print(f"  out{i}: {_describe(out)}")
    print(f"  reference: {ms:.0f} ms")


def main() -> int:
    print(
        f"mk {mk.__version__}: nn front end + reference interpreter (lowering, CPU executor and CUDA backend come next)\n"
    )
    for path in sorted(EXAMPLES.glob("*.mlir")):
        run_example(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
