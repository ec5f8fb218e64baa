"""The mugraph interpreter against float64 NumPy, plus mutation tests: a wrong map or accumulator
in a graph that still verifies must give wrong numbers (or an unwritten/overwritten element)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np
import pytest

import mk.dialects.mugraph_maps as maps
from mk.interp.mugraph import MugraphRunError, run_mugraph

BF16 = ml_dtypes.bfloat16
Arrays = Sequence[np.ndarray]


def f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(f64(out) - ref) / np.linalg.norm(ref))


def randn(rng: np.random.Generator, shape: Sequence[int], dtype: type = BF16, scale: float = 1.0):
    return (rng.standard_normal(tuple(shape)) * scale).astype(dtype)


def mutate(text: str, old: str, new: str) -> str:
    """`text` with the one occurrence of `old` replaced (a mutation must hit exactly one spot)."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


# ------------------------------------------------------------------------------------------------
# Worked examples of test/lit/dialects/mugraph/ops.mlir, shrunk
# ------------------------------------------------------------------------------------------------

RMS_NORM_LINEAR = """
func.func @rms_norm_linear(%x: tensor<8x256xbf16>, %g: tensor<256xbf16>, %w: tensor<512x256xbf16>) -> tensor<8x512xbf16> {
  %y = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 4 (%x, %g, %w) : (tensor<8x256xbf16>, tensor<256xbf16>, tensor<512x256xbf16>) -> tensor<8x512xbf16> {
  ^bb0(%xa: tensor<8x256xbf16>, %ga: tensor<256xbf16>, %wa: tensor<512x256xbf16>, %ya: tensor<8x512xbf16>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x256xbf16> -> tensor<8x64xbf16>
    %gt = mugraph.input %ga imap [-1, -1, -1] fmap 0 : tensor<256xbf16> -> tensor<64xbf16>
    %wt = mugraph.input %wa imap [0, -1, -1] fmap 1 : tensor<512x256xbf16> -> tensor<128x64xbf16>
    %xg = mugraph.binary "mul" %xt, %gt : (tensor<8x64xbf16>, tensor<64xbf16>) -> tensor<8x64xbf16>
    %p = mugraph.matmul %xg, %wt transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>
    %acc = mugraph.accum "sum" %p : tensor<8x128xf32> -> tensor<8x128xf32>
    %ms = mugraph.accum "mean_sq_last" %xt : tensor<8x64xbf16> -> tensor<8x1xf32>
    %rs = mugraph.thread_map %ms : (tensor<8x1xf32>) -> tensor<8x1xf32> {
    ^bb0(%m: f32):
      %eps = arith.constant 1.000000e-06 : f32
      %sum = arith.addf %m, %eps : f32
      %r = math.rsqrt %sum : f32
      mugraph.yield %r : f32
    }
    %yt = mugraph.binary "mul" %acc, %rs : (tensor<8x128xf32>, tensor<8x1xf32>) -> tensor<8x128xbf16>
    mugraph.output %yt to %ya omap [1, -1, -1] : tensor<8x128xbf16> -> tensor<8x512xbf16>
  }
  func.return %y : tensor<8x512xbf16>
}
"""


def rms_norm_linear_inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [randn(rng, (8, 256)), randn(rng, (256,)), randn(rng, (512, 256), scale=1 / 16)]


def rms_norm_linear_ref(x: np.ndarray, g: np.ndarray, w: np.ndarray) -> np.ndarray:
    x, g, w = f64(x), f64(g), f64(w)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g @ w.T


