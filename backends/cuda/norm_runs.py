"""A graph_def that only normalises rows (an input of 16-bit rows, the norm weight, one RMSNorm,
optionally a RoPE of the normalised rows, the output in the rows' type, optionally in place at a
position): one device call, mk::gpu::rms_norm_runs or rms_norm_rope_runs, that reads each row
into a warp's registers and writes it back, instead of f32 tiles loaded, normalised, rotated
and stored element by element (a prefill's norm of 9 rows of 1,024 took ~20 us a task on the
H200 that way, its QK-norm + RoPE of 37 rows of 128 ~13 us, most of it the tiles' loads and
stores). A decode step's QK-norm (one table row for all) keeps its tile form unless
MK_CUDA_ROW_RUNS says otherwise (switches.row_runs)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_ops import BufferRef
from mk.backends.cpu.emit_scalar import float_literal
from mk.backends.cuda import switches
from mk.backends.cuda.elementwise import box_runs
from mk.dialects.mugraph import GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import RMSNormOp, RopeOp
from mk.inputs import tensor_type

HALF_TYPES = {"bf16": "true", "f16": "false"}  # the calls' BF16 argument


@dataclass(frozen=True)
class NormPlan:
    """The rows' and the norm weight's inputs, the norm, the output, and where the body rotates
    the normalised rows its RoPE and the tables' inputs; `pos`, the input holding an in-place
    output's position."""

    x: InputOp
    g: InputOp
    norm: RMSNormOp
    out: OutputOp
    rope: RopeOp | None = None
    tables: tuple[InputOp, InputOp] | None = None
    pos: InputOp | None = None

    def width(self) -> int:
        return shape_of(self.norm.x)[-1]

    def rows(self) -> int:
        return math.prod(shape_of(self.norm.x)) // self.width()

    def positions(self) -> int:
        """Rows of the RoPE tables (1: one row for all), row r taking row r % positions."""
        if self.tables is None:
            return 1
        table = self.tables[0].tile_shape()
        return math.prod(table) // (self.width() // 2)


def _half_type(value: SSAValue) -> str | None:
    name = str(tensor_type(value).get_element_type())
    return name if name in HALF_TYPES else None


_Rope = tuple[RopeOp | None, tuple[InputOp, InputOp] | None]


def _rope(
    norm: RMSNormOp, ops: Sequence[Operation], by_tile: dict[SSAValue, InputOp]
) -> _Rope | None:
    """The RoPE that rotates the norm's rows and its tables' inputs, (None, None) where there is
    none, or None where the body rotates in a way the call does not."""
    ropes = [o for o in ops if isinstance(o, RopeOp)]
    if not ropes:
        return None, None
    (rope,) = ropes
    tables = (by_tile.get(rope.cos), by_tile.get(rope.sin))
    if rope.x is not norm.res or tables[0] is None or tables[1] is None:
        return None
    x, half = shape_of(norm.x), shape_of(norm.x)[-1] // 2
    shapes = {tables[0].tile_shape(), tables[1].tile_shape()}
    if len(shapes) != 1 or x[-1] % 64 or len(x) < 2:
        return None
    (table,) = shapes
    if math.prod(table) != half and (
        table[-2:] != (x[-2], half) or math.prod(table) != x[-2] * half
    ):
        return None  # neither one row for all nor a row per position of x's second-last dim
    return rope, (tables[0], tables[1])


