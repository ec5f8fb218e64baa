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
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_maps import broadcast_shapes
from mk.dialects.mugraph_tiles import (
    ReshapeOp,
    RMSNormOp,
    RopeOp,
)
from mk.passes.mugraph_fuse_epilogue import plain_writer

# A masked score: finite so that e^(masked - m) is exactly 0 once any real score is seen, and a
# fully masked row never produces inf - inf; the merge turns rows whose max stayed here into 0.
MASKED = -1.0e30
MASKED_LIMIT = -1.0e29

ValueMap = Callable[[SSAValue], SSAValue]
# New ops, and the new value standing for each nn value they replace.
Emitted = tuple[list[Operation], dict[SSAValue, SSAValue]]


DEFAULT_TILE_N = 64
DEFAULT_TILE_M = 64


@dataclass(frozen=True)
class Tiling:
    """The pass options every rule reads."""

    num_sms: int = 132
    tile_n: int = DEFAULT_TILE_N  # 0: fit the SMs' waves
    tile_k: int = 64
    kv_chunk: int = 64
    kv_splits: int = 0
    tile_m: int = 0  # rows per block before ops over rows split them; 0: row_tile()
    k_splits: int = 1  # linear family: splits of K; 0 chooses blocks ≈ num_sms, 1 never splits
    # decode attention folds q chain + new K/V rows (1), rows only (2), rows as made (3)
    attention_fold: int = 1
    task_us: int = 3  # tile_n 0: a linear task's fixed cost in the wave model (0: fill only)
    norm_rows: int = 16  # an RMSNorm fuses into its linears up to this many rows (0: any count)
    merge_rows: int = 1  # decode attention's merge folds into the o-projection up to this batch
    split_loop: int = 1  # mugraph-split-loop will split the folded merge's loop (kv_splits)
    gather_pairs: int = 1  # an embedding of ids an embedding picks is one kernel (1) or two (0)
    cache_rows: int = 1  # a cache write's head-split rows: copy blocks per head (1) or one task (0)

    def row_tile(self) -> int:
        """Rows per block (tile_m, else DEFAULT_TILE_M); a linear of many rows may take more
        (nn_to_mugraph_groups.WIDE_TILE)."""
        return self.tile_m or DEFAULT_TILE_M


def chunk_size(extent: int, want: int) -> int:
    """The largest divisor of `extent` that is <= `want`; the whole extent when that divisor is
    at most half of `want` (e.g. a prime extent), where splitting would only add overhead."""
    want = max(1, want)
    if extent <= want:
        return max(extent, 1)
    best = max(d for d in range(1, want + 1) if extent % d == 0)
    return best if best * 2 > want else extent


def rows_cut_well(rows: int, tile: int = DEFAULT_TILE_M) -> bool:
    """Whether blocks of rows (a prefill's positions) find a divisor that cuts them near `tile`:
    at most one block, or chunk_size cuts them. Otherwise every kernel over them takes all the
    rows in one block (a prime count: no tensor-core tile, one query row an attention block)."""
    return rows <= tile or chunk_size(rows, tile) < rows


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
    kernel.location = op.location  # a run-time failure names the op's line
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


def producer_parts(x: SSAValue) -> int | None:
    """The blocks along grid x of the graph_def that writes `x` split only its last dim into,
    so that a partial argmax takes each block's tile (mugraph-fuse-epilogue then runs it in
    that block); None for any other producer."""
    g = x.owner
    if not isinstance(g, GraphDefOp):
        return None
    out = plain_writer(g, g.res.index(x))
    grid, last = g.grid_shape(), len(shape_of(x)) - 1
    if out is None or out.omap_dims() != (last, -1, -1) or grid[1:] != (1, 1) or grid[0] < 2:
        return None
    return grid[0]


