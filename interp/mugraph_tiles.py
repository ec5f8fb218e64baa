"""NumPy kernels of mugraph block-graph ops: tile ops, thread_map scalar bodies and accumulators."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import FloatAttr, IndexType, IntegerAttr, TensorType
from xdsl.ir import Block, Operation, SSAValue

from mk.dialects.mugraph import ArgmaxOp, PositionOp
from mk.dialects.mugraph_maps import ACCUM_KINDS
from mk.dialects.mugraph_tiles import (
    AccumOp,
    AccumSoftmaxOp,
    BinaryOp,
    ConcatOp,
    MatmulOp,
    ReduceOp,
    ReshapeOp,
    RMSNormOp,
    RopeOp,
    ThreadMapOp,
    UnaryOp,
    YieldOp,
)
from mk.inputs import numpy_dtype
from mk.interp.nn_ops import weighted_values

Tile = np.ndarray
BlockCoord = tuple[int, int, int]
# (op, operand tiles, block, iteration) -> result tiles, unrounded (the runner rounds them).
TileKernel = Callable[[Operation, Sequence[Tile], BlockCoord, int], tuple[Tile, ...]]
ScalarKernel = Callable[[Operation, Sequence[np.ndarray]], np.ndarray]

_F32 = np.float32
BF16 = ml_dtypes.bfloat16


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def is_float_dtype(dtype: np.dtype) -> bool:
    """Floats, ml_dtypes' bfloat16 included (NumPy files it under kind 'V')."""
    return dtype.kind == "f" or dtype == np.dtype(BF16)


def element_dtype(value: SSAValue) -> np.dtype:
    """The NumPy dtype of a tile's or a scalar's elements (index is int64)."""
    ty = value.type
    elem = ty.element_type if isinstance(ty, TensorType) else ty
    return np.dtype(np.int64) if isinstance(elem, IndexType) else numpy_dtype(elem)


def _erf(x: np.ndarray) -> np.ndarray:
    # NumPy has no erf; float64 through math.erf, back to the input's precision.
    out = np.vectorize(math.erf, otypes=[np.float64])(np.asarray(x, dtype=np.float64))
    return out.astype(np.asarray(x).dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1 + _erf(x / _F32(math.sqrt(2.0))))).astype(x.dtype)


# ------------------------------------------------------------------------------------------------
# Tile ops
# ------------------------------------------------------------------------------------------------

_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: _F32(1) / np.sqrt(x),
    "square": np.square,
    "neg": np.negative,
    "relu": lambda x: np.maximum(x, _F32(0)),
    "sigmoid": _sigmoid,
    "silu": lambda x: x * _sigmoid(x),
    "gelu": _gelu,
    "recip": lambda x: _F32(1) / x,
    "cast": lambda x: x,
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
_REDUCE: dict[str, Callable[..., np.ndarray]] = {"sum": np.sum, "max": np.max, "mean": np.mean}


def _matmul(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, MatmulOp)
    b = _f32(t[1])
    if op.transpose_b is not None:
        b = np.swapaxes(b, -1, -2)
    return (np.matmul(_f32(t[0]), b),)


def _unary(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, UnaryOp)
    x = _f32(t[0])
    if op.kind.data == "scale":
        assert op.factor is not None
        return (x * _F32(op.factor.value.data),)
    return (_UNARY[op.kind.data](x),)


def _binary(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, BinaryOp)
    return (_BINARY[op.kind.data](_f32(t[0]), _f32(t[1])),)


def _reduce(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, ReduceOp)
    fn = _REDUCE[op.kind.data]
    return (fn(_f32(t[0]), axis=op.dim.value.data, keepdims=op.keepdim is not None),)


def _rms_norm(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, RMSNormOp)
    x, g = _f32(t[0]), _f32(t[1])
    mean_sq = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(mean_sq + _F32(op.epsilon.value.data)) * g,)


def _rope(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, RopeOp)
    x, c, s = _f32(t[0]), _f32(t[1]), _f32(t[2])
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return (np.concatenate(np.broadcast_arrays(x1 * c - x2 * s, x2 * c + x1 * s), axis=-1),)


