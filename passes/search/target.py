"""What the search must compute: an nn subgraph's inputs, outputs, dim labels and expressions.

Every dim of every value gets a **label**: dims that must be the same index space are unified
(a linear's x[..., K] with w[N, K], an elementwise op's operands with its result, ...), so a
grid axis or the for-loop can be said to walk "label N" and each input's imap/fmap follows. Dims
of extent 1 get the label UNIT (they broadcast). Labels summed over somewhere are *reduced*; the
others can be partitioned by the grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Operation, SSAValue

from mk.dialects import nn
from mk.dialects.mugraph_base import shape_of
from mk.passes.search.expr import Algebra

UNIT = -1

# nn op -> opaque function name in the abstract expressions (and the mugraph unary kind)
OPAQUE = {
    nn.ExpOp: "exp",
    nn.SqrtOp: "sqrt",
    nn.RsqrtOp: "rsqrt",
    nn.SigmoidOp: "sigmoid",
    nn.SiluOp: "silu",
    nn.GeluOp: "gelu",
    nn.ReluOp: "relu",
}
SUPPORTED = (
    nn.LinearOp, nn.MatmulOp, nn.AddOp, nn.SubOp, nn.MulOp, nn.DivOp, nn.ReduceSumOp,
    nn.ReduceMeanOp, nn.RMSNormOp, nn.SquareOp, nn.NegOp, nn.ScaleOp, *OPAQUE,
)  # fmt: skip


def attr_float(op: Operation, name: str) -> float:
    """A float (or integer) nn attribute, defaults filled in."""
    value = nn.attribute_values(op)[name]
    assert isinstance(value, int | float)
    return float(value)


def attr_int(op: Operation, name: str) -> int:
    value = nn.attribute_values(op)[name]
    assert isinstance(value, int)
    return value


class Unsupported(Exception):
    """The subgraph holds an op or shape the search does not model (the rules lower it)."""


class _Unify:
    def __init__(self) -> None:
        self.parent: dict[tuple[SSAValue, int], tuple[SSAValue, int]] = {}

    def find(self, k: tuple[SSAValue, int]) -> tuple[SSAValue, int]:
        while self.parent.get(k, k) != k:
            k = self.parent[k]
        return k

    def union(self, a: SSAValue, da: int, b: SSAValue, db: int) -> None:
        sa, sb = shape_of(a), shape_of(b)
        da, db = da % len(sa), db % len(sb)
        if sa[da] != sb[db]:
            raise Unsupported(f"dims {sa[da]} and {sb[db]} meet in one index space")
        if sa[da] == 1:
            return
        ra, rb = self.find((a, da)), self.find((b, db))
        if ra != rb:
            self.parent[rb] = ra


@dataclass
class Problem:
    """A subgraph to search for: inputs (kernel operands), outputs, labels and expressions."""

    algebra: Algebra
    inputs: list[SSAValue]
    outputs: list[SSAValue]
    labels: dict[SSAValue, tuple[int, ...]]
    extents: dict[int, int]
    reduced: set[int]
    nf: dict[SSAValue, int]
    input_names: list[str] = field(default_factory=list)

    def output_labels(self) -> list[int]:
        """Labels of output dims, in first-seen order: what the grid may partition."""
        out: list[int] = []
        for v in self.outputs:
            for label in self.labels[v]:
                if label != UNIT and label not in self.reduced and label not in out:
                    out.append(label)
        return out


def _unify_op(u: _Unify, op: Operation) -> list[int]:
    """Unify the dims op relates; returns the dims (of operand 0) it reduces."""
    res = op.results[0]
    if isinstance(op, nn.LinearOp | nn.MatmulOp):
        x, w = op.operands
        if len(shape_of(w)) != 2 or len(shape_of(x)) < 1:
            raise Unsupported("batched matmul")
        kw, nw = (1, 0) if isinstance(op, nn.LinearOp) else (0, 1)
        u.union(x, -1, w, kw)
        u.union(res, -1, w, nw)
        for d in range(len(shape_of(x)) - 1):
            u.union(res, d, x, d)
        return [len(shape_of(x)) - 1]
    if isinstance(op, nn.ReduceSumOp | nn.ReduceMeanOp):
        (x,) = op.operands
        attrs = nn.attribute_values(op)
        rank, dim = len(shape_of(x)), attr_int(op, "dim")
        dim %= rank
        j = 0
        for d in range(rank):
            if d == dim:
                j += 1 if attrs["keepdim"] else 0
                continue
            u.union(res, j, x, d)
            j += 1
        return [dim]
    if isinstance(op, nn.RMSNormOp):
        x, g = op.operands
        u.union(x, -1, g, 0)
        for d in range(len(shape_of(x))):
            u.union(res, d, x, d)
        return [len(shape_of(x)) - 1]
    for v in op.operands:  # elementwise, NumPy broadcasting
        off = len(shape_of(res)) - len(shape_of(v))
        for d in range(len(shape_of(v))):
            if shape_of(v)[d] == shape_of(res)[d + off]:
                u.union(res, d + off, v, d)
    return []


def _expression(p: Problem, op: Operation, reduced: list[int]) -> int:
    """The abstract expression of op's result from its operands'."""
    a = p.algebra
    args = [p.nf[v] for v in op.operands]
    labels = p.labels[op.operands[0]]
    if isinstance(op, nn.MulOp):
        return a.mul(args[0], args[1], labels, p.labels[op.operands[1]])
    if isinstance(op, nn.LinearOp | nn.MatmulOp):
        return a.reduce(a.mul(args[0], args[1]), labels[-1], True)
    if isinstance(op, nn.ReduceSumOp | nn.ReduceMeanOp):
        (dim,) = reduced
        total = a.reduce(args[0], labels[dim], True)
        if isinstance(op, nn.ReduceMeanOp):
            total = a.scale(total, 1.0 / shape_of(op.operands[0])[dim])
        return total
    if isinstance(op, nn.RMSNormOp):
        x, g = args
        k = shape_of(op.operands[0])[-1]
        ms = a.scale(a.reduce(a.mul(x, x), labels[-1], True), 1.0 / k)
        eps = attr_float(op, "epsilon")
        rs = a.fn("rsqrt", a.add(ms, a.const(eps)))
        return a.mul(a.mul(x, rs), g)
    return _elementwise(a, op, args)


def _elementwise(a: Algebra, op: Operation, args: list[int]) -> int:
    if type(op) in OPAQUE:
        return a.fn(OPAQUE[type(op)], args[0])
    match op:
        case nn.AddOp():
            return a.add(args[0], args[1])
        case nn.SubOp():
            return a.add(args[0], a.scale(args[1], -1.0))
        case nn.MulOp():
            return a.mul(args[0], args[1])
        case nn.DivOp():
            return a.mul(args[0], a.fn("recip", args[1]))
        case nn.SquareOp():
            return a.mul(args[0], args[0])
        case nn.NegOp():
            return a.scale(args[0], -1.0)
        case nn.ScaleOp():
            return a.scale(args[0], attr_float(op, "factor"))
    raise Unsupported(f"'{op.name}'")


def analyse(
    ops: Sequence[Operation], inputs: Sequence[SSAValue], outputs: Sequence[SSAValue]
) -> Problem:
    """The Problem of computing `outputs` from `inputs` with `ops` (in program order)."""
    for op in ops:
        if not isinstance(op, SUPPORTED):
            raise Unsupported(f"'{op.name}' is not modelled by the search")
        for v in (*op.operands, *op.results):
            if not shape_of(v):
                raise Unsupported("rank-0 tensors")
    u = _Unify()
    reduced_dims = {op: _unify_op(u, op) for op in ops}
    values = [*inputs, *(r for op in ops for r in op.results)]
    roots: dict[tuple[SSAValue, int], int] = {}
    labels: dict[SSAValue, tuple[int, ...]] = {}
    extents: dict[int, int] = {}
    for v in values:
        ls = []
        for d, size in enumerate(shape_of(v)):
            if size == 1:
                ls.append(UNIT)
                continue
            label = roots.setdefault(u.find((v, d)), len(roots))
            extents[label] = size
            ls.append(label)
        labels[v] = tuple(ls)
    reduced = {labels[op.operands[0]][d] for op, ds in reduced_dims.items() for d in ds}
    reduced.discard(UNIT)
    algebra = Algebra()
    names = [v.name_hint or f"arg{i}" for i, v in enumerate(inputs)]
    nf = {
        v: algebra.var(f"{n}#{i}", labels[v])
        for i, (v, n) in enumerate(zip(inputs, names, strict=True))
    }
    p = Problem(algebra, list(inputs), list(outputs), labels, extents, reduced, nf, names)
    for op in ops:
        p.nf[op.results[0]] = _expression(p, op, reduced_dims[op])
    if set(p.output_labels()) & reduced:
        raise Unsupported("an output dim is also reduced")
    return p


def function_problem(func: FuncOp) -> Problem:
    """The Problem of a whole function body."""
    ret = func.body.block.last_op
    if not isinstance(ret, ReturnOp):
        raise Unsupported("function without func.return")
    ops = [op for op in func.body.block.ops if op is not ret]
    return analyse(ops, list(func.body.block.args), list(ret.operands))