GATED_MLP = """
func.func @gated_mlp(%x: tensor<4x128xbf16>, %w1: tensor<256x128xbf16>, %w3: tensor<256x128xbf16>, %w2: tensor<128x256xbf16>) -> tensor<4x128xbf16> {
  %h = mugraph.graph_def grid [4, 1, 1] threads 256 forloop 4 (%x, %w1, %w3) : (tensor<4x128xbf16>, tensor<256x128xbf16>, tensor<256x128xbf16>) -> tensor<4x256xbf16> {
  ^bb0(%xa: tensor<4x128xbf16>, %w1a: tensor<256x128xbf16>, %w3a: tensor<256x128xbf16>, %ha: tensor<4x256xbf16>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<4x128xbf16> -> tensor<4x32xbf16>
    %w1t = mugraph.input %w1a imap [0, -1, -1] fmap 1 : tensor<256x128xbf16> -> tensor<64x32xbf16>
    %w3t = mugraph.input %w3a imap [0, -1, -1] fmap 1 : tensor<256x128xbf16> -> tensor<64x32xbf16>
    %p1 = mugraph.matmul %xt, %w1t transpose_b : (tensor<4x32xbf16>, tensor<64x32xbf16>) -> tensor<4x64xf32>
    %p3 = mugraph.matmul %xt, %w3t transpose_b : (tensor<4x32xbf16>, tensor<64x32xbf16>) -> tensor<4x64xf32>
    %a1 = mugraph.accum "sum" %p1 : tensor<4x64xf32> -> tensor<4x64xf32>
    %a3 = mugraph.accum "sum" %p3 : tensor<4x64xf32> -> tensor<4x64xf32>
    %ht = mugraph.thread_map %a1, %a3 : (tensor<4x64xf32>, tensor<4x64xf32>) -> tensor<4x64xbf16> {
    ^bb0(%gate: f32, %up: f32):
      %one = arith.constant 1.000000e+00 : f32
      %neg = arith.negf %gate : f32
      %e = math.exp %neg : f32
      %den = arith.addf %one, %e : f32
      %silu = arith.divf %gate, %den : f32
      %prod = arith.mulf %silu, %up : f32
      mugraph.yield %prod : f32
    }
    mugraph.output %ht to %ha omap [1, -1, -1] : tensor<4x64xbf16> -> tensor<4x256xbf16>
  }
  %y = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 8 (%h, %w2, %x) : (tensor<4x256xbf16>, tensor<128x256xbf16>, tensor<4x128xbf16>) -> tensor<4x128xbf16> {
  ^bb0(%hb: tensor<4x256xbf16>, %w2b: tensor<128x256xbf16>, %rb: tensor<4x128xbf16>, %yb: tensor<4x128xbf16>):
    %ht = mugraph.input %hb imap [-1, -1, -1] fmap 1 : tensor<4x256xbf16> -> tensor<4x32xbf16>
    %w2t = mugraph.input %w2b imap [0, -1, -1] fmap 1 : tensor<128x256xbf16> -> tensor<64x32xbf16>
    %rt = mugraph.input %rb imap [1, -1, -1] fmap -1 : tensor<4x128xbf16> -> tensor<4x64xbf16>
    %p = mugraph.matmul %ht, %w2t transpose_b : (tensor<4x32xbf16>, tensor<64x32xbf16>) -> tensor<4x64xf32>
    %acc = mugraph.accum "sum" %p : tensor<4x64xf32> -> tensor<4x64xf32>
    %yt = mugraph.binary "add" %acc, %rt : (tensor<4x64xf32>, tensor<4x64xbf16>) -> tensor<4x64xbf16>
    mugraph.output %yt to %yb omap [1, -1, -1] : tensor<4x64xbf16> -> tensor<4x128xbf16>
  }
  func.return %y : tensor<4x128xbf16>
}
"""


def gated_mlp_inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    s = 1 / math.sqrt(128)
    return [
        randn(rng, (4, 128)),
        randn(rng, (256, 128), scale=s),
        randn(rng, (256, 128), scale=s),
        randn(rng, (128, 256), scale=1 / 16),
    ]


def gated_mlp_ref(x: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray) -> np.ndarray:
    x, w1, w3, w2 = f64(x), f64(w1), f64(w3), f64(w2)
    gate, up = x @ w1.T, x @ w3.T
    return (gate / (1 + np.exp(-gate)) * up) @ w2.T + x