def _concat(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, ConcatOp)
    parts = [_f32(x) if is_float_dtype(x.dtype) else x for x in t]
    return (np.concatenate(parts, axis=op.dim.value.data),)


def _reshape(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, ReshapeOp)
    res = op.res.type
    assert isinstance(res, TensorType)
    return (np.reshape(t[0], tuple(res.get_shape())),)


def _position(op: Operation, t: Sequence[Tile], block: BlockCoord, it: int) -> tuple[Tile, ...]:
    assert isinstance(op, PositionOp)
    dim, shape = op.dim.value.data, t[0].shape
    where = op.positions(block, it)
    line = np.arange(where.start, where.stop).reshape(
        [-1 if d == dim else 1 for d in range(len(shape))]
    )
    return (np.broadcast_to(line, shape),)


def _argmax(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, ArgmaxOp)
    dim, values = op.dim.value.data, _f32(t[0])
    first = np.expand_dims(np.argmax(values, axis=dim), dim)  # first occurrence of the max
    return (
        np.take_along_axis(values, first, axis=dim),
        np.take_along_axis(t[1], first, axis=dim),
    )


def _thread_map(op: Operation, t: Sequence[Tile], _b: BlockCoord, _i: int) -> tuple[Tile, ...]:
    assert isinstance(op, ThreadMapOp)
    args = op.body.block.args
    # Region arguments say what a thread computes in: f32 for float tiles, else the int type.
    scalars = [x.astype(element_dtype(a), copy=False) for x, a in zip(t, args, strict=True)]
    shape = np.broadcast_shapes(*(x.shape for x in t))
    return tuple(np.broadcast_to(y, shape) for y in run_scalar_body(op.body.block, scalars))


TILE_KERNELS: dict[type[Operation], TileKernel] = {
    MatmulOp: _matmul,
    UnaryOp: _unary,
    BinaryOp: _binary,
    ReduceOp: _reduce,
    RMSNormOp: _rms_norm,
    RopeOp: _rope,
    ConcatOp: _concat,
    ReshapeOp: _reshape,
    PositionOp: _position,
    ArgmaxOp: _argmax,
    ThreadMapOp: _thread_map,
}
"""Block-graph op class -> kernel; mugraph.input/output and accumulators are the runner's."""


# ------------------------------------------------------------------------------------------------
# thread_map bodies: each scalar arith/math op applied to whole arrays at once
# ------------------------------------------------------------------------------------------------


def _constant(op: Operation, _a: Sequence[np.ndarray]) -> np.ndarray:
    value = op.properties["value"]
    assert isinstance(value, FloatAttr | IntegerAttr), f"unsupported constant {value}"
    return np.asarray(value.value.data, dtype=element_dtype(op.results[0]))


def _same(fn: Callable[..., np.ndarray]) -> ScalarKernel:
    """An elementwise kernel whose result keeps the first operand's dtype (f32 stays f32)."""
    return lambda _op, a: np.asarray(fn(*a)).astype(a[0].dtype, copy=False)


def _to_result(op: Operation, a: Sequence[np.ndarray]) -> np.ndarray:
    return a[0].astype(element_dtype(op.results[0]))


def _trunc_to_result(op: Operation, a: Sequence[np.ndarray]) -> np.ndarray:
    return np.trunc(a[0]).astype(element_dtype(op.results[0]))


def _div_trunc(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # C semantics (round towards zero), unlike Python's floor division.
    return (np.abs(a) // np.abs(b)) * np.sign(a) * np.sign(b)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.floor(np.abs(x) + x.dtype.type(0.5))


_CMPF: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "false": lambda a, b: np.zeros(np.broadcast_shapes(a.shape, b.shape), bool),
    "oeq": np.equal,
    "ogt": np.greater,
    "oge": np.greater_equal,
    "olt": np.less,
    "ole": np.less_equal,
    "one": lambda a, b: (a != b) & ~np.isnan(a) & ~np.isnan(b),
    "ord": lambda a, b: ~np.isnan(a) & ~np.isnan(b),
    "ueq": lambda a, b: (a == b) | np.isnan(a) | np.isnan(b),
    "ugt": lambda a, b: ~(a <= b),
    "uge": lambda a, b: ~(a < b),
    "ult": lambda a, b: ~(a >= b),
    "ule": lambda a, b: ~(a > b),
    "une": np.not_equal,
    "uno": lambda a, b: np.isnan(a) | np.isnan(b),
    "true": lambda a, b: np.ones(np.broadcast_shapes(a.shape, b.shape), bool),
}
_CMPF_NAMES = list(_CMPF)
_CMPI = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]
_CMPI_FNS = [np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal]


