"""Fusion for nn-to-mugraph: linear groups (RMSNorm prologue, sibling linears, epilogues, output
views) and elementwise chains.

A **linear group** is one graph-defined kernel: every `nn.linear` / `nn.matmul` ("head") that
reads the same activation x, optionally the `nn.rms_norm` that produced x (applied Mirage-style:
x·g is fed to the matmuls and Σx² accumulates in the same for-loop over K; the epilogue scales
each row by rsqrt(mean + ε)), and a DAG of elementwise nn ops on the heads' results (silu·mul,
residual adds, scales, ...) computed in thread_map epilogues. Grid x splits the output columns,
grid y the rows when there are many, and the for-loop walks K.

Output reshapes fold into a linear group's output maps (`_Layout.view_map`). An **elementwise
group** (two or more elementwise ops not fed by a linear) is one graph_def with a thread_map per
output.

Fusion is applied only where it is valid: a fused-away value has no user outside the group, all
heads produce the same shape up to their last dim, and no value the group reads depends on what
the group computes (the kernel would need its own output).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects import arith
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import IntegerAttr, StringAttr, TensorType, f32, i64
from xdsl.ir import Operation, SSAValue

from mk.dialects import nn
from mk.dialects.mugraph import GraphDefOp
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_tiles import (
    AccumOp,
    BinaryOp,
    MatmulOp,
    ReduceOp,
    shape_of,
    tensor_type,
)
from mk.passes.nn_to_mugraph_rules import (
    DEFAULT_TILE_N,
    ELEMENTWISE_OPS,
    Emitted,
    Operands,
    Tiling,
    ValueMap,
    chunk_size,
    const,
    finish,
    maps_broadcast,
    new_builder,
    nn_float,
    parts_at_most,
    reshape,
    run_scalar_chain,
)

LINEAR_OPS = (nn.LinearOp, nn.MatmulOp)


@dataclass
class LinearGroup:
    """The nn ops one fused linear-family kernel replaces."""

    x: SSAValue  # the activation the kernel reads (the norm's input when a norm is fused)
    norm: nn.RMSNormOp | None
    heads: list[Operation]
    epilogue: list[Operation] = field(default_factory=list)  # elementwise ops, program order
    views: dict[SSAValue, nn.ReshapeOp] = field(default_factory=dict)  # folded output reshapes

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
    anchor: Operation, claimed: set[Operation], order: dict[Operation, int], t: Tiling
) -> LinearGroup | None:
    """The largest valid group containing `anchor` (an unclaimed linear/matmul), or None."""
    x = anchor.operands[0]
    norm = x.owner if isinstance(x.owner, nn.RMSNormOp) and x.owner not in claimed else None
    users = sorted({u.operation for u in x.uses}, key=lambda o: order.get(o, len(order)))
    if norm is not None and not all(_is_head_of(u, x) and u not in claimed for u in users):
        norm = None
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
    _absorb_epilogue(group, claimed, order)
    _fold_views(group, claimed, _layout(group, t))
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
            if _absorbable(op, values, members):
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
# Building the kernel
# ------------------------------------------------------------------------------------------------


def _column_blocks(widths: Sequence[int], tile_n: int, row_blocks: int, num_sms: int) -> int:
    """Blocks along the output columns: each head's width split evenly, tiles <= tile_n; with
    tile_n 0, the fewest blocks that fill the SMs' waves best (tiles of >= 8 columns)."""
    common = math.gcd(*widths)
    widest = max(widths)
    if tile_n == 0:
        return _wave_blocks(common, widest, row_blocks, num_sms)
    for d in range(1, common + 1):
        if common % d == 0 and widest // d <= tile_n:
            parts = d
            break
    else:
        parts = common
    tile = widest // parts
    return parts if tile * 2 > min(widest, tile_n) or tile == widest else 1


MIN_AUTO_TILE = 8