ATTENTION = """
func.func @decode_attention(%q: tensor<1x8x1x32xbf16>, %k: tensor<1x2x256x32xbf16>, %v: tensor<1x2x256x32xbf16>) -> tensor<1x8x1x32xbf16> {
  %o, %m, %l = mugraph.graph_def grid [2, 4, 1] threads 128 forloop 4 (%q, %k, %v) : (tensor<1x8x1x32xbf16>, tensor<1x2x256x32xbf16>, tensor<1x2x256x32xbf16>) -> (tensor<4x1x8x1x32xf32>, tensor<4x1x8x1x1xf32>, tensor<4x1x8x1x1xf32>) {
  ^bb0(%qa: tensor<1x8x1x32xbf16>, %ka: tensor<1x2x256x32xbf16>, %va: tensor<1x2x256x32xbf16>, %oa: tensor<4x1x8x1x32xf32>, %ma: tensor<4x1x8x1x1xf32>, %la: tensor<4x1x8x1x1xf32>):
    %qt = mugraph.input %qa imap [1, -1, -1] fmap -1 : tensor<1x8x1x32xbf16> -> tensor<1x4x1x32xbf16>
    %kt = mugraph.input %ka imap [1, 2, -1] fmap 2 : tensor<1x2x256x32xbf16> -> tensor<1x1x16x32xbf16>
    %vt = mugraph.input %va imap [1, 2, -1] fmap 2 : tensor<1x2x256x32xbf16> -> tensor<1x1x16x32xbf16>
    %q2 = mugraph.reshape %qt : tensor<1x4x1x32xbf16> -> tensor<4x32xbf16>
    %k2 = mugraph.reshape %kt : tensor<1x1x16x32xbf16> -> tensor<16x32xbf16>
    %v2 = mugraph.reshape %vt : tensor<1x1x16x32xbf16> -> tensor<16x32xbf16>
    %s = mugraph.matmul %q2, %k2 transpose_b : (tensor<4x32xbf16>, tensor<16x32xbf16>) -> tensor<4x16xf32>
    %ss = mugraph.unary "scale" %s {factor = 0.176776692 : f32} : tensor<4x16xf32> -> tensor<4x16xf32>
    %ot, %mt, %lt = mugraph.accum_softmax %ss, %v2 : (tensor<4x16xf32>, tensor<16x32xbf16>) -> (tensor<4x32xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    %o5 = mugraph.reshape %ot : tensor<4x32xf32> -> tensor<1x1x4x1x32xf32>
    %m5 = mugraph.reshape %mt : tensor<4x1xf32> -> tensor<1x1x4x1x1xf32>
    %l5 = mugraph.reshape %lt : tensor<4x1xf32> -> tensor<1x1x4x1x1xf32>
    mugraph.output %o5 to %oa omap [2, 0, -1] : tensor<1x1x4x1x32xf32> -> tensor<4x1x8x1x32xf32>
    mugraph.output %m5 to %ma omap [2, 0, -1] : tensor<1x1x4x1x1xf32> -> tensor<4x1x8x1x1xf32>
    mugraph.output %l5 to %la omap [2, 0, -1] : tensor<1x1x4x1x1xf32> -> tensor<4x1x8x1x1xf32>
  }
  %out = mugraph.graph_def grid [2, 1, 1] threads 128 forloop 1 (%o, %m, %l) : (tensor<4x1x8x1x32xf32>, tensor<4x1x8x1x1xf32>, tensor<4x1x8x1x1xf32>) -> tensor<1x8x1x32xbf16> {
  ^bb0(%ob: tensor<4x1x8x1x32xf32>, %mb: tensor<4x1x8x1x1xf32>, %lb: tensor<4x1x8x1x1xf32>, %res: tensor<1x8x1x32xbf16>):
    %op = mugraph.input %ob imap [2, -1, -1] fmap -1 : tensor<4x1x8x1x32xf32> -> tensor<4x1x4x1x32xf32>
    %mp = mugraph.input %mb imap [2, -1, -1] fmap -1 : tensor<4x1x8x1x1xf32> -> tensor<4x1x4x1x1xf32>
    %lp = mugraph.input %lb imap [2, -1, -1] fmap -1 : tensor<4x1x8x1x1xf32> -> tensor<4x1x4x1x1xf32>
    %mx = mugraph.reduce "max" %mp dim 0 keepdim : tensor<4x1x4x1x1xf32> -> tensor<1x1x4x1x1xf32>
    %w = mugraph.thread_map %mp, %mx : (tensor<4x1x4x1x1xf32>, tensor<1x1x4x1x1xf32>) -> tensor<4x1x4x1x1xf32> {
    ^bb0(%mi: f32, %mmax: f32):
      %d = arith.subf %mi, %mmax : f32
      %e = math.exp %d : f32
      mugraph.yield %e : f32
    }
    %lw = mugraph.binary "mul" %lp, %w : (tensor<4x1x4x1x1xf32>, tensor<4x1x4x1x1xf32>) -> tensor<4x1x4x1x1xf32>
    %lsum = mugraph.reduce "sum" %lw dim 0 : tensor<4x1x4x1x1xf32> -> tensor<1x4x1x1xf32>
    %ow = mugraph.binary "mul" %op, %w : (tensor<4x1x4x1x32xf32>, tensor<4x1x4x1x1xf32>) -> tensor<4x1x4x1x32xf32>
    %osum = mugraph.reduce "sum" %ow dim 0 : tensor<4x1x4x1x32xf32> -> tensor<1x4x1x32xf32>
    %fin = mugraph.binary "div" %osum, %lsum : (tensor<1x4x1x32xf32>, tensor<1x4x1x1xf32>) -> tensor<1x4x1x32xbf16>
    mugraph.output %fin to %res omap [1, -1, -1] : tensor<1x4x1x32xbf16> -> tensor<1x8x1x32xbf16>
  }
  func.return %out : tensor<1x8x1x32xbf16>
}
"""