def _predicate(op: Operation) -> int:
    attr = op.properties["predicate"]
    assert isinstance(attr, IntegerAttr)
    return attr.value.data


def _cmpf(op: Operation, a: Sequence[np.ndarray]) -> np.ndarray:
    return _CMPF[_CMPF_NAMES[_predicate(op)]](a[0], a[1])


def _cmpi(op: Operation, a: Sequence[np.ndarray]) -> np.ndarray:
    p = _predicate(op)
    x, y = a[0], a[1]
    if p >= 6:  # unsigned predicates compare the bit patterns as unsigned numbers
        unsigned = np.dtype(f"u{x.dtype.itemsize}")
        x, y, p = x.astype(unsigned), y.astype(unsigned), p - 4
    return _CMPI_FNS[p](x, y)


SCALAR_KERNELS: dict[str, ScalarKernel] = {
    "arith.constant": _constant,
    "arith.addf": _same(np.add),
    "arith.subf": _same(np.subtract),
    "arith.mulf": _same(np.multiply),
    "arith.divf": _same(np.divide),
    "arith.negf": _same(np.negative),
    "arith.maximumf": _same(np.maximum),  # NaN-propagating
    "arith.minimumf": _same(np.minimum),
    "arith.maxnumf": _same(np.fmax),  # NaN-ignoring
    "arith.minnumf": _same(np.fmin),
    "arith.addi": _same(np.add),
    "arith.subi": _same(np.subtract),
    "arith.muli": _same(np.multiply),
    "arith.divsi": _same(_div_trunc),
    "arith.remsi": _same(lambda a, b: a - b * _div_trunc(a, b)),
    "arith.maxsi": _same(np.maximum),
    "arith.minsi": _same(np.minimum),
    "arith.andi": _same(np.bitwise_and),
    "arith.ori": _same(np.bitwise_or),
    "arith.xori": _same(np.bitwise_xor),
    "arith.cmpf": _cmpf,
    "arith.cmpi": _cmpi,
    "arith.select": lambda _op, a: np.where(a[0], a[1], a[2]),
    "arith.sitofp": _to_result,
    "arith.fptosi": _trunc_to_result,
    "arith.extf": _to_result,
    "arith.truncf": _to_result,
    "arith.extsi": _to_result,
    "arith.trunci": _to_result,
    "arith.index_cast": _to_result,
    "math.exp": _same(np.exp),
    "math.exp2": _same(np.exp2),
    "math.expm1": _same(np.expm1),
    "math.log": _same(np.log),
    "math.log2": _same(np.log2),
    "math.log10": _same(np.log10),
    "math.log1p": _same(np.log1p),
    "math.sqrt": _same(np.sqrt),
    "math.rsqrt": _same(lambda x: 1 / np.sqrt(x)),
    "math.cbrt": _same(np.cbrt),
    "math.tanh": _same(np.tanh),
    "math.sin": _same(np.sin),
    "math.cos": _same(np.cos),
    "math.tan": _same(np.tan),
    "math.sinh": _same(np.sinh),
    "math.cosh": _same(np.cosh),
    "math.asin": _same(np.arcsin),
    "math.acos": _same(np.arccos),
    "math.atan": _same(np.arctan),
    "math.atan2": _same(np.arctan2),
    "math.erf": _same(_erf),
    "math.absf": _same(np.abs),
    "math.absi": _same(np.abs),
    "math.ceil": _same(np.ceil),
    "math.floor": _same(np.floor),
    "math.trunc": _same(np.trunc),
    "math.round": _same(_round_half_away),
    "math.roundeven": _same(np.rint),
    "math.copysign": _same(np.copysign),
    "math.powf": _same(np.power),
    "math.fpowi": _same(lambda x, n: np.power(x, n.astype(x.dtype))),
    "math.fma": _same(lambda a, b, c: a * b + c),
}
"""arith/math op name -> NumPy kernel on whole arrays (a thread_map runs its body once per tile)."""


