"""Programs over finite fields: the nn target and a candidate μGraph on random inputs, evaluated
in Z_p and Z_q at once (every array has a leading axis of 2 for the two residues).

Ring ops (add, sub, mul, matmul, sums, means as multiplication by n⁻¹, constants) are exact.
Every other op is built from a few **uninterpreted functions** — exp, rsqrt, sqrt, recip, erf
and a binary max — each evaluated as a keyed pseudo-random function of both residues of its
argument, with a key drawn fresh for every trial: silu(x) = x·recip(1 + exp(−x)), sigmoid(x) = recip(1 + exp(−x)),
a / b = a·recip(b), relu(x) = max(x, 0), rms_norm = x·rsqrt(mean(x²) + ε)·g, and a thread_map
body's arith/math ops the same way. Both programs use the same definitions, so a candidate that
is the same formal expression as the target (commutative-ring identities, the uninterpreted
functions compared by their arguments) gives equal outputs in every trial.

Each value carries a degree bound (inputs 1, products add, an uninterpreted function's result
counts as a fresh variable of degree 1) and each uninterpreted-function application is counted:
`verify` turns both into the false-positive bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, TensorType
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Operation, SSAValue

from mk.dialects import mugraph_maps as maps
from mk.dialects import nn
from mk.dialects.mugraph import GraphDefOp, InputOp, KernelOp, OutputOp
from mk.dialects.mugraph_tiles import (
    AccumOp,
    BinaryOp,
    MatmulOp,
    ReduceOp,
    ReshapeOp,
    RMSNormOp,
    ThreadMapOp,
    UnaryOp,
    YieldOp,
)

# Two primes below 2^31: products fit int64, and a matmul splits one operand into 16-bit halves.
PRIMES = (2_147_483_647, 2_147_483_629)
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
_LIMB_K = 1 << 11  # (2^31 · 2^11) · 2^11 = 2^53: float64 sums stay exact
_SHIFTS = (0, 11, 22)  # b's 11-bit limbs


class Unsupported(Exception):
    """An op the field semantics does not model (max-reductions, softmax, gathers, ...)."""


@dataclass
class Value:
    """Residues mod both primes (a leading axis of 2: `a[0]` mod p, `a[1]` mod q) and a bound on
    the degree as a polynomial in the inputs and the function outputs."""

    a: np.ndarray  # int64, shape (2, *logical shape)
    deg: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.a.shape[1:])

    @property
    def ndim(self) -> int:
        return self.a.ndim - 1


def _axis(dim: int) -> int:
    """The array axis of a logical dim (past the leading residue axis)."""
    return dim + 1 if dim >= 0 else dim


def _aligned(x: Value, ndim: int) -> np.ndarray:
    """x's array with size-1 axes after the residue axis, for NumPy broadcasting to `ndim`."""
    missing = ndim - x.ndim
    return x.a.reshape(2, *([1] * missing), *x.shape) if missing > 0 else x.a


