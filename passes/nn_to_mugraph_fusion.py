"""Fusion of the linear family for nn-to-mugraph: RMSNorm prologues, sibling linears, epilogues.

A **linear group** is one graph-defined kernel: every `nn.linear` / `nn.matmul` ("head") that
reads the same activation x, optionally the `nn.rms_norm` that produced x (applied Mirage-style:
x·g is fed to the matmuls and Σx² accumulates in the same for-loop over K; the epilogue scales
each row by rsqrt(mean + ε)), and a DAG of elementwise nn ops on the heads' results (silu·mul,
residual adds, scales, ...) computed in thread_map epilogues. Grid x splits the output columns,
grid y the rows when there are many, and the for-loop walks K.

Fusion is applied only where it is valid: a fused-away value has no user outside the group, all
heads produce the same shape up to their last dim, and no value the group reads depends on what
the group computes (the kernel would need its own output).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import TensorType, f32
from xdsl.ir import Block, Operation, SSAValue

from mk.dialects import nn
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_tiles import AccumOp, BinaryOp, MatmulOp, shape_of, tensor_type
from mk.passes.nn_to_mugraph_rules import (
    ELEMENTWISE_OPS,
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
from xdsl.dialects import arith
from xdsl.dialects import math as mathd

LINEAR_OPS = (nn.LinearOp, nn.MatmulOp)


@dataclass
class LinearGroup:
    """The nn ops one fused linear-family kernel replaces."""

    x: SSAValue  # the activation the kernel reads (the norm's input when a norm is fused)
    norm: nn.RMSNormOp | None
    heads: list[Operation]
    epilogue: list[Operation] = field(default_factory=list)  # elementwise ops, program order

    def ops(self) -> list[Operation]:
        return [*([self.norm] if self.norm else []), *self.heads, *self.epilogue]

    def produced(self) -> set[SSAValue]:
        return {r for op in self.ops() for r in op.results}

    def outputs(self) -> list[SSAValue]:
        """Values used outside the group (or returned): the kernel's results, in op order."""
        inside = set(self.ops())
        return [
            r
            for op in [*self.heads, *self.epilogue]
            for r in op.results
            if any(u.operation not in inside for u in r.uses)
        ]

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
    anchor: Operation, claimed: set[Operation], order: dict[Operation, int]
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
    return group


def _absorbable(op: Operation, group: LinearGroup, inside: set[Operation]) -> bool:
    """An elementwise op on group values that can be computed in the group's epilogue."""
    if not isinstance(op, ELEMENTWISE_OPS) or op in inside:
        return False
    produced = group.produced()
    internal = [v for v in op.operands if v in produced]
    if not internal:
        return False
    out_shape = shape_of(op.results[0])
    if any(shape_of(v) != out_shape for v in internal):
        return False  # the op would broadcast a group value: not the output tiling any more
    for v in internal:
        if v.owner is group.norm:
            return False
        if any(u.operation not in inside and u.operation is not op for u in v.uses):
            return False  # v has another user outside: it would have to be written too
    external = [v for v in op.operands if v not in produced]
    return not depends_on(external, inside)


def _absorb_epilogue(
    group: LinearGroup, claimed: set[Operation], order: dict[Operation, int]
) -> None:
    """Grow the epilogue to a fixpoint, visiting candidate users in program order."""
    changed = True
    while changed:
        changed = False
        inside = set(group.ops())
        users = {u.operation for v in group.produced() for u in v.uses}
        for op in sorted((users & order.keys()) - inside - claimed, key=order.__getitem__):
            if _absorbable(op, group, inside):
                group.epilogue.append(op)
                group.epilogue.sort(key=order.__getitem__)
                changed = True
                break


# ------------------------------------------------------------------------------------------------
# Building the kernel
# ------------------------------------------------------------------------------------------------


def _column_blocks(widths: Sequence[int], tile_n: int) -> int:
    """Blocks along the output columns: each head's width split evenly, tiles <= tile_n."""
    common = math.gcd(*widths)
    widest = max(widths)
    for d in range(1, common + 1):
        if common % d == 0 and widest // d <= tile_n:
            parts = d
            break
    else:
        parts = common
    tile = widest // parts
    return parts if tile * 2 > min(widest, tile_n) or tile == widest else 1


