"""A graph_def that only copies a tile (an input, reshapes, the output, all of one dtype): one
device call that moves it 16 bytes at a time between the two sides' runs, instead of a load into
a float tile and a store element by element (a prefill's head transposes took ~5.5 us a task of
9.5 KB on the H200)."""

from __future__ import annotations

from dataclasses import dataclass

from mk.backends.cpu.emit_ops import BufferRef
from mk.backends.cpu.emit_scalar import dtype_code
from mk.backends.cuda.elementwise import box_runs
from mk.dialects.mugraph import GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import ReshapeOp
from mk.inputs import numpy_dtype, tensor_type


@dataclass(frozen=True)
class CopyPlan:
    """The input whose tile the output writes, element for element (reshapes keep the order);
    `pos`, the input holding an in-place output's position (a prefill's V rows into the cache)."""

    src: InputOp
    out: OutputOp
    pos: InputOp | None = None


def plan_copy(op: GraphDefOp) -> CopyPlan | None:
    """The copy a graph_def of one for-loop iteration is, or None when it does anything else."""
    ops = list(op.body.block.ops)
    inputs = [o for o in ops if isinstance(o, InputOp)]
    outputs = op.output_ops()
    if op.forloop_range() != 1 or len(outputs) != 1:
        return None
    if any(not isinstance(o, InputOp | ReshapeOp | OutputOp) for o in ops):
        return None
    out = outputs[0]
    at = out.position()
    pos = next((i for i in inputs if at is not None and i.tile is at[0]), None)
    rest = [i for i in inputs if i is not pos]
    if (
        len(rest) != 1
        or (at is None and out.over() is not None)
        or (at is not None and pos is None)
    ):
        return None
    src = rest[0]
    value = out.tile
    while isinstance(value.owner, ReshapeOp):
        value = value.owner.x
    types = [src.source.type, src.tile.type, out.dest.type]
    types += [o.res.type for o in ops if isinstance(o, ReshapeOp)]
    if value is not src.tile or len({dtype_code(t) for t in types}) != 1:
        return None
    return CopyPlan(src, out, pos)


def copy_calls(
    plan: CopyPlan, src: BufferRef, dests: list[BufferRef], s_first: str, d_firsts: list[str]
) -> list[str] | None:
    """One mk::gpu::copy_runs per result buffer, the tile's first elements at `s_first` and
    `d_firsts`; None where a side is not plain runs (or waits on flags)."""
    s_runs = box_runs(src.shape, plan.src.tile_shape())
    d_runs = [box_runs(ref.shape, shape_of(plan.out.tile)) for ref in dests]
    if s_runs is None or src.flagged or not dests or any(r.flagged for r in dests):
        return None
    size = numpy_dtype(tensor_type(plan.src.source).get_element_type()).itemsize
    calls = []
    for ref, runs, d_first in zip(dests, d_runs, d_firsts, strict=True):
        if runs is None:
            return None
        calls.append(
            f"mk::gpu::copy_runs<{size}>(buffers[{ref.index}], {d_first}, {runs.cols}, "
            f"{runs.ld}, buffers[{src.index}], {s_first}, {s_runs.cols}, {s_runs.ld}, "
            f"{s_runs.rows * s_runs.cols});  // a copy"
        )
    return calls