@dataclass
class Field:
    """Z_p × Z_q in lockstep with this trial's uninterpreted functions, which see both residues
    of their argument; records degrees and function uses."""

    rng: np.random.Generator
    primes: tuple[int, int] = PRIMES
    keys: dict[str, int] = field(default_factory=dict)
    uses: dict[str, int] = field(default_factory=dict)  # scalar applications per function
    max_deg: int = 1
    counting: bool = True  # off while a block recomputes terms another block already made

    def _m(self, ndim: int) -> np.ndarray:
        return np.array(self.primes, dtype=np.int64).reshape(2, *([1] * ndim))

    def random(self, shape: Sequence[int]) -> Value:
        high = self._m(len(shape))
        return Value(self.rng.integers(0, high, size=(2, *shape), dtype=np.int64), 1)

    def _residue(self, c: float, p: int) -> int:
        frac = Fraction(c).limit_denominator(1 << 16)
        if float(frac) == c:  # 1/512, 0.5, 1: exact rationals map to n·d⁻¹
            return frac.numerator % p * pow(frac.denominator, -1, p) % p
        # ε = 1e-6 is not one: any fixed element works, the same in both programs
        return int.from_bytes(np.float64(c).tobytes(), "little") % p

    def const(self, c: float) -> Value:
        return Value(np.array([self._residue(c, p) for p in self.primes], dtype=np.int64), 0)

    def _track(self, v: Value) -> Value:
        self.max_deg = max(self.max_deg, v.deg)
        return v

    def add(self, x: Value, y: Value) -> Value:
        n = max(x.ndim, y.ndim)
        return Value((_aligned(x, n) + _aligned(y, n)) % self._m(n), max(x.deg, y.deg))

    def neg(self, x: Value) -> Value:
        m = self._m(x.ndim)
        return Value((m - x.a) % m, x.deg)

    def mul(self, x: Value, y: Value) -> Value:
        n = max(x.ndim, y.ndim)
        return self._track(Value(_aligned(x, n) * _aligned(y, n) % self._m(n), x.deg + y.deg))

    def matmul(self, x: Value, y: Value) -> Value:
        """Exact modular matmul through float64 BLAS: b in 11-bit limbs, K in chunks of 2^11, so
        every partial sum stays below 2^53."""
        n = max(x.ndim, y.ndim)
        a, b, m = _aligned(x, n), _aligned(y, n), self._m(n)
        k = a.shape[-1]
        scale = np.array([1 << s for s in _SHIFTS], dtype=np.int64).reshape(3, *([1] * (n + 1)))
        out: np.ndarray | int = 0
        for start in range(0, k, _LIMB_K):
            af = a[..., start : start + _LIMB_K].astype(np.float64)
            bc = b[..., start : start + _LIMB_K, :]
            limbs = np.stack([(bc >> s) & 0x7FF for s in _SHIFTS]).astype(np.float64)
            part = np.matmul(af, limbs).astype(np.int64) % m  # one BLAS call for the 3 limbs
            out = (out + (part * scale).sum(axis=0)) % m
        assert isinstance(out, np.ndarray)
        return self._track(Value(out, x.deg + y.deg))

    def sum(self, x: Value, dim: int, keepdims: bool = True) -> Value:
        total = np.sum(x.a, axis=_axis(dim), keepdims=keepdims)
        return Value(total % self._m(total.ndim - 1), x.deg)

    def scale_int_inv(self, x: Value, n: int) -> Value:
        inv = np.array([pow(n, -1, p) for p in self.primes], dtype=np.int64)
        return Value(x.a * inv.reshape(2, *([1] * x.ndim)) % self._m(x.ndim), x.deg)

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        return Value(x.a.reshape(2, *shape), x.deg)

    def fn(self, name: str, *xs: Value) -> Value:
        """An uninterpreted function: splitmix64 of both residues of each argument, under this
        trial's key, reduced mod each prime."""
        key = self.keys.setdefault(name, int(self.rng.integers(0, 1 << 62)))
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        n = len(shape)
        z = np.full(shape, key, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for x in xs:
                a = np.broadcast_to(_aligned(x, n), (2, *shape)).astype(np.uint64)
                z = _mix(_mix(z ^ a[0]) ^ a[1])
            out = np.stack([z, _mix(z ^ np.uint64(0x5851F42D4C957F2D))])
        if self.counting:
            self.uses[name] = self.uses.get(name, 0) + int(math.prod(shape))
        return Value((out % self._m(n).astype(np.uint64)).astype(np.int64), 1)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z + np.uint64(0x9E3779B97F4A7C15)) & _MASK
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
    return z ^ (z >> np.uint64(31))


# ------------------------------------------------------------------------------------------------
# Elementwise and reduction semantics shared by nn ops, library kernels and tile ops
# ------------------------------------------------------------------------------------------------


def recip(f: Field, x: Value) -> Value:
    return f.fn("recip", x)


def sigmoid(f: Field, x: Value) -> Value:
    return recip(f, f.add(f.const(1.0), f.fn("exp", f.neg(x))))


