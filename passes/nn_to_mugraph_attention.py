"""nn-to-mugraph's decode attention: split over the KV length with an online-softmax accumulator,
then a merge; the per-head ops feeding it and the new cache row run inside its blocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import TensorType, f32
from xdsl.ir import Attribute, Operation, SSAValue

from mk.dialects import nn
from mk.dialects.mugraph import GraphDefOp, PositionOp
from mk.dialects.mugraph_base import shape_of, tensor_type
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_tiles import (
    AccumSoftmaxOp,
    BinaryOp,
    MatmulOp,
    ReduceOp,
    RMSNormOp,
    RopeOp,
    UnaryOp,
)
from mk.passes.mugraph_fuse_loop import DEFAULT_FOLD_BYTES
from mk.passes.nn_to_mugraph_rules import (
    MASKED,
    MASKED_LIMIT,
    RowChain,
    Tiling,
    ValueMap,
    chunk_size,
    const,
    finish,
    head_view_source,
    maps_broadcast,
    new_builder,
    nn_attributes,
    nn_float,
    parts_at_most,
    reshape,
    table_map,
)

# A block of the split kernel is (KV head, split, batch row): how a [B, H, ...] operand's heads
# and rows follow the grid.
_HEAD_MAP = (1, -1, 0)
# With many queries (a prefill) a block is (KV head, query block, batch row) instead, its loop
# walking all the keys: q's and the result's query dim follow the grid's y.
_QUERY_MAP = (1, 2, 0)
# Rows (query heads of a KV head x queries) a block takes at most where there are many queries:
# the CUDA backend's block_attention holds 16 rows a warp, 128 a CTA.
Q_ROWS = 128


@dataclass(frozen=True)
class NewRow:
    """A one-row `nn.cache_write` along the keys' dim whose result only the attention reads.

    The attention reads the cache before the write and, at the write's index, the row itself:
    `chain` (the per-head RMSNorm and/or RoPE that made the row, left to its own kernel for the
    write) is recomputed in its blocks. So the attention waits for neither the row's kernel nor
    the write, and the write waits for the attention's reads instead (write-after-read)."""

    write: nn.CacheWriteOp
    chain: RowChain | None

    def view(self) -> Operation | None:
        """The head-splitting reshape in front of the row or its chain."""
        if self.chain is not None:
            return self.chain.view
        view = self.write.new.owner
        return view if isinstance(view, Operation) and head_view_source(view) else None

    def source(self) -> SSAValue:
        """What a block reads for its head's row: the chain's input, or the row (through a
        head-splitting reshape)."""
        if self.chain is not None:
            return self.chain.source()
        view = self.view()
        return view.operands[0] if view is not None else self.write.new


@dataclass(frozen=True)
class AttentionPlan:
    """An nn.attention and the ops folded into it.

    q_view: an nn.reshape [B, Hq·D] -> [B, Hq, 1, D] feeding q (the kernel reads its input and
    regroups the tile); q_chain instead: the per-head RMSNorm and/or RoPE of q (with such a
    reshape in front), computed by the attention's blocks; out_view: an nn.reshape [B, Hq, 1, D]
    -> [B, Hq·D] of the result (the kernel writes the merged heads directly); k_row / v_row: the
    new K / V row (`NewRow`). All only when Sq = 1.
    """

    op: nn.AttentionOp
    q_view: nn.ReshapeOp | None = None
    out_view: nn.ReshapeOp | None = None
    q_chain: RowChain | None = None
    k_row: NewRow | None = None
    v_row: NewRow | None = None

    def ops(self) -> list[Operation]:
        chain = self.q_chain.ops() if self.q_chain else []
        return [*chain, *(o for o in (self.q_view, self.op, self.out_view) if o is not None)]

    def result(self) -> SSAValue:
        return (self.out_view or self.op).results[0]

    def q_folded(self) -> bool:
        return self.q_view is not None or self.q_chain is not None

    def qkv_sources(self) -> tuple[SSAValue, SSAValue, SSAValue]:
        """The nn values the kernels read for q, k and v (k and v may be one value)."""
        op = self.op
        if self.q_chain is not None:
            q = self.q_chain.source()
        else:
            q = self.q_view.operands[0] if self.q_view else op.q
        k = self.k_row.write.cache if self.k_row else op.k
        v = self.v_row.write.cache if self.v_row else op.v
        return q, k, v

    def sources(self) -> list[SSAValue]:
        """The nn values the kernels read, each once, in operand order."""
        op = self.op
        values = [*self.qkv_sources(), *([op.kv_len] if op.kv_len else [])]
        values += _chain_operands(self.q_chain)
        for row in (self.k_row, self.v_row):
            if row is not None:
                values += [row.source(), row.write.index, *_chain_operands(row.chain)]
        return list(dict.fromkeys(values))

    def views(self) -> dict[SSAValue, SSAValue]:
        """The head-splitting reshapes read through, source to result: the kernel reads the
        result where the source's producer wrote it in the split layout instead."""
        views = [self.q_chain.view if self.q_chain else None]
        views += [row.view() for row in (self.k_row, self.v_row) if row is not None]
        return {v.operands[0]: v.results[0] for v in views if v is not None}


