"""NumPy kernels of the nn ops: each computes in float32; the caller rounds to the result type."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextvars import ContextVar

import numpy as np

from mk.interp.nn_ties import argmax_steer

Attrs = dict[str, int | float | bool | tuple[int, ...]]
Shape = tuple[int, ...]
Kernel = Callable[[Sequence[np.ndarray], Attrs, Shape], np.ndarray]


class KernelError(ValueError):
    """A data-dependent error (e.g. an id out of range); the interpreter adds the op's location."""


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _int(attrs: Attrs, key: str) -> int:
    value = attrs[key]
    assert isinstance(value, int), f"attribute {key} should be an integer, got {value!r}"
    return int(value)


def _float(attrs: Attrs, key: str) -> np.float32:
    value = attrs[key]
    assert isinstance(value, int | float), f"attribute {key} should be a number, got {value!r}"
    return np.float32(value)


def _ints(attrs: Attrs, key: str) -> tuple[int, ...]:
    value = attrs[key]
    assert isinstance(value, tuple), f"attribute {key} should be a tuple, got {value!r}"
    return tuple(int(v) for v in value)


# Vectorised over float64 because NumPy has no erf and scipy is not a dependency.
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of a non-positive number only: no overflow for large |x|.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(np.float32)


def _unary(fn: Callable[[np.ndarray], np.ndarray]) -> Kernel:
    return lambda args, _attrs, _shape: fn(_f32(args[0]))


def _gelu(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))).astype(np.float32)


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Kernel:
    return lambda args, _attrs, _shape: fn(_f32(args[0]), _f32(args[1]))