UNARY: dict[str, Callable[[Field, Value], Value]] = {
    "exp": lambda f, x: f.fn("exp", x),
    "sqrt": lambda f, x: f.fn("sqrt", x),
    "rsqrt": lambda f, x: f.fn("rsqrt", x),
    "recip": recip,
    "square": lambda f, x: f.mul(x, x),
    "neg": lambda f, x: f.neg(x),
    "relu": lambda f, x: f.fn("max", x, f.const(0.0)),
    "sigmoid": sigmoid,
    "silu": lambda f, x: f.mul(x, sigmoid(f, x)),
    "gelu": lambda f, x: f.mul(
        f.mul(x, f.const(0.5)),
        f.add(f.const(1.0), f.fn("erf", f.mul(x, f.const(1.0 / math.sqrt(2.0))))),
    ),
    "cast": lambda f, x: x,
}
BINARY: dict[str, Callable[[Field, Value, Value], Value]] = {
    "add": lambda f, x, y: f.add(x, y),
    "sub": lambda f, x, y: f.add(x, f.neg(y)),
    "mul": lambda f, x, y: f.mul(x, y),
    "div": lambda f, x, y: f.mul(x, recip(f, y)),
    "maximum": lambda f, x, y: f.fn("max", x, y),
}


def reduce(f: Field, kind: str, x: Value, dim: int, keepdim: bool) -> Value:
    if kind not in ("sum", "mean"):
        raise Unsupported(f"reduction '{kind}'")
    total = f.sum(x, dim, keepdim)
    return f.scale_int_inv(total, x.shape[dim]) if kind == "mean" else total


def rms_norm(f: Field, x: Value, g: Value, eps: float) -> Value:
    ms = reduce(f, "mean", f.mul(x, x), x.ndim - 1, True)
    return f.mul(f.mul(x, f.fn("rsqrt", f.add(ms, f.const(eps)))), g)


def _attr_float(attrs: Mapping[str, object], name: str) -> float:
    value = attrs[name]
    assert isinstance(value, float | int)
    return float(value)


def nn_kernel(
    f: Field, kind: str, args: Sequence[Value], attrs: Mapping[str, object], shape: Sequence[int]
) -> Value:
    """One nn op (or library kernel of that kind) on field values."""
    if kind in UNARY:
        return UNARY[kind](f, args[0])
    if kind == "scale":
        return f.mul(args[0], f.const(_attr_float(attrs, "factor")))
    if kind in BINARY:
        return BINARY[kind](f, args[0], args[1])
    if kind in ("matmul", "linear"):
        w = args[1].a.swapaxes(-1, -2) if kind == "linear" else args[1].a
        return f.matmul(args[0], Value(w, args[1].deg))
    if kind in ("reduce_sum", "reduce_mean"):
        x = args[0]
        dim = attrs["dim"]
        assert isinstance(dim, int)
        dim %= x.ndim
        return reduce(f, kind.removeprefix("reduce_"), x, dim, bool(attrs["keepdim"]))
    if kind == "rms_norm":
        return rms_norm(f, args[0], args[1], _attr_float(attrs, "epsilon"))
    if kind == "reshape":
        return f.reshape(args[0], shape)
    raise Unsupported(f"'{kind}'")


# ------------------------------------------------------------------------------------------------
# Programs
# ------------------------------------------------------------------------------------------------


def _shape(v: SSAValue) -> tuple[int, ...]:
    assert isinstance(v.type, TensorType)
    return tuple(v.type.get_shape())


def run_function(f: Field, func: FuncOp, inputs: Sequence[Value]) -> list[Value]:
    """An nn / mugraph kernel-graph function on field values."""
    env: dict[SSAValue, Value] = dict(zip(func.body.block.args, inputs, strict=True))
    for op in func.body.block.ops:
        if isinstance(op, ReturnOp):
            return [env[v] for v in op.operands]
        args = [env[v] for v in op.operands]
        if isinstance(op, GraphDefOp):
            outs = run_graph_def(f, op, args)
        elif isinstance(op, KernelOp):
            attrs = {k: _plain(a) for k, a in op.attributes.items()}
            outs = [nn_kernel(f, op.kind.data, args, attrs, _shape(op.res[0]))]
        elif isinstance(op, nn.NNOp):
            outs = [
                nn_kernel(
                    f,
                    op.name.removeprefix("nn."),
                    args,
                    nn.attribute_values(op),
                    _shape(op.results[0]),
                )
            ]
        else:
            raise Unsupported(f"'{op.name}'")
        env.update(zip(op.results, outs, strict=True))
    raise Unsupported("function without func.return")


