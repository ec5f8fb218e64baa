"""mk.reference op by op against float64 NumPy written independently here."""

from __future__ import annotations

import math
from collections.abc import Sequence

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import mk

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


@pytest.mark.parametrize("causal", [False, True])
def test_attention_skips_nan_rows_past_kv_len(causal: bool) -> None:
    """Cache rows past kv_len were never written (torch.empty): NaN there must not reach the
    output through a zero weight (0·NaN)."""
    rng = np.random.default_rng(12)
    b, hq, hkv, sq, s, d = 2, 4, 2, 2, 7, 8
    q, k, v = (randn(rng, shape, "f32") for shape in [(b, hq, sq, d), *[(b, hkv, s, d)] * 2])
    kv_len = np.array([5, 3], dtype=np.int32)
    for row, length in enumerate(kv_len):
        k[row, :, length:], v[row, :, length:] = np.nan, np.nan
    attrs = f"{{scale = 3.535534e-01 : f32, causal = {str(causal).lower()}}}"
    out = run_one("nn.attention", [q, k, v, kv_len], ["f32"] * 3 + ["i32"], (q.shape, "f32"), attrs)
    assert np.isfinite(out).all()
    assert_close(out, attention64(q, k, v, 3.535534e-01, causal, kv_len), "f32")


def test_weighted_values_keep_ieee_sums_of_the_weighed_values_only() -> None:
    """A non-finite value reaches exactly the outputs that weigh it (inf, -inf, NaN for both or
    a NaN), as a float64 loop over the weighed keys gives; unweighed ones add nothing."""
    from mk.interp.nn_ops import weighted_values

    rng = np.random.default_rng(5)
    p = rng.random((2, 3, 6)).astype(np.float32)
    p[p < 0.4] = 0.0
    v = rng.standard_normal((2, 6, 4)).astype(np.float32)
    v[0, 1, 0], v[0, 2, 0], v[1, 3, 2], v[1, 4, 1], v[1, 5, 1] = np.inf, -np.inf, np.nan, np.inf, 1
    want = np.zeros((2, 3, 4))
    for b, q, d in np.ndindex(*want.shape):
        keys = [k for k in range(6) if p[b, q, k] != 0]
        with np.errstate(invalid="ignore"):
            want[b, q, d] = sum((float(p[b, q, k]) * float(v[b, k, d]) for k in keys), 0.0)
    got = weighted_values(p, v).astype(np.float64)
    same = np.isnan(got) == np.isnan(want)
    assert same.all()
    finite = np.isfinite(want)
    assert (np.isinf(got) == np.isinf(want)).all() and (
        got[np.isinf(want)] == want[np.isinf(want)]
    ).all()
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)
    assert np.isinf(want).any() and np.isnan(want).any()  # the case covers both
