"""Matching for nn-to-mugraph fusion: linear and elementwise groups, and a linear group's layout."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from xdsl.ir import Operation, SSAValue

from mk.dialects import nn
from mk.dialects.mugraph_base import shape_of, tensor_type
from mk.dialects.nn_decode import donated_arg, donated_write
from mk.passes.cost_model import element_bytes
from mk.passes.nn_to_mugraph_rules import ELEMENTWISE_OPS, Tiling, chunk_size, parts_at_most

LINEAR_OPS = (nn.LinearOp, nn.MatmulOp)


@dataclass
class LinearGroup:
    """The nn ops one fused linear-family kernel replaces."""

    x: SSAValue  # the activation the kernel reads (the norm's input when a norm is fused)
    norm: nn.RMSNormOp | None
    heads: list[Operation]
    epilogue: list[Operation] = field(default_factory=list)  # elementwise ops, program order
    views: dict[SSAValue, nn.ReshapeOp] = field(default_factory=dict)  # folded output reshapes
    k_chunk: int = 0  # K per for-loop iteration when x's producer writes it in such blocks

    def ops(self) -> list[Operation]:
        norm = [self.norm] if self.norm else []
        return [*norm, *self.heads, *self.epilogue, *self.views.values()]

    def produced(self) -> set[SSAValue]:
        """Values computed by the heads and the epilogue (the norm's output is never written)."""
        return {r for op in [*self.heads, *self.epilogue] for r in op.results}

    def computed_outputs(self) -> list[SSAValue]:
        """Values used outside the group (or returned), in op order: the kernel writes them."""
        inside = set(self.ops())
        return [
            r
            for op in [*self.heads, *self.epilogue]
            for r in op.results
            if any(u.operation not in inside for u in r.uses) or r in self.views
        ]

    def written(self, value: SSAValue) -> SSAValue:
        """The nn value a computed output stands for: itself, or its folded reshape's result."""
        view = self.views.get(value)
        return view.results[0] if view else value

    def extras(self) -> list[SSAValue]:
        """Values the epilogue reads from outside the group, in first-use order."""
        produced, seen = self.produced(), []
        for op in self.epilogue:
            for v in op.operands:
                if v not in produced and v not in seen:
                    seen.append(v)
        return seen


# ------------------------------------------------------------------------------------------------
# Matching
# ------------------------------------------------------------------------------------------------


def depends_on(values: Iterable[SSAValue], ops: set[Operation]) -> bool:
    """Whether any of `values` is computed (transitively) from a result of `ops`."""
    stack, seen = list(values), set()
    while stack:
        v = stack.pop()
        owner = v.owner
        if not isinstance(owner, Operation) or owner in seen:
            continue
        if owner in ops:
            return True
        seen.add(owner)
        stack.extend(owner.operands)
    return False


def _head_shape(op: Operation) -> tuple[int, ...]:
    return shape_of(op.results[0])[:-1]


def _is_head_of(op: Operation, x: SSAValue) -> bool:
    return isinstance(op, LINEAR_OPS) and op.operands[0] is x and op.operands[1] is not x


def match_linear_group(
    anchor: Operation,
    claimed: set[Operation],
    order: dict[Operation, int],
    t: Tiling,
    k_chunks: Mapping[SSAValue, int] | None = None,
) -> LinearGroup | None:
    """The largest valid group containing `anchor` (an unclaimed linear/matmul), or None.
    `k_chunks`: activations written in blocks along K, and their block width: a group reading
    one (without a norm) walks K in those blocks, so mugraph-fuse-loop can fold the writer in."""
    x = anchor.operands[0]
    norm = x.owner if isinstance(x.owner, nn.RMSNormOp) and x.owner not in claimed else None
    users = sorted({u.operation for u in x.uses}, key=lambda o: order.get(o, len(order)))
    if norm is not None and not all(_is_head_of(u, x) and u not in claimed for u in users):
        norm = None
    if norm is not None and 0 < t.norm_rows < math.prod(shape_of(x)[:-1]):
        norm = None  # many rows: normalised once by their own kernel
    candidates = [u for u in users if _is_head_of(u, x) and u not in claimed]
    heads: list[Operation] = []
    for op in candidates:
        if op is not anchor and _head_shape(op) != _head_shape(anchor):
            continue
        trial = [*heads, op]
        if not depends_on([v for h in trial for v in h.operands[1:]], set(trial)):
            heads = trial
    if anchor not in heads:
        return None
    group = LinearGroup(norm.operands[0] if norm else x, norm, heads)
    if norm is not None and len(heads) != len(users):
        group = LinearGroup(x, None, heads)
    if group.norm is None and k_chunks:
        group.k_chunk = k_chunks.get(group.x, 0)
    _absorb_epilogue(group, claimed, order)
    _fold_views(group, claimed, layout(group, t))
    return group


def _absorbable(op: Operation, produced: set[SSAValue], inside: set[Operation]) -> bool:
    """An elementwise op on `produced` values that the same kernel can compute after them."""
    if not isinstance(op, ELEMENTWISE_OPS) or op in inside:
        return False
    internal = [v for v in op.operands if v in produced]
    if not internal:
        return False
    out_shape = shape_of(op.results[0])
    if any(shape_of(v) != out_shape for v in internal):
        return False  # the op would broadcast a group value: not the output tiling any more
    for v in internal:
        if any(u.operation not in inside and u.operation is not op for u in v.uses):
            return False  # v has another user outside: it would have to be written too
    external = [v for v in op.operands if v not in produced]
    return not depends_on(external, inside)


def _before_writes(ops: Iterable[Operation], order: Mapping[Operation, int]) -> bool:
    """Whether every donated argument the ops read is written in place after all of them: their
    kernel runs where the last of them was, and must still see the argument's old value."""
    ops = list(ops)
    last = max(order.get(o, -1) for o in ops)
    for op in ops:
        for v in op.operands:
            if (arg := donated_arg(v)) is None:
                continue
            write = donated_write(*arg).owner
            if isinstance(write, Operation) and order.get(write, last + 1) < last:
                return False
    return True


def _grow(
    chain: list[Operation],
    produced: Callable[[], set[SSAValue]],
    inside: Callable[[], set[Operation]],
    claimed: set[Operation],
    order: dict[Operation, int],
) -> None:
    """Append absorbable users to `chain` until none is left, in program order."""
    changed = True
    while changed:
        changed = False
        members, values = inside(), produced()
        users = {u.operation for v in values for u in v.uses}
        for op in sorted((users & order.keys()) - members - claimed, key=order.__getitem__):
            if _absorbable(op, values, members) and _before_writes([*members, op], order):
                chain.append(op)
                chain.sort(key=order.__getitem__)
                changed = True
                break


def _absorb_epilogue(
    group: LinearGroup, claimed: set[Operation], order: dict[Operation, int]
) -> None:
    _grow(group.epilogue, group.produced, lambda: set(group.ops()), claimed, order)


@dataclass
class ElementwiseGroup:
    """A DAG of elementwise nn ops of one output shape, computed by one thread_map kernel."""

    ops: list[Operation]

    def produced(self) -> set[SSAValue]:
        return {r for op in self.ops for r in op.results}

    def outputs(self) -> list[SSAValue]:
        inside = set(self.ops)
        return [
            r
            for op in self.ops
            for r in op.results
            if any(u.operation not in inside for u in r.uses)
        ]

    def leaves(self) -> list[SSAValue]:
        produced, seen = self.produced(), []
        for op in self.ops:
            for v in op.operands:
                if v not in produced and v not in seen:
                    seen.append(v)
        return seen


def match_elementwise_group(
    anchor: Operation, claimed: set[Operation], order: dict[Operation, int]
) -> ElementwiseGroup | None:
    """Two or more elementwise ops from `anchor` on that fuse into one kernel, or None."""
    if not isinstance(anchor, ELEMENTWISE_OPS) or not shape_of(anchor.results[0]):
        return None
    group = ElementwiseGroup([anchor])
    _grow(group.ops, group.produced, lambda: set(group.ops), claimed, order)
    return group if len(group.ops) > 1 else None


# ------------------------------------------------------------------------------------------------
# Layout: the grid, loop and maps of a linear group
# ------------------------------------------------------------------------------------------------


def _column_blocks(
    widths: Sequence[int], t: Tiling, row_blocks: int, row_bytes: int, total: bool = False
) -> int:
    """Blocks along the output columns: each head's width split evenly, tiles <= tile_n (with
    `total`, the heads' tiles together); with tile_n 0, the fewest blocks that fill the SMs'
    waves best (tiles of >= 8 columns), or with task_us the blocks of least modelled time
    (_wave_time)."""
    common = math.gcd(*widths)
    widest = sum(widths) if total else max(widths)
    if t.tile_n == 0:
        if t.task_us > 0:
            return _timed_blocks(common, widest, sum(widths), row_blocks, row_bytes, t)
        return _wave_blocks(common, widest, row_blocks, t.num_sms)
    for d in range(1, common + 1):
        if common % d == 0 and widest // d <= t.tile_n:
            parts = d
            break
    else:
        parts = common
    tile = widest // parts
    return parts if tile * 2 > min(widest, t.tile_n) or tile == widest else 1


MIN_AUTO_TILE = 8
DECODE_ROWS = 16  # rows a block of a decode-shaped linear has at most (the streamed products)
MANY_ROWS_TILE_N = 64  # tile_n 0: the columns of a block of more rows than that
# tile_m and tile_n 0: a linear of at least WIDE_TILE rows takes blocks of WIDE_TILE rows and
# columns where that many blocks still give every SM one (fewer operand bytes per product; on
# the H200, 4096³ in bf16 ran 1.97 -> 1.12 ms with 128 x 128 blocks against 64 x 64 on wgmma),
# else of WIDE_TILE rows and MANY_ROWS_TILE_N columns where those do (qwen3-0.6b's prefill of
# 999 positions: its o/down projections in 144 blocks of 111 x 64 instead of 432 of 37 x 64,
# 29.06 -> 27.60 ms), else 64 x 64 (bench/RESULTS.md). "Every SM" is within 5 %: 1,008 rows'
# o-projection of 1,024 columns in 128 blocks of 126 x 64 on 132 SMs (one wave) rather than 256
# of 63 x 64 (two).
WIDE_TILE = 128
# One SM's share of HBM bandwidth while a decode linear streams its weights on the H200: the
# op-mark profile's weight segments ran at 21-31 KB/us per SM (bench/RESULTS.md).
SM_BYTES_PER_US = 25_000


def _block_counts(common: int, widest: int) -> list[int]:
    parts = [d for d in range(1, common + 1) if common % d == 0]
    return [d for d in parts if widest // d >= MIN_AUTO_TILE] or [1]


def _wave_blocks(common: int, widest: int, row_blocks: int, num_sms: int) -> int:
    def fill(d: int) -> float:
        blocks = d * row_blocks
        return blocks / (-(-blocks // num_sms) * num_sms)

    parts = _block_counts(common, widest)
    best = max(fill(d) for d in parts)
    return min(d for d in parts if fill(d) >= 0.98 * best)


def _wave_time(d: int, width: int, row_blocks: int, row_bytes: int, t: Tiling) -> float:
    """Modelled µs of a linear in d column blocks: each SM runs its tasks one after another, and
    a task costs its fixed part plus its weight rows at one SM's share of HBM bandwidth."""
    waves = -(-d * row_blocks // t.num_sms)
    return waves * (t.task_us + width / d * row_bytes / SM_BYTES_PER_US)


def _timed_blocks(
    common: int, widest: int, width: int, row_blocks: int, row_bytes: int, t: Tiling
) -> int:
    """The column blocks of least _wave_time (the fewest among equals)."""
    parts = _block_counts(common, widest)
    return min(parts, key=lambda d: (_wave_time(d, width, row_blocks, row_bytes, t), d))


@dataclass
class Layout:
    """Grid and loop of a linear group and the maps that follow from them."""

    grid: tuple[int, int, int]
    forloop: int
    out_shape: tuple[int, ...]  # the first head's result (all heads share it but the last dim)

    def out_map(self) -> tuple[int, int, int]:
        r = len(self.out_shape)
        return (r - 1, r - 2 if self.grid[1] > 1 else -1, -1)

    def extra_map(self, shape: Sequence[int]) -> tuple[int, ...]:
        """An epilogue operand's imap: partitioned like the output where it is not broadcast."""
        dims = []
        for axis, d in enumerate(self.out_map()):
            e = d - (len(self.out_shape) - len(shape)) if d >= 0 else -1
            dims.append(e if e >= 0 and shape[e] != 1 and self.grid[axis] > 1 else -1)
        return tuple(dims)

    def view_map(
        self, width: int, view: Sequence[int]
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(tile shape, omap) writing a [..., width] output straight into a reshape of it, or
        None when the tiling cannot: only leading dims change (rows not split), or the last dim
        splits into heads [..., H, 1, ..., D] and a block's columns are whole heads."""
        lead, rows_split = self.out_shape[:-1], self.grid[1] > 1
        nt = width // self.grid[0]
        if view[-1] == width and math.prod(view[:-1]) == math.prod(lead) and not rows_split:
            return (*view[:-1], nt), (len(view) - 1, -1, -1)
        tail = view[len(lead) :]
        if tuple(view[: len(lead)]) != lead or len(tail) < 2 or any(d != 1 for d in tail[1:-1]):
            return None
        heads, d = tail[0], tail[-1]
        if heads * d != width or nt % d:
            return None
        tile = (*self.tile_lead(), nt // d, *tail[1:-1], d)
        return tile, (len(lead), len(lead) - 1 if rows_split else -1, -1)

    def tile_lead(self) -> tuple[int, ...]:
        lead = list(self.out_shape[:-1])
        if self.grid[1] > 1:
            lead[-1] //= self.grid[1]
        return tuple(lead)


def _tall_columns(xs: list[int], widths: list[int], t: Tiling) -> int:
    """The columns of a linear's blocks of WIDE_TILE rows, or 0 where it takes the usual blocks
    (tile_m or tile_n set, fewer rows, or too few blocks). WIDE_TILE columns count whole blocks
    of WIDE_TILE rows, as measured (llama-3.2-1b's o/down projections, 7 x 16 of them, stay
    narrow: as cut, 9 x 16 = 144 blocks would leave 12 for a second wave); MANY_ROWS_TILE_N
    columns count the row blocks as chunk_size cuts them (999 rows: 9 of 111)."""
    if t.tile_m or t.tile_n or len(xs) < 2 or xs[-2] < WIDE_TILE:
        return 0
    cut = chunk_size(xs[-2], WIDE_TILE)
    if cut > WIDE_TILE:
        return 0  # no divisor of the rows cuts them into blocks this tall
    if _fills_a_wave((xs[-2] // WIDE_TILE) * (sum(widths) // WIDE_TILE), t.num_sms):
        return WIDE_TILE
    if _fills_a_wave((xs[-2] // cut) * (sum(widths) // MANY_ROWS_TILE_N), t.num_sms):
        return MANY_ROWS_TILE_N
    return 0


def _fills_a_wave(blocks: int, num_sms: int) -> bool:
    """At least 95 % of the SMs get a block (the rest idle a wave, not the whole wave)."""
    return blocks * 20 >= num_sms * 19


def layout(group: LinearGroup, t: Tiling) -> Layout:
    xs: list[int] = list(shape_of(group.x))
    out = shape_of(group.heads[0].results[0])
    widths = [shape_of(h.results[0])[-1] for h in group.heads]
    tall = _tall_columns(xs, widths, t)
    row_tile = WIDE_TILE if tall else t.row_tile()
    rows = 1
    if len(xs) >= 2 and len(out) == len(xs) and xs[-2] > row_tile:
        rows = xs[-2] // chunk_size(xs[-2], row_tile)
    k = xs[-1]
    weight = tensor_type(group.heads[0].operands[1])
    if t.tile_n == 0 and len(xs) >= 2 and xs[-2] // rows > DECODE_ROWS:
        # Many rows a block: the product is bound by its arithmetic, not by one pass over the
        # weights, and square-ish tiles keep its operands' traffic down.
        t = replace(t, tile_n=tall or MANY_ROWS_TILE_N)
    # A tall block's heads share its columns: their sums together are what a gemm tile keeps
    # (a prefill's q/k/v blocks of 64 + 32 + 32 rather than 128 + 64 + 64 columns).
    cols = _column_blocks(widths, t, rows, k * element_bytes(weight.element_type), total=tall > 0)
    chunk = group.k_chunk if group.k_chunk and k % group.k_chunk == 0 else chunk_size(k, t.tile_k)
    return Layout((cols, rows, 1), k // chunk, out)


def _fold_views(group: LinearGroup, claimed: set[Operation], lay: Layout) -> None:
    """Claim each output's sole-user reshape that the output maps can write directly."""
    inside = set(group.ops())
    for v in [r for op in [*group.heads, *group.epilogue] for r in op.results]:
        users = {u.operation for u in v.uses}
        view = users.pop() if len(users) == 1 else None
        if not isinstance(view, nn.ReshapeOp) or view in claimed or view in inside:
            continue
        if lay.view_map(shape_of(v)[-1], shape_of(view.results[0])) is not None:
            group.views[v] = view


MAX_K_SPLITS = 16


def k_splits(lay: Layout, t: Tiling) -> int:
    """Splits of K across grid z: 1 unless the output blocks leave SMs idle; then about
    num_sms / blocks splits (at most 16) of at least two for-loop iterations each, dividing the
    loop. A forced count (k_splits > 1) is the largest divisor of the loop not above it."""
    if t.k_splits > 0:
        return parts_at_most(lay.forloop, min(t.k_splits, MAX_K_SPLITS))
    blocks = lay.grid[0] * lay.grid[1]
    if blocks >= t.num_sms:
        return 1
    return parts_at_most(lay.forloop, min(MAX_K_SPLITS, t.num_sms // blocks, lay.forloop // 2))