def _plain(attr: object) -> object:
    if isinstance(attr, FloatAttr):
        return float(attr.value.data)
    if isinstance(attr, IntegerAttr):
        return int(attr.value.data)
    return attr


def run_graph_def(f: Field, op: GraphDefOp, args: Sequence[Value]) -> list[Value]:
    """A graph-defined kernel block by block and iteration by iteration, as the interpreter
    does; every result element must be written exactly once."""
    results = [np.full((2, *_shape(r)), -1, dtype=np.int64) for r in op.res]
    degs = [0] * len(results)
    loop, epilogue = op.loop_ops(), op.epilogue_ops()
    forloop = op.forloop_range()
    fresh = _FreshTerms(op)
    for block in op.blocks():
        env: dict[SSAValue, Value] = {}
        accs: dict[Operation, Value] = {}
        for it in range(forloop):
            for inner in loop:
                f.counting = fresh(inner, block, it)
                _step(f, inner, env, accs, args, block, it, forloop)
        for acc, value in accs.items():
            env[acc.results[0]] = _finish_accum(f, acc, value, forloop)
        for inner in epilogue:
            f.counting = fresh(inner, block, -1)
            if isinstance(inner, OutputOp):
                _write(inner, env[inner.tile], results, degs, block)
            else:
                _step(f, inner, env, accs, args, block, forloop - 1, forloop)
    f.counting = True
    if any((r < 0).any() for r in results):
        raise AssertionError("a graph_def left an element unwritten")
    return [Value(r, d) for r, d in zip(results, degs, strict=True)]


class _FreshTerms:
    """Whether an op in a block makes scalar terms no earlier block made: its result depends
    only on the slices its ancestor inputs read, so blocks reading the same slices (a
    replicated operand) recompute formally identical terms, which the bound counts once."""

    def __init__(self, op: GraphDefOp) -> None:
        self.inputs: dict[Operation, list[InputOp]] = {}
        for inner in op.body.block.ops:
            if isinstance(inner, InputOp):
                self.inputs[inner] = [inner]
            else:
                ups = [
                    self.inputs.get(v.owner, [])
                    for v in inner.operands
                    if isinstance(v.owner, Operation)
                ]
                self.inputs[inner] = list(dict.fromkeys(x for u in ups for x in u))
        self.seen: set[tuple[object, ...]] = set()
        self._block: maps.BlockCoord | None = None
        self._foot: dict[InputOp, tuple[tuple[int, int], ...]] = {}

    def __call__(self, op: Operation, block: maps.BlockCoord, iteration: int) -> bool:
        if block != self._block:
            self._block = block
            self._foot = {
                i: tuple((s.start, s.stop) for s in i.block_slices(block))
                for i in {x for xs in self.inputs.values() for x in xs}
            }
        key = (op, iteration, tuple(self._foot[i] for i in self.inputs[op]))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def _write(
    out: OutputOp, tile: Value, results: list[np.ndarray], degs: list[int], block: maps.BlockCoord
) -> None:
    i = out.result_index()
    where = out.tile_slices(block)
    where = (slice(None), *where)
    if (results[i][where] >= 0).any():
        raise AssertionError("two blocks write one element")
    results[i][where] = np.broadcast_to(tile.a, results[i][where].shape)
    degs[i] = max(degs[i], tile.deg)