def attention_inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # Large scores make the softmax peaked, so a missing rescale by e^(m_old - m_new) shows.
    return [
        randn(rng, (1, 8, 1, 32), scale=3),
        randn(rng, (1, 2, 256, 32)),
        randn(rng, (1, 2, 256, 32)),
    ]


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    q, k, v = f64(q), np.repeat(f64(k), 4, axis=1), np.repeat(f64(v), 4, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(32)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True) @ v


ARGMAX = """
func.func @argmax(%logits: tensor<4x256xbf16>) -> tensor<4xi32> {
  %pv, %pi = mugraph.graph_def grid [8, 1, 1] threads 256 forloop 1 (%logits) : (tensor<4x256xbf16>) -> (tensor<4x8xf32>, tensor<4x8xi32>) {
  ^bb0(%la: tensor<4x256xbf16>, %pva: tensor<4x8xf32>, %pia: tensor<4x8xi32>):
    %lt = mugraph.input %la imap [1, -1, -1] fmap -1 : tensor<4x256xbf16> -> tensor<4x32xbf16>
    %pos = mugraph.position %lt dim 1 : tensor<4x32xbf16> -> tensor<4x32xi32>
    %mv, %mi = mugraph.argmax %lt, %pos dim 1 : (tensor<4x32xbf16>, tensor<4x32xi32>) -> (tensor<4x1xf32>, tensor<4x1xi32>)
    mugraph.output %mv to %pva omap [1, -1, -1] : tensor<4x1xf32> -> tensor<4x8xf32>
    mugraph.output %mi to %pia omap [1, -1, -1] : tensor<4x1xi32> -> tensor<4x8xi32>
  }
  %ids = mugraph.graph_def grid [4, 1, 1] threads 32 forloop 1 (%pv, %pi) : (tensor<4x8xf32>, tensor<4x8xi32>) -> tensor<4xi32> {
  ^bb0(%pvb: tensor<4x8xf32>, %pib: tensor<4x8xi32>, %idb: tensor<4xi32>):
    %vt = mugraph.input %pvb imap [0, -1, -1] fmap -1 : tensor<4x8xf32> -> tensor<1x8xf32>
    %it = mugraph.input %pib imap [0, -1, -1] fmap -1 : tensor<4x8xi32> -> tensor<1x8xi32>
    %bv, %bi = mugraph.argmax %vt, %it dim 1 : (tensor<1x8xf32>, tensor<1x8xi32>) -> (tensor<1x1xf32>, tensor<1x1xi32>)
    %id = mugraph.reshape %bi : tensor<1x1xi32> -> tensor<1xi32>
    mugraph.output %id to %idb omap [0, -1, -1] : tensor<1xi32> -> tensor<4xi32>
  }
  func.return %ids : tensor<4xi32>
}
"""


def argmax_inputs(seed: int = 0) -> list[np.ndarray]:
    # Few distinct values: many ties, and the first index of the maximum must win.
    rng = np.random.default_rng(seed)
    return [rng.integers(-20, 8, size=(4, 256)).astype(BF16)]


def argmax_ref(logits: np.ndarray) -> np.ndarray:
    return np.argmax(f64(logits), axis=-1).astype(np.int32)