def argmax_kernels(
    op: Operation, t: Tiling, lookup: ValueMap, view: TensorType | None = None
) -> list[Operation]:
    """Two graph_defs: each block of the first finds the max of its chunk and its global index
    (partials with a trailing dim indexed by grid x); the second picks the first best partial.
    `view`: [1, B] for a [B] result seen through a reshape, written as that by the second."""
    x, res = op.operands[0], op.results[0]
    shape = shape_of(x)
    r = len(shape)
    parts = producer_parts(lookup(x)) or argmax_parts(shape[-1], t)
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
    b = new_builder(list(partial.results), [view or res.type], (rows, 1, 1), 32, 1, [name])
    vt = b.input(0, imap, -1, "vt")
    it = b.input(1, imap, -1, "it")
    _, bi = b.add(ArgmaxOp(vt, it, r - 1), "bv", "bi").results
    if view is not None:  # each row's [1, 1] index tile at column `row` of [1, B]
        b.output(bi, 0, (1, -1, -1))
    else:
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


# Rows one block of a row chain takes at most: the warps of a CUDA block, one row each
# (mk::gpu::rms_norm_rows).
CHAIN_BLOCK_ROWS = 8
# A grid dim of a row chain longer than this (a prefill's positions) is cut into blocks of
# about that many rows instead of one row each (999 positions of 16 heads: 16 · 27 blocks of 37
# rows rather than 15,984 of one).
CHAIN_MANY_ROWS = 64


