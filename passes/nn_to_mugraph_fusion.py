"""Fusion for nn-to-mugraph: linear groups (RMSNorm prologue, sibling linears, epilogues, output
views) and elementwise chains.

A **linear group** is one graph-defined kernel: every `nn.linear` / `nn.matmul` ("head") that
reads the same activation x, optionally the `nn.rms_norm` that produced x (applied Mirage-style:
x·g is fed to the matmuls and Σx² accumulates in the same for-loop over K; each output's
thread_map scales its accumulators by rsqrt(Σx²/K + ε)), and a DAG of elementwise nn ops on the
heads' results (silu·mul, residual adds, scales, ...) computed in thread_map epilogues. Grid x
splits the output columns, grid y the rows when there are many, and the for-loop walks K.

Output reshapes fold into a linear group's output maps (`Layout.view_map`). An **elementwise
group** (two or more elementwise ops not fed by a linear) is one graph_def with a thread_map per
output.

Fusion is applied only where it is valid: a fused-away value has no user outside the group, all
heads produce the same shape up to their last dim, and no value the group reads depends on what
the group computes (the kernel would need its own output).

Matching the groups and a linear group's layout (grid, loop, maps) live in `nn_to_mugraph_groups`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import IntegerAttr, StringAttr, TensorType, f32, i64
from xdsl.ir import Operation, SSAValue

from mk.dialects import nn
from mk.dialects.mugraph import FUSED_ATTR, GraphDefOp
from mk.dialects.mugraph_base import shape_of, tensor_type
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_tiles import AccumOp, BinaryOp, MatmulOp, ReduceOp
from mk.passes.nn_to_mugraph_groups import ElementwiseGroup, Layout, LinearGroup, k_splits, layout
from mk.passes.nn_to_mugraph_rules import (
    DEFAULT_TILE_N,
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
    reshape,
    run_scalar_chain,
)

# ------------------------------------------------------------------------------------------------
# Building the kernel
# ------------------------------------------------------------------------------------------------


def linear_group_kernel(group: LinearGroup, t: Tiling, lookup: ValueMap) -> Emitted:
    """The fused graph_def(s) of a linear group; maps each written nn value to a kernel result.

    One graph_def, or with split-K two: the first writes each head's f32 partial sums of its K
    split into a workspace [S, ...] (grid z → the leading split dim), the second sums them and
    applies the norm scale (Σx² recomputed from x), the epilogue, the rounding and the views."""
    lay = layout(group, t)
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
    norm = _norm_sum_sq(b, group, xt)
    _write_outputs(b, group, lay, accs, norm, extras)
    kernel = finish(b, names)
    if _is_fused(group):
        kernel.attributes[FUSED_ATTR] = _fused_label(group)
    return [kernel], dict(zip(written, kernel.results, strict=True))


def _is_fused(group: LinearGroup) -> bool:
    return bool(group.norm or group.epilogue or len(group.heads) > 1 or group.views)


def _x_tile(
    b: BlockGraphBuilder, group: LinearGroup, lay: Layout, ix: int, split: bool
) -> SSAValue:
    """x's tile of one iteration (a row when x is a vector); grid z picks the K split."""
    xr = len(shape_of(group.x))
    kdim = xr - 1 if split else -1
    xt = b.input(ix, (-1, xr - 2 if lay.grid[1] > 1 else -1, kdim), xr - 1, "xt")
    return reshape(b, xt, (1, *shape_of(xt)), "xt2") if xr == 1 else xt