def test_rms_norm_linear_matches_float64() -> None:
    inputs = rms_norm_linear_inputs()
    (y,) = run_mugraph(RMS_NORM_LINEAR, *inputs)
    assert y.dtype == BF16 and y.shape == (8, 512)
    assert rel_err(y, rms_norm_linear_ref(*inputs)) <= 1e-2


def test_gated_mlp_matches_float64() -> None:
    inputs = gated_mlp_inputs()
    (y,) = run_mugraph(GATED_MLP, *inputs)
    assert y.dtype == BF16 and y.shape == (4, 128)
    assert rel_err(y, gated_mlp_ref(*inputs)) <= 2e-2


def test_split_kv_attention_matches_float64() -> None:
    inputs = attention_inputs()
    (o,) = run_mugraph(ATTENTION, *inputs)
    assert o.dtype == BF16 and o.shape == (1, 8, 1, 32)
    assert rel_err(o, attention_ref(*inputs)) <= 1e-2


def test_argmax_partial_reduce_picks_first_maximum() -> None:
    inputs = argmax_inputs()
    (ids,) = run_mugraph(ARGMAX, *inputs)
    assert ids.dtype == np.int32
    np.testing.assert_array_equal(ids, argmax_ref(*inputs))


def test_full_size_rms_norm_linear_from_lit_examples() -> None:
    """The unshrunk lit example (48 blocks × 64 iterations) runs and is right."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "lit/dialects/mugraph/ops.mlir").read_text()
    chunk = next(c for c in text.split("// -----") if "@rms_norm_linear" in c)
    rng = np.random.default_rng(1)
    x, g, w = randn(rng, (8, 4096)), randn(rng, (4096,)), randn(rng, (6144, 4096), scale=1 / 64)
    (y,) = run_mugraph(chunk, x, g, w)
    assert rel_err(y, rms_norm_linear_ref(x, g, w)) <= 1e-2


# ------------------------------------------------------------------------------------------------
# Mutations: each still verifies, and each must be caught
# ------------------------------------------------------------------------------------------------


# A blocked matmul on a 2x2 grid with square tiles: swapping map entries keeps every type.
BLOCKED_MATMUL = """
func.func @mm(%a: tensor<8x16xf32>, %b: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %c = mugraph.graph_def grid [2, 2, 1] threads 32 forloop 4 (%a, %b) : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32> {
  ^bb0(%aa: tensor<8x16xf32>, %ba: tensor<16x8xf32>, %ca: tensor<8x8xf32>):
    %at = mugraph.input %aa imap [0, -1, -1] fmap 1 : tensor<8x16xf32> -> tensor<4x4xf32>
    %bt = mugraph.input %ba imap [-1, 1, -1] fmap 0 : tensor<16x8xf32> -> tensor<4x4xf32>
    %p = mugraph.matmul %at, %bt : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %acc = mugraph.accum "sum" %p : tensor<4x4xf32> -> tensor<4x4xf32>
    mugraph.output %acc to %ca omap [0, 1, -1] : tensor<4x4xf32> -> tensor<8x8xf32>
  }
  func.return %c : tensor<8x8xf32>
}
"""


def blocked_matmul_inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [randn(rng, (8, 16), np.float32), randn(rng, (16, 8), np.float32)]


def blocked_matmul_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return f64(a) @ f64(b)


# The for-loop walks columns of x; each iteration's 8x2 tile is flattened and summed.
WALK = """
func.func @walk(%x: tensor<8x8xf32>) -> tensor<16xf32> {
  %y = mugraph.graph_def grid [1, 1, 1] threads 32 forloop 4 (%x) : (tensor<8x8xf32>) -> tensor<16xf32> {
  ^bb0(%xa: tensor<8x8xf32>, %ya: tensor<16xf32>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x8xf32> -> tensor<8x2xf32>
    %r = mugraph.reshape %xt : tensor<8x2xf32> -> tensor<16xf32>
    %acc = mugraph.accum "sum" %r : tensor<16xf32> -> tensor<16xf32>
    mugraph.output %acc to %ya omap [-1, -1, -1] : tensor<16xf32> -> tensor<16xf32>
  }
  func.return %y : tensor<16xf32>
}
"""


def walk_inputs(seed: int = 0) -> list[np.ndarray]:
    return [randn(np.random.default_rng(seed), (8, 8), np.float32)]


def walk_ref(x: np.ndarray) -> np.ndarray:
    return np.sum([f64(x)[:, 2 * k : 2 * k + 2].reshape(16) for k in range(4)], axis=0)


Case = tuple[str, Callable[[int], list[np.ndarray]], Callable[..., np.ndarray], float]
EXAMPLES: dict[str, Case] = {
    "rms_norm_linear": (RMS_NORM_LINEAR, rms_norm_linear_inputs, rms_norm_linear_ref, 1e-2),
    "gated_mlp": (GATED_MLP, gated_mlp_inputs, gated_mlp_ref, 2e-2),
    "attention": (ATTENTION, attention_inputs, attention_ref, 1e-2),
    "blocked_matmul": (BLOCKED_MATMUL, blocked_matmul_inputs, blocked_matmul_ref, 1e-5),
    "walk": (WALK, walk_inputs, walk_ref, 1e-6),
}

# (example, [(text, replacement), ...]); every mutant still parses and verifies.
MUTATIONS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "omap": ("blocked_matmul", [("omap [0, 1, -1]", "omap [1, 0, -1]")]),
    "imap of a": ("blocked_matmul", [("%aa imap [0, -1, -1]", "%aa imap [-1, 0, -1]")]),
    "imap of b": ("blocked_matmul", [("%ba imap [-1, 1, -1]", "%ba imap [1, -1, -1]")]),
    # A lone fmap change always changes the tile type; the reshape follows it.
    "fmap": ("walk", [
        ("fmap 1 : tensor<8x8xf32> -> tensor<8x2xf32>", "fmap 0 : tensor<8x8xf32> -> tensor<2x8xf32>"),
        ("%xt : tensor<8x2xf32>", "%xt : tensor<2x8xf32>"),
    ]),
    # W1 read with grid and loop roles swapped: the same 64x32 tiles, transposed positions.
    "imap and fmap": ("gated_mlp", [
        ("%w1a imap [0, -1, -1] fmap 1", "%w1a imap [1, -1, -1] fmap 0"),
    ]),
    "accum mean_sq_last -> sum_sq_last": (
        "rms_norm_linear", [('"mean_sq_last"', '"sum_sq_last"')]
    ),
    "accum mean_sq_last -> mean_last": ("rms_norm_linear", [('"mean_sq_last"', '"mean_last"')]),
    "accum sum -> max": ("rms_norm_linear", [('accum "sum" %p', 'accum "max" %p')]),
    "matmul accum sum -> max": ("blocked_matmul", [('"sum"', '"max"')]),
    "up-projection accum sum -> max": ("gated_mlp", [('accum "sum" %p3', 'accum "max" %p3')]),
}  # fmt: skip


@pytest.mark.parametrize("name", EXAMPLES)
def test_unmutated_example_is_right(name: str) -> None:
    text, make_inputs, ref, tol = EXAMPLES[name]
    inputs = make_inputs(0)
    (out,) = run_mugraph(text, *inputs)
    assert rel_err(out, ref(*inputs)) <= tol


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_mutated_graph_gives_wrong_numbers(mutation: str) -> None:
    example, edits = MUTATIONS[mutation]
    text, make_inputs, ref, tol = EXAMPLES[example]
    for old, new in edits:
        text = mutate(text, old, new)
    inputs = make_inputs(0)
    (out,) = run_mugraph(text, *inputs)  # still verifies and runs
    err = rel_err(out, ref(*inputs))
    assert not err <= max(10 * tol, 0.1), f"mutant is within {err:.2g} of the reference"  # NaN too


def test_overlapping_writes_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """An omap bug that makes blocks write the same tile names the blocks and the element."""
    real = maps.output_tile_slices

    def every_block_writes_block_0(shape, grid, omap, block, summed=False):  # noqa: ANN001, ANN202
        return real(shape, grid, omap, (0, 0, 0), summed)

    monkeypatch.setattr(maps, "output_tile_slices", every_block_writes_block_0)
    with pytest.raises(
        MugraphRunError,
        match=r"block \(1, 0, 0\) writes element \(0, 0\) of result #0, already written by block \(0, 0, 0\)",
    ) as e:
        run_mugraph(BLOCKED_MATMUL, *blocked_matmul_inputs())
    assert "'mugraph.graph_def' (%c)" in str(e.value)
    assert "<source>:3:" in str(e.value)  # the kernel's location


def test_unwritten_elements_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grid that does not cover the result leaves NaN behind; the interpreter refuses it."""
    from mk.dialects.mugraph import GraphDefOp

    real = GraphDefOp.blocks
    monkeypatch.setattr(GraphDefOp, "blocks", lambda self: list(real(self))[:-1])
    with pytest.raises(
        MugraphRunError, match=r"no block writes element \(4, 4\) of result #0 \(16 of 64"
    ):
        run_mugraph(BLOCKED_MATMUL, *blocked_matmul_inputs())


def test_inputs_are_read_tile_by_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every mugraph.input read is one tile of one block in one iteration, never the tensor."""
    reads: list[tuple[tuple[int, ...], tuple[int, ...], int, tuple[int, ...]]] = []
    real = maps.input_tile_slices

    def recording(shape, grid, imap, fmap, forloop, block, iteration):  # noqa: ANN001, ANN202
        where = real(shape, grid, imap, fmap, forloop, block, iteration)
        reads.append((tuple(imap), tuple(block), iteration, tuple(s.stop - s.start for s in where)))
        return where

    monkeypatch.setattr(maps, "input_tile_slices", recording)
    run_mugraph(BLOCKED_MATMUL, *blocked_matmul_inputs())
    assert len(reads) == 2 * 4 * 4  # 2 inputs × 4 blocks × 4 iterations
    assert {shape for *_, shape in reads} == {(4, 4)}
    blocks = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
    a_reads = sorted((b, i) for imap, b, i, _ in reads if imap == (0, -1, -1))
    assert a_reads == sorted((b, i) for b in blocks for i in range(4))


# ------------------------------------------------------------------------------------------------
# In-place outputs (a KV-cache append)
# ------------------------------------------------------------------------------------------------

APPEND = """
func.func @append(%k: tensor<2x2x1x16xbf16>, %cache: tensor<2x2x8x16xbf16>, %p: tensor<1xi32>) -> tensor<2x2x8x16xbf16> {
  %c = mugraph.graph_def grid [2, 2, 1] threads 128 forloop 1 (%k, %cache, %p) : (tensor<2x2x1x16xbf16>, tensor<2x2x8x16xbf16>, tensor<1xi32>) -> tensor<2x2x8x16xbf16> {
  ^bb0(%ka: tensor<2x2x1x16xbf16>, %cachea: tensor<2x2x8x16xbf16>, %pa: tensor<1xi32>, %ca: tensor<2x2x8x16xbf16>):
    %kt = mugraph.input %ka imap [1, 0, -1] fmap -1 : tensor<2x2x1x16xbf16> -> tensor<1x1x1x16xbf16>
    %pt = mugraph.input %pa imap [-1, -1, -1] fmap -1 : tensor<1xi32> -> tensor<1xi32>
    %st = mugraph.unary "neg" %kt : tensor<1x1x1x16xbf16> -> tensor<1x1x1x16xf32>
    mugraph.output %st to %ca omap [1, 0, -1] at %pt dim 2 over %cachea : tensor<1x1x1x16xf32>, tensor<1xi32> -> tensor<2x2x8x16xbf16>
  }
  func.return %c : tensor<2x2x8x16xbf16>
}
"""


@pytest.mark.parametrize("pos", [0, 5, 7])
def test_in_place_output_writes_its_rows_at_the_position(pos: int) -> None:
    rng = np.random.default_rng(pos)
    k, cache = randn(rng, (2, 2, 1, 16)), randn(rng, (2, 2, 8, 16))
    (out,) = run_mugraph(APPEND, k, cache, np.array([pos], np.int32))
    want = f64(cache).copy()
    want[:, :, pos] = -f64(k[:, :, 0])
    assert np.array_equal(f64(out), want)  # every other row is the cache's, bit for bit


@pytest.mark.parametrize("pos", [-1, 8])
def test_in_place_output_outside_the_result_is_reported(pos: int) -> None:
    rng = np.random.default_rng(0)
    k, cache = randn(rng, (2, 2, 1, 16)), randn(rng, (2, 2, 8, 16))
    with pytest.raises(
        MugraphRunError, match=rf"writes positions \[{pos}, {pos + 1}\) outside \[0, 8\) of dim 2"
    ):
        run_mugraph(APPEND, k, cache, np.array([pos], np.int32))