@dataclass
class _Layout:
    """Grid and loop of a linear group and the maps that follow from them."""

    grid: tuple[int, int, int]
    forloop: int
    out_rank: int
    vector: bool  # x is rank 1: tiles get a unit row dim for the matmul

    def out_map(self) -> tuple[int, int, int]:
        r = self.out_rank
        return (r - 1, r - 2 if self.grid[1] > 1 else -1, -1)

    def extra_map(self, shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
        """An epilogue operand's imap: partitioned like the output where it is not broadcast."""
        dims = []
        for axis, d in enumerate(self.out_map()):
            e = d - (len(out_shape) - len(shape)) if d >= 0 else -1
            dims.append(e if e >= 0 and shape[e] != 1 and self.grid[axis] > 1 else -1)
        return tuple(dims)


def _layout(group: LinearGroup, t: Tiling) -> _Layout:
    xs = shape_of(group.x)
    out = shape_of(group.heads[0].results[0])
    cols = _column_blocks([shape_of(h.results[0])[-1] for h in group.heads], t.tile_n)
    rows = 1
    if len(xs) >= 2 and len(out) == len(xs) and xs[-2] > t.tile_m:
        rows = xs[-2] // chunk_size(xs[-2], t.tile_m)
    k = xs[-1]
    return _Layout((cols, rows, 1), k // chunk_size(k, t.tile_k), len(out), len(xs) == 1)


def linear_group_kernel(group: LinearGroup, t: Tiling, lookup: ValueMap) -> tuple[
    list[Operation], dict[SSAValue, SSAValue]
]:  # fmt: skip
    """The fused graph_def of a linear group; maps each output nn value to the kernel's result."""
    lay = _layout(group, t)
    outputs = group.outputs()
    operands = Operands()
    ix = operands.index(group.x)
    ig = operands.index(group.norm.operands[1]) if group.norm else -1
    iw = [operands.index(h.operands[1]) for h in group.heads]
    extras = {v: operands.index(v) for v in group.extras()}
    b = new_builder(
        [lookup(v) for v in operands.values],
        [v.type for v in outputs],
        lay.grid,
        128,
        lay.forloop,
        [v.name_hint or "y" for v in outputs],
    )
    xr = len(shape_of(group.x))
    xt = b.input(ix, (-1, xr - 2 if lay.grid[1] > 1 else -1, -1), xr - 1, "xt")
    if lay.vector:
        xt = reshape(b, xt, (1, *shape_of(xt)), "xt2")
    a, rs = xt, None
    if group.norm is not None:
        gt = b.input(ig, (-1, -1, -1), 0, "gt")
        a = b.add(BinaryOp("mul", xt, gt), "xg").res
    accs = {h.results[0]: _head_accumulator(b, h, a, iw[i]) for i, h in enumerate(group.heads)}
    if group.norm is not None:
        ms = b.add(AccumOp("mean_sq_last", xt), "ms").res
        eps = nn_float(group.norm, "epsilon")
        rs = b.thread_map(
            [ms], [ms.type], lambda m: [mathd.RsqrtOp(arith.AddfOp(m, const(eps)).result).result],
            "rs",
        ).res[0]  # fmt: skip
    out_shape = shape_of(group.heads[0].results[0])
    extra_tiles = {
        v: b.input(i, lay.extra_map(shape_of(v), out_shape), -1, f"{v.name_hint or 'e'}t")
        for v, i in extras.items()
    }
    for i, v in enumerate(outputs):
        tile = _epilogue_value(b, group, v, accs, rs, extra_tiles)
        tile = reshape(b, tile, shape_of(tile)[1:] if lay.vector else shape_of(tile), "yv")
        b.output(tile, i, lay.out_map())
    kernel = finish(b, [v.name_hint or "y" for v in outputs])
    if group.norm is not None or group.epilogue or len(group.heads) > 1:
        kernel.attributes["mk.fused"] = _fused_label(group)
    return [kernel], dict(zip(outputs, kernel.results, strict=True))


def _fused_label(group: LinearGroup) -> "StringAttr":
    from xdsl.dialects.builtin import StringAttr

    parts = (["rms_norm"] if group.norm else []) + [h.name.removeprefix("nn.") for h in group.heads]
    parts += [op.name.removeprefix("nn.") for op in group.epilogue]
    return StringAttr("+".join(parts))


def _head_accumulator(b: BlockGraphBuilder, head: Operation, a: SSAValue, index: int) -> SSAValue:
    w = head.operands[1]
    name = w.name_hint or "w"
    if isinstance(head, nn.LinearOp):
        wt = b.input(index, (0, -1, -1), 1, f"{name}t")
        p = b.add(MatmulOp(a, wt, transpose_b=True), f"{name}p").res
    else:
        r = len(shape_of(w))
        wt = b.input(index, (r - 1, -1, -1), r - 2, f"{name}t")
        p = b.add(MatmulOp(a, wt), f"{name}p").res
    return b.add(AccumOp("sum", p), f"{name}acc").res


def _needed(group: LinearGroup, value: SSAValue) -> tuple[list[Operation], list[SSAValue]]:
    """The epilogue ops computing `value` and the leaves (head results, extras) they read."""
    heads = {h.results[0] for h in group.heads}
    ops: set[Operation] = set()
    leaves: list[SSAValue] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if v in heads or v.owner not in group.epilogue:
            if v not in leaves:
                leaves.append(v)
            continue
        op = v.owner
        assert isinstance(op, Operation)
        if op not in ops:
            ops.add(op)
            stack.extend(op.operands)
    rank = {v: i for i, v in enumerate([*(h.results[0] for h in group.heads), *group.extras()])}
    return [op for op in group.epilogue if op in ops], sorted(leaves, key=rank.__getitem__)


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
    ops, leaves = _needed(group, value)
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


__all__ = ["LINEAR_OPS", "LinearGroup", "Block", "depends_on", "f32", "linear_group_kernel"]