def _products(
    b: BlockGraphBuilder, group: LinearGroup, lay: Layout, ix: int, ig: int, iw: list[int],
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
    lay: Layout,
    accs: dict[SSAValue, SSAValue],
    norm: _NormScale | None,
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
        tile = _epilogue_value(b, group, v, accs, norm, extra_tiles)
        width = shape_of(v)[-1]
        tile_shape, omap = lay.view_map(width, shape_of(w)) if w is not v else (None, None)  # type: ignore[misc]
        if tile_shape is None or omap is None:
            tile_shape, omap = (*lay.tile_lead(), width // lay.grid[0]), lay.out_map()
        b.output(reshape(b, tile, tile_shape, f"{name}v"), i, omap)


def _partial_map(lay: Layout, z: int) -> tuple[int, int, int]:
    """The output map shifted past the leading split dim, grid z onto that dim (or -1)."""
    x, y, _ = lay.out_map()
    return (x + 1, y + 1 if y >= 0 else -1, z)


def _split_k_kernels(group: LinearGroup, lay: Layout, splits: int, lookup: ValueMap) -> Emitted:
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
        split.attributes[FUSED_ATTR] = _fused_label(group)
    reduce = _reduce_kernel(group, lay, list(split.results), lookup)
    written = [group.written(v) for v in group.computed_outputs()]
    return [split, reduce], dict(zip(written, reduce.results, strict=True))


def _reduce_kernel(
    group: LinearGroup, lay: Layout, partials: list[SSAValue], lookup: ValueMap
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
    norm = None
    if group.norm is not None:
        norm = _norm_sum_sq(b, group, _x_tile(b, group, lay, ix, False))
    _write_outputs(b, group, lay, accs, norm, extras)
    kernel = finish(b, names)
    kernel.attributes["mk.split_k_reduce"] = IntegerAttr(shape_of(partials[0])[0], i64)
    return kernel


@dataclass(frozen=True)
class _NormScale:
    """A fused RMSNorm's Σx² tile ([rows, 1]) and what turns it into the row's scale. The scale
    is computed per element inside the epilogue's thread_map rather than by a mean accumulator
    and a thread_map of its own: those were a division loop, a one-element loop and a barrier
    (one thread writes the scale, all read it) ahead of the output loop of every task."""

    sum_sq: SSAValue
    k: int  # the normalized extent (x's last dim)
    eps: float

    def scale(self, s: SSAValue) -> SSAValue:
        """rsqrt(s / K + ε) of one Σx² scalar: the float ops of mean_sq_last's division and of
        rsqrt(mean + ε), in the same order, so every backend's results stay bit-identical."""
        mean = arith.DivfOp(s, const(float(self.k))).result
        return mathd.RsqrtOp(arith.AddfOp(mean, const(self.eps)).result).result


def _norm_sum_sq(b: BlockGraphBuilder, group: LinearGroup, xt: SSAValue) -> _NormScale | None:
    """Σx² per row over the loop (the norm's statistic), None without a fused norm."""
    if group.norm is None:
        return None
    ss = b.add(AccumOp("sum_sq_last", xt), "ss").res
    return _NormScale(ss, shape_of(group.x)[-1], nn_float(group.norm, "epsilon"))


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
    norm: _NormScale | None,
    extra_tiles: dict[SSAValue, SSAValue],
) -> SSAValue:
    """The tile of one output: an accumulator, or a thread_map of the epilogue DAG whose
    accumulator leaves are first scaled by the norm's rsqrt(Σx²/K + ε) (Σx² broadcasts per row)."""
    elem = tensor_type(value).element_type
    heads = [h.results[0] for h in group.heads]
    ops, leaves = _needed(group.epilogue, value, [*heads, *group.extras()])
    name = value.name_hint or "y"
    if not ops and norm is None:
        return accs[value]
    args = [accs[v] if v in accs else extra_tiles[v] for v in leaves]
    if norm is not None:
        args.append(norm.sum_sq)

    def body(*scalars: SSAValue) -> list[SSAValue]:
        env = dict(zip(leaves, scalars, strict=False))
        if norm is not None:
            rs = norm.scale(scalars[-1])
            for v in leaves:
                if v in accs:
                    env[v] = arith.MulfOp(env[v], rs).result
        return run_scalar_chain(env, ops, [value])

    result_type = TensorType(elem, maps_broadcast(*(shape_of(a) for a in args)))
    return b.thread_map(args, [result_type], body, f"{name}t").res[0]


def elementwise_kernel(group: ElementwiseGroup, t: Tiling, lookup: ValueMap) -> Emitted:
    """One graph_def: blocks split the last dim (and rows when many), a thread_map per output."""
    outputs, leaves = group.outputs(), group.leaves()
    shape = shape_of(group.ops[0].results[0])
    r = len(shape)
    cols = shape[-1] // chunk_size(shape[-1], t.tile_n or DEFAULT_TILE_N)
    rows = shape[-2] // chunk_size(shape[-2], t.row_tile()) if r >= 2 else 1
    lay = Layout((cols, rows, 1), 1, shape)
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
    kernel.attributes[FUSED_ATTR] = StringAttr("+".join(op.name[3:] for op in group.ops))
    return [kernel], dict(zip(outputs, kernel.results, strict=True))
