"""Lowering an nn program to mugraph and checking it against the nn reference, shared by the
nn-to-mugraph test files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from mk.dialects import make_context
from mk.dialects import mugraph as mg
from mk.dialects.nn_decode import donated_args
from mk.inputs import random_inputs
from mk.interp.mugraph import run_mugraph
from mk.interp.nn import run_reference
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import entry_function

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# A norm and two linears whose outputs are viewed as heads (the reshapes fold into the linears).
QKV_VIEWS = """
func.func @qkv(%x: tensor<1x256xbf16>, %g: tensor<256xbf16>, %wq: tensor<256x256xbf16>, %wk: tensor<128x256xbf16>) -> (tensor<1x4x1x64xbf16>, tensor<1x2x1x64xbf16>) {
  %h = nn.rms_norm %x, %g {epsilon = 1.0e-05 : f32} : (tensor<1x256xbf16>, tensor<256xbf16>) -> tensor<1x256xbf16>
  %q = nn.linear %h, %wq : (tensor<1x256xbf16>, tensor<256x256xbf16>) -> tensor<1x256xbf16>
  %k = nn.linear %h, %wk : (tensor<1x256xbf16>, tensor<128x256xbf16>) -> tensor<1x128xbf16>
  %q4 = nn.reshape %q : (tensor<1x256xbf16>) -> tensor<1x4x1x64xbf16>
  %k4 = nn.reshape %k : (tensor<1x128xbf16>) -> tensor<1x2x1x64xbf16>
  func.return %q4, %k4 : tensor<1x4x1x64xbf16>, tensor<1x2x1x64xbf16>
}"""


def lower(module: ModuleOp, **options: int) -> ModuleOp:
    options.setdefault("k_splits", 0)  # split-K on (auto) unless a test pins it
    NnToMugraphPass(**options).apply(make_context(), module)
    module.verify()
    return module


def kernels(module: ModuleOp) -> list[mg.KernelOp | mg.GraphDefOp]:
    return [op for op in module.walk() if isinstance(op, mg.KernelOp | mg.GraphDefOp)]


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    o, r = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert o.shape == r.shape
    same_nan = np.isnan(o) == np.isnan(r)
    assert same_nan.all(), "NaN in different places"
    o, r = np.nan_to_num(o, nan=0.0), np.nan_to_num(r, nan=0.0)
    same_inf = np.isinf(o) == np.isinf(r)
    assert same_inf.all(), "inf in different places"
    finite = np.isfinite(r)
    assert (o[~finite] == r[~finite]).all(), "infinities of different signs"
    o, r = o[finite], r[finite]
    return float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30))


def tolerance(ref: np.ndarray) -> float:
    return 1e-5 if ref.dtype == np.float32 else 2e-2


def check_agrees(module: ModuleOp, seed: int = 0, **options: int) -> ModuleOp:
    """Run the nn reference, lower, run the mugraph interpreter on the same inputs, compare."""
    func = entry_function(module)
    inputs = random_inputs(func, seed)
    ref_inputs = [x.copy() for x in inputs]  # donated arguments are updated in place
    reference = run_reference(module, *ref_inputs)
    lowered = lower(module, **options)
    assert not [op for op in lowered.walk() if op.dialect_name() == "nn"]
    outputs = run_mugraph(lowered, *inputs)
    donated = donated_args(func)
    outputs = (*outputs, *(inputs[i] for i in donated))
    reference = (*reference, *(ref_inputs[i] for i in donated))
    for out, ref in zip(outputs, reference, strict=True):
        assert out.dtype == ref.dtype and out.shape == ref.shape
        if ref.dtype.kind in "iu":
            np.testing.assert_array_equal(out, ref)
        else:
            assert rel_error(out, ref) <= tolerance(ref), (rel_error(out, ref), str(lowered))
    return lowered
