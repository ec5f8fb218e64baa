"""The merge of split-KV attention partials as one device call instead of a chain of tile steps.

A graph_def that reads S partials (o, and per row the running max m and sum l) along a leading
split dim and combines them — mx = max m, w = e^(m − mx), lsum = Σ l·w, osum = Σ o·w — is what
decode attention's merge kernel is (nn_to_mugraph_rules._merge_kernel). Written as tile steps
it takes six barriers and stages every partial in shared memory; `mk::gpu::merge_splits`
(mk/cuda_merge.cuh) computes mx, lsum and osum with one round of loads per thread (two
beyond 32 splits) and one barrier, and the graph_def's normalisation and stores run after it as usual.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import FloatData
from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_scalar import dtype_code, float_literal
from mk.backends.cuda.elementwise import Runs, box_runs
from mk.backends.cuda.stream_attention import THREADS, used_only_by
from mk.dialects.mugraph import GraphDefOp, InputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import BinaryOp, ReduceOp, ReshapeOp, ThreadMapOp, YieldOp


@dataclass(frozen=True)
class MergePlan:
    """The inputs and results of a split merge; `handled` are the ops the device call replaces."""

    out: InputOp  # the partial outputs
    peak: InputOp  # their running maxima
    total: InputOp  # their softmax sums
    mx: ReduceOp
    lsum: ReduceOp
    osum: ReduceOp
    handled: frozenset[Operation]

    @property
    def splits(self) -> int:
        return self.peak.tile_shape()[0]

    @property
    def rows(self) -> int:
        return math.prod(self.peak.tile_shape()) // self.splits

    @property
    def width(self) -> int:
        """Elements of o per row."""
        return math.prod(self.out.tile_shape()) // math.prod(self.peak.tile_shape())

    def results(self) -> tuple[ReduceOp, ReduceOp, ReduceOp]:
        return self.mx, self.lsum, self.osum

    def streamed(self) -> set[SSAValue]:
        """The values the device call never holds as tiles."""
        return {r for op in self.handled - set(self.results()) for r in op.results}


def plan_merge(op: GraphDefOp) -> MergePlan | None:
    """The merge form of `op`, or None when its loop does anything else with the partials."""
    if op.forloop_range() != 1:
        return None
    return match_merge(op.loop_ops())


def match_merge(ops: Sequence[Operation], tile_runs: bool = True) -> MergePlan | None:
    """The merge among `ops` (a graph_def's loop), or None. `tile_runs`: each split's rows of
    a tile must be one run of its source (a merge kernel's own tiles); a merge folded into a
    linear's loop merges its whole sources instead (plan_merged_x checks their layout)."""
    reduces = [o for o in ops if isinstance(o, ReduceOp) and o.dim.value.data == 0]
    mx = next((r for r in reduces if r.kind.data == "max" and r.keepdim is not None), None)
    if mx is None or not isinstance(m := mx.x.owner, InputOp):
        return None
    w = _weights(mx, m)
    if w is None:
        return None
    found = [_weighted_sum(r, w) for r in reduces if r.kind.data == "sum" and r.keepdim is None]
    sums = [f for f in found if f is not None]
    lsum = next((s for s in sums if shape_of(s[1].tile) == shape_of(m.tile)), None)
    osum = next((s for s in sums if s is not lsum), None)
    if lsum is None or osum is None:
        return None
    (ls, total, lmul), (os_, out, omul) = lsum, osum
    handled: set[Operation] = {m, mx, w, total, lmul, ls, out, omul, os_}
    if len(handled) != 9 or not _shapes_fit(m, total, out, tile_runs):
        return None
    if not used_only_by(handled - {mx, ls, os_}, handled):
        return None
    return MergePlan(out, m, total, mx, ls, os_, frozenset(handled))


def _weights(mx: ReduceOp, m: InputOp) -> ThreadMapOp | None:
    """The thread_map e^(m − mx) over the partial maxima, if that is mx's other use."""
    for use in mx.res.uses:
        t = use.operation
        if isinstance(t, ThreadMapOp) and list(t.args) == [m.tile, mx.res] and _is_exp_diff(t):
            return t
    return None


def _is_exp_diff(t: ThreadMapOp) -> bool:
    ops = list(t.body.block.ops)
    if len(ops) != 3 or not isinstance(sub := ops[0], arith.SubfOp):
        return False
    a, b = t.body.block.args
    exp, done = ops[1], ops[2]
    return (
        sub.lhs == a
        and sub.rhs == b
        and isinstance(exp, mathd.ExpOp)
        and exp.operand == sub.result
        and isinstance(done, YieldOp)
        and list(done.operands) == [exp.result]
    )


def _weighted_sum(r: ReduceOp, w: ThreadMapOp) -> tuple[ReduceOp, InputOp, BinaryOp] | None:
    """(sum, input, product) for a sum over splits of an input times the weights."""
    mul = r.x.owner
    if not isinstance(mul, BinaryOp) or mul.kind.data != "mul":
        return None
    weights = w.res[0]
    other = mul.b if mul.a == weights else mul.a if mul.b == weights else None
    if other is None or not isinstance(src := other.owner, InputOp):
        return None
    return r, src, mul


def _shapes_fit(peak: InputOp, total: InputOp, out: InputOp, tile_runs: bool) -> bool:
    """f32 partials, split-major, every split's rows one contiguous run of its source (unless
    not `tile_runs`)."""
    tm, to = peak.tile_shape(), out.tile_shape()
    if total.tile_shape() != tm or len(to) != len(tm) or tm[-1] != 1 or to[:-1] != tm[:-1]:
        return False
    if tm[0] < 2:
        return False
    ops = (peak, total, out)
    if any(dtype_code(x.tile.type) != "mk::DTYPE_F32" for x in ops):
        return False
    if any(dtype_code(x.source.type) != "mk::DTYPE_F32" for x in ops):
        return False
    if not tile_runs:
        return True
    runs = [_runs(x) for x in ops]
    if any(r is None or r.rows != tm[0] for r in runs):
        return False
    return runs[0] == runs[1]  # the maxima and the sums share one layout


def _runs(op: InputOp) -> Runs | None:
    tile = op.tile_shape()
    runs = box_runs(shape_of(op.source), tile)
    if runs is None or runs.cols != math.prod(tile) // tile[0]:
        return None
    return runs


def split_ld(op: InputOp) -> int:
    """Elements between one split's run and the next in the source."""
    runs = _runs(op)
    assert runs is not None
    return runs.ld


def merge_lines(
    plan: MergePlan, var: Callable[[SSAValue], str], source: Callable[[InputOp], str]
) -> list[str]:
    """The device call: `var` names a result's tile, `source` points at an input's first
    element (a `const float*`)."""
    lines = [f"{var(r.res)}.resize({math.prod(shape_of(r.res))});" for r in plan.results()]
    out, peak, total = (source(x) for x in (plan.out, plan.peak, plan.total))
    lines.append(
        f"mk::gpu::merge_splits<{plan.splits}, {plan.rows}, {plan.width}>("
        f"{out}, {split_ld(plan.out)}, {peak}, {total}, {split_ld(plan.peak)}, "
        f"{var(plan.mx.res)}.data(), "
        f"{var(plan.lsum.res)}.data(), {var(plan.osum.res)}.data());"
    )
    return lines


# ------------------------------------------------------------------------------------------------
# The merge as a linear's activation (mugraph-fuse-loop folded it into the o-projection's loop)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergedX:
    """A linear's activation chunk that is iteration i's merge of the split partials, normalised
    (osum / lsum, or 0 for a row that saw no key) and viewed as the chunk [B, G · width] (B
    batch rows, G heads). Over the whole loop the iterations' rows are all the rows of the
    partials, in the activation's order, so one device call merges them all into the staged
    activation before the weights stream."""

    merge: MergePlan
    norm: ThreadMapOp
    view: ReshapeOp  # the normalised tile as the activation chunk
    rows: int  # over the whole loop
    empty_below: float  # a row whose max is below this saw no visible key
    handled: frozenset[Operation]
    run: int = 0  # rows come in runs of this many consecutive partial rows (0: all consecutive)
    run_ld: int = 0  # partial rows from one run to the next

    @property
    def tile(self) -> SSAValue:
        return self.view.res


def plan_merged_x(loop: Sequence[Operation], lhs: SSAValue, forloop: int) -> MergedX | None:
    """The merged form of a matmul's left side `lhs`, or None when it is anything else."""
    view = lhs.owner
    if not isinstance(view, ReshapeOp) or not isinstance(norm := view.x.owner, ThreadMapOp):
        return None
    merge = match_merge(loop, tile_runs=False)
    if merge is None or any(x.fmap_dim() != 2 for x in (merge.out, merge.peak, merge.total)):
        return None
    args = list(norm.args)
    if len(args) != 3 or args[0] != merge.osum.res or args[1] != merge.lsum.res:
        return None
    mx4 = args[2].owner
    if not isinstance(mx4, ReshapeOp) or mx4.x != merge.mx.res:
        return None
    empty_below = _normalise_limit(norm)
    shape = shape_of(lhs)
    if empty_below is None or len(shape) != 2:
        return None
    if shape[0] * shape[1] != merge.rows * merge.width or len(norm.res) != 1:
        return None
    # Every iteration's rows, from the block's first: [splits, B, Hq, 1, D] holds row (b, h)
    # where the activation [B, Hq·D] has its head h of row b, so merging them in order lays out
    # the block's activation: all of it, or (mugraph-split-loop: one iteration a block) one KV
    # head's columns, of one row (consecutive rows) or of every row (a run per row).
    rows = merge.rows * forloop
    runs = {_head_runs(op, forloop) for op in (merge.out, merge.peak, merge.total)}
    if len(runs) != 1 or (run := runs.pop()) is None:
        return None
    handled = {*merge.handled, mx4, norm, view}
    if not used_only_by(handled - {view}, handled):
        return None
    return MergedX(merge, norm, view, rows, empty_below, frozenset(handled), *run)


def _head_runs(op: InputOp, forloop: int) -> tuple[int, int] | None:
    """How the loop's tiles of partials [S, B, H, ...] along H lie in each split: (0, 0) for
    consecutive rows (one batch row, or all of H), (heads, H) for a run of heads per batch row;
    None unless every split and every dim after H is whole."""
    tile, shape = op.tile_shape(), shape_of(op.source)
    if len(shape) < 3 or tile[0] != shape[0] or tile[3:] != shape[3:]:
        return None
    heads = tile[2] * forloop
    if tile[1] == 1 or heads == shape[2]:
        return 0, 0
    return heads, shape[2]


def _normalise_limit(t: ThreadMapOp) -> float | None:
    """c when `t` is (o, l, m) -> m < c ? 0 : o / l, else None."""
    ops = list(t.body.block.ops)
    if len(ops) != 6:
        return None
    limit, cmp, zero, div, sel, done = ops
    o, lsum, m = t.body.block.args
    if not (isinstance(limit, arith.ConstantOp) and isinstance(zero, arith.ConstantOp)):
        return None
    c, z = (getattr(x.value, "value", None) for x in (limit, zero))
    if not isinstance(c, FloatData) or not isinstance(z, FloatData) or z.data != 0.0:
        return None
    ok = (
        isinstance(cmp, arith.CmpfOp)
        and cmp.predicate.value.data == 4  # olt
        and (cmp.lhs, cmp.rhs) == (m, limit.result)
        and isinstance(div, arith.DivfOp)
        and (div.lhs, div.rhs) == (o, lsum)
        and isinstance(sel, arith.SelectOp)
        and (sel.cond, sel.lhs, sel.rhs) == (cmp.result, zero.result, div.result)
        and isinstance(done, YieldOp)
        and list(done.operands) == [sel.result]
    )
    return c.data if ok else None


def merged_x_lines(
    x: MergedX, dtype: str, into: str, source: Callable[[InputOp], str], beside: str = ""
) -> list[str]:
    """The device call merging every row into `into` (floats, rounded to `dtype`); with
    `beside`, the statement the threads of the warps that do not merge run meanwhile, knowing
    their index `t` of `n` (merge_rows_beside: needs idle_warps)."""
    m = x.merge
    out, peak, total = (source(op) for op in (m.out, m.peak, m.total))
    runs = f", {x.run}, {x.run_ld}" if x.run else ""
    args = (
        f"{out}, {_whole_ld(m.out)}, {peak}, {total}, {_whole_ld(m.peak)}, {x.rows}, "
        f"{float_literal(x.empty_below)}, {dtype}, {into}"
    )
    if beside:
        assert idle_warps(x), "merge_rows_beside needs warps that do not merge"
        call = f"mk::gpu::merge_rows_beside<{m.splits}, {m.width}{runs}>"
        return [f"{call}({args}, [&](int t, int n) {{ {beside} }});"]
    return [f"mk::gpu::merge_rows<{m.splits}, {m.width}{runs}>({args});"]


def idle_warps(x: MergedX) -> bool:
    """Whether a CTA's threads merge at most one item (four elements of a row) each and leave a
    warp or more idle."""
    return leaves_a_warp_idle(x.rows * (x.merge.width // 4))


def mostly_idle(x: MergedX) -> bool:
    """Whether a CTA's merge takes at most a quarter of its threads (an item, four elements of a
    row, a thread): where the warps beside it asking for the weights paid off."""
    return x.rows * (x.merge.width // 4) <= THREADS // 4


def leaves_a_warp_idle(items: int) -> bool:
    """Whether `items`, one a thread from thread 0, leave a CTA's last warp or more without one."""
    return items <= THREADS - 32


def _whole_ld(op: InputOp) -> int:
    """Elements between one split and the next in the source (split-major)."""
    return math.prod(shape_of(op.source)[1:])