def _chain_operands(chain: RowChain | None) -> list[SSAValue]:
    if chain is None:
        return []
    weights = [chain.norm.operands[1]] if chain.norm else []
    return weights + (list(chain.rope.operands[1:]) if chain.rope else [])


def kv_splits(batch: int, q_heads: int, kv_heads: int, seq: int, d: int, t: Tiling) -> int:
    """How many ways to split the keys: blocks ≈ num_sms, each split at least kv_chunk long;
    at batch 1 at least two kv_chunks long and no more than lets mugraph-fuse-loop fold the
    merge into its consumer."""
    if t.kv_splits > 0:
        return parts_at_most(seq, t.kv_splits)
    target = max(1, t.num_sms // max(1, batch * kv_heads))
    splits = parts_at_most(seq, min(target, max(1, seq // max(1, t.kv_chunk))))
    if batch != 1:
        return splits
    # Without mugraph-split-loop every o-projection block merges every split: then at least two
    # chunks a split, so that it reads half as much, at the cost of half the blocks (H200,
    # bench/RESULTS.md session 55: qwen3-0.6b 1.100 against 1.110 ms/token with its 16 splits,
    # llama-3.2-1b 1.112 against 1.123). Split, a block merges one KV head's partials only.
    if not t.split_loop:
        splits = parts_at_most(seq, min(splits, max(1, seq // max(1, 2 * t.kv_chunk))))
    # A merge that does not fold is a phase of its own, with its hop, on every layer's critical
    # path: qwen3-8b's step took 5.29 ms/token with 8 splits (folded) against 5.44 with 16.
    # Where mugraph-split-loop gives each block `split_loop` KV heads' partials, mugraph-fuse-loop
    # bounds that share, and the bound here follows it: qwen3-8b then takes 16 splits (33 KB a
    # block), 4.819 against 4.839 ms/token with 8 on the H200 (bench/RESULTS.md, session 62).
    fitting = splits
    while fitting >= 4 and merge_share_bytes(fitting, q_heads, kv_heads, d, t) > DEFAULT_FOLD_BYTES:
        fitting = parts_at_most(seq, fitting // 2)
    return (
        fitting
        if merge_share_bytes(fitting, q_heads, kv_heads, d, t) <= DEFAULT_FOLD_BYTES
        else splits
    )


def merge_share_bytes(splits: int, q_heads: int, kv_heads: int, d: int, t: Tiling) -> int:
    """What one block of a folded batch-1 merge reads: all of it, or with mugraph-split-loop the
    partials of its `split_loop` KV heads."""
    whole = merge_input_bytes(splits, q_heads, d)
    if not t.split_loop or kv_heads < 1:
        return whole
    return whole * min(t.split_loop, kv_heads) // kv_heads


def merge_input_bytes(splits: int, q_heads: int, d: int) -> int:
    """What a batch-1 split-KV merge reads: each split's f32 output row and max and sum per head."""
    return splits * q_heads * (d + 2) * 4


@dataclass(frozen=True)
class _AttnShape:
    batch: int
    q_heads: int
    sq: int
    d: int
    kv_heads: int
    seq: int
    q_rows: int = 0  # queries a block takes (all of sq unless the grid splits them)

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def block_sq(self) -> int:
        return self.q_rows or self.sq

    @property
    def rows(self) -> int:
        return self.group * self.block_sq

    @property
    def q_blocked(self) -> bool:
        return self.block_sq < self.sq


class _Block:
    """A kernel's block-graph builder and the operand index of each nn value it reads."""

    def __init__(self, b: BlockGraphBuilder, sources: Sequence[SSAValue]) -> None:
        self.b = b
        self.index = {v: i for i, v in enumerate(sources)}
        self.tiles: dict[tuple[int, tuple[int, ...], int], SSAValue] = {}

    def input(self, value: SSAValue, imap: Sequence[int], fmap: int, name: str) -> SSAValue:
        """The tile of `value` under these maps, read once however often it is asked for."""
        key = (self.index[value], tuple(imap), fmap)
        if key not in self.tiles:
            self.tiles[key] = self.b.input(key[0], imap, fmap, name)
        return self.tiles[key]


def merge_block_width(plan: AttentionPlan, t: Tiling) -> int:
    """Columns one block of the merge writes of a [B, Hq·D] result (split keys; every batch
    row, up to t.merge_rows of them whose partials fit the fold), which a one-dim grid over the
    KV heads covers; 0 otherwise."""
    (bsz, hq, _, d), (_, hkv, seq, _) = shape_of(plan.op.q), shape_of(plan.op.k)
    if plan.out_view is None or bsz > t.merge_rows or hkv < 2:
        return 0
    splits = kv_splits(bsz, hq, hkv, seq, d, t)
    if splits < 2 or (bsz > 1 and bsz * merge_input_bytes(splits, hq, d) > DEFAULT_FOLD_BYTES):
        return 0
    return hq // hkv * d


def attention_kernels(
    plan: AttentionPlan, t: Tiling, lookup: ValueMap
) -> tuple[list[Operation], dict[SSAValue, SSAValue]]:
    op = plan.op
    (bsz, hq, sq, d), (_, hkv, seq, _) = shape_of(op.q), shape_of(op.k)
    q_rows = query_rows(plan, sq, hq // hkv)
    sh = _AttnShape(bsz, hq, sq, d, hkv, seq, q_rows)
    splits = 1 if sh.q_blocked else kv_splits(bsz, hq, hkv, seq, d, t)
    span = seq // splits
    forloop = span // chunk_size(span, t.kv_chunk)
    sources = plan.sources()
    operands = [_resolve(v, plan.views(), lookup) for v in sources]
    result = plan.result()
    name = result.name_hint or "att"
    if splits == 1:
        grid = (hkv, sq // sh.block_sq, bsz)
        b = new_builder(operands, [result.type], grid, 128, forloop, [name])
        out, peak, total = _split_block(_Block(b, sources), plan, sh)
        fin = _normalise(b, out, total, peak, tensor_type(result).element_type, "fin")
        _write_result(b, plan, sh, fin)
        kernel = finish(b, [name])
        return [kernel], {result: kernel.results[0]}
    o_type = TensorType(f32, (splits, bsz, hq, sq, d))
    ml_type = TensorType(f32, (splits, bsz, hq, sq, 1))
    b = new_builder(
        operands, [o_type, ml_type, ml_type], (hkv, splits, bsz), 128, forloop, ["o", "m", "l"]
    )
    out, peak, total = _split_block(_Block(b, sources), plan, sh)
    part = (1, 1, sh.group, sq)
    for i, (tile, last) in enumerate(((out, d), (peak, 1), (total, 1))):
        b.output(reshape(b, tile, (*part, last), f"{'oml'[i]}5"), i, (2, 0, 1))
    split = finish(b, [f"{name}_o", f"{name}_m", f"{name}_l"])
    rows = sh.batch if sh.batch > 1 and merge_block_width(plan, t) else 1
    merge = _merge_kernel(plan, sh, splits, list(split.results), name, rows)
    return [split, merge], {result: merge.results[0]}


def query_rows(plan: AttentionPlan, sq: int, group: int) -> int:
    """Queries one block takes: all of them, or where the group's rows for all of them are
    more than Q_ROWS (a prefill) the largest divisor of sq that keeps them within it, the grid
    walking the rest (the keys then not split). Only where no view, per-head chain or new cache
    row is folded in, and the result is not a merged-head view."""
    folded = plan.q_folded() or plan.k_row is not None or plan.v_row is not None
    if sq * group <= Q_ROWS or folded or plan.out_view is not None:
        return sq
    return parts_at_most(sq, max(1, Q_ROWS // group))


def _resolve(value: SSAValue, views: dict[SSAValue, SSAValue], lookup: ValueMap) -> SSAValue:
    """The kernel operand for an nn value: its replacement, or the replacement of the head view
    of it that its producer wrote instead (a [B, H, 1, D] tile reads the same heads)."""
    new = lookup(value)
    if new is value and isinstance(value.owner, Operation) and value in views:
        new = lookup(views[value])
    return new


def _split_block(blk: _Block, plan: AttentionPlan, sh: _AttnShape) -> tuple[SSAValue, ...]:
    """Scores of one KV chunk, masked and scaled, into the online-softmax accumulator."""
    b, op = blk.b, plan.op
    q_source, k_source, v_source = plan.qkv_sources()
    qt = blk.input(q_source, _QUERY_MAP if sh.q_blocked else _HEAD_MAP, -1, "qt")
    if plan.q_chain is not None:
        qt = _apply_chain(blk, plan.q_chain, qt, (1, sh.group, 1, sh.d), "q")
    q2 = reshape(b, qt, (sh.rows, sh.d), "q2")
    kv_map = _HEAD_MAP if sh.q_blocked else (1, 2, 0)  # all keys, or the block's split
    kt = blk.input(k_source, kv_map, 2, "kt")
    vt = blk.input(v_source, kv_map, 2, "vt")
    ks = _with_new_row(blk, plan.k_row, kt, sh, "k")
    vs = _with_new_row(blk, plan.v_row, vt, sh, "v")
    chunk = shape_of(kt)[2]
    k2 = reshape(b, ks, (chunk, sh.d), "k2")
    v2 = reshape(b, vs, (chunk, sh.d), "v2")
    s = b.add(MatmulOp(q2, k2, transpose_b=True), "s").res
    scale = nn_float(op, "scale")
    causal = bool(nn_attributes(op)["causal"].value.data)  # type: ignore[union-attr]
    if op.kv_len is None and not causal:
        ss = b.add(UnaryOp("scale", s, factor=scale), "ss").res
    else:
        ss = _masked_scores(blk, plan, sh, s, qt, kt, scale, causal)
    out, peak, total = b.add(AccumSoftmaxOp(ss, v2), "ot", "mt", "lt").results
    return out, peak, total


def _apply_chain(
    blk: _Block, chain: RowChain, tile: SSAValue, shape: tuple[int, ...], name: str
) -> SSAValue:
    """A block's heads of a row chain's result, [1, G, 1, D], from its heads of the chain's
    input: the norm and RoPE as the chain's own kernel computes them, rounded at the end."""
    b = blk.b
    full = shape_of(chain.last().results[0])
    elem = tensor_type(chain.last().results[0]).element_type
    xt = reshape(b, tile, shape, f"{name}xv")
    if chain.norm is not None:
        wt = blk.input(chain.norm.operands[1], (-1, -1, -1), -1, f"{name}w")
        epsilon = nn.attribute_values(chain.norm)["epsilon"]
        assert isinstance(epsilon, float)
        last = f32 if chain.rope is not None else elem
        xt = b.add(RMSNormOp(xt, wt, epsilon, last), f"{name}n").res
    if chain.rope is not None:
        cos, sin = (
            blk.input(v, table_map(shape_of(v), full, _HEAD_MAP), -1, f"{name}{label}")
            for v, label in zip(chain.rope.operands[1:], ("c", "s"), strict=True)
        )
        xt = b.add(RopeOp(xt, cos, sin, elem), f"{name}rot").res
    return xt


def _with_new_row(
    blk: _Block, row: NewRow | None, tile: SSAValue, sh: _AttnShape, name: str
) -> SSAValue:
    """A K or V chunk of the cache before the write, with the new row at the write's index."""
    if row is None:
        return tile
    b = blk.b
    new = blk.input(row.source(), _HEAD_MAP, -1, f"{name}new")
    if row.chain is not None:
        new = _apply_chain(blk, row.chain, new, (1, 1, 1, sh.d), f"{name}n")
    new = reshape(b, new, (1, 1, 1, sh.d), f"{name}row")
    index = row.write.index
    at = blk.input(index, (-1, -1, 0) if shape_of(index)[0] > 1 else (-1, -1, -1), -1, f"{name}at")
    pos = b.add(PositionOp(tile, 2), f"{name}pos").res

    def body(p: SSAValue, i: SSAValue, fresh: SSAValue, old: SSAValue) -> list[SSAValue]:
        return [arith.SelectOp(arith.CmpiOp(p, i, "eq").result, fresh, old).result]

    return b.thread_map([pos, at, new, tile], [tile.type], body, f"{name}sel").res[0]


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
    blk: _Block, plan: AttentionPlan, sh: _AttnShape, s: SSAValue, qt: SSAValue,
    kt: SSAValue, scale: float, causal: bool,
) -> SSAValue:  # fmt: skip
    """scale·s where the key is visible (before kv_len; causal: at or before the query's
    position kv_len − Sq + i), MASKED elsewhere."""
    b = blk.b
    chunk = shape_of(kt)[2]
    args = [s, _positions(b, kt, 2, (1, chunk), "kp")]
    with_q = causal and not plan.q_folded()
    if with_q:
        args.append(_positions(b, qt, 2, (sh.rows, 1), "qp"))
    has_len = plan.op.kv_len is not None
    if plan.op.kv_len is not None:
        args.append(blk.input(plan.op.kv_len, (-1, -1, 0), -1, "lent"))

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


def _write_result(
    b: BlockGraphBuilder, plan: AttentionPlan, sh: _AttnShape, fin: SSAValue, rows: int = 1
) -> None:
    """Write a block's [G·Sq, D] (or [1, G, Sq, D]) result tile, merging heads when folded;
    `rows` > 1: the block holds every batch row ([B, G·D], a merge cut for the fold)."""
    if plan.out_view is not None:
        tile = reshape(b, fin, (rows, sh.group * sh.d), "fin2")
    else:
        tile = reshape(b, fin, (1, sh.group, sh.block_sq, sh.d), "fin4")
    omap = _QUERY_MAP if sh.q_blocked else _HEAD_MAP
    b.output(tile, 0, (1, -1, -1) if rows > 1 else omap)


def _merge_kernel(
    plan: AttentionPlan,
    sh: _AttnShape,
    splits: int,
    parts: list[SSAValue],
    name: str,
    rows: int = 1,
) -> GraphDefOp:
    """Combine the split partials: weights e^(m_i − max m), o = Σ w·o_i / Σ w·l_i. A block per
    KV head and batch row, or with `rows` (the batch) a block per KV head taking all rows."""
    result = plan.result()
    grid = (sh.kv_heads, 1, 1 if rows > 1 else sh.batch)
    b = new_builder(parts, [result.type], grid, 128, 1, [name])
    imap = (2, -1, -1 if rows > 1 else 1)
    op_, mp, lp = (b.input(i, imap, -1, n) for i, n in enumerate(("op", "mp", "lp")))
    mx = b.add(ReduceOp("max", mp, 0, keepdim=True), "mx").res
    w = b.thread_map(
        [mp, mx], [mp.type], lambda mi, mm: [mathd.ExpOp(arith.SubfOp(mi, mm).result).result], "w"
    ).res[0]
    lsum = b.add(ReduceOp("sum", b.add(BinaryOp("mul", lp, w), "lw").res, 0), "lsum").res
    osum = b.add(ReduceOp("sum", b.add(BinaryOp("mul", op_, w), "ow").res, 0), "osum").res
    mx4 = reshape(b, mx, shape_of(lsum), "mx4")
    fin = _normalise(b, osum, lsum, mx4, tensor_type(result).element_type, "fin")
    _write_result(b, plan, sh, fin, rows)
    return finish(b, [name])
