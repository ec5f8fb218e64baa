"""Random nn programs through the whole pipeline: nn-to-mugraph, mugraph-to-task, task-schedule and
the task simulator's random interleavings must reproduce `mk.reference`."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nn_programs import programs
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline

import mk
from mk.dialects import make_context
from mk.dialects.task import GraphOp
from mk.inputs import random_inputs
from mk.interp.task import sequential, simulate
from mk.passes import get_all_passes
from mk.source import entry_function, load_module


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert (np.isnan(g) == np.isnan(w)).all(), "NaN in different places"
    g, w = np.nan_to_num(g), np.nan_to_num(w)
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))


@settings(
    max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(programs(), st.integers(1, 6), st.integers(0, 3))
def test_random_programs_simulate_to_the_reference(
    module: ModuleOp, num_sms: int, seed: int
) -> None:
    module = load_module(str(module))  # parsed and verified, as a user program would be
    inputs = random_inputs(entry_function(module), seed=seed)
    want = mk.reference(module, *inputs)
    spec = f"nn-to-mugraph,mugraph-to-task,task-schedule{{num-sms={num_sms}}}"
    PassPipeline.parse_spec(get_all_passes(), spec).apply(make_context(), module)
    module.verify()
    (graph,) = [op for op in module.walk() if isinstance(op, GraphOp)]
    ref = sequential(graph, inputs)
    assert ref.violation is None, ref.violation
    for run in range(2):
        result = simulate(graph, inputs, seed=seed * 2 + run, reference=ref)
        assert result.violation is None, result.violation
        for got, exp in zip(result.outputs, want, strict=True):
            assert got.dtype == exp.dtype and got.shape == exp.shape
            if exp.dtype.kind in "iu":
                np.testing.assert_array_equal(got, exp)
            else:
                tolerance = 1e-5 if exp.dtype == np.float32 else 2e-2
                assert _relative_error(got, exp) <= tolerance
