"""The mugraph interpreter's accumulators, tile ops, library kernels, calls and run contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_mugraph_interp import (
    BF16,
    BLOCKED_MATMUL,
    RMS_NORM_LINEAR,
    blocked_matmul_inputs,
    f64,
    mutate,
    randn,
    rel_err,
    rms_norm_linear_inputs,
    rms_norm_linear_ref,
)

from mk.diagnostics import MkError
from mk.interp.mugraph import run_mugraph
from mk.interp.nn import run_reference

# ------------------------------------------------------------------------------------------------
# Accumulators
# ------------------------------------------------------------------------------------------------

# Two blocks of 2 rows; the loop walks the 32 columns 8 at a time. Every accumulator kind.
ACCUMULATORS = """
func.func @accums(%x: tensor<4x32xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x5xf32>) {
  %s, %m, %last = mugraph.graph_def grid [2, 1, 1] threads 32 forloop 4 (%x) : (tensor<4x32xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x5xf32>) {
  ^bb0(%xa: tensor<4x32xf32>, %sa: tensor<4x8xf32>, %ma: tensor<4x8xf32>, %la: tensor<4x5xf32>):
    %xt = mugraph.input %xa imap [0, -1, -1] fmap 1 : tensor<4x32xf32> -> tensor<2x8xf32>
    %a0 = mugraph.accum "sum" %xt : tensor<2x8xf32> -> tensor<2x8xf32>
    %a1 = mugraph.accum "max" %xt : tensor<2x8xf32> -> tensor<2x8xf32>
    %a2 = mugraph.accum "sum_last" %xt : tensor<2x8xf32> -> tensor<2x1xf32>
    %a3 = mugraph.accum "max_last" %xt : tensor<2x8xf32> -> tensor<2x1xf32>
    %a4 = mugraph.accum "mean_last" %xt : tensor<2x8xf32> -> tensor<2x1xf32>
    %a5 = mugraph.accum "sum_sq_last" %xt : tensor<2x8xf32> -> tensor<2x1xf32>
    %a6 = mugraph.accum "mean_sq_last" %xt : tensor<2x8xf32> -> tensor<2x1xf32>
    %cat = mugraph.concat %a2, %a3, %a4, %a5, %a6 dim 1 : (tensor<2x1xf32>, tensor<2x1xf32>, tensor<2x1xf32>, tensor<2x1xf32>, tensor<2x1xf32>) -> tensor<2x5xf32>
    mugraph.output %a0 to %sa omap [0, -1, -1] : tensor<2x8xf32> -> tensor<4x8xf32>
    mugraph.output %a1 to %ma omap [0, -1, -1] : tensor<2x8xf32> -> tensor<4x8xf32>
    mugraph.output %cat to %la omap [0, -1, -1] : tensor<2x5xf32> -> tensor<4x5xf32>
  }
  func.return %s, %m, %last : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x5xf32>
}
"""
LAST_KINDS = ["sum_last", "max_last", "mean_last", "sum_sq_last", "mean_sq_last"]


def accumulators_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    chunks = f64(x).reshape(4, 4, 8)  # [row, iteration, column]
    last = [
        x.sum(-1),
        x.max(-1),
        x.mean(-1),
        (f64(x) ** 2).sum(-1),
        (f64(x) ** 2).mean(-1),
    ]
    return chunks.sum(1), chunks.max(1), np.stack([f64(v) for v in last], axis=1)


def test_every_accumulator_kind() -> None:
    x = randn(np.random.default_rng(3), (4, 32), np.float32)
    outs = run_mugraph(ACCUMULATORS, x)
    for out, ref in zip(outs, accumulators_ref(x), strict=True):
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "old,new",
    [('"sum" %xt', '"max" %xt'), ('"max" %xt', '"sum" %xt')]
    + [(f'"{a}"', f'"{b}"') for a in LAST_KINDS for b in LAST_KINDS if a != b],
)
def test_accumulator_kind_mutants_are_caught(old: str, new: str) -> None:
    x = randn(np.random.default_rng(3), (4, 32), np.float32)
    outs = run_mugraph(mutate(ACCUMULATORS, old, new), x)
    assert any(
        not np.allclose(o, r, rtol=1e-3) for o, r in zip(outs, accumulators_ref(x), strict=True)
    )


ONLINE_SOFTMAX = """
func.func @online_softmax(%s: tensor<4x16xf32>, %v: tensor<16x8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x1xf32>) {
  %y, %m, %l = mugraph.graph_def grid [1, 1, 1] threads 32 forloop 4 (%s, %v) : (tensor<4x16xf32>, tensor<16x8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x1xf32>) {
  ^bb0(%sa: tensor<4x16xf32>, %va: tensor<16x8xf32>, %ya: tensor<4x8xf32>, %ma: tensor<4x1xf32>, %la: tensor<4x1xf32>):
    %st = mugraph.input %sa imap [-1, -1, -1] fmap 1 : tensor<4x16xf32> -> tensor<4x4xf32>
    %vt = mugraph.input %va imap [-1, -1, -1] fmap 0 : tensor<16x8xf32> -> tensor<4x8xf32>
    %ot, %mt, %lt = mugraph.accum_softmax %st, %vt : (tensor<4x4xf32>, tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    %yt = mugraph.binary "div" %ot, %lt : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
    mugraph.output %yt to %ya omap [-1, -1, -1] : tensor<4x8xf32> -> tensor<4x8xf32>
    mugraph.output %mt to %ma omap [-1, -1, -1] : tensor<4x1xf32> -> tensor<4x1xf32>
    mugraph.output %lt to %la omap [-1, -1, -1] : tensor<4x1xf32> -> tensor<4x1xf32>
  }
  func.return %y, %m, %l : tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x1xf32>
}
"""


def test_online_softmax_rescales_and_survives_masked_chunks() -> None:
    rng = np.random.default_rng(5)
    s = randn(rng, (4, 16), np.float32, scale=6)
    s[0, :8] = -np.inf  # the first two iterations see only masked keys in row 0
    s[1] = np.linspace(-20, 20, 16)  # the max grows every iteration: o and l must be rescaled
    v = randn(rng, (16, 8), np.float32)
    y, m, total = run_mugraph(ONLINE_SOFTMAX, s, v)
    s64 = f64(s)
    peak = s64.max(-1, keepdims=True)
    p = np.exp(s64 - peak)
    np.testing.assert_allclose(m, peak, rtol=1e-6)
    np.testing.assert_allclose(total, p.sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(y, p / p.sum(-1, keepdims=True) @ f64(v), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# thread_map and the other tile ops
# ------------------------------------------------------------------------------------------------

# Operands of shapes 4x1, 1x8 and 8 broadcast to 4x8; two results (bf16 and f32), one of them a
# constant; a second thread_map on an integer position tile.
THREAD_MAP = """
func.func @tm(%a: tensor<4x1xf32>, %b: tensor<1x8xbf16>, %c: tensor<8xf32>) -> (tensor<4x8xbf16>, tensor<4x8xf32>, tensor<8xf32>) {
  %r0, %r1, %r2 = mugraph.graph_def grid [1, 1, 1] threads 32 forloop 1 (%a, %b, %c) : (tensor<4x1xf32>, tensor<1x8xbf16>, tensor<8xf32>) -> (tensor<4x8xbf16>, tensor<4x8xf32>, tensor<8xf32>) {
  ^bb0(%aa: tensor<4x1xf32>, %ba: tensor<1x8xbf16>, %ca: tensor<8xf32>, %r0a: tensor<4x8xbf16>, %r1a: tensor<4x8xf32>, %r2a: tensor<8xf32>):
    %at = mugraph.input %aa imap [-1, -1, -1] fmap -1 : tensor<4x1xf32> -> tensor<4x1xf32>
    %bt = mugraph.input %ba imap [-1, -1, -1] fmap -1 : tensor<1x8xbf16> -> tensor<1x8xbf16>
    %ct = mugraph.input %ca imap [-1, -1, -1] fmap -1 : tensor<8xf32> -> tensor<8xf32>
    %y, %k = mugraph.thread_map %at, %bt, %ct : (tensor<4x1xf32>, tensor<1x8xbf16>, tensor<8xf32>) -> (tensor<4x8xbf16>, tensor<4x8xf32>) {
    ^bb0(%x: f32, %w: f32, %z: f32):
      %p = arith.mulf %x, %w : f32
      %t = math.tanh %z : f32
      %gt = arith.cmpf ogt, %x, %w : f32
      %s = arith.select %gt, %p, %t : f32
      %e = math.erf %s : f32
      %h = arith.constant 2.500000e+00 : f32
      mugraph.yield %e, %h : f32, f32
    }
    %pos = mugraph.position %ct dim 0 : tensor<8xf32> -> tensor<8xi32>
    %q = mugraph.thread_map %pos, %ct : (tensor<8xi32>, tensor<8xf32>) -> tensor<8xf32> {
    ^bb0(%i: i32, %z: f32):
      %three = arith.constant 3 : i32
      %i3 = arith.muli %i, %three : i32
      %f = arith.sitofp %i3 : i32 to f32
      %m = arith.maximumf %f, %z : f32
      mugraph.yield %m : f32
    }
    mugraph.output %y to %r0a omap [-1, -1, -1] : tensor<4x8xbf16> -> tensor<4x8xbf16>
    mugraph.output %k to %r1a omap [-1, -1, -1] : tensor<4x8xf32> -> tensor<4x8xf32>
    mugraph.output %q to %r2a omap [-1, -1, -1] : tensor<8xf32> -> tensor<8xf32>
  }
  func.return %r0, %r1, %r2 : tensor<4x8xbf16>, tensor<4x8xf32>, tensor<8xf32>
}
"""


def test_thread_map_broadcasts_and_rounds() -> None:
    rng = np.random.default_rng(7)
    a, b = randn(rng, (4, 1), np.float32), randn(rng, (1, 8))
    c = randn(rng, (8,), np.float32, scale=10)
    y, k, q = run_mugraph(THREAD_MAP, a, b, c)
    x, w = f64(a), f64(b)
    s = np.where(x > w, x * w, np.tanh(f64(c)))
    expected = np.vectorize(math.erf)(s)
    assert y.dtype == BF16 and y.shape == (4, 8)
    np.testing.assert_allclose(f64(y), expected, rtol=8e-3, atol=1e-6)  # bf16 rounding
    np.testing.assert_array_equal(k, np.full((4, 8), 2.5, np.float32))
    np.testing.assert_array_equal(q, np.maximum(3 * np.arange(8, dtype=np.float32), c))


# Row-wise rms_norm, reduce "mean", unary kinds and a concat, one row per block.
TILE_OPS = """
func.func @tile_ops(%x: tensor<4x64xbf16>, %g: tensor<64xbf16>) -> (tensor<4x64xbf16>, tensor<4x4xf32>) {
  %n, %st = mugraph.graph_def grid [4, 1, 1] threads 64 forloop 1 (%x, %g) : (tensor<4x64xbf16>, tensor<64xbf16>) -> (tensor<4x64xbf16>, tensor<4x4xf32>) {
  ^bb0(%xa: tensor<4x64xbf16>, %ga: tensor<64xbf16>, %na: tensor<4x64xbf16>, %sa: tensor<4x4xf32>):
    %xt = mugraph.input %xa imap [0, -1, -1] fmap -1 : tensor<4x64xbf16> -> tensor<1x64xbf16>
    %gt = mugraph.input %ga imap [-1, -1, -1] fmap -1 : tensor<64xbf16> -> tensor<64xbf16>
    %nt = mugraph.rms_norm %xt, %gt {epsilon = 1.000000e-05 : f32} : (tensor<1x64xbf16>, tensor<64xbf16>) -> tensor<1x64xbf16>
    %mean = mugraph.reduce "mean" %xt dim 1 keepdim : tensor<1x64xbf16> -> tensor<1x1xf32>
    %mx = mugraph.reduce "max" %xt dim 1 keepdim : tensor<1x64xbf16> -> tensor<1x1xf32>
    %sg = mugraph.unary "silu" %mx : tensor<1x1xf32> -> tensor<1x1xf32>
    %gl = mugraph.unary "gelu" %mean : tensor<1x1xf32> -> tensor<1x1xf32>
    %cat = mugraph.concat %mean, %mx, %sg, %gl dim 1 : (tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>, tensor<1x1xf32>) -> tensor<1x4xf32>
    mugraph.output %nt to %na omap [0, -1, -1] : tensor<1x64xbf16> -> tensor<4x64xbf16>
    mugraph.output %cat to %sa omap [0, -1, -1] : tensor<1x4xf32> -> tensor<4x4xf32>
  }
  func.return %n, %st : tensor<4x64xbf16>, tensor<4x4xf32>
}
"""


def test_row_tile_ops() -> None:
    rng = np.random.default_rng(11)
    x, g = randn(rng, (4, 64)), randn(rng, (64,))
    n, st = run_mugraph(TILE_OPS, x, g)
    x64 = f64(x)
    norm = x64 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + 1e-5) * f64(g)
    assert rel_err(n, norm) <= 1e-2
    mean, mx = x64.mean(-1), x64.max(-1)
    gelu = 0.5 * mean * (1 + np.vectorize(math.erf)(mean / math.sqrt(2)))
    ref = np.stack([mean, mx, mx / (1 + np.exp(-mx)), gelu], axis=1)
    np.testing.assert_allclose(st, ref, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Library kernels, leftover nn ops, calls, and the run_reference-like contract
# ------------------------------------------------------------------------------------------------

LIBRARY = """
func.func @lib(%table: tensor<64x16xbf16>, %ids: tensor<4xi32>, %g: tensor<16xbf16>, %q: tensor<1x4x1x16xbf16>, %k: tensor<1x2x32x16xbf16>, %v: tensor<1x2x32x16xbf16>, %len: tensor<1xi32>) -> (tensor<16xbf16>, tensor<16x4xbf16>, tensor<1x4x1x16xbf16>, tensor<4xi32>) {
  %e = {P}embedding{Q} (%table, %ids) : (tensor<64x16xbf16>, tensor<4xi32>) -> tensor<4x16xbf16>
  %n = {P}rms_norm{Q} (%e, %g) : (tensor<4x16xbf16>, tensor<16xbf16>) -> tensor<4x16xbf16>
  %s = {P}softmax{Q} (%n) : (tensor<4x16xbf16>) -> tensor<4x16xbf16>
  %r = {P}reduce_sum{Q} (%s) {dim = 0 : i64} : (tensor<4x16xbf16>) -> tensor<16xbf16>
  %t = {P}transpose{Q} (%n) {perm = array<i64: 1, 0>} : (tensor<4x16xbf16>) -> tensor<16x4xbf16>
  %a = {P}attention{Q} (%q, %k, %v, %len) {scale = 2.500000e-01 : f32} : (tensor<1x4x1x16xbf16>, tensor<1x2x32x16xbf16>, tensor<1x2x32x16xbf16>, tensor<1xi32>) -> tensor<1x4x1x16xbf16>
  %am = {P}argmax{Q} (%n) : (tensor<4x16xbf16>) -> tensor<4xi32>
  func.return %r, %t, %a, %am : tensor<16xbf16>, tensor<16x4xbf16>, tensor<1x4x1x16xbf16>, tensor<4xi32>
}
"""


def library_program(kernels: bool) -> str:
    """The kernel graph, or the nn program it stands for (nn ops take no parentheses)."""
    if kernels:
        return LIBRARY.replace("{P}", 'mugraph.kernel "').replace("{Q}", '"')
    lines = LIBRARY.replace("{P}", "nn.").replace("{Q}", "").splitlines()
    ops = [
        ln.replace(" (%", " %", 1).replace(") ", " ", 1) if "= nn." in ln else ln for ln in lines
    ]
    return "\n".join(ops)


def test_library_kernels_mean_the_nn_ops_with_their_defaults() -> None:
    rng = np.random.default_rng(13)
    inputs = [
        randn(rng, (64, 16)),
        rng.integers(0, 64, size=4).astype(np.int32),
        randn(rng, (16,)),
        randn(rng, (1, 4, 1, 16)),
        randn(rng, (1, 2, 32, 16)),
        randn(rng, (1, 2, 32, 16)),
        np.array([20], np.int32),
    ]
    got = run_mugraph(library_program(kernels=True), *inputs)
    want = run_reference(library_program(kernels=False), *inputs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_library_kernel_data_error_is_located() -> None:
    table, ids = np.zeros((64, 16), BF16), np.array([0, 1, 64, 2], np.int32)
    text = 'func.func @f(%t: tensor<64x16xbf16>, %i: tensor<4xi32>) -> tensor<4x16xbf16> {\n  %e = mugraph.kernel "embedding" (%t, %i) : (tensor<64x16xbf16>, tensor<4xi32>) -> tensor<4x16xbf16>\n  func.return %e : tensor<4x16xbf16>\n}\n'
    with pytest.raises(
        ValueError, match=r"<source>:2:\d+: error: 'mugraph.kernel' \"embedding\" id 64"
    ):
        run_mugraph(text, table, ids)


MIXED = """
func.func @mixed(%x: tensor<8x256xbf16>, %g: tensor<256xbf16>, %w: tensor<512x256xbf16>) -> tensor<8x512xbf16> {
  %h = nn.rms_norm %x, %g {epsilon = 1.0e-06 : f32} : (tensor<8x256xbf16>, tensor<256xbf16>) -> tensor<8x256xbf16>
  %y = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 4 (%h, %w) : (tensor<8x256xbf16>, tensor<512x256xbf16>) -> tensor<8x512xbf16> {
  ^bb0(%ha: tensor<8x256xbf16>, %wa: tensor<512x256xbf16>, %ya: tensor<8x512xbf16>):
    %ht = mugraph.input %ha imap [-1, -1, -1] fmap 1 : tensor<8x256xbf16> -> tensor<8x64xbf16>
    %wt = mugraph.input %wa imap [0, -1, -1] fmap 1 : tensor<512x256xbf16> -> tensor<128x64xbf16>
    %p = mugraph.matmul %ht, %wt transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>
    %acc = mugraph.accum "sum" %p : tensor<8x128xf32> -> tensor<8x128xf32>
    mugraph.output %acc to %ya omap [1, -1, -1] : tensor<8x128xf32> -> tensor<8x512xbf16>
  }
  %z = func.call @act(%y) : (tensor<8x512xbf16>) -> tensor<8x512xbf16>
  func.return %z : tensor<8x512xbf16>
}
func.func private @act(%a: tensor<8x512xbf16>) -> tensor<8x512xbf16> {
  %s = mugraph.kernel "silu" (%a) : (tensor<8x512xbf16>) -> tensor<8x512xbf16>
  func.return %s : tensor<8x512xbf16>
}
"""


def test_partially_lowered_program_with_calls() -> None:
    x, g, w = rms_norm_linear_inputs()
    (z,) = run_mugraph(MIXED, x, g, w)
    y = rms_norm_linear_ref(x, g, w)
    assert rel_err(z, y / (1 + np.exp(-y))) <= 2e-2


def test_input_checks_match_run_reference() -> None:
    x, g, w = rms_norm_linear_inputs()
    with pytest.raises(ValueError, match=r"expects 3 inputs"):
        run_mugraph(RMS_NORM_LINEAR, x, g)
    with pytest.raises(ValueError, match=r"argument 0 \('%x'\): expected dtype bfloat16"):
        run_mugraph(RMS_NORM_LINEAR, x.astype(np.float32), g, w)
    with pytest.raises(ValueError, match=r"argument 2 \('%w'\): expected shape \(512, 256\)"):
        run_mugraph(RMS_NORM_LINEAR, x, g, w.T)


def test_outputs_do_not_alias_inputs() -> None:
    text = (
        "func.func @id(%a: tensor<4xf32>) -> tensor<4xf32> {\n  func.return %a : tensor<4xf32>\n}\n"
    )
    a = np.arange(4, dtype=np.float32)
    (out,) = run_mugraph(text, a)
    out[0] = 42
    assert a[0] == 0


def test_entry_by_name() -> None:
    text = MIXED.replace("func.func private @act", "func.func @act")
    (out,) = run_mugraph(text, np.ones((8, 512), BF16), entry="act")
    np.testing.assert_allclose(f64(out), 1 / (1 + math.exp(-1)), rtol=1e-2)


def test_unsupported_scalar_op_is_reported_before_running() -> None:
    text = mutate(
        THREAD_MAP,
        "%t = math.tanh %z : f32",
        "%t = math.tanh %z : f32\n      %bits = arith.bitcast %z : f32 to i32",
    )
    with pytest.raises(
        MkError,
        match=r"<source>:\d+:\d+: error: 'arith.bitcast' is not supported by the mugraph interpreter",
    ):
        run_mugraph(
            text, np.zeros((4, 1), np.float32), np.zeros((1, 8), BF16), np.zeros(8, np.float32)
        )


def test_invalid_program_is_a_located_error() -> None:
    bad = mutate(BLOCKED_MATMUL, "omap [0, 1, -1]", "omap [0, -1, -1]")
    with pytest.raises(MkError, match=r"<source>:\d+:\d+: error: 'mugraph.output'"):
        run_mugraph(bad, *blocked_matmul_inputs())
