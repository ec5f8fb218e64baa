"""Kernel builders of nn-to-mugraph: library kernels, scalar epilogues and the shared tiling choices."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import FloatAttr, TensorType, f32, i32
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import IRDLOperation

from mk.dialects import nn
from mk.dialects.mugraph import ArgmaxOp, GraphDefOp, KernelOp, PositionOp
from mk.dialects.mugraph_base import shape_of, tensor_type
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_maps import broadcast_shapes
from mk.dialects.mugraph_tiles import (
    AccumSoftmaxOp,
    BinaryOp,
    MatmulOp,
    ReduceOp,
    ReshapeOp,
    RMSNormOp,
    RopeOp,
    UnaryOp,
)

# A masked score: finite so that e^(masked - m) is exactly 0 once any real score is seen, and a
# fully masked row never produces inf - inf; the merge turns rows whose max stayed here into 0.
MASKED = -1.0e30
MASKED_LIMIT = -1.0e29

ValueMap = Callable[[SSAValue], SSAValue]
# New ops, and the new value standing for each nn value they replace.
Emitted = tuple[list[Operation], dict[SSAValue, SSAValue]]


DEFAULT_TILE_N = 64


@dataclass(frozen=True)
class Tiling:
    """The pass options every rule reads."""

    num_sms: int = 132
    tile_n: int = DEFAULT_TILE_N  # 0: fit the SMs' waves
    tile_k: int = 64
    kv_chunk: int = 64
    kv_splits: int = 0
    tile_m: int = 64  # rows per block before the linear family also splits rows
    k_splits: int = 1  # linear family: splits of K; 0 chooses blocks ≈ num_sms, 1 never splits


def chunk_size(extent: int, want: int) -> int:
    """The largest divisor of `extent` that is <= `want`; the whole extent when that divisor is
    at most half of `want` (e.g. a prime extent), where splitting would only add overhead."""
    want = max(1, want)
    if extent <= want:
        return max(extent, 1)
    best = max(d for d in range(1, want + 1) if extent % d == 0)
    return best if best * 2 > want else extent


def parts_at_most(extent: int, most: int) -> int:
    """The largest divisor of `extent` that is <= `most` (at least 1)."""
    return max(d for d in range(1, max(1, min(extent, most)) + 1) if extent % d == 0)


def name_of(value: SSAValue, suffix: str = "") -> str:
    base = value.name_hint or "v"
    return f"{base}{suffix}"


def new_builder(
    operands: Sequence[SSAValue],
    result_types: Sequence[Attribute],
    grid: Sequence[int],
    threads: int,
    forloop: int,
    result_names: Sequence[str],
) -> BlockGraphBuilder:
    """A block-graph builder whose block arguments are named after the kernel's values."""
    return BlockGraphBuilder(
        operands,
        result_types,
        grid=grid,
        threads=threads,
        forloop=forloop,
        arg_names=[f"{name_of(v)}_a" for v in operands],
        result_names=[f"{n}_r" for n in result_names],
    )


class Operands:
    """The distinct operands of a kernel, each kernel operand read once however often it is used."""

    def __init__(self) -> None:
        self.values: list[SSAValue] = []

    def index(self, value: SSAValue) -> int:
        if value not in self.values:
            self.values.append(value)
        return self.values.index(value)


def reshape(b: BlockGraphBuilder, tile: SSAValue, shape: Sequence[int], name: str) -> SSAValue:
    if shape_of(tile) == tuple(shape):
        return tile
    return b.add(ReshapeOp(tile, shape), name).res


# ------------------------------------------------------------------------------------------------
# Library kernels
# ------------------------------------------------------------------------------------------------


def nn_attributes(op: Operation) -> dict[str, Attribute]:
    """The nn op's properties with defaults filled in: the library kernel's attributes."""
    attrs: dict[str, Attribute] = {}
    assert isinstance(op, IRDLOperation)
    for name, definition in type(op).get_irdl_definition().properties.items():
        attr = op.properties.get(name, definition.default_value)
        if attr is not None:
            attrs[name] = attr
    return attrs


