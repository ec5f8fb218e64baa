"""mk.reference against float64 NumPy written independently here, its input checks, and mk-run."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import mk
from mk.diagnostics import MkError
from mk.inputs import random_inputs
from mk.source import entry_function, load_module
from mk.tools.mk_run import main as mk_run

DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "i32": np.int32}
TOLERANCE = {"f32": 1e-5, "f16": 2e-2, "bf16": 2e-2}
FLOATS = ["f32", "bf16", "f16"]
FEW = settings(max_examples=25, deadline=None, database=None, derandomize=True)


# --- helpers: build a one-op program, make inputs, compare ------------------------------------


def tensor(shape: Sequence[int], dt: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + dt + ">"


def one_op(
    op: str,
    operands: Sequence[tuple[Sequence[int], str]],
    result: tuple[Sequence[int], str],
    attrs: str = "",
) -> str:
    """`func.func @main` whose body is the single op `%r = op %a0, %a1, ... attrs : (...) -> ...`."""
    types = [tensor(s, d) for s, d in operands]
    res = tensor(*result)
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(types))
    names = ", ".join(f"%a{i}" for i in range(len(types)))
    attr_text = f" {attrs}" if attrs else ""
    return (
        f"func.func @main({params}) -> {res} {{\n"
        f"  %r = {op} {names}{attr_text} : ({', '.join(types)}) -> {res}\n"
        f"  func.return %r : {res}\n"
        "}\n"
    )


def randn(rng: np.random.Generator, shape: Sequence[int], dt: str) -> np.ndarray:
    return rng.standard_normal(tuple(shape)).astype(DTYPES[dt])


def f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def assert_close(out: np.ndarray, ref: np.ndarray, dt: str) -> None:
    assert out.dtype == np.dtype(DTYPES[dt])
    assert out.shape == ref.shape
    err = np.linalg.norm(f64(out) - ref) / np.linalg.norm(ref)
    assert err <= TOLERANCE[dt], f"relative error {err:.3g} > {TOLERANCE[dt]}"


def run_one(
    op: str,
    inputs: Sequence[np.ndarray],
    dts: Sequence[str],
    result: tuple[Sequence[int], str],
    attrs: str = "",
) -> np.ndarray:
    text = one_op(op, [(x.shape, d) for x, d in zip(inputs, dts, strict=True)], result, attrs)
    (out,) = mk.reference(text, *inputs)
    return out


def erf64(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) for v in x.reshape(-1)]).reshape(x.shape)


def softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# --- elementwise ------------------------------------------------------------------------------

UNARY = {
    "nn.exp": np.exp,
    "nn.sqrt": np.sqrt,
    "nn.rsqrt": lambda x: 1.0 / np.sqrt(x),
    "nn.square": lambda x: x * x,
    "nn.neg": lambda x: -x,
    "nn.relu": lambda x: np.where(x > 0, x, 0.0),
    "nn.sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "nn.silu": lambda x: x / (1.0 + np.exp(-x)),
    "nn.gelu": lambda x: 0.5 * x * (1.0 + erf64(x / math.sqrt(2.0))),
}


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op: str, dt: str) -> None:
    x = np.random.default_rng(1).standard_normal((3, 5, 8)) * 2
    if op in ("nn.sqrt", "nn.rsqrt"):
        x = np.abs(x) + 0.1
    x = x.astype(DTYPES[dt])
    assert_close(run_one(op, [x], [dt], (x.shape, dt)), UNARY[op](f64(x)), dt)


@pytest.mark.parametrize("dt", FLOATS)
def test_scale(dt: str) -> None:
    x = randn(np.random.default_rng(2), (4, 6), dt)
    out = run_one("nn.scale", [x], [dt], (x.shape, dt), "{factor = -1.250000e-01 : f32}")
    assert_close(out, f64(x) * -0.125, dt)


BINARY = {
    "nn.add": np.add,
    "nn.sub": np.subtract,
    "nn.mul": np.multiply,
    "nn.div": np.divide,
    "nn.maximum": np.maximum,
}


def _binary_inputs(shape_a: tuple[int, ...], shape_b: tuple[int, ...], op: str, dt: str, seed: int):
    rng = np.random.default_rng(seed)
    a = randn(rng, shape_a, dt)
    b = rng.standard_normal(shape_b)
    if op == "nn.div":  # keep denominators away from zero
        b = np.sign(b) * (np.abs(b) + 0.5)
    return a, b.astype(DTYPES[dt])


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast(op: str, dt: str) -> None:
    a, b = _binary_inputs((2, 1, 5), (3, 1), op, dt, seed=3)
    out = run_one(op, [a, b], [dt, dt], ((2, 3, 5), dt))
    assert_close(out, BINARY[op](f64(a), f64(b)), dt)


@FEW
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=4, max_side=4),
    op=st.sampled_from(sorted(BINARY)),
    dt=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_binary_broadcast_property(shapes, op: str, dt: str, seed: int) -> None:
    (shape_a, shape_b), result = shapes.input_shapes, shapes.result_shape
    a, b = _binary_inputs(shape_a, shape_b, op, dt, seed)
    out = run_one(op, [a, b], [dt, dt], (result, dt))
    assert_close(out, BINARY[op](f64(a), f64(b)), dt)


# --- reductions, softmax, argmax ---------------------------------------------------------------

REDUCE = {"nn.reduce_sum": np.sum, "nn.reduce_max": np.max, "nn.reduce_mean": np.mean}


def _reduced_shape(shape: tuple[int, ...], dim: int, keepdim: bool) -> tuple[int, ...]:
    axis = dim % len(shape)
    if keepdim:
        return shape[:axis] + (1,) + shape[axis + 1 :]
    return shape[:axis] + shape[axis + 1 :]


def _check_reduce(op: str, shape: tuple[int, ...], dim: int, keepdim: bool, dt: str, seed: int):
    x = randn(np.random.default_rng(seed), shape, dt)
    attrs = f"{{dim = {dim} : i64, keepdim = {str(keepdim).lower()}}}"
    out = run_one(op, [x], [dt], (_reduced_shape(shape, dim, keepdim), dt), attrs)
    assert_close(out, REDUCE[op](f64(x), axis=dim, keepdims=keepdim), dt)


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize(("dim", "keepdim"), [(-1, False), (0, True), (1, False)])
def test_reduce(op: str, dim: int, keepdim: bool, dt: str) -> None:
    _check_reduce(op, (3, 7, 5), dim, keepdim, dt, seed=4)


@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reduce_to_rank_0(op: str) -> None:
    _check_reduce(op, (7,), -1, False, "f32", seed=12)


@st.composite
def _shape_and_dim(draw: st.DrawFn) -> tuple[tuple[int, ...], int]:
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=2, max_size=4)))
    return shape, draw(st.integers(-len(shape), len(shape) - 1))


@FEW
@given(
    shape_dim=_shape_and_dim(),
    keepdim=st.booleans(),
    op=st.sampled_from(sorted(REDUCE)),
    dt=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_reduce_property(shape_dim, keepdim: bool, op: str, dt: str, seed: int) -> None:
    shape, dim = shape_dim
    _check_reduce(op, shape, dim, keepdim, dt, seed)


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax(dim: int, dt: str) -> None:
    x = (np.random.default_rng(5).standard_normal((4, 6, 3)) * 30).astype(DTYPES[dt])
    out = run_one("nn.softmax", [x], [dt], (x.shape, dt), f"{{dim = {dim} : i64}}")
    assert_close(out, softmax64(f64(x), dim), dt)


def test_softmax_large_values_are_stable() -> None:
    x = np.array([[1000.0, 1001.0, 999.0]], dtype=np.float32)
    out = run_one("nn.softmax", [x], ["f32"], (x.shape, "f32"))
    assert np.all(np.isfinite(out))
    assert_close(out, softmax64(f64(x), -1), "f32")


@pytest.mark.parametrize("dt", FLOATS)
def test_argmax_takes_first_maximum(dt: str) -> None:
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -5, 4, 4]], dtype=DTYPES[dt])
    out = run_one("nn.argmax", [x], [dt], ((3,), "i32"))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [1, 0, 2])
    col = run_one("nn.argmax", [x], [dt], ((4,), "i32"), "{dim = 0 : i64}")
    np.testing.assert_array_equal(col, [1, 0, 2, 2])


# --- matmul, linear, norms, rope ---------------------------------------------------------------


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((5, 16), (16, 3)),
        ((2, 5, 16), (16, 3)),
        ((2, 5, 16), (2, 16, 3)),
        ((2, 1, 4, 8), (3, 8, 6)),
    ],
)
def test_matmul(shape_a, shape_b, dt: str) -> None:
    rng = np.random.default_rng(6)
    a, b = randn(rng, shape_a, dt), randn(rng, shape_b, dt)
    ref = np.einsum("...mk,...kn->...mn", f64(a), f64(b))
    assert_close(run_one("nn.matmul", [a, b], [dt, dt], (ref.shape, dt)), ref, dt)


@pytest.mark.parametrize("dt", FLOATS)
def test_linear(dt: str) -> None:
    rng = np.random.default_rng(7)
    x, w = randn(rng, (2, 3, 24), dt), randn(rng, (10, 24), dt)
    ref = np.einsum("bsk,nk->bsn", f64(x), f64(w))
    assert_close(run_one("nn.linear", [x, w], [dt, dt], (ref.shape, dt)), ref, dt)


@pytest.mark.parametrize("dt", FLOATS)
def test_rms_norm(dt: str) -> None:
    rng = np.random.default_rng(8)
    x, w = randn(rng, (3, 4, 32), dt), randn(rng, (32,), dt)
    xs = f64(x)
    ref = xs / np.sqrt((xs**2).mean(-1, keepdims=True) + 1e-5) * f64(w)
    out = run_one("nn.rms_norm", [x, w], [dt, dt], (x.shape, dt), "{epsilon = 1.000000e-05 : f32}")
    assert_close(out, ref, dt)


def test_rms_norm_default_epsilon_matters() -> None:
    x, w = np.full((1, 4), 1e-3, np.float32), np.ones((4,), np.float32)
    out = run_one("nn.rms_norm", [x, w], ["f32", "f32"], (x.shape, "f32"))
    assert_close(out, np.full((1, 4), 1e-3 / math.sqrt(1e-6 + 1e-6)), "f32")


@pytest.mark.parametrize("dt", FLOATS)
def test_rope(dt: str) -> None:
    rng = np.random.default_rng(9)
    x = randn(rng, (2, 3, 5, 8), dt)
    angle = rng.uniform(0, 6, (5, 4))
    cos, sin = np.cos(angle).astype(DTYPES[dt]), np.sin(angle).astype(DTYPES[dt])
    xs, c, s = f64(x), f64(cos), f64(sin)
    ref = np.empty_like(xs)
    for i in range(4):  # element-wise rotation of each pair (i, i + D/2)
        ref[..., i] = xs[..., i] * c[:, i] - xs[..., i + 4] * s[:, i]
        ref[..., i + 4] = xs[..., i + 4] * c[:, i] + xs[..., i] * s[:, i]
    out = run_one("nn.rope", [x, cos, sin], [dt] * 3, (x.shape, dt))
    assert_close(out, ref, dt)


# --- embedding and layout ops -----------------------------------------------------------------


@pytest.mark.parametrize("dt", FLOATS)
def test_embedding(dt: str) -> None:
    table = randn(np.random.default_rng(10), (7, 5), dt)
    ids = np.array([[6, 0], [3, 3]], dtype=np.int32)
    out = run_one("nn.embedding", [table, ids], [dt, "i32"], ((2, 2, 5), dt))
    ref = np.stack([np.stack([f64(table)[j] for j in row]) for row in ids])
    np.testing.assert_array_equal(f64(out), ref)
    assert out.dtype == np.dtype(DTYPES[dt])


@pytest.mark.parametrize("bad", [7, -1])
def test_embedding_id_out_of_range_names_the_op(bad: int) -> None:
    table = np.zeros((7, 5), np.float32)
    ids = np.array([1, bad], dtype=np.int32)
    with pytest.raises(
        ValueError, match=rf"'nn.embedding' id {bad} at index \(1,\) is out of range"
    ):
        run_one("nn.embedding", [table, ids], ["f32", "i32"], ((2, 5), "f32"))


@pytest.mark.parametrize("dt", ["f32", "bf16", "i32"])
def test_layout_ops(dt: str) -> None:
    base_x, base_y = np.arange(24).reshape(2, 3, 4) - 5, np.arange(12).reshape(2, 3, 2) * 2
    x, y = base_x.astype(DTYPES[dt]), base_y.astype(DTYPES[dt])
    perm, window = (
        "{perm = array<i64: 2, 0, 1>}",
        "array<i64: 1, 1, 0>, sizes = array<i64: 1, 2, 3>",
    )
    cases = [
        ("nn.reshape", [x], "", np.arange(24).reshape(4, 6) - 5),
        ("nn.transpose", [x], perm, np.moveaxis(base_x, 2, 0)),
        ("nn.concat", [x, y], "{dim = -1 : i64}", np.dstack([base_x, base_y])),
        ("nn.slice", [x], f"{{offsets = {window}}}", base_x[1:2, 1:3, 0:3]),
    ]
    for op, inputs, attrs, ref in cases:
        out = run_one(op, inputs, [dt] * len(inputs), (ref.shape, dt), attrs)
        assert out.dtype == np.dtype(DTYPES[dt]), op
        np.testing.assert_array_equal(f64(out), ref, err_msg=op)


# --- attention --------------------------------------------------------------------------------


def attention64(q, k, v, scale: float, causal: bool, kv_len=None) -> np.ndarray:
    q, k, v = f64(q), f64(k), f64(v)
    batch, hq, sq, _ = q.shape
    hkv, s = k.shape[1], k.shape[2]
    out = np.zeros_like(q)
    for b in range(batch):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(sq):
                keys = [
                    j
                    for j in range(s)
                    if (kv_len is None or j < kv_len[b])
                    and (not causal or j <= (s if kv_len is None else kv_len[b]) - sq + i)
                ]
                logits = np.array([q[b, h, i] @ k[b, kh, j] * scale for j in keys])
                p = np.exp(logits - logits.max())
                out[b, h, i] = (p / p.sum()) @ v[b, kh, keys]
    return out


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize(
    ("hq", "hkv", "sq", "causal", "with_len"),
    [
        (2, 2, 5, False, False),
        (4, 2, 5, True, False),
        (4, 1, 1, False, True),
        (6, 2, 3, True, True),
    ],
)
def test_attention(hq: int, hkv: int, sq: int, causal: bool, with_len: bool, dt: str) -> None:
    rng = np.random.default_rng(11)
    b, s, d = 2, 6, 8
    q, k, v = (
        randn(rng, (b, hq, sq, d), dt),
        randn(rng, (b, hkv, s, d), dt),
        randn(rng, (b, hkv, s, d), dt),
    )
    inputs, dts = [q, k, v], [dt] * 3
    kv_len = None
    if with_len:
        kv_len = np.array([s, 4], dtype=np.int32)
        inputs, dts = [*inputs, kv_len], [*dts, "i32"]
    attrs = f"{{scale = 3.535534e-01 : f32, causal = {str(causal).lower()}}}"
    out = run_one("nn.attention", inputs, dts, (q.shape, dt), attrs)
    assert_close(out, attention64(q, k, v, 3.535534e-01, causal, kv_len), dt)


# --- whole programs: calls, rounding, entry, sources --------------------------------------------

CHAIN = """
func.func @main(%x: tensor<4xbf16>, %e: tensor<4xbf16>) -> tensor<4xbf16> {
  %s = func.call @add(%x, %e) : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  %d = nn.sub %s, %x : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  func.return %d : tensor<4xbf16>
}
func.func private @add(%a: tensor<4xbf16>, %b: tensor<4xbf16>) -> tensor<4xbf16> {
  %r = nn.add %a, %b : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  func.return %r : tensor<4xbf16>
}
func.func @other(%x: tensor<4xbf16>) -> (tensor<4xbf16>, tensor<4xbf16>) {
  %n = nn.neg %x : (tensor<4xbf16>) -> tensor<4xbf16>
  func.return %n, %x : tensor<4xbf16>, tensor<4xbf16>
}
"""


def test_bf16_rounds_after_every_op_through_a_call() -> None:
    # 1 + 2^-9 is not a bf16 value: rounded after the add it is 1, so the difference is 0; a
    # program rounded only at the end would return 2^-9.
    x = np.ones(4, ml_dtypes.bfloat16)
    e = np.full(4, 2.0**-9, ml_dtypes.bfloat16)
    (out,) = mk.reference(CHAIN, x, e)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(f64(out), np.zeros(4))


def test_named_entry_and_outputs_do_not_alias_inputs() -> None:
    x = np.array([1, -2, 3, 0.5], ml_dtypes.bfloat16)
    neg, same = mk.reference(CHAIN, x, entry="other")
    np.testing.assert_array_equal(f64(neg), -f64(x))
    np.testing.assert_array_equal(f64(same), f64(x))
    same[0] = 7
    assert x[0] == 1


def test_sources_path_and_module(tmp_path: Path) -> None:
    path = tmp_path / "chain.mlir"
    path.write_text(CHAIN)
    x, e = np.ones(4, ml_dtypes.bfloat16), np.ones(4, ml_dtypes.bfloat16)
    for source in (path, str(path), load_module(CHAIN)):
        (out,) = mk.reference(source, x, e)
        np.testing.assert_array_equal(f64(out), np.ones(4))


def test_unsupported_op_is_a_located_error() -> None:
    text = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = arith.addf %x, %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
}"""
    with pytest.raises(MkError, match=r"<source>:2:\d+: error: 'arith.addf' is not supported"):
        mk.reference(text, np.zeros(4, np.float32))