def run_scalar_body(block: Block, args: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Evaluate a thread_map body on arrays (one element per thread) and return what it yields."""
    env: dict[SSAValue, np.ndarray] = dict(zip(block.args, args, strict=True))
    for op in block.ops:
        operands = [env[v] for v in op.operands]
        if isinstance(op, YieldOp):
            return tuple(operands)
        env[op.results[0]] = np.asarray(SCALAR_KERNELS[op.name](op, operands))
    raise AssertionError("a verified thread_map body ends with mugraph.yield")


# ------------------------------------------------------------------------------------------------
# Accumulators: f32 state carried across the for-loop iterations of one block
# ------------------------------------------------------------------------------------------------


class Accumulator:
    """State of one accumulator op in one block: `update` per iteration, `results` after."""

    def update(self, tiles: Sequence[Tile]) -> None:
        raise NotImplementedError

    def results(self) -> tuple[Tile, ...]:
        raise NotImplementedError


class ReduceAccumulator(Accumulator):
    """`mugraph.accum`: sum or max across iterations, optionally of x² or of the last dim."""

    def __init__(self, op: AccumOp, forloop: int) -> None:
        self.kind = ACCUM_KINDS[op.kind.data]
        res = op.res.type
        assert isinstance(res, TensorType)
        start = 0.0 if self.kind.combine == "sum" else -np.inf
        self.value = np.full(tuple(res.get_shape()), start, dtype=np.float32)
        x = op.x.type
        assert isinstance(x, TensorType)
        # The mean divides by all the elements the loop walked: tile's last dim × forloop.
        self.extent = (x.get_shape()[-1] if x.get_shape() else 1) * forloop

    def update(self, tiles: Sequence[Tile]) -> None:
        x = _f32(tiles[0])
        if self.kind.square:
            x = x * x
        combine = np.add if self.kind.combine == "sum" else np.maximum
        if self.kind.reduce_last:
            x = combine.reduce(x, axis=-1, keepdims=True)
        self.value = combine(self.value, x)

    def results(self) -> tuple[Tile, ...]:
        if self.kind.mean:
            return (self.value / _F32(self.extent),)
        return (self.value,)


class SoftmaxAccumulator(Accumulator):
    """`mugraph.accum_softmax`: online softmax with running max m, running sum l, unnormalised o."""

    def __init__(self, op: AccumSoftmaxOp) -> None:
        o, m = op.o.type, op.m.type
        assert isinstance(o, TensorType) and isinstance(m, TensorType)
        self.o = np.zeros(tuple(o.get_shape()), dtype=np.float32)
        self.m = np.full(tuple(m.get_shape()), -np.inf, dtype=np.float32)
        self.l = np.zeros(tuple(m.get_shape()), dtype=np.float32)

    def update(self, tiles: Sequence[Tile]) -> None:
        s, v = _f32(tiles[0]), _f32(tiles[1])
        m_new = np.maximum(self.m, np.max(s, axis=-1, keepdims=True))
        # A row with no finite score yet (all masked): shift by 0 so e^(-inf - 0) = 0, not NaN.
        shift = np.where(np.isfinite(m_new), m_new, _F32(0))
        rescale = np.exp(self.m - shift)
        p = np.exp(s - shift)
        self.l = self.l * rescale + np.sum(p, axis=-1, keepdims=True)
        self.o = self.o * rescale + weighted_values(p, v)
        self.m = m_new

    def results(self) -> tuple[Tile, ...]:
        return (self.o, self.m, self.l)


def make_accumulator(op: Operation, forloop: int) -> Accumulator:
    if isinstance(op, AccumSoftmaxOp):
        return SoftmaxAccumulator(op)
    assert isinstance(op, AccumOp)
    return ReduceAccumulator(op, forloop)