def library_kernel(op: Operation, lookup: ValueMap) -> KernelOp:
    """`mugraph.kernel "<kind>"` running the nn op as a pre-written tile program."""
    kind = op.name.removeprefix("nn.")
    kernel = KernelOp(
        kind, [lookup(v) for v in op.operands], [r.type for r in op.results], nn_attributes(op)
    )
    for new, old in zip(kernel.results, op.results, strict=True):
        new.name_hint = old.name_hint
    return kernel


# ------------------------------------------------------------------------------------------------
# Scalar epilogues: nn elementwise ops as arith/math on one element (a thread_map body)
# ------------------------------------------------------------------------------------------------


def const(value: float) -> SSAValue:
    return arith.ConstantOp(FloatAttr(value, f32)).result


def _sigmoid(x: SSAValue) -> SSAValue:
    e = mathd.ExpOp(arith.NegfOp(x).result).result
    return arith.DivfOp(const(1.0), arith.AddfOp(const(1.0), e).result).result


def _gelu(x: SSAValue) -> SSAValue:
    t = mathd.ErfOp(arith.MulfOp(x, const(1.0 / math.sqrt(2.0))).result).result
    half_x = arith.MulfOp(x, const(0.5)).result
    return arith.MulfOp(half_x, arith.AddfOp(const(1.0), t).result).result


def _scalar_unary(op: Operation, x: SSAValue) -> SSAValue:
    match op:
        case nn.ExpOp():
            return mathd.ExpOp(x).result
        case nn.SqrtOp():
            return mathd.SqrtOp(x).result
        case nn.RsqrtOp():
            return mathd.RsqrtOp(x).result
        case nn.SquareOp():
            return arith.MulfOp(x, x).result
        case nn.NegOp():
            return arith.NegfOp(x).result
        case nn.ReluOp():
            return arith.MaximumfOp(x, const(0.0)).result
        case nn.SigmoidOp():
            return _sigmoid(x)
        case nn.SiluOp():
            return arith.MulfOp(x, _sigmoid(x)).result
        case nn.GeluOp():
            return _gelu(x)
        case nn.ScaleOp():
            return arith.MulfOp(x, const(nn_float(op, "factor"))).result
    raise AssertionError(f"no scalar form for {op.name}")


_SCALAR_BINARY: dict[type[Operation], Callable[[SSAValue, SSAValue], Operation]] = {
    nn.AddOp: arith.AddfOp,
    nn.SubOp: arith.SubfOp,
    nn.MulOp: arith.MulfOp,
    nn.DivOp: arith.DivfOp,
    nn.MaximumOp: arith.MaximumfOp,
}

ELEMENTWISE_OPS = (*nn.UNARY_OPS, *nn.BINARY_OPS)


def nn_float(op: Operation, name: str) -> float:
    attr = nn_attributes(op)[name]
    assert isinstance(attr, FloatAttr)
    return float(attr.value.data)


def scalar_op(op: Operation, operands: Sequence[SSAValue]) -> SSAValue:
    """The scalar value of one nn elementwise op, built where an ImplicitBuilder is active."""
    if isinstance(op, nn.UNARY_OPS):
        return _scalar_unary(op, operands[0])
    return _SCALAR_BINARY[type(op)](operands[0], operands[1]).results[0]


def run_scalar_chain(
    env: dict[SSAValue, SSAValue], ops: Sequence[Operation], outputs: Sequence[SSAValue]
) -> list[SSAValue]:
    """Scalar values of `outputs`, computing `ops` in order from the leaves already in `env`."""
    for op in ops:
        env[op.results[0]] = scalar_op(op, [env[v] for v in op.operands])
    return [env[v] for v in outputs]


def finish(b: BlockGraphBuilder, names: Sequence[str]) -> GraphDefOp:
    kernel = b.finish()
    for r, n in zip(kernel.results, names, strict=True):
        r.name_hint = n
    return kernel


# ------------------------------------------------------------------------------------------------
# Argmax: partial argmax per column chunk, then a reduce kernel over the partials
# ------------------------------------------------------------------------------------------------