def _step(
    f: Field, op: Operation, env: dict[SSAValue, Value], accs: dict[Operation, Value],
    args: Sequence[Value], block: maps.BlockCoord, it: int, forloop: int,
) -> None:  # fmt: skip
    if isinstance(op, InputOp):
        src = args[op.source_index()]
        env[op.tile] = Value(src.a[(slice(None), *op.tile_slices(block, it))], src.deg)
        return
    xs = [env[v] for v in op.operands]
    if isinstance(op, AccumOp):
        update = _accum_update(f, op, xs[0])
        accs[op] = f.add(accs[op], update) if op in accs else update
        return
    env.update(zip(op.results, _tile_op(f, op, xs), strict=True))


def _accum_update(f: Field, op: AccumOp, x: Value) -> Value:
    kind = maps.ACCUM_KINDS.get(op.kind.data)
    if kind is None or kind.combine != "sum":
        raise Unsupported(f"accumulator '{op.kind.data}'")
    if kind.square:
        x = f.mul(x, x)
    return f.sum(x, -1) if kind.reduce_last else x


def _finish_accum(f: Field, op: Operation, value: Value, forloop: int) -> Value:
    assert isinstance(op, AccumOp)
    if maps.ACCUM_KINDS[op.kind.data].mean:
        x = op.x.type
        assert isinstance(x, TensorType)
        return f.scale_int_inv(value, x.get_shape()[-1] * forloop)
    return value


def _tile_op(f: Field, op: Operation, xs: list[Value]) -> list[Value]:
    if isinstance(op, MatmulOp):
        b = xs[1].a.swapaxes(-1, -2) if op.transpose_b is not None else xs[1].a
        return [f.matmul(xs[0], Value(b, xs[1].deg))]
    if isinstance(op, UnaryOp):
        if op.kind.data == "scale":
            assert op.factor is not None
            return [f.mul(xs[0], f.const(float(op.factor.value.data)))]
        return [UNARY[op.kind.data](f, xs[0])]
    if isinstance(op, BinaryOp):
        return [BINARY[op.kind.data](f, xs[0], xs[1])]
    if isinstance(op, ReduceOp):
        return [reduce(f, op.kind.data, xs[0], op.dim.value.data, op.keepdim is not None)]
    if isinstance(op, RMSNormOp):
        return [rms_norm(f, xs[0], xs[1], float(op.epsilon.value.data))]
    if isinstance(op, ReshapeOp):
        return [f.reshape(xs[0], _shape(op.res))]
    if isinstance(op, ThreadMapOp):
        return _thread_map(f, op, xs)
    raise Unsupported(f"'{op.name}'")


_SCALAR_BINARY = {
    "arith.addf": "add",
    "arith.subf": "sub",
    "arith.mulf": "mul",
    "arith.divf": "div",
    "arith.maximumf": "maximum",
}
_SCALAR_UNARY = {"arith.negf": "neg", "math.exp": "exp", "math.sqrt": "sqrt", "math.rsqrt": "rsqrt"}


def _thread_map(f: Field, op: ThreadMapOp, xs: list[Value]) -> list[Value]:
    env: dict[SSAValue, Value] = dict(zip(op.body.block.args, xs, strict=True))
    for s in op.body.block.ops:
        if isinstance(s, YieldOp):
            shape = np.broadcast_shapes(*(x.shape for x in xs))
            n = len(shape)
            return [
                Value(np.broadcast_to(_aligned(env[v], n), (2, *shape)), env[v].deg)
                for v in s.values
            ]
        args = [env[v] for v in s.operands]
        if s.name == "arith.constant":
            value = s.properties["value"]
            assert isinstance(value, FloatAttr)
            env[s.results[0]] = f.const(float(value.value.data))
        elif s.name in _SCALAR_BINARY:
            env[s.results[0]] = BINARY[_SCALAR_BINARY[s.name]](f, args[0], args[1])
        elif s.name in _SCALAR_UNARY:
            env[s.results[0]] = UNARY[_SCALAR_UNARY[s.name]](f, args[0])
        elif s.name == "math.erf":
            env[s.results[0]] = f.fn("erf", args[0])
        else:
            raise Unsupported(f"'{s.name}' in a thread_map")
    raise AssertionError("a verified thread_map body ends with mugraph.yield")
