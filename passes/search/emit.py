"""Instantiates a found block graph as a `mugraph.graph_def` for one tiling (grid extents per
label, for-loop range), and enumerates the tilings worth costing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue
from xdsl.utils.exceptions import VerifyException

from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph import GraphDefOp
from mk.dialects.mugraph_base import shape_of, tensor_type
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_maps import MapError
from mk.dialects.mugraph_tiles import (
    AccumOp,
    BinaryOp,
    MatmulOp,
    ReduceOp,
    ReshapeOp,
    UnaryOp,
)
from mk.passes.cost_model import element_bytes
from mk.passes.nn_to_mugraph_rules import const
from mk.passes.search.blockgraph import Tile
from mk.passes.search.enumerate import Found
from mk.passes.search.target import Problem

MIN_TILE = 8  # smallest extent a grid split leaves per block
MIN_CHUNK = 16  # smallest extent one for-loop iteration walks


@dataclass(frozen=True)
class Tiling:
    """Grid axes as (label, extent) (x first; at most two) and the for-loop range."""

    grid: tuple[tuple[int, int], ...]
    forloop: int

    def grid_shape(self) -> tuple[int, int, int]:
        ext = [e for _, e in self.grid] + [1] * (3 - len(self.grid))
        return (ext[0], ext[1], ext[2])

    def describe(self) -> str:
        return f"grid {list(self.grid_shape())} forloop {self.forloop}"


def _splits(extent: int, smallest: int, most: int) -> list[int]:
    return [
        d for d in range(2, min(extent, most) + 1) if extent % d == 0 and extent // d >= smallest
    ]


def tilings(p: Problem, found: Found, num_sms: int) -> list[Tiling]:
    """Every tiling of `found`: grid x over one output label, grid y optionally over another,
    for-loop ranges that leave chunks of >= MIN_CHUNK; deterministic order."""
    labels = p.output_labels()
    grids: list[tuple[tuple[int, int], ...]] = [()]
    for x in labels:
        for ex in _splits(p.extents[x], MIN_TILE, num_sms):
            grids.append(((x, ex),))
            for y in labels:
                if y != x:
                    grids += [
                        ((x, ex), (y, ey)) for ey in _splits(p.extents[y], MIN_TILE, num_sms // ex)
                    ]
    loops = [1] if found.loop is None else _splits(p.extents[found.loop], MIN_CHUNK, 1 << 30)
    return [Tiling(g, f) for g in grids for f in loops]


def default_tiling(p: Problem, found: Found, num_sms: int, tile: int = 64) -> Tiling:
    """What the rules would pick: the last output label split into ~`tile` columns, chunks of
    ~`tile` along the loop; used to rank graphs before their tilings are swept."""
    labels = p.output_labels()
    grid: tuple[tuple[int, int], ...] = ()
    if labels:
        last = labels[-1]
        splits = [
            d for d in _splits(p.extents[last], MIN_TILE, num_sms) if p.extents[last] // d >= tile
        ]
        if splits:
            grid = ((last, max(splits)),)
    forloop = 1
    if found.loop is not None:
        splits = [
            d
            for d in _splits(p.extents[found.loop], MIN_CHUNK, 1 << 30)
            if p.extents[found.loop] // d >= tile
        ]
        forloop = max(splits) if splits else 2 if p.extents[found.loop] % 2 == 0 else 1
    return Tiling(grid, forloop)


def _int(attr: object) -> int:
    assert isinstance(attr, int)
    return attr


def _float(attr: object) -> float:
    assert isinstance(attr, int | float)
    return float(attr)


def _axis_map(labels: Sequence[int], tiling: Tiling) -> tuple[int, int, int]:
    dims = [labels.index(label) if label in labels else -1 for label, _ in tiling.grid]
    dims += [-1] * (3 - len(dims))
    return (dims[0], dims[1], dims[2])


class _Emitter:
    def __init__(self, p: Problem, found: Found, tiling: Tiling, operands: Sequence[SSAValue]):
        self.p, self.found, self.tiling = p, found, tiling
        self.used = sorted({_int(t.attr) for t in found.tiles if t.kind == "input"})
        args = [operands[i] for i in self.used]
        types = [o.type for o in p.outputs]
        names = [f"{p.input_names[i]}_a" for i in self.used]
        self.b = BlockGraphBuilder(
            args, types, tiling.grid_shape(), 128, tiling.forloop, names,
            [f"{o.name_hint or 'y'}_r" for o in p.outputs],
        )  # fmt: skip
        self.values: list[SSAValue] = []

    def build(self) -> GraphDefOp:
        for t in self.found.tiles:
            self.values.append(self._op(t))
        for k, (out, index) in enumerate(zip(self.p.outputs, self.found.outputs, strict=True)):
            omap = _axis_map(self.p.labels[out], self.tiling)
            tile = self.values[index]
            want = list(maps.output_tile_shape(shape_of(out), self.tiling.grid_shape(), omap))
            if math.prod(shape_of(tile)) != math.prod(want):
                raise MapError(f"output tile {shape_of(tile)} does not fill {want}")
            if list(shape_of(tile)) != want:
                tile = self.b.add(ReshapeOp(tile, want), f"o{k}").res
            self.b.output(tile, k, omap)
        kernel = self.b.finish()
        for r, out in zip(kernel.results, self.p.outputs, strict=True):
            r.name_hint = out.name_hint
        return kernel

    def _op(self, t: Tile) -> SSAValue:
        b, v, name = self.b, self.values, f"t{len(self.values)}"
        args = [v[i] for i in t.operands]
        if t.kind == "input":
            index = _int(t.attr)
            labels = self.p.labels[self.p.inputs[index]]
            loop = self.found.loop
            fmap = labels.index(loop) if loop is not None and loop in labels else -1
            return b.input(self.used.index(index), _axis_map(labels, self.tiling), fmap, name)
        if t.kind == "matmul":
            return b.add(MatmulOp(args[0], args[1], transpose_b=bool(t.attr)), name).res
        if t.kind in ("mul", "add", "sub"):
            return b.add(BinaryOp(t.kind, args[0], args[1]), name).res
        if t.kind == "unary":
            return b.add(UnaryOp(str(t.attr), args[0]), name).res
        if t.kind == "scale":
            return b.add(UnaryOp("scale", args[0], factor=_float(t.attr)), name).res
        if t.kind == "addc":
            c = _float(t.attr)
            body = lambda x: [arith.AddfOp(x, const(c)).result]  # noqa: E731
            return b.thread_map(args, [args[0].type], body, name).res[0]
        if t.kind == "reduce":
            assert isinstance(t.attr, tuple)
            kind, dim = t.attr
            return b.add(ReduceOp(kind, args[0], dim, keepdim=True), name).res
        assert t.kind == "accum"
        return b.add(AccumOp(str(t.attr), args[0]), name).res


def instantiate(
    p: Problem, found: Found, tiling: Tiling, operands: Sequence[SSAValue], verify: bool = True
) -> GraphDefOp | None:
    """The graph_def of `found` under `tiling` reading `operands` (one per problem input), or
    None when the tiling does not fit (a split that does not divide, an invalid map). Without
    `verify` only the maps and shapes the builder computes are checked (enough to cost it)."""
    try:
        kernel = _Emitter(p, found, tiling, operands).build()
        if verify:
            kernel.verify()
    except (MapError, VerifyException, AssertionError):
        return None
    return kernel


def smem_bytes(kernel: GraphDefOp) -> int:
    """Bytes one block holds at once: every tile of its block graph (a conservative bound)."""
    total = 0
    for op in kernel.body.block.ops:
        for r in op.results:
            ty = r.type
            if isinstance(ty, TensorType):
                total += math.prod(ty.get_shape()) * element_bytes(tensor_type(r).element_type)
    return total
