"""A graph_def that only normalises rows (an input of 16-bit rows, the norm weight, one RMSNorm,
the output in the rows' type): one device call, mk::gpu::rms_norm_runs, that reads each row into
a warp's registers and writes it back normalised, instead of f32 tiles loaded, normalised and
stored element by element (a prefill's norm of 9 rows of 1,024 took ~20 us a task on the H200
that way, most of it the tiles' loads and stores)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.ir import SSAValue

from mk.backends.cpu.emit_ops import BufferRef
from mk.backends.cpu.emit_scalar import float_literal
from mk.backends.cuda.elementwise import box_runs
from mk.dialects.mugraph import GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import RMSNormOp
from mk.inputs import tensor_type

HALF_TYPES = {"bf16": "true", "f16": "false"}  # rms_norm_runs's BF16 argument


@dataclass(frozen=True)
class NormPlan:
    """The rows' input, the norm weight's input, the norm, and the output it writes."""

    x: InputOp
    g: InputOp
    norm: RMSNormOp
    out: OutputOp

    def width(self) -> int:
        return shape_of(self.norm.x)[-1]

    def rows(self) -> int:
        return math.prod(shape_of(self.norm.x)) // self.width()


def _half_type(value: SSAValue) -> str | None:
    name = str(tensor_type(value).get_element_type())
    return name if name in HALF_TYPES else None


def plan_norm(op: GraphDefOp) -> NormPlan | None:
    """The norm a graph_def of one for-loop iteration is, or None when it does anything else."""
    ops = list(op.body.block.ops)
    inputs = [o for o in ops if isinstance(o, InputOp)]
    norms = [o for o in ops if isinstance(o, RMSNormOp)]
    outputs = op.output_ops()
    if op.forloop_range() != 1 or len(inputs) != 2 or len(norms) != 1 or len(outputs) != 1:
        return None
    if len(ops) != 4:
        return None
    (norm,), (out,) = norms, outputs
    by_tile: dict[SSAValue, InputOp] = {i.tile: i for i in inputs}
    x, g = by_tile.get(norm.x), by_tile.get(norm.g)
    if x is None or g is None or out.tile is not norm.res or out.over() is not None:
        return None
    width = shape_of(norm.x)[-1] if shape_of(norm.x) else 0
    if width % 32 or shape_of(norm.g) != (width,) or shape_of(norm.res) != shape_of(norm.x):
        return None
    types = {_half_type(v) for v in (x.source, x.tile, g.source, out.dest)}
    if len(types) != 1 or None in types:
        return None
    return NormPlan(x, g, norm, out)


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


def norm_calls(
    plan: NormPlan,
    x: BufferRef,
    g: BufferRef,
    dests: list[BufferRef],
    firsts: tuple[str, str, list[str]],
) -> list[str] | None:
    """One mk::gpu::rms_norm_runs per result buffer, the rows' first elements and the weight's at
    `firsts` (x, g, each result); None where a side is not rows of whole runs or a buffer waits
    on flags."""
    s_first, g_first, d_firsts = firsts
    width, tile = plan.width(), plan.x.tile_shape()
    s_ld = _row_step(x, tile, width)
    if s_ld is None or x.flagged or g.flagged or not dests:
        return None
    kind = HALF_TYPES[_half_type(plan.x.source) or "bf16"]
    eps = float_literal(float(plan.norm.epsilon.value.data))
    calls = []
    for ref, d_first in zip(dests, d_firsts, strict=True):
        d_ld = _row_step(ref, shape_of(plan.out.tile), width)
        if d_ld is None or ref.flagged:
            return None
        calls.append(
            f"mk::gpu::rms_norm_runs<{width}, {kind}>(buffers[{ref.index}], {d_first}, {d_ld}, "
            f"buffers[{x.index}], {s_first}, {s_ld}, static_cast<const uint16_t*>(buffers[{g.index}])"
            f" + ({g_first}), {plan.rows()}, {eps});  // a norm"
        )
    return calls