def test_call_to_a_declaration_is_a_located_error() -> None:
    text = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = func.call @ext(%x) : (tensor<4xf32>) -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}
func.func private @ext(tensor<4xf32>) -> tensor<4xf32>"""
    with pytest.raises(
        MkError, match=r"<source>:2:\d+: error: 'func.call' calls @ext, which has no body"
    ):
        mk.reference(text, np.zeros(4, np.float32))


def test_unknown_entry_is_an_error() -> None:
    with pytest.raises(MkError, match="no function named 'nope'"):
        mk.reference(CHAIN, entry="nope")


# --- input checks -----------------------------------------------------------------------------

SIGNATURE = """func.func @f(%x: tensor<2x8xbf16>, %w: tensor<8x3xbf16>, %ids: tensor<2xi32>) -> tensor<2x3xbf16> {
  %y = nn.matmul %x, %w : (tensor<2x8xbf16>, tensor<8x3xbf16>) -> tensor<2x3xbf16>
  func.return %y : tensor<2x3xbf16>
}"""


def _good() -> list[np.ndarray]:
    return [
        np.ones((2, 8), ml_dtypes.bfloat16),
        np.ones((8, 3), ml_dtypes.bfloat16),
        np.zeros(2, np.int32),
    ]


def test_good_inputs_run() -> None:
    (out,) = mk.reference(SIGNATURE, *_good())
    np.testing.assert_array_equal(f64(out), np.full((2, 3), 8.0))


@pytest.mark.parametrize("count", [0, 2, 4])
def test_wrong_input_count(count: int) -> None:
    inputs = (_good() + _good())[:count]
    with pytest.raises(ValueError, match=rf"@f expects 3 inputs \(%x, %w, %ids\), got {count}"):
        mk.reference(SIGNATURE, *inputs)


@pytest.mark.parametrize(
    ("index", "value", "message"),
    [
        (
            1,
            np.ones((8, 4), ml_dtypes.bfloat16),
            r"argument 1 \('%w'\): expected shape \(8, 3\), got \(8, 4\)",
        ),
        (
            0,
            np.ones((2, 8, 1), ml_dtypes.bfloat16),
            r"argument 0 \('%x'\): expected shape \(2, 8\), got \(2, 8, 1\)",
        ),
        (
            1,
            np.ones((8, 3), np.float32),
            r"argument 1 \('%w'\): expected dtype bfloat16 .*, got float32",
        ),
        (
            0,
            np.ones((2, 8), np.float16),
            r"argument 0 \('%x'\): expected dtype bfloat16 .*, got float16",
        ),
        (2, np.zeros(2, np.int64), r"argument 2 \('%ids'\): expected dtype int32 .*, got int64"),
        (2, [0, 1], r"argument 2 \('%ids'\): expected a numpy array .*, got list"),
        (0, 1.0, r"argument 0 \('%x'\): expected a numpy array .*, got float"),
    ],
)
def test_bad_input_names_the_argument(index: int, value: object, message: str) -> None:
    inputs: list[object] = list(_good())
    inputs[index] = value
    with pytest.raises(ValueError, match=message):
        mk.reference(SIGNATURE, *inputs)


def test_f64_input_for_f32_argument_is_rejected() -> None:
    text = one_op("nn.exp", [((3,), "f32")], ((3,), "f32"))
    with pytest.raises(
        ValueError, match=r"argument 0 \('%a0'\): expected dtype float32 .*, got float64"
    ):
        mk.reference(text, np.zeros(3))


def test_unnamed_argument_is_numbered() -> None:
    text = """func.func @f(%0: tensor<3xf32>) -> tensor<3xf32> {
  %1 = nn.exp %0 : (tensor<3xf32>) -> tensor<3xf32>
  func.return %1 : tensor<3xf32>
}"""
    with pytest.raises(ValueError, match=r"^argument 0: expected shape \(3,\), got \(4,\)"):
        mk.reference(text, np.zeros(4, np.float32))


# --- random inputs and mk-run -----------------------------------------------------------------

DECODE = """func.func @decode(%ids: tensor<64xi32>, %emb: tensor<5x32xbf16>, %g: tensor<32xbf16>,
    %w: tensor<48x32xbf16>, %k: tensor<2x2x6x8xbf16>, %v: tensor<2x2x6x8xbf16>,
    %q: tensor<2x4x1x8xbf16>, %len: tensor<2xi32>) -> (tensor<64x48xbf16>, tensor<2x4x1x8xbf16>) {
  %x = nn.embedding %emb, %ids : (tensor<5x32xbf16>, tensor<64xi32>) -> tensor<64x32xbf16>
  %n = nn.rms_norm %x, %g : (tensor<64x32xbf16>, tensor<32xbf16>) -> tensor<64x32xbf16>
  %y = nn.linear %n, %w : (tensor<64x32xbf16>, tensor<48x32xbf16>) -> tensor<64x48xbf16>
  %o = nn.attention %q, %k, %v, %len {scale = 0.35 : f32} : (tensor<2x4x1x8xbf16>, tensor<2x2x6x8xbf16>, tensor<2x2x6x8xbf16>, tensor<2xi32>) -> tensor<2x4x1x8xbf16>
  func.return %y, %o : tensor<64x48xbf16>, tensor<2x4x1x8xbf16>
}
"""


def test_random_inputs_respect_roles_and_seed() -> None:
    func = entry_function(load_module(DECODE))
    inputs = random_inputs(func, seed=5)
    ids, emb, g, w, _k, _v, _q, kv_len = inputs
    assert [a.dtype for a in inputs] == [np.int32] + [ml_dtypes.bfloat16] * 6 + [np.int32]
    assert ids.min() >= 0 and ids.max() < 5 and len(set(ids.tolist())) > 1
    assert kv_len.min() >= 1 and kv_len.max() <= 6
    assert np.count_nonzero(f64(g)) > 0 and np.count_nonzero(f64(emb)) > 0
    assert f64(w).std() < 0.5  # scaled by 1/sqrt(32)
    again = random_inputs(func, seed=5)
    assert all(np.array_equal(f64(a), f64(b)) for a, b in zip(inputs, again, strict=True))
    assert not np.array_equal(f64(random_inputs(func, seed=6)[1]), f64(emb))
    mk.reference(DECODE, *inputs)  # ids in range: no error


def test_mk_run_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "decode.mlir"
    path.write_text(DECODE)
    assert mk_run([str(path), "--reference", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert "output 0: shape (64, 48) dtype bfloat16 mean " in first
    assert "output 1: shape (2, 4, 1, 8) dtype bfloat16 mean " in first
    assert re.search(r"first \[-?\d", first)
    assert re.search(r"reference time: \d+\.\d ms", first)
    assert mk_run([str(path), "--reference", "--seed", "3", "--entry", "decode"]) == 0
    second = capsys.readouterr().out
    assert first.split("reference time")[0] == second.split("reference time")[0]


def test_mk_run_cuda_without_a_gpu_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpu_present: bool
) -> None:
    path = tmp_path / "decode.mlir"
    path.write_text(DECODE)
    if gpu_present:
        pytest.skip("a GPU is present: the cuda target runs")
    assert mk_run([str(path), "--target", "cuda"]) == 2
    assert "'cuda' target needs an NVIDIA GPU" in capsys.readouterr().err


def test_mk_run_user_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.mlir"
    bad.write_text(
        "func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = nn.exp %x : (tensor<2xf32>) ->\n}\n"
    )
    assert mk_run([str(bad), "--reference"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"bad\.mlir:3:1: error: ", err) and "Traceback" not in err
    assert mk_run([str(tmp_path / "missing.mlir"), "--reference"]) == 1
    assert "missing.mlir" in capsys.readouterr().err
    private = tmp_path / "private.mlir"
    private.write_text(CHAIN.replace("func.func @", "func.func private @"))
    assert mk_run([str(private), "--reference"]) == 1
    assert "no public function" in capsys.readouterr().err