def _reduce(fn: Callable[..., np.ndarray]) -> Kernel:
    def kernel(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
        return fn(_f32(args[0]), axis=_int(attrs, "dim"), keepdims=bool(attrs["keepdim"]))

    return kernel


def _scale(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
    return _f32(args[0]) * _float(attrs, "factor")


def _softmax_along(x: np.ndarray, axis: int) -> np.ndarray:
    # Fully masked rows (all -inf) give zeros rather than NaN.
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, np.float32(0))
    e = np.exp(x - peak)
    total = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def _softmax(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
    return _softmax_along(_f32(args[0]), _int(attrs, "dim"))


def _rms_norm(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
    x, w = _f32(args[0]), _f32(args[1])
    mean_sq = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(mean_sq + _float(attrs, "epsilon")) * w


def _rope(args: Sequence[np.ndarray], _attrs: Attrs, _shape: Shape) -> np.ndarray:
    x, cos, sin = (_f32(a) for a in args[:3])
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _matmul(args: Sequence[np.ndarray], _attrs: Attrs, _shape: Shape) -> np.ndarray:
    return np.matmul(_f32(args[0]), _f32(args[1]))


def _linear(args: Sequence[np.ndarray], _attrs: Attrs, _shape: Shape) -> np.ndarray:
    return np.matmul(_f32(args[0]), _f32(args[1]).T)


def check_ids(ids: np.ndarray, rows: int) -> np.ndarray:
    """The ids as int64 indices into a table of `rows` rows; KernelError names the first one
    out of range and its index."""
    bad = (ids < 0) | (ids >= rows)
    if np.any(bad):
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise KernelError(
            f"id {int(ids[first])} at index {first} is out of range for a table of {rows} rows"
        )
    return ids.astype(np.int64)


def _embedding(args: Sequence[np.ndarray], _attrs: Attrs, _shape: Shape) -> np.ndarray:
    table, ids = args[0], args[1]
    return _f32(table)[check_ids(ids, table.shape[0])]


def _argmax(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
    steer = argmax_steer.get()
    if steer is not None:
        return steer.choose(_f32(args[0]), _int(attrs, "dim"), current_step.get())
    return np.argmax(_f32(args[0]), axis=_int(attrs, "dim")).astype(np.int32)


def _reshape(args: Sequence[np.ndarray], _attrs: Attrs, shape: Shape) -> np.ndarray:
    return np.reshape(args[0], shape)


def _transpose(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
    return np.transpose(args[0], _ints(attrs, "perm"))


def _concat(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
    return np.concatenate(list(args), axis=_int(attrs, "dim"))


def _slice(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
    offsets, sizes = _ints(attrs, "offsets"), _ints(attrs, "sizes")
    return args[0][tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))]


def weighted_values(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """p·v where a weight of exactly 0 adds nothing: a masked key's value row may hold anything
    (NaN past kv_len in a cache never written), and 0·NaN must not reach the output. A value
    that is not finite still reaches every output whose weight for it is not 0, with IEEE's
    sums (inf, -inf, or NaN for both or a NaN); no [.., q, k, d] product is materialised."""
    finite = np.isfinite(v)
    if finite.all():
        return np.matmul(p, v)
    out = np.matmul(p, np.where(finite, v, 0)).astype(np.float32)
    weighed = (p != 0).astype(np.float32)

    def reaches(bad: np.ndarray) -> np.ndarray:
        return np.matmul(weighed, bad.astype(np.float32)) > 0

    up, down, nan = reaches(v == np.inf), reaches(v == -np.inf), reaches(np.isnan(v))
    out = np.where(up, np.float32(np.inf), out)
    out = np.where(down, np.float32(-np.inf), out)
    return np.where(nan | (up & down), np.float32(np.nan), out)


def _attention(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
    q, k, v = (_f32(a) for a in args[:3])
    batch, hq, sq, _ = q.shape
    hkv, s = k.shape[1], k.shape[2]
    group = hq // hkv
    # Grouped query: q head h reads kv head h // group.
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * _float(attrs, "scale")
    keys = np.arange(s)
    # Valid keys per batch row; the Sq queries are the last Sq positions of that valid prefix.
    length = np.asarray(args[3]).astype(np.int64) if len(args) > 3 else np.full(batch, s)
    visible = np.broadcast_to(
        keys[None, None, None, :] < length[:, None, None, None], (batch, 1, sq, s)
    )
    if attrs["causal"]:
        query_pos = length[:, None] - sq + np.arange(sq)[None, :]
        visible = visible & (keys[None, None, None, :] <= query_pos[:, None, :, None])
    scores = np.where(visible, scores, np.float32(-np.inf))
    return weighted_values(_softmax_along(scores, -1), v)


# The decode-loop step t the interpreters are running (`nn.steps`); 0 outside a decode loop.
current_step: ContextVar[int] = ContextVar("current_step", default=0)


def _step(args: Sequence[np.ndarray], attrs: Attrs, shape: Shape) -> np.ndarray:
    value = args[0].astype(np.int64) + _int(attrs, "offset") + current_step.get()
    return np.broadcast_to(value, shape)


def _cache_write(args: Sequence[np.ndarray], attrs: Attrs, _shape: Shape) -> np.ndarray:
    cache, new, index = args
    dim = _int(attrs, "dim") % cache.ndim
    extent = cache.shape[dim]
    # `new` holds the written slab in row-major order; the mugraph kernel may read it through a
    # reshape (its own shape then differs from the slab's), nn.cache_write's verifier makes it
    # the slab itself.
    n = new.size * extent // max(cache.size, 1)
    new = new.reshape(cache.shape[:dim] + (n,) + cache.shape[dim + 1 :])
    out = np.array(cache, copy=True)
    starts = np.asarray(index).astype(np.int64)
    for row in range(cache.shape[0] if len(starts) > 1 else 1):
        start = int(starts[row if len(starts) > 1 else 0])
        if start < 0 or start + n > extent:
            raise KernelError(
                f"index {start} writes positions [{start}, {start + n}) outside [0, {extent}) "
                f"of dim {dim}"
            )
        where: list[slice | int] = [slice(None)] * cache.ndim
        if len(starts) > 1:
            where[0] = slice(row, row + 1)
        src: list[slice | int] = list(where)
        where[dim] = slice(start, start + n)
        out[tuple(where)] = new[tuple(src)]
    return out


KERNELS: dict[str, Kernel] = {
    "nn.matmul": _matmul,
    "nn.linear": _linear,
    "nn.exp": _unary(np.exp),
    "nn.sqrt": _unary(np.sqrt),
    "nn.rsqrt": _unary(lambda x: np.float32(1) / np.sqrt(x)),
    "nn.square": _unary(np.square),
    "nn.neg": _unary(np.negative),
    "nn.relu": _unary(lambda x: np.maximum(x, np.float32(0))),
    "nn.sigmoid": _unary(_sigmoid),
    "nn.silu": _unary(lambda x: x * _sigmoid(x)),
    "nn.gelu": _unary(_gelu),
    "nn.scale": _scale,
    "nn.add": _binary(np.add),
    "nn.sub": _binary(np.subtract),
    "nn.mul": _binary(np.multiply),
    "nn.div": _binary(np.divide),
    "nn.maximum": _binary(np.maximum),
    "nn.reduce_sum": _reduce(np.sum),
    "nn.reduce_max": _reduce(np.max),
    "nn.reduce_mean": _reduce(np.mean),
    "nn.softmax": _softmax,
    "nn.rms_norm": _rms_norm,
    "nn.rope": _rope,
    "nn.embedding": _embedding,
    "nn.argmax": _argmax,
    "nn.reshape": _reshape,
    "nn.transpose": _transpose,
    "nn.concat": _concat,
    "nn.slice": _slice,
    "nn.attention": _attention,
    "nn.step": _step,
    "nn.cache_write": _cache_write,
}
"""Op name -> kernel. Layout ops and cache_write keep their operands' dtype, step its integers;
every other kernel returns float32 (argmax: int32)."""