def chain_block(extent: int, alone: bool = False, num_sms: int = 0) -> int:
    """Elements of a row chain's grid dim of `extent` one block takes. A dim that is the grid's
    only one (`alone`: a prefill's hidden rows, no heads beside them) takes the fewest rows that
    keep its blocks within one wave of `num_sms`, so that a block's rows stay few (999 rows:
    111 blocks of 9, whose f32 tiles fit in shared memory, rather than 27 of 37)."""
    if extent <= CHAIN_MANY_ROWS:
        return 1
    if alone and num_sms > 0:
        fits = [d for d in range(-(-extent // num_sms), CHAIN_MANY_ROWS + 1) if extent % d == 0]
        if fits:
            return fits[0]
    return chunk_size(extent, CHAIN_MANY_ROWS)


def chain_dims(chain: RowChain, shape: Sequence[int]) -> list[int]:
    """The grid dims of a row chain's kernel: its heads only, each block taking every row of
    its head, when there are at most CHAIN_BLOCK_ROWS rows and they share their RoPE position
    (a decode step's QK-norm at batch 8: 16 + 8 blocks, one wave, instead of 128 + 64 that
    stacked two on half the SMs); else row_dims."""
    if chain.view is not None:
        head = len(shape_of(chain.view.operands[0])) - 1
        rows = math.prod(shape[:head])
        tables = chain.rope.operands[1:] if chain.rope is not None else ()
        shared = all(math.prod(shape_of(t)) == shape[-1] // 2 for t in tables)
        if 1 < rows <= CHAIN_BLOCK_ROWS and shared and shape[head] > 1:
            return [head]
    return row_dims(shape)


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
    head-splitting reshape (read through), an optional standalone RMSNorm, an optional RoPE;
    the reshape alone is a copy by heads (a cache write's new rows, see `cache_rows`)."""

    view: Operation | None
    norm: Operation | None
    rope: Operation | None

    def ops(self) -> list[Operation]:
        return [op for op in (self.view, self.norm, self.rope) if op is not None]

    def last(self) -> Operation:
        last = self.rope or self.norm or self.view
        assert last is not None
        return last

    def source(self) -> SSAValue:
        first = self.ops()[0]
        return first.operands[0]


def table_map(table: Sequence[int], shape: Sequence[int], omap: Sequence[int]) -> tuple[int, ...]:
    """A broadcast operand's imap: a grid axis maps to its aligned dim unless that is 1."""
    shift = len(shape) - len(table)
    return tuple(d - shift if d >= shift and table[d - shift] > 1 else -1 for d in omap)


def row_chain_kernel(chain: RowChain, t: Tiling, lookup: ValueMap) -> list[Operation]:
    """Each block reads its rows (through a head-splitting reshape, as a tile reshape), then
    normalises them and/or rotates them (or only copies them); nothing is rounded between the
    fused ops."""
    res = chain.last().results[0]
    shape = shape_of(res)
    dims = chain_dims(chain, shape)
    alone = len(dims) == 1
    blocks = tuple(shape[d] // chain_block(shape[d], alone, t.num_sms) for d in dims)
    grid = blocks + (1,) * (3 - len(dims))
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
            b.input(k + i, table_map(shape_of(t), shape, omap), -1, f"{name}_{label}")
            for i, (t, label) in enumerate(zip(chain.rope.operands[1:], ("c", "s"), strict=True))
        )
        xt = b.add(RopeOp(xt, cos, sin), f"{name}_rot").res
    b.output(xt, 0, omap)
    return [finish(b, [name])]


def maps_broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    shape = broadcast_shapes(*shapes)
    assert shape is not None
    return shape


# ------------------------------------------------------------------------------------------------
# Head transposes: [B, A, C, D] <-> [B, C, A, D] (a prefill's heads into and out of attention)
# ------------------------------------------------------------------------------------------------


def is_head_transpose(op: Operation) -> bool:
    """A 4-D nn.transpose that swaps dims 1 and 2."""
    if not isinstance(op, nn.TransposeOp) or len(shape_of(op.operands[0])) != 4:
        return False
    return tuple(nn.attribute_values(op)["perm"]) == (0, 2, 1, 3)  # type: ignore[arg-type]


def head_transpose_views(
    op: Operation, source: Operation | None, result: Operation | None
) -> tuple[Operation | None, Operation | None]:
    """The reshapes around a head transpose its kernel reads or writes through, at batch 1:
    [S, H·D] -> [1, S, H, D] before one that takes heads out of rows, [1, S, H, D] -> [S, H·D]
    after one that puts them back."""
    bsz, a, c, d = shape_of(op.operands[0])
    if bsz != 1:
        return None, None
    if not (
        isinstance(source, nn.ReshapeOp) and a >= c and shape_of(source.operands[0]) == (a, c * d)
    ):
        source = None
    if not (
        isinstance(result, nn.ReshapeOp) and a < c and shape_of(result.results[0]) == (c, a * d)
    ):
        result = None
    return source, result


def head_transpose_kernel(
    op: Operation,
    lookup: ValueMap,
    source: Operation | None = None,
    result: Operation | None = None,
) -> list[Operation]:
    """Blocks of one index of the shorter swapped dim, up to CHAIN_MANY_ROWS of the longer one
    and one batch row: a block's tile keeps its element order (the dim of extent 1 moves), so the
    copy is a tile reshape, and the grid spreads it over the SMs (a library kernel is one task).
    `source` / `result` (head_transpose_views) are read or written through as [rows, D] tiles."""
    bsz, a, c, d = shape_of(op.operands[0])
    res = (result or op).results[0]
    name = res.name_hint or "t"
    read = source.operands[0] if source is not None else op.operands[0]
    if a >= c:  # x: C, y: chunks of A
        rows = chunk_size(a, CHAIN_MANY_ROWS)
        grid, imap, omap = (c, a // rows, bsz), (2, 1, 0), (1, 2, 0)
        out_tile: tuple[int, ...] = (1, 1, rows, d)
        if source is not None:
            imap = (1, 0, -1)
    else:  # x: A, y: chunks of C
        rows = chunk_size(c, CHAIN_MANY_ROWS)
        grid, imap, omap = (a, c // rows, bsz), (1, 2, 0), (2, 1, 0)
        out_tile = (1, rows, 1, d)
        if result is not None:
            omap, out_tile = (1, 0, -1), (rows, d)
    b = new_builder([lookup(read)], [res.type], grid, 128, 1, [name])
    tile = reshape(b, b.input(0, imap, -1, f"{name}_x"), out_tile, f"{name}_y")
    b.output(tile, 0, omap)
    return [finish(b, [name])]