def plan_norm(op: GraphDefOp) -> NormPlan | None:
    """The norm (and RoPE) a graph_def of one for-loop iteration is, or None when it does
    anything else or switches.row_runs leaves it to the tile path."""
    ops = list(op.body.block.ops)
    inputs = [o for o in ops if isinstance(o, InputOp)]
    norms = [o for o in ops if isinstance(o, RMSNormOp)]
    outputs = op.output_ops()
    if op.forloop_range() != 1 or len(norms) != 1 or len(outputs) != 1:
        return None
    (norm,), (out,) = norms, outputs
    by_tile: dict[SSAValue, InputOp] = {i.tile: i for i in inputs}
    x, g = by_tile.get(norm.x), by_tile.get(norm.g)
    width = shape_of(norm.x)[-1] if shape_of(norm.x) else 0
    if x is None or g is None or width % 32 or shape_of(norm.g) != (width,):
        return None
    found = _rope(norm, ops, by_tile)
    if found is None:
        return None
    rope, tables = found
    at = out.position()
    pos = by_tile.get(at[0]) if at is not None else None
    used = {x, g, *(tables or ()), *((pos,) if pos is not None else ())}
    if (at is not None and pos is None) or len(ops) != len(used) + 2 + (rope is not None):
        return None
    last = rope.res if rope is not None else norm.res
    if out.tile is not last or shape_of(last) != shape_of(norm.x) or out.accumulate is not None:
        return None
    halves = [x.source, x.tile, g.source, out.dest, *(t.source for t in tables or ())]
    types = {_half_type(v) for v in halves}
    if len(types) != 1 or None in types:
        return None
    plan = NormPlan(x, g, norm, out, rope, tables, pos)
    return plan if switches.row_runs(rope is not None and plan.positions() == 1) else None


def _row_step(ref: BufferRef, tile: tuple[int, ...], width: int) -> str | None:
    """Elements from one row of the box to the next in its buffer, or None when its rows are
    not whole runs of `width`."""
    runs = box_runs(ref.shape, tile)
    if runs is None:
        return None
    if runs.cols == width:
        return str(runs.ld)
    if runs.rows == 1 and runs.cols % width == 0:
        return str(width)
    return None


@dataclass(frozen=True)
class Firsts:
    """The tiles' first elements in their buffers: the rows, the norm weight, each result and
    the tables' (one expression for both, None without a RoPE)."""

    x: str
    g: str
    results: list[str]
    tables: str | None = None


def norm_calls(
    plan: NormPlan,
    x: BufferRef,
    g: BufferRef,
    tables: Sequence[BufferRef],
    dests: list[BufferRef],
    firsts: Firsts,
) -> list[str] | None:
    """One call per result buffer; None where a side is not rows of whole runs, the tables are
    not rows of D/2 one after another, or a buffer waits on flags."""
    width, tile = plan.width(), plan.x.tile_shape()
    s_ld = _row_step(x, tile, width)
    flagged = x.flagged or g.flagged or any(t.flagged for t in tables)
    if s_ld is None or flagged or not dests:
        return None
    kind = HALF_TYPES[_half_type(plan.x.source) or "bf16"]
    eps = float_literal(float(plan.norm.epsilon.value.data))
    weight = f"static_cast<const uint16_t*>(buffers[{g.index}]) + ({firsts.g})"
    if plan.tables is not None:
        half = width // 2
        steps = {
            _row_step(t, i.tile_shape(), half) for t, i in zip(tables, plan.tables, strict=True)
        }
        if steps != {str(half)} and plan.positions() > 1:
            return None
        row_tables = "true" if plan.positions() > 1 else "false"
        name = f"rms_norm_rope_runs<{width}, {kind}, {row_tables}>"
        rest = (
            f"{weight}, buffers[{tables[0].index}], buffers[{tables[1].index}], {firsts.tables}, "
            f"{plan.rows()}, {plan.positions()}, {eps}"
        )
    else:
        name = f"rms_norm_runs<{width}, {kind}>"
        rest = f"{weight}, {plan.rows()}, {eps}"
    calls = []
    for ref, d_first in zip(dests, firsts.results, strict=True):
        d_ld = _row_step(ref, shape_of(plan.out.tile), width)
        if d_ld is None or ref.flagged:
            return None
        calls.append(
            f"mk::gpu::{name}(buffers[{ref.index}], {d_first}, {d_ld}, buffers[{x.index}], "
            f"{firsts.x}, {s_ld}, {rest});  // a norm"
        )
    return calls
