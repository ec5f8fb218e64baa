"""Bodies that are one device call whole: a graph_def that only copies its tile (copy_runs.py)
or only normalises rows (norm_runs.py), its tiles' loops replaced by the call."""

from __future__ import annotations

from mk.backends.cpu.emit_ops import GraphDefEmitter
from mk.backends.cuda.copy_runs import copy_calls, plan_copy
from mk.backends.cuda.elementwise import flat_offset
from mk.backends.cuda.norm_runs import Firsts, norm_calls, plan_norm
from mk.dialects.mugraph import InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of


def placed_starts(
    e: GraphDefEmitter, out: OutputOp, pos: InputOp | None
) -> tuple[list[str], list[str]] | None:
    """The output tile's per-dimension starts and the lines before the call: for an in-place
    output, the load of its position (at_pos) and the bounds check that fails the task, as the
    tile form's store does. None where the position's buffer waits on flags (the tile form then
    polls them)."""
    starts, at = e.output_starts(out), out.position()
    if pos is None or at is None:
        return starts, []
    ref = e.operands[pos.source_index()]
    if ref.flagged:
        return None
    where = flat_offset(ref.shape, e.input_starts(pos, "0"))
    d = at[1]
    starts[d] = "at_pos" if starts[d] == "0" else f"at_pos + {starts[d]}"
    extent, n = shape_of(out.dest)[d], shape_of(out.tile)[d]
    return starts, [
        f"const int64_t at_pos = mk::gpu::load_elem_i(buffers[{ref.index}], {ref.dtype}, {where});",
        f"if ({starts[d]} < 0 || {starts[d]} + {n} > {extent}) return 1;",
    ]


def copy_body(e: GraphDefEmitter) -> list[str] | None:
    """The copy calls of a graph_def that only copies its tile, or None."""
    plan = plan_copy(e.op)
    if plan is None:
        return None
    src = e.operands[plan.src.source_index()]
    refs = e.results.get(plan.out.result_index(), [])
    placed = placed_starts(e, plan.out, plan.pos)
    if placed is None:
        return None
    starts, lines = placed
    s_first = flat_offset(src.shape, e.input_starts(plan.src, "0"))
    d_firsts = [flat_offset(ref.shape, starts) for ref in refs]
    calls = copy_calls(plan, src, refs, s_first, d_firsts)
    return None if calls is None else [*lines, *calls]


def norm_body(e: GraphDefEmitter) -> list[str] | None:
    """The norm calls of a graph_def that only normalises (and rotates) rows, after the load of
    an in-place output's position and its bounds check; or None."""
    plan = plan_norm(e.op)
    if plan is None:
        return None
    x, g = (e.operands[i.source_index()] for i in (plan.x, plan.g))
    tables = [e.operands[i.source_index()] for i in plan.tables or ()]
    table_firsts = {
        flat_offset(ref.shape, e.input_starts(i, "0"))
        for ref, i in zip(tables, plan.tables or (), strict=True)
    }
    if len(table_firsts) > 1:
        return None  # cos and sin rows from different places
    placed = placed_starts(e, plan.out, plan.pos)
    if placed is None:
        return None
    starts, lines = placed
    refs = e.results.get(plan.out.result_index(), [])
    firsts = Firsts(
        flat_offset(x.shape, e.input_starts(plan.x, "0")),
        flat_offset(g.shape, e.input_starts(plan.g, "0")),
        [flat_offset(ref.shape, starts) for ref in refs],
        table_firsts.pop() if table_firsts else None,
    )
    calls = norm_calls(plan, x, g, tables, refs, firsts)
    return None if calls is None else [*lines, *calls]


def whole_calls(e: GraphDefEmitter) -> list[str] | None:
    """The device calls that are the whole body of e's graph_def, or None (the usual body)."""
    return copy_body(e) or norm_body(e)
