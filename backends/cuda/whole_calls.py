"""Bodies that are one device call whole: a graph_def that only copies its tile (copy_runs.py)
or only normalises rows (norm_runs.py), its tiles' loops replaced by the call."""

from __future__ import annotations

from mk.backends.cpu.emit_ops import GraphDefEmitter
from mk.backends.cuda.copy_runs import copy_calls, plan_copy
from mk.backends.cuda.elementwise import flat_offset
from mk.backends.cuda.norm_runs import norm_calls, plan_norm


def copy_body(e: GraphDefEmitter) -> list[str] | None:
    """The copy calls of a graph_def that only copies its tile, or None."""
    plan = plan_copy(e.op)
    if plan is None:
        return None
    src = e.operands[plan.src.source_index()]
    refs = e.results.get(plan.out.result_index(), [])
    s_first = flat_offset(src.shape, e.input_starts(plan.src, "0"))
    d_firsts = [flat_offset(ref.shape, e.output_starts(plan.out)) for ref in refs]
    return copy_calls(plan, src, refs, s_first, d_firsts)


def norm_body(e: GraphDefEmitter) -> list[str] | None:
    """The norm calls of a graph_def that only normalises rows, or None."""
    plan = plan_norm(e.op)
    if plan is None:
        return None
    x, g = (e.operands[i.source_index()] for i in (plan.x, plan.g))
    refs = e.results.get(plan.out.result_index(), [])
    firsts = (
        flat_offset(x.shape, e.input_starts(plan.x, "0")),
        flat_offset(g.shape, e.input_starts(plan.g, "0")),
        [flat_offset(ref.shape, e.output_starts(plan.out)) for ref in refs],
    )
    return norm_calls(plan, x, g, refs, firsts)


def whole_calls(e: GraphDefEmitter) -> list[str] | None:
    """The device calls that are the whole body of e's graph_def, or None (the usual body)."""
    return copy_body(e) or norm_body(e)