def _wave_blocks(common: int, widest: int, row_blocks: int, num_sms: int) -> int:
    def fill(d: int) -> float:
        blocks = d * row_blocks
        return blocks / (-(-blocks // num_sms) * num_sms)

    parts = [d for d in range(1, common + 1) if common % d == 0]
    parts = [d for d in parts if widest // d >= MIN_AUTO_TILE] or [1]
    best = max(fill(d) for d in parts)
    return min(d for d in parts if fill(d) >= 0.98 * best)


@dataclass
class _Layout:
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


def _layout(group: LinearGroup, t: Tiling) -> _Layout:
    xs: list[int] = list(shape_of(group.x))
    out = shape_of(group.heads[0].results[0])
    rows = 1
    if len(xs) >= 2 and len(out) == len(xs) and xs[-2] > t.tile_m:
        rows = xs[-2] // chunk_size(xs[-2], t.tile_m)
    widths = [shape_of(h.results[0])[-1] for h in group.heads]
    cols = _column_blocks(widths, t.tile_n, rows, t.num_sms)
    k = xs[-1]
    return _Layout((cols, rows, 1), k // chunk_size(k, t.tile_k), out)


def _fold_views(group: LinearGroup, claimed: set[Operation], lay: _Layout) -> None:
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


def k_splits(lay: _Layout, t: Tiling) -> int:
    """Splits of K across grid z: 1 unless the output blocks leave SMs idle; then about
    num_sms / blocks splits (at most 16) of at least two for-loop iterations each, dividing the
    loop. A forced count (k_splits > 1) is the largest divisor of the loop not above it."""
    if t.k_splits > 0:
        return parts_at_most(lay.forloop, min(t.k_splits, MAX_K_SPLITS))
    blocks = lay.grid[0] * lay.grid[1]
    if blocks >= t.num_sms:
        return 1
    return parts_at_most(lay.forloop, min(MAX_K_SPLITS, t.num_sms // blocks, lay.forloop // 2))


def linear_group_kernel(group: LinearGroup, t: Tiling, lookup: ValueMap) -> Emitted:
    """The fused graph_def(s) of a linear group; maps each written nn value to a kernel result.

    One graph_def, or with split-K two: the first writes each head's f32 partial sums of its K
    split into a workspace [S, ...] (grid z → the leading split dim), the second sums them and
    applies the norm scale (Σx² recomputed from x), the epilogue, the rounding and the views."""
    lay = _layout(group, t)
    splits = k_splits(lay, t)
    if splits > 1:
        return _split_k_kernels(group, lay, splits, lookup)
    outputs = group.computed_outputs()
    written = [group.written(v) for v in outputs]
    names = [v.name_hint or "y" for v in written]
    operands = Operands()
    ix = operands.index(group.x)
    ig = operands.index(group.norm.operands[1]) if group.norm else -1
    iw = [operands.index(h.operands[1]) for h in group.heads]
    extras = {v: operands.index(v) for v in group.extras()}
    args = [lookup(v) for v in operands.values]
    b = new_builder(args, [v.type for v in written], lay.grid, 128, lay.forloop, names)
    xt, accs = _products(b, group, lay, ix, ig, iw, 1)
    rs = None
    if group.norm is not None:
        rs = _norm_scale(b, AccumOp("mean_sq_last", xt), nn_float(group.norm, "epsilon"))
    _write_outputs(b, group, lay, accs, rs, extras)
    kernel = finish(b, names)
    if _is_fused(group):
        kernel.attributes["mk.fused"] = _fused_label(group)
    return [kernel], dict(zip(written, kernel.results, strict=True))


def _is_fused(group: LinearGroup) -> bool:
    return bool(group.norm or group.epilogue or len(group.heads) > 1 or group.views)


def _x_tile(
    b: BlockGraphBuilder, group: LinearGroup, lay: _Layout, ix: int, split: bool
) -> SSAValue:
    """x's tile of one iteration (a row when x is a vector); grid z picks the K split."""
    xr = len(shape_of(group.x))
    kdim = xr - 1 if split else -1
    xt = b.input(ix, (-1, xr - 2 if lay.grid[1] > 1 else -1, kdim), xr - 1, "xt")
    return reshape(b, xt, (1, *shape_of(xt)), "xt2") if xr == 1 else xt


def _products(
    b: BlockGraphBuilder, group: LinearGroup, lay: _Layout, ix: int, ig: int, iw: list[int],
    splits: int,
) -> tuple[SSAValue, dict[SSAValue, SSAValue]]:  # fmt: skip
    """x's tile and each head's accumulated product (x·g when a norm is fused) over the loop."""
    split = splits > 1
    xt = _x_tile(b, group, lay, ix, split)
    a = xt
    if group.norm is not None:
        gt = b.input(ig, (-1, -1, 0 if split else -1), 0, "gt")
        a = b.add(BinaryOp("mul", xt, gt), "xg").res
    accs: dict[SSAValue, SSAValue] = {
        h.results[0]: _head_accumulator(b, h, a, iw[i], split) for i, h in enumerate(group.heads)
    }
    return xt, accs


def _write_outputs(
    b: BlockGraphBuilder,
    group: LinearGroup,
    lay: _Layout,
    accs: dict[SSAValue, SSAValue],
    rs: SSAValue | None,
    extras: dict[SSAValue, int],
) -> None:
    """The epilogue of every computed output, rounded and written (into its view when folded)."""
    extra_tiles = {
        v: b.input(i, lay.extra_map(shape_of(v)), -1, f"{v.name_hint or 'e'}_t")
        for v, i in extras.items()
    }
    for i, v in enumerate(group.computed_outputs()):
        w = group.written(v)
        name = w.name_hint or "y"
        tile = _epilogue_value(b, group, v, accs, rs, extra_tiles)
        width = shape_of(v)[-1]
        tile_shape, omap = lay.view_map(width, shape_of(w)) if w is not v else (None, None)  # type: ignore[misc]
        if tile_shape is None or omap is None:
            tile_shape, omap = (*lay.tile_lead(), width // lay.grid[0]), lay.out_map()
        b.output(reshape(b, tile, tile_shape, f"{name}v"), i, omap)


def _partial_map(lay: _Layout, z: int) -> tuple[int, int, int]:
    """The output map shifted past the leading split dim, grid z onto that dim (or -1)."""
    x, y, _ = lay.out_map()
    return (x + 1, y + 1 if y >= 0 else -1, z)


def _split_k_kernels(group: LinearGroup, lay: _Layout, splits: int, lookup: ValueMap) -> Emitted:
    heads = [h.results[0] for h in group.heads]
    partials = [TensorType(f32, (splits, *shape_of(v))) for v in heads]
    pnames = [f"{v.name_hint or 'y'}_p" for v in heads]
    operands = Operands()
    ix = operands.index(group.x)
    ig = operands.index(group.norm.operands[1]) if group.norm else -1
    iw = [operands.index(h.operands[1]) for h in group.heads]
    grid = (lay.grid[0], lay.grid[1], splits)
    b = new_builder(
        [lookup(v) for v in operands.values], partials, grid, 128, lay.forloop // splits, pnames
    )
    _, accs = _products(b, group, lay, ix, ig, iw, splits)
    for i, v in enumerate(heads):
        tile = (1, *lay.tile_lead(), shape_of(v)[-1] // lay.grid[0])
        b.output(reshape(b, accs[v], tile, f"{pnames[i]}v"), i, _partial_map(lay, 0))
    split = finish(b, pnames)
    split.attributes["mk.split_k"] = IntegerAttr(splits, i64)
    if _is_fused(group):
        split.attributes["mk.fused"] = _fused_label(group)
    reduce = _reduce_kernel(group, lay, list(split.results), lookup)
    written = [group.written(v) for v in group.computed_outputs()]
    return [split, reduce], dict(zip(written, reduce.results, strict=True))


def _reduce_kernel(
    group: LinearGroup, lay: _Layout, partials: list[SSAValue], lookup: ValueMap
) -> GraphDefOp:
    """Σ over the split dim of each head's partials, then the group's epilogue."""
    written = [group.written(v) for v in group.computed_outputs()]
    names = [v.name_hint or "y" for v in written]
    operands = Operands()
    for p in partials:
        operands.index(p)
    ix = operands.index(group.x) if group.norm else -1
    extras = {v: operands.index(v) for v in group.extras()}
    args = [lookup(v) for v in operands.values]
    forloop = lay.forloop if group.norm else 1  # the norm statistic walks x's row again
    grid = (lay.grid[0], lay.grid[1], 1)
    b = new_builder(args, [v.type for v in written], grid, 128, forloop, names)
    accs: dict[SSAValue, SSAValue] = {}
    for i, h in enumerate(group.heads):
        v, name = h.results[0], h.results[0].name_hint or "y"
        pt = b.input(i, _partial_map(lay, -1), -1, f"{name}_pt")
        total = b.add(ReduceOp("sum", pt, 0), f"{name}_s").res
        lead = lay.tile_lead() if len(shape_of(group.x)) >= 2 else (1,)  # a vector x is a row
        accs[v] = reshape(b, total, (*lead, shape_of(v)[-1] // lay.grid[0]), f"{name}acc")
    rs = None
    if group.norm is not None:
        xt = _x_tile(b, group, lay, ix, False)
        rs = _norm_scale(b, AccumOp("mean_sq_last", xt), nn_float(group.norm, "epsilon"))
    _write_outputs(b, group, lay, accs, rs, extras)
    kernel = finish(b, names)
    kernel.attributes["mk.split_k_reduce"] = IntegerAttr(shape_of(partials[0])[0], i64)
    return kernel


def _norm_scale(b: BlockGraphBuilder, mean_sq: AccumOp, eps: float) -> SSAValue:
    """rsqrt(mean(x²) + ε) per row, after the loop."""
    ms = b.add(mean_sq, "ms").res

    def body(m: SSAValue) -> list[SSAValue]:
        return [mathd.RsqrtOp(arith.AddfOp(m, const(eps)).result).result]

    return b.thread_map([ms], [ms.type], body, "rs").res[0]


def _fused_label(group: LinearGroup) -> StringAttr:
    ops = [op for op in group.ops() if op is not None]
    return StringAttr("+".join(op.name.removeprefix("nn.") for op in ops))


def _head_accumulator(
    b: BlockGraphBuilder, head: Operation, a: SSAValue, index: int, split: bool
) -> SSAValue:
    w = head.operands[1]
    name = w.name_hint or "w"
    if isinstance(head, nn.LinearOp):
        wt = b.input(index, (0, -1, 1 if split else -1), 1, f"{name}t")
        p = b.add(MatmulOp(a, wt, transpose_b=True), f"{name}p").res
    else:
        r = len(shape_of(w))
        wt = b.input(index, (r - 1, -1, r - 2 if split else -1), r - 2, f"{name}t")
        p = b.add(MatmulOp(a, wt), f"{name}p").res
    return b.add(AccumOp("sum", p), f"{name}acc").res


def _needed(
    chain: Sequence[Operation], value: SSAValue, leaf_order: Sequence[SSAValue]
) -> tuple[list[Operation], list[SSAValue]]:
    """The ops of `chain` computing `value` and the values from outside it they read (in
    `leaf_order`, which lists every candidate leaf)."""
    members = set(chain)
    ops: set[Operation] = set()
    leaves: set[SSAValue] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        op = v.owner
        if not isinstance(op, Operation) or op not in members:
            leaves.add(v)
        elif op not in ops:
            ops.add(op)
            stack.extend(op.operands)
    return [op for op in chain if op in ops], [v for v in leaf_order if v in leaves]


def _epilogue_value(
    b: BlockGraphBuilder,
    group: LinearGroup,
    value: SSAValue,
    accs: dict[SSAValue, SSAValue],
    rs: SSAValue | None,
    extra_tiles: dict[SSAValue, SSAValue],
) -> SSAValue:
    """The tile of one output: an accumulator, acc·rs, or a thread_map of the epilogue DAG."""
    elem = tensor_type(value).element_type
    heads = [h.results[0] for h in group.heads]
    ops, leaves = _needed(group.epilogue, value, [*heads, *group.extras()])
    name = value.name_hint or "y"
    if not ops:
        if rs is None:
            return accs[value]
        return b.add(BinaryOp("mul", accs[value], rs, elem), f"{name}t").res
    args = [accs[v] if v in accs else extra_tiles[v] for v in leaves]
    if rs is not None:
        args.append(rs)

    def body(*scalars: SSAValue) -> list[SSAValue]:
        env = dict(zip(leaves, scalars, strict=False))
        if rs is not None:
            for v in leaves:
                if v in accs:
                    env[v] = arith.MulfOp(env[v], scalars[-1]).result
        return run_scalar_chain(env, ops, [value])

    result_type = TensorType(elem, maps_broadcast(*(shape_of(a) for a in args)))
    return b.thread_map(args, [result_type], body, f"{name}t").res[0]


def elementwise_kernel(group: ElementwiseGroup, t: Tiling, lookup: ValueMap) -> Emitted:
    """One graph_def: blocks split the last dim (and rows when many), a thread_map per output."""
    outputs, leaves = group.outputs(), group.leaves()
    shape = shape_of(group.ops[0].results[0])
    r = len(shape)
    cols = shape[-1] // chunk_size(shape[-1], t.tile_n or DEFAULT_TILE_N)
    rows = shape[-2] // chunk_size(shape[-2], t.tile_m) if r >= 2 else 1
    lay = _Layout((cols, rows, 1), 1, shape)
    names = [v.name_hint or "y" for v in outputs]
    b = new_builder([lookup(v) for v in leaves], [v.type for v in outputs], lay.grid, 128, 1, names)
    tiles = [
        b.input(i, lay.extra_map(shape_of(v)), -1, f"{v.name_hint or 'e'}_t")
        for i, v in enumerate(leaves)
    ]
    for i, v in enumerate(outputs):
        ops, needed = _needed(group.ops, v, leaves)
        args = [tiles[leaves.index(x)] for x in needed]
        result = TensorType(tensor_type(v).element_type, maps_broadcast(*map(shape_of, args)))

        def body(
            *scalars: SSAValue,
            ops: list[Operation] = ops,
            needed: list[SSAValue] = needed,
            value: SSAValue = v,
        ) -> list[SSAValue]:
            return run_scalar_chain(dict(zip(needed, scalars, strict=True)), ops, [value])

        tile = b.thread_map(args, [result], body, f"{names[i]}t").res[0]
        b.output(
            reshape(b, tile, (*lay.tile_lead(), shape[-1] // cols), f"{names[i]}v"),
            i,
            lay.out_map(),
        )
    kernel = finish(b, names)
    kernel.attributes["mk.fused"] = StringAttr("+".join(op.name[3:] for op in group.ops))
    return [kernel], dict(zip(outputs, kernel.results, strict=True))