def argmax_parts(n: int, t: Tiling) -> int:
    """Chunks of the reduced dim: about num_sms of them, each at least 256 wide."""
    want = max(256, -(-n // max(1, t.num_sms)))
    chunk = min(d for d in range(1, n + 1) if n % d == 0 and d >= min(want, n))
    return n // chunk


def argmax_kernels(op: Operation, t: Tiling, lookup: ValueMap) -> list[Operation]:
    """Two graph_defs: each block of the first finds the max of its chunk and its global index
    (partials with a trailing dim indexed by grid x); the second picks the first best partial."""
    x, res = op.operands[0], op.results[0]
    shape = shape_of(x)
    r, parts = len(shape), argmax_parts(shape[-1], t)
    lead = shape[:-1]
    pv_type, pi_type = TensorType(f32, (*lead, parts)), TensorType(i32, (*lead, parts))
    name = res.name_hint or "idx"
    b = new_builder([lookup(x)], [pv_type, pi_type], (parts, 1, 1), 128, 1, ["pv", "pi"])
    xt = b.input(0, (r - 1, -1, -1), -1, "xt")
    pos = b.add(PositionOp(xt, r - 1), "pos").res
    mv, mi = b.add(ArgmaxOp(xt, pos, r - 1), "mv", "mi").results
    b.output(mv, 0, (r - 1, -1, -1))
    b.output(mi, 1, (r - 1, -1, -1))
    partial = finish(b, [f"{name}_pv", f"{name}_pi"])
    rows = shape[0] if r >= 2 else 1
    imap = (0, -1, -1) if r >= 2 else (-1, -1, -1)
    b = new_builder(list(partial.results), [res.type], (rows, 1, 1), 32, 1, [name])
    vt = b.input(0, imap, -1, "vt")
    it = b.input(1, imap, -1, "it")
    _, bi = b.add(ArgmaxOp(vt, it, r - 1), "bv", "bi").results
    out_shape = (1, *lead[1:]) if r >= 2 else ()
    b.output(reshape(b, bi, out_shape, "id"), 0, imap)
    return [partial, finish(b, [name])]


# ------------------------------------------------------------------------------------------------
# RMSNorm on its own (e.g. QK-norm per head): one block per row, not one task for all rows
# ------------------------------------------------------------------------------------------------


def row_dims(shape: Sequence[int]) -> list[int]:
    """The (at most two) largest leading dims a standalone RMSNorm spreads over blocks."""
    lead = [d for d in range(len(shape) - 1) if shape[d] > 1]
    return sorted(sorted(lead, key=lambda d: (-shape[d], d))[:2])


def head_view_source(view: Operation) -> SSAValue | None:
    """The source of a reshape [..., H·D] -> [..., H, 1, ..., D] (heads split off the last dim)."""
    if not isinstance(view, nn.ReshapeOp):
        return None
    src, out = shape_of(view.operands[0]), shape_of(view.results[0])
    lead = len(src) - 1
    tail = out[lead:]
    if out[:lead] != src[:lead] or len(tail) < 2 or any(d != 1 for d in tail[1:-1]):
        return None
    return view.operands[0] if tail[0] * tail[-1] == src[-1] else None


@dataclass(frozen=True)
class RowChain:
    """Per-row ops fused into one graph_def with one block per row group: an optional
    head-splitting reshape (read through), an optional standalone RMSNorm, an optional RoPE."""

    view: Operation | None
    norm: Operation | None
    rope: Operation | None

    def ops(self) -> list[Operation]:
        return [op for op in (self.view, self.norm, self.rope) if op is not None]

    def last(self) -> Operation:
        last = self.rope or self.norm
        assert last is not None
        return last

    def source(self) -> SSAValue:
        first = self.ops()[0]
        return first.operands[0]


def _table_map(table: Sequence[int], shape: Sequence[int], omap: Sequence[int]) -> tuple[int, ...]:
    """A broadcast operand's imap: a grid axis maps to its aligned dim unless that is 1."""
    shift = len(shape) - len(table)
    return tuple(d - shift if d >= shift and table[d - shift] > 1 else -1 for d in omap)


def row_chain_kernel(chain: RowChain, lookup: ValueMap) -> list[Operation]:
    """Each block reads its rows (through a head-splitting reshape, as a tile reshape), then
    normalises them and/or rotates them; nothing is rounded between the fused ops."""
    res = chain.last().results[0]
    shape = shape_of(res)
    dims = row_dims(shape)
    grid = tuple(shape[d] for d in dims) + (1,) * (3 - len(dims))
    omap = tuple(dims) + (-1,) * (3 - len(dims))
    read = chain.source()
    lead = len(shape_of(read)) - 1
    operands = [read]
    if chain.norm is not None:
        operands.append(chain.norm.operands[1])
    if chain.rope is not None:
        operands += list(chain.rope.operands[1:])
    name = res.name_hint or "y"
    b = new_builder([lookup(v) for v in operands], [res.type], grid, 128, 1, [name])
    imap = tuple(min(d, lead) if d >= 0 else -1 for d in omap)
    tile = tuple(n // grid[dims.index(d)] if d in dims else n for d, n in enumerate(shape))
    xt = reshape(b, b.input(0, imap, -1, f"{name}_x"), tile, f"{name}_xv")
    k = 1
    if chain.norm is not None:
        wt = b.input(k, (-1, -1, -1), -1, f"{name}_w")
        epsilon = nn.attribute_values(chain.norm)["epsilon"]
        assert isinstance(epsilon, float)
        xt = b.add(RMSNormOp(xt, wt, epsilon), f"{name}_n").res
        k += 1
    if chain.rope is not None:
        cos, sin = (
            b.input(k + i, _table_map(shape_of(t), shape, omap), -1, f"{name}_{label}")
            for i, (t, label) in enumerate(zip(chain.rope.operands[1:], ("c", "s"), strict=True))
        )
        xt = b.add(RopeOp(xt, cos, sin), f"{name}_rot").res
    b.output(xt, 0, omap)
    return [finish(b, [name])]


# ------------------------------------------------------------------------------------------------
# Decode attention: split over the KV length with an online-softmax accumulator, then a merge
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionPlan:
    """An nn.attention and the layout ops folded into its maps.

    q_view: an nn.reshape [B, Hq·D] -> [B, Hq, 1, D] feeding q (the kernel reads its input and
    regroups the tile); out_view: an nn.reshape [B, Hq, 1, D] -> [B, Hq·D] of the result (the
    kernel writes the merged heads directly). Both only when Sq = 1.
    """

    op: nn.AttentionOp
    q_view: nn.ReshapeOp | None = None
    out_view: nn.ReshapeOp | None = None

    def ops(self) -> list[Operation]:
        return [o for o in (self.q_view, self.op, self.out_view) if o is not None]

    def result(self) -> SSAValue:
        return (self.out_view or self.op).results[0]


def kv_splits(batch: int, kv_heads: int, seq: int, t: Tiling) -> int:
    """How many ways to split the keys: blocks ≈ num_sms, each split at least kv_chunk long."""
    if t.kv_splits > 0:
        return parts_at_most(seq, t.kv_splits)
    target = max(1, t.num_sms // max(1, batch * kv_heads))
    return parts_at_most(seq, min(target, max(1, seq // max(1, t.kv_chunk))))


@dataclass(frozen=True)
class _AttnShape:
    batch: int
    q_heads: int
    sq: int
    d: int
    kv_heads: int
    seq: int

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def rows(self) -> int:
        return self.group * self.sq


def merge_block_width(plan: AttentionPlan, t: Tiling) -> int:
    """Columns one block of the merge writes of a [1, Hq·D] result (one batch row, split
    keys), which a one-dim grid covers; 0 otherwise."""
    (bsz, hq, _, d), (_, hkv, seq, _) = shape_of(plan.op.q), shape_of(plan.op.k)
    if plan.out_view is None or bsz != 1 or hkv < 2 or kv_splits(bsz, hkv, seq, t) < 2:
        return 0
    return hq // hkv * d


def attention_kernels(
    plan: AttentionPlan, t: Tiling, lookup: ValueMap
) -> tuple[list[Operation], dict[SSAValue, SSAValue]]:
    op = plan.op
    (bsz, hq, sq, d), (_, hkv, seq, _) = shape_of(op.q), shape_of(op.k)
    sh = _AttnShape(bsz, hq, sq, d, hkv, seq)
    splits = kv_splits(bsz, hkv, seq, t)
    span = seq // splits
    forloop = span // chunk_size(span, t.kv_chunk)
    q_src = plan.q_view.operands[0] if plan.q_view else op.q
    sources = [q_src, op.k, op.v, *([op.kv_len] if op.kv_len else [])]
    result = plan.result()
    name = result.name_hint or "att"
    if splits == 1:
        b = new_builder(
            [lookup(v) for v in sources], [result.type], (hkv, 1, bsz), 128, forloop, [name]
        )
        out, peak, total = _split_block(b, plan, sh)
        fin = _normalise(b, out, total, peak, tensor_type(result).element_type, "fin")
        _write_result(b, plan, sh, fin)
        kernel = finish(b, [name])
        return [kernel], {result: kernel.results[0]}
    o_type = TensorType(f32, (splits, bsz, hq, sq, d))
    ml_type = TensorType(f32, (splits, bsz, hq, sq, 1))
    b = new_builder(
        [lookup(v) for v in sources], [o_type, ml_type, ml_type], (hkv, splits, bsz), 128, forloop,
        ["o", "m", "l"],
    )  # fmt: skip
    out, peak, total = _split_block(b, plan, sh)
    part = (1, 1, sh.group, sq)
    for i, (tile, last) in enumerate(((out, d), (peak, 1), (total, 1))):
        b.output(reshape(b, tile, (*part, last), f"{'oml'[i]}5"), i, (2, 0, 1))
    split = finish(b, [f"{name}_o", f"{name}_m", f"{name}_l"])
    merge = _merge_kernel(plan, sh, splits, list(split.results), name)
    return [split, merge], {result: merge.results[0]}


def _split_block(
    b: BlockGraphBuilder, plan: AttentionPlan, sh: _AttnShape
) -> tuple[SSAValue, SSAValue, SSAValue]:
    """Scores of one KV chunk, masked and scaled, into the online-softmax accumulator."""
    op = plan.op
    qt = b.input(0, (1, -1, 0), -1, "qt")
    q2 = reshape(b, qt, (sh.rows, sh.d), "q2")
    kt = b.input(1, (1, 2, 0), 2, "kt")
    vt = b.input(2, (1, 2, 0), 2, "vt")
    chunk = shape_of(kt)[2]
    k2 = reshape(b, kt, (chunk, sh.d), "k2")
    v2 = reshape(b, vt, (chunk, sh.d), "v2")
    s = b.add(MatmulOp(q2, k2, transpose_b=True), "s").res
    scale = nn_float(op, "scale")
    causal = bool(nn_attributes(op)["causal"].value.data)  # type: ignore[union-attr]
    if op.kv_len is None and not causal:
        ss = b.add(UnaryOp("scale", s, factor=scale), "ss").res
    else:
        ss = _masked_scores(b, plan, sh, s, qt, kt, scale, causal)
    out, peak, total = b.add(AccumSoftmaxOp(ss, v2), "ot", "mt", "lt").results
    return out, peak, total


def _positions(
    b: BlockGraphBuilder, tile: SSAValue, dim: int, shape: Sequence[int], name: str
) -> SSAValue:
    """Positions along `dim` of an input tile as an f32 tile of `shape` (one per row/key)."""
    pos = b.add(PositionOp(tile, dim), f"{name}i").res
    as_f32 = TensorType(f32, shape_of(pos))
    pf = b.thread_map([pos], [as_f32], lambda p: [arith.SIToFPOp(p, f32).result], f"{name}f").res[0]
    last = len(shape_of(pos)) - 1
    red = b.add(ReduceOp("max", pf, last), f"{name}r").res
    return reshape(b, red, shape, name)


def _masked_scores(
    b: BlockGraphBuilder, plan: AttentionPlan, sh: _AttnShape, s: SSAValue, qt: SSAValue,
    kt: SSAValue, scale: float, causal: bool,
) -> SSAValue:  # fmt: skip
    """scale·s where the key is visible (before kv_len; causal: at or before the query's
    position kv_len − Sq + i), MASKED elsewhere."""
    chunk = shape_of(kt)[2]
    args = [s, _positions(b, kt, 2, (1, chunk), "kp")]
    if causal:
        if plan.q_view is None:
            args.append(_positions(b, qt, 2, (sh.rows, 1), "qp"))
    has_len = plan.op.kv_len is not None
    if has_len:
        args.append(b.input(3, (-1, -1, 0), -1, "lent"))
    with_q = causal and plan.q_view is None

    def body(*x: SSAValue) -> list[SSAValue]:
        length = arith.SIToFPOp(x[-1], f32).result if has_len else const(float(sh.seq))
        visible = arith.CmpfOp(x[1], length, "olt").result
        if causal:
            qi = x[2] if with_q else const(0.0)
            qpos = arith.AddfOp(arith.SubfOp(length, const(float(sh.sq))).result, qi).result
            visible = arith.AndIOp(visible, arith.CmpfOp(x[1], qpos, "ole").result).result
        scaled = arith.MulfOp(x[0], const(scale)).result
        return [arith.SelectOp(visible, scaled, const(MASKED)).result]

    return b.thread_map(args, [s.type], body, "ss").res[0]


def _normalise(
    b: BlockGraphBuilder,
    out: SSAValue,
    total: SSAValue,
    peak: SSAValue,
    elem: Attribute,
    name: str,
) -> SSAValue:
    """out / total, or 0 for a row that saw no visible key (its max stayed MASKED)."""
    shape = maps_broadcast(shape_of(out), shape_of(total))

    def body(ov: SSAValue, lv: SSAValue, mv: SSAValue) -> list[SSAValue]:
        empty = arith.CmpfOp(mv, const(MASKED_LIMIT), "olt").result
        return [arith.SelectOp(empty, const(0.0), arith.DivfOp(ov, lv).result).result]

    return b.thread_map([out, total, peak], [TensorType(elem, shape)], body, name).res[0]


def maps_broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    shape = broadcast_shapes(*shapes)
    assert shape is not None
    return shape


def _write_result(b: BlockGraphBuilder, plan: AttentionPlan, sh: _AttnShape, fin: SSAValue) -> None:
    """Write a block's [G·Sq, D] (or [1, G, Sq, D]) result tile, merging heads when folded."""
    if plan.out_view is not None:
        tile = reshape(b, fin, (1, sh.group * sh.d), "fin2")
    else:
        tile = reshape(b, fin, (1, sh.group, sh.sq, sh.d), "fin4")
    b.output(tile, 0, (1, -1, 0))


def _merge_kernel(
    plan: AttentionPlan, sh: _AttnShape, splits: int, parts: list[SSAValue], name: str
) -> GraphDefOp:
    """Combine the split partials: weights e^(m_i − max m), o = Σ w·o_i / Σ w·l_i."""
    result = plan.result()
    b = new_builder(parts, [result.type], (sh.kv_heads, 1, sh.batch), 128, 1, [name])
    imap = (2, -1, 1)
    op_, mp, lp = (b.input(i, imap, -1, n) for i, n in enumerate(("op", "mp", "lp")))
    mx = b.add(ReduceOp("max", mp, 0, keepdim=True), "mx").res
    w = b.thread_map(
        [mp, mx], [mp.type], lambda mi, mm: [mathd.ExpOp(arith.SubfOp(mi, mm).result).result], "w"
    ).res[0]
    lsum = b.add(ReduceOp("sum", b.add(BinaryOp("mul", lp, w), "lw").res, 0), "lsum").res
    osum = b.add(ReduceOp("sum", b.add(BinaryOp("mul", op_, w), "ow").res, 0), "osum").res
    mx4 = reshape(b, mx, shape_of(lsum), "mx4")
    fin = _normalise(b, osum, lsum, mx4, tensor_type(result).element_type, "fin")
    _write_result(b, plan, sh, fin)
    return finish(b, [name])
