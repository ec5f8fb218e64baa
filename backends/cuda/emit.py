"""Emit one CUDA source per task.graph: cooperative device task bodies and the megakernel ABI.

The task bodies reuse the CPU backend's statement emitters (same ops, same order, same
rounding) and rewrite their statements for the device: tiles become fixed-capacity
`mk::gpu::Tile`s in the CTA's scratch area, the helpers become the cooperative ones of
mk/cuda_kernels.h, and element loops (thread_map) stride over the CTA's threads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit import (
    LibraryEmitter,
    _graph_of,
    _ident,
    grid_kernel,
)
from mk.backends.cpu.emit_ops import (
    BINARY_ENUM,
    REDUCE_ENUM,
    UNARY_ENUM,
    BufferRef,
    GraphDefEmitter,
)
from mk.backends.cpu.emit_scalar import dtype_code, float_literal, is_float
from mk.backends.cuda import op_marks, switches
from mk.backends.cuda.barriers import PLACEHOLDER, Loop, every_loop, place_barriers
from mk.backends.cuda.device_lines import device_lines
from mk.backends.cuda.dispatch import (
    body_slots,
    device_function,
    dispatch_struct,
    ring_layout,
    slot_rows,
)
from mk.backends.cuda.elementwise import box_runs, element_offset, flat_offset
from mk.backends.cuda.fuse_loops import fuse_element_loops
from mk.backends.cuda.row_ops import static_row_op
from mk.backends.cuda.split_merge import MergedX, MergePlan, merge_lines, merged_x_lines, plan_merge
from mk.backends.cuda.stream import (
    STAGE_LOST,
    STAGE_X_BYTES,
    TURN_STOPPED,
    StreamPlan,
    plan_stream,
    prefetch_spans,
    stage_offsets,
    staged_ld,
    staging,
)
from mk.backends.cuda.stream_attention import (
    AttentionPlan,
    HeadRow,
    plan_attention,
    score_lambda,
)
from mk.backends.shared_bodies import SharedBodies
from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph import GraphDefOp, InputOp, KernelOp, OutputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import (
    AccumOp,
    BinaryOp,
    ReduceOp,
    ReshapeOp,
    ThreadMapOp,
    UnaryOp,
)
from mk.dialects.task import BufferOp, GraphOp, GridOp
from mk.dialects.task_index import tail_edge
from mk.inputs import numpy_dtype, tensor_type

SCRATCH_SLACK = 1 << 16  # bytes per CTA beyond the tiles: alignment and small temporaries
# The budget to try when turning the prefetch on (MK_CUDA_PREFETCH): two tasks' worth on every
# SM must fit the 50 MB L2 beside the activations, or the prefetch evicts what it fetched.
PREFETCH_MAX = 128 << 10


def prefetch_at_wait() -> bool:
    """MK_CUDA_PREFETCH_AT: `ahead` (default) asks the L2 for the next task's weights while the
    current one waits and runs; `wait` asks for a task's own weights once a wait finds its
    producers unfinished, so a ready task starts without the cost."""
    return switches.choice("MK_CUDA_PREFETCH_AT", ("ahead", "wait")) == "wait"


def early_loads() -> bool:
    """MK_CUDA_EARLY=1: a streamed linear asks the L2 for its first round of weights before it
    stages the activation (stream_linear's Early), so that round trip overlaps the staging."""
    return switches.flag("MK_CUDA_EARLY")


def load_ahead() -> bool:
    """MK_CUDA_LOAD_AHEAD=1: a streamed linear on CUDA cores whose body reads nothing before
    its product issues the first round of its weight loads and then waits for its turn itself
    (stream_linear's Ahead, mk::Turn), so HBM streams them while the producers finish."""
    return switches.flag("MK_CUDA_LOAD_AHEAD")


def lean_linears() -> bool:
    """On unless MK_CUDA_LEAN=0: a streamed linear on CUDA cores writes its sums and Σx² instead of adding
    to them (StreamLinear::assign), so its body does not zero them first (one element loop per
    accumulator and a barrier less before the weights stream), and Σx² is summed at the staging
    barrier instead of behind a barrier of its own after the products (qwen3-0.6b 1.311 ->
    1.275 ms/token with FUSE_LOOPS on the H200)."""
    return switches.flag("MK_CUDA_LEAN", default=True)


def fuse_loops() -> bool:
    """On unless MK_CUDA_FUSE_LOOPS=0: element loops that need no barrier between them run as one loop
    (fuse_loops.py): a decode epilogue's scale, activation and stores in one statement."""
    return switches.flag("MK_CUDA_FUSE_LOOPS", default=True)


def merge_tiles() -> bool:
    """MK_CUDA_MERGE_TILES=1: the split-KV merge as tile steps, as before its device call."""
    return switches.flag("MK_CUDA_MERGE_TILES")


def _bool(value: bool) -> str:
    return "true" if value else "false"


def prefetch_budget() -> int:
    """Most weight bytes a task asks the L2 for ahead of its turn: MK_CUDA_PREFETCH (bytes),
    else PREFETCH_MAX with MK_CUDA_PREFETCH_AT=wait and 0 without. Off by default: on the H200
    a qwen3-0.6b step took 308 us without it and 371 us with 128 KB one task ahead
    (bench/RESULTS.md), while the gated MLP and RMSNorm+Linear rows moved within the noise."""
    return switches.byte_count("MK_CUDA_PREFETCH", PREFETCH_MAX if prefetch_at_wait() else 0)


def weights_evict_first() -> bool:
    """Whether streamed weights are loaded with the L2's evict-first priority
    (MK_CUDA_WEIGHT_L2=evict_first): a decode step reads each weight byte once and far more of
    them than the L2 holds, so keeping them only pushes out what is read again (activations,
    the KV cache, event counters, the kernel's code)."""
    return switches.choice("MK_CUDA_WEIGHT_L2", ("normal", "evict_first")) == "evict_first"


def _defines(profile: bool) -> str:
    """The header switches of one build (mk/cuda_arena.h, mk/cuda_stream.cuh)."""
    lines = ["#define MK_OP_MARKS 1"] if profile else []
    if profile and op_marks.warm():
        lines.append("#define MK_OP_MARKS_WARM 1")
    if weights_evict_first():
        lines.append("#define MK_STREAM_EVICT_FIRST 1")
    if switches.flag("MK_CUDA_MMA_PIPE"):
        lines.append("#define MK_MMA_PIPE 1")
    # A body that waits itself polls as the dispatcher does (mk/cuda_wait.cuh).
    if switches.flag("MK_CUDA_WAIT_BATCH"):
        lines.append("#define MK_WAIT_BATCH 1")
    if switches.flag("MK_CUDA_POLL_PIPE"):
        lines.append("#define MK_POLL_PIPE 1")
    return "".join(line + "\n" for line in lines)


_PRELUDE = """\
// Generated by mk.backends.cuda from task.graph @{name}; do not edit.
{defines}#include <stdint.h>

#include "mk/cuda_attention.cuh"
#include "mk/cuda_megakernel.cuh"
#include "mk/cuda_stream.cuh"
#include "mk/version.h"

namespace {{
"""


@dataclass(frozen=True)
class CudaSource:
    """The emitted program: its text, the scratch bytes one CTA needs, in a profile build
    (op_marks.py) the label of each op mark per grid, and what the host needs to lay out the
    queue entries (entries.py)."""

    text: str
    scratch_per_sm: int
    mark_labels: dict[str, tuple[str, ...]] | None = None
    # Per kind, the buffer-table rows of its body's slots; Dispatch::kSlots; buffer-table rows.
    slot_rows: tuple[tuple[int, ...], ...] = ()
    slots: int = 1
    num_buffers: int = 0


def _numel(value: SSAValue) -> int:
    ty = value.type
    return math.prod(ty.get_shape()) if isinstance(ty, TensorType) else 1


class DeviceGraphDefEmitter(GraphDefEmitter):
    """The CPU emitter with thread_map's element loop spread over the CTA's threads, and the
    loop of a decode-shaped linear (stream.py) or of decode attention (stream_attention.py)
    streamed."""

    def __init__(
        self,
        op: GraphDefOp,
        operands: Sequence[BufferRef],
        results: dict[int, list[BufferRef]],
        stage: bool = False,
    ) -> None:
        super().__init__(op, operands, results)
        stream = plan_stream(op)
        if stream is not None and stage:  # the chunk leaves the ring its room
            stream = dataclasses.replace(stream, x_bytes=STAGE_X_BYTES)
        if stream is not None and isinstance(stream.x, MergedX):
            k = op.forloop_range() * shape_of(stream.x.tile)[1]
            if stream.chunk(k) < k:
                stream = None  # the merge writes the whole activation: it must be one chunk
        self.plan: StreamPlan | AttentionPlan | MergePlan | None = (
            stream or plan_attention(op) or (None if merge_tiles() else plan_merge(op))
        )
        self.stage_weights_ahead = stage
        # Accumulators the streamed loop writes whole (StreamLinear::assign): not zeroed first.
        self.assigned: set[SSAValue] = set()
        if isinstance(self.plan, StreamPlan) and lean_linears():
            k = op.forloop_range() * shape_of(self.plan.x.tile)[1]
            if not self.plan.tensor_cores(k):
                self.assigned = {acc.res for _, acc in self.plan.products}
                if self.plan.sum_sq is not None:
                    self.assigned.add(self.plan.sum_sq.res)
        self.smem_floats = 0
        self.staged_bytes = 0  # weights the body stages in the ring
        self.views: set[SSAValue] = set()
        self.prefetch: list[str] = []
        self.stage: list[str] = []
        self.loops: list[Loop] = []

    def materialised(self, value: SSAValue) -> bool:
        return self.plan is None or value not in self.plan.streamed()

    def emit(self) -> list[str]:
        """The body; one that streams weights starts with what one thread of the megakernel
        runs before the task's turn: the L2 prefetch (ahead = kAheadL2, while the task before
        it waits and runs) and the copy into shared memory (ahead = kAheadStage, while it
        waits)."""
        # The megakernel's __syncthreads() after every task covers the body's last loops.
        body, loops = super().emit(), self.loops
        if fuse_loops() and not every_loop():
            body, loops = fuse_element_loops(body, loops)
        lines = place_barriers(body, loops, trailing=False)
        if self.stage:
            lines.insert(
                2, f"if (ahead == mk::gpu::kAheadStage) {{ {' '.join(self.stage)} return 1; }}"
            )
        if self.prefetch:
            lines.insert(
                2, f"if (ahead == mk::gpu::kAheadL2) {{ {' '.join(self.prefetch)} return 0; }}"
            )
        return lines

    def layout_op(self, op: Operation, it: str) -> None:
        """A reshape keeping the dtype is a view: its tile shares the source's storage (a
        handle copy), not a cooperative copy with a barrier."""
        if isinstance(op, ReshapeOp) and dtype_code(op.res.type) == dtype_code(op.x.type):
            self.lines.append(f"{self.var(op.res)}.alias({self.var(op.x)});")
            self.views.add(op.res)
            return
        super().layout_op(op, it)

    def round(self, value: SSAValue) -> None:
        if value not in self.views:  # a view's source was rounded when it was made
            super().round(value)

    def emit_loop(self, loop: Sequence[Operation]) -> None:
        if isinstance(self.plan, StreamPlan):
            self.stream_linear(self.plan)
        elif isinstance(self.plan, AttentionPlan):
            self.stream_attention(self.plan)
        elif isinstance(self.plan, MergePlan):
            self.split_merge(self.plan, loop)
        else:
            # An iteration's inputs read only the kernel's operands: loading them all first
            # puts their loads in one round trip instead of one behind each step's barrier.
            loads = [op for op in loop if isinstance(op, InputOp)]
            super().emit_loop([*loads, *(op for op in loop if not isinstance(op, InputOp))])

    def flat_start(self, op: InputOp) -> str:
        """The element offset of `op`'s first tile (iteration 0) in its row-major source."""
        ref = self.operands[op.source_index()]
        strides = [math.prod(ref.shape[d + 1 :]) for d in range(len(ref.shape))]
        terms = [f"({s}) * {n}" for s, n in zip(self.input_starts(op, "0"), strides, strict=True)]
        return " + ".join(terms)

    def stream_attention(self, plan: AttentionPlan) -> None:
        """The call, after the loop-invariant ops it reads (their loads first, in one round
        trip) and its scalars."""
        emit = self.lines.append
        loads = [op for op in plan.prologue if isinstance(op, InputOp)] + plan.scalars()
        for op in [*loads, *(op for op in plan.prologue if not isinstance(op, InputOp))]:
            self.step(op, "0")
        k, v = (self.operands[op.source_index()] for op in (plan.k, plan.v))
        key_dim = len(k.shape) - 2
        self.smem_floats = plan.smem_floats()
        emit("{")
        emit("mk::gpu::StreamAttention sa{};")
        q_row = None if isinstance(plan.q, InputOp) else plan.head_row(plan.q)
        if isinstance(plan.q, InputOp):
            self.row_source("sa.q", plan.q)
        elif q_row is not None:
            self.row_source("sa.q", q_row.x)
            self.row_ops("sa.q_ops", q_row)
        else:
            emit(f"sa.q = {self.var(plan.q)}.data();")
            emit("sa.q_dtype = mk::DTYPE_F32;")
        for name, new in (("k", plan.k_new), ("v", plan.v_new)):
            if new is None:
                continue
            if (row := plan.head_row(new.new)) is not None:
                self.row_source(f"sa.{name}_new", row.x)
                if name == "k":
                    self.row_ops("sa.k_ops", row)
            else:
                emit(f"sa.{name}_new = {self.var(new.new)}.data();")
                emit(f"sa.{name}_new_dtype = mk::DTYPE_F32;")
        if (at := plan.new_at()) is not None:
            emit(f"sa.new_key = static_cast<int64_t>({self.var(at.tile)}[0]);")
        for name, ref, op in (("k", k, plan.k), ("v", v, plan.v)):
            emit(
                f"sa.{name} = static_cast<const uint16_t*>(buffers[{ref.index}]) + "
                f"{self.flat_start(op)};"
            )
        emit(f"sa.kv_dtype = {k.dtype};")
        emit(f"sa.ld = {k.shape[-1]};")
        emit(f"sa.keys = {self.forloop * plan.k.tile_shape()[key_dim]};")
        emit(f"sa.key0 = {self.input_starts(plan.k, '0')[key_dim]};")
        for name, value in (("o", plan.acc.o), ("m", plan.acc.m), ("l", plan.acc.l)):
            emit(f"sa.{name} = {self.var(value)}.data();")
        self.lines += score_lambda(plan, lambda op: f"{self.var(op.tile)}[0]", self.fresh)
        emit(f"mk::gpu::stream_attention<{plan.rows}, {plan.head_dim}>(sa, score);")
        emit("}")

    def row_pointer(self, op: InputOp) -> str:
        """A pointer to the first element of an input's tile, in place."""
        ref = self.operands[op.source_index()]
        return f"mk::gpu::elem_at(buffers[{ref.index}], {ref.dtype}, {self.flat_start(op)})"

    def row_source(self, field: str, op: InputOp) -> None:
        """`field` (a pointer) and its `_dtype` for the rows an input's tile covers, in place."""
        self.lines.append(f"{field} = {self.row_pointer(op)};")
        self.lines.append(f"{field}_dtype = {self.operands[op.source_index()].dtype};")

    def row_ops(self, field: str, row: HeadRow) -> None:
        """The mk::gpu::RowOps `field` for a head row's norm and RoPE."""
        emit = self.lines.append
        if row.norm is not None and row.g is not None:
            self.row_source(f"{field}.g", row.g)
            emit(f"{field}.eps = {float_literal(float(row.norm.epsilon.value.data))};")
        if row.tables is not None:
            cos, sin = row.tables
            emit(f"{field}.cos = {self.row_pointer(cos)};")
            emit(f"{field}.sin = {self.row_pointer(sin)};")
            emit(f"{field}.t_dtype = {self.operands[cos.source_index()].dtype};")
        emit(f"{field}.out_dtype = {dtype_code(row.out.type)};")

    def split_merge(self, plan: MergePlan, loop: Sequence[Operation]) -> None:
        """The merge call (forloop 1, so no loop around it), then the loop's other ops."""

        def source(op: InputOp) -> str:
            ref = self.operands[op.source_index()]
            return f"static_cast<const float*>(buffers[{ref.index}]) + {self.flat_start(op)}"

        self.lines += merge_lines(plan, self.var, source)
        for op in loop:
            if op not in plan.handled:
                self.step(op, "0")

    def merged_x(self, x: MergedX) -> None:
        """The partials merged straight into the staged activation (one chunk: all of K)."""

        def source(op: InputOp) -> str:
            ref = self.operands[op.source_index()]
            return f"static_cast<const float*>(buffers[{ref.index}]) + {self.flat_start(op)}"

        dtype = dtype_code(x.norm.res[0].type)
        self.lines += merged_x_lines(
            x, dtype, "reinterpret_cast<float*>(mk::gpu::mk_dynamic_smem)", source
        )
        self.lines.append("sl.x_ready = true;")

    def stream_linear(self, plan: StreamPlan) -> None:
        emit = self.lines.append
        k = self.forloop * shape_of(plan.x.tile)[1]
        chunk = plan.chunk(k)
        # Every global access of a body names buffers[i]: none before the product means the
        # weights may be requested before the task's turn.
        reads_before = any("buffers[" in line for line in self.lines)
        self.smem_floats = plan.rows * chunk
        emit("{")
        emit("mk::gpu::StreamLinear sl{};")
        emit("sl.arena = &arena;")
        if isinstance(plan.x, MergedX):
            self.merged_x(plan.x)
        else:
            x = self.operands[plan.x.source_index()]
            r0, c0 = self.input_starts(plan.x, "0")
            at = f"({r0}) * {x.shape[1]} + {c0}"
            emit(f"sl.x = mk::gpu::elem_at(buffers[{x.index}], {x.dtype}, {at});")
            emit(f"sl.x_dtype = {x.dtype};")
            emit(f"sl.x_ld = {x.shape[1]};")
        g_at = ""  # the norm weight's first element
        if plan.g is not None:
            g = self.operands[plan.g.source_index()]
            (g0,) = self.input_starts(plan.g, "0")
            g_at = f"mk::gpu::elem_at(buffers[{g.index}], {g.dtype}, {g0})"
            emit(f"sl.g = {g_at};")
            emit(f"sl.g_dtype = {g.dtype};")
        emit(f"sl.w_dtype = {dtype_code(plan.products[0][0].tile.type)};")
        if self.assigned:
            emit("sl.assign = true;")
        emit(f"sl.k = {k};")
        emit(f"sl.kc = {chunk};")
        if plan.sum_sq is not None:
            emit(f"sl.sum_sq = {self.var(plan.sum_sq.res)}.data();")
        emit(f"sl.nw = {len(plan.products)};")
        firsts, lds = [], []
        for w, _ in plan.products:
            ref = self.operands[w.source_index()]
            n0, k0 = self.input_starts(w, "0")
            firsts.append(
                f"static_cast<const uint16_t*>(buffers[{ref.index}]) + ({n0}) * {ref.shape[1]} + {k0}"
            )
            lds.append(ref.shape[1])
        rows = [w.tile_shape()[0] for w, _ in plan.products]
        mma = plan.tensor_cores(k)
        staged = stage_offsets(rows, k, lds, mma) if self.stage_weights_ahead else None
        for i, (_, acc) in enumerate(plan.products):
            at, ld = firsts[i], lds[i]
            if staged is not None:
                at = f"reinterpret_cast<const uint16_t*>(arena.stage_base + {staged[i]})"
                ld = staged_ld(k, mma)
            emit(
                f"sl.w[{i}] = mk::gpu::StreamWeight{{{at}, {ld}, {rows[i]}, "
                f"{self.var(acc.res)}.data()}};"
            )
        if staged is not None:
            self.stage_weights(rows, k, firsts, lds, staged, staged_ld(k, mma))
        # Tensor cores take rows in 8-row groups across warps: only a whole slab is fetched.
        most = prefetch_budget()
        budget = most if not mma or 2 * k * sum(rows) <= most else 0
        fetch = [
            f"mk::gpu::prefetch_rows({firsts[i]} + {r0} * {lds[i]}, {n}, {lds[i]}, {k});"
            for i, r0, n in prefetch_spans(rows, 2 * k, budget)
        ]
        if plan.g is not None:  # the norm weight: the staging's first load
            fetch.append(f"mk::gpu::prefetch_l2({g_at}, {k} * mk::dtype_size({g.dtype}));")
        if budget:
            self.prefetch = fetch
        call = (
            f"mk::gpu::stream_linear<{plan.rows}, {plan.rows_per_round()}, "
            f"{plan.mma_steps() if mma else plan.steps_in_flight(k)}, "
            f"{plan.loads_per_thread(k)}, {_bool(mma)}"
        )
        groups = plan.mma_groups() if mma else 1
        ahead = (
            load_ahead()
            and not mma
            and staged is None
            and chunk >= k
            and not isinstance(plan.x, MergedX)
            and not reads_before
        )
        # The template's trailing arguments (Staged, G, Early, Ahead), defaults left off.
        tail = [_bool(staged is not None), str(groups), _bool(early_loads()), _bool(ahead)]
        while tail and tail[-1] in ("false", "1"):
            tail.pop()
        call += "".join(f", {a}" for a in tail)
        if ahead:
            emit(f"if (!{call}>(sl)) return {TURN_STOPPED};")
        elif staged is None:
            emit(f"{call}>(sl);")
        else:
            emit(f"if (!{call}>(sl)) return {STAGE_LOST};")
        emit("}")
        for op in plan.invariant:
            self.load(op, "0")

    def stage_weights(
        self,
        rows: list[int],
        k: int,
        firsts: list[str],
        lds: list[int],
        offsets: list[int],
        ld: int,
    ) -> None:
        """The copy of the task's weight rows into its place in the ring (`ld` apart), and its
        room there."""
        self.stage = [f"mk::gpu::stage_expect(arena, {2 * k * sum(rows)});"] + [
            f"mk::gpu::stage_rows(arena, {off}, {first}, {n}, {src_ld}, {k}, {ld});"
            for off, first, n, src_ld in zip(offsets, firsts, rows, lds, strict=True)
        ]
        self.staged_bytes = offsets[-1] + 2 * rows[-1] * ld

    def element_loop(
        self,
        n: int,
        reads: Sequence[tuple[SSAValue, str]],
        writes: Sequence[SSAValue],
        body: Sequence[str],
        whole: bool = False,
    ) -> None:
        """An element loop over n elements (barriers.py decides the barrier before it); `whole`:
        `body` is a statement that runs the loop itself, with MK_FOR_EACH's element mapping."""
        reads_at = tuple((self.var(v), at) for v, at in reads)
        text = tuple(body) if whole else (f"MK_FOR_EACH_U32(e, {n}) {{", *body, "}")
        self.loops.append(Loop(n, reads_at, tuple(self.var(w) for w in writes), text))
        self.lines.append(f"{PLACEHOLDER}{len(self.loops) - 1}")

    def thread_map(self, op: ThreadMapOp) -> None:
        out_shape = maps.broadcast_shapes(*(shape_of(a) for a in op.args))
        assert out_shape is not None
        n = math.prod(out_shape)
        for r in op.res:
            self.lines.append(f"{self.var(r)}.resize({n});")
        offsets = [element_offset(out_shape, shape_of(a)) for a in op.args]
        start = len(self.lines)
        self.thread_map_element(op, lambda k: offsets[k])
        body = self.lines[start:]
        del self.lines[start:]
        self.element_loop(n, list(zip(op.args, offsets, strict=True)), op.res, body)

    def tile_op(self, op: Operation, it: str) -> None:
        line = static_row_op(op, self.var, self.f)
        if line is None:
            super().tile_op(op, it)
        else:
            self.lines.append(line)

    def step(self, op: Operation, it: str) -> None:
        if isinstance(op, BinaryOp | UnaryOp):
            self.elementwise(op)
        elif isinstance(op, ReduceOp) and is_float(op.x.type):
            self.reduction(op)
        else:
            super().step(op, it)

    def reduction(self, op: ReduceOp) -> None:
        """One loop over the outputs, each reducing its line of the input (extents resolved
        here), rounded to the result's dtype."""
        shape = shape_of(op.x)
        d = op.dim.value.data % len(shape)
        n, inner = shape[d], math.prod(shape[d + 1 :])
        out = math.prod(shape[:d]) * inner
        x, res = self.var(op.x), self.var(op.res)
        line = (
            f"{x}.data() + e * {n}"
            if inner == 1
            else (f"{x}.data() + (e / {inner}u) * {n * inner} + e % {inner}u")
        )
        kind = REDUCE_ENUM[op.kind.data].replace("mk::cpu::", "mk::gpu::")
        value = f"mk::gpu::reduce_line({line}, {n}, {inner}, {kind}, false)"
        if dtype_code(op.res.type) != "mk::DTYPE_F32":
            value = f"mk::gpu::round_to({value}, {dtype_code(op.res.type)})"
        self.lines.append(f"{res}.resize({out});")
        self.element_loop(out, [(op.x, "line")], [op.res], [f"{res}[e] = {value};  // reduce"])

    def elementwise(self, op: BinaryOp | UnaryOp) -> None:
        """One element loop that reads the operands at offsets resolved here, computes and
        rounds to the result's dtype (the CPU form is a helper call, then a rounding pass)."""
        out = shape_of(op.res)
        n = math.prod(out)
        operands = [op.a, op.b] if isinstance(op, BinaryOp) else [op.x]
        offsets = [element_offset(out, shape_of(v)) for v in operands]

        def read(k: int) -> str:
            at = f"{self.var(operands[k])}[{offsets[k]}]"
            return at if is_float(operands[k].type) else f"static_cast<float>({at})"

        kind = op.kind.data
        if isinstance(op, BinaryOp):
            value = f"mk::gpu::binary(mk::gpu::{BINARY_ENUM[kind]}, {read(0)}, {read(1)})"
        else:
            factor = float_literal(float(op.factor.value.data)) if op.factor is not None else "0.0f"
            unary = UNARY_ENUM[kind].replace("mk::cpu::", "mk::gpu::")
            value = f"mk::gpu::unary({unary}, {read(0)}, {factor})"
        dtype = dtype_code(op.res.type)
        if not is_float(op.res.type):
            value = f"mk::gpu::from_float<int64_t>({value})"
        elif dtype != "mk::DTYPE_F32":
            value = f"mk::gpu::round_to({value}, {dtype})"
        res = self.var(op.res)
        self.lines.append(f"{res}.resize({n});")
        body = [f"{res}[e] = {value};  // {kind}"]
        self.element_loop(n, list(zip(operands, offsets, strict=True)), [op.res], body)

    def init_accumulator(self, op: Operation) -> None:
        if not isinstance(op, AccumOp):
            super().init_accumulator(op)
            return
        start = "0.0f" if maps.ACCUM_KINDS[op.kind.data].combine == "sum" else "-INFINITY"
        n = math.prod(shape_of(op.res))
        self.lines.append(f"{self.var(op.res)}.resize({n});")
        if op.res in self.assigned:
            return
        self.element_loop(n, [], [op.res], [f"{self.var(op.res)}[e] = {start};  // init"])

    def load(self, op: InputOp, it: str) -> None:
        ref = self.operands[op.source_index()]
        runs = box_runs(ref.shape, op.tile_shape())
        if runs is None:
            super().load(op, it)
            return
        first = flat_offset(ref.shape, self.input_starts(op, it))
        n, tile = runs.rows * runs.cols, self.var(op.tile)
        self.lines.append(f"{tile}.resize({n});")
        load = (
            f"mk::gpu::load_runs<{ref.dtype}, {n}, {runs.cols}>({tile}, buffers[{ref.index}], "
            f"{first}, {runs.ld});  // load"
        )
        self.element_loop(n, [], [op.tile], [load], whole=True)
        if dtype_code(op.tile.type) != ref.dtype:
            self.round(op.tile)

    def store_box(self, ref: BufferRef, starts: Sequence[str], op: OutputOp) -> None:
        runs = box_runs(ref.shape, shape_of(op.tile))
        if runs is None:
            super().store_box(ref, starts, op)
            return
        store = (
            f"mk::gpu::store_run_elem<{ref.dtype}, {runs.cols}>(buffers[{ref.index}], "
            f"{flat_offset(ref.shape, starts)}, {runs.ld}, e, {self.var(op.tile)}[e]);  // store"
        )
        self.element_loop(runs.rows * runs.cols, [(op.tile, "e")], [], [store])


class DeviceLibraryEmitter(LibraryEmitter):
    """The CPU library emitter; an embedding id out of range fails the task with its index;
    concat and reshape between buffers of one dtype copy bytes (contiguous runs, 16-byte
    vectors where aligned) instead of going through float tiles."""

    def emit(self) -> list[str]:
        runs = self.copy_runs()
        if runs is None:
            return super().emit()
        outer, parts = runs
        srcs = ", ".join(f"mk::gpu::CopyPart{{buffers[{ref.index}], {run}}}" for ref, run in parts)
        self.lines.append("(void)t;  // a library kernel runs whole: no tile coordinates")
        self.lines.append(f"const mk::gpu::CopyPart parts[] = {{{srcs}}};")
        for ref, _ in self.results:
            self.lines.append(
                f"mk::gpu::concat_runs(buffers[{ref.index}], parts, {len(parts)}, {outer});"
            )
        return self.lines

    def copy_runs(self) -> tuple[int, list[tuple[BufferRef, int]]] | None:
        """(outer rows, [(source, bytes per row)]) when the kernel is a byte copy into whole
        result buffers of its own dtype, else None."""
        kind = self.op.kind.data
        out_dtype = dtype_code(self.op.res[0].type)
        if kind not in ("concat", "reshape") or not self.results:
            return None
        if any(r.dtype != out_dtype for r in self.operands) or any(
            any(sl.start != 0 or sl.stop != n for sl, n in zip(where, ref.shape, strict=True))
            or math.prod(ref.shape) != math.prod(self.out_shape)
            for ref, where in self.results
        ):
            return None
        size = numpy_dtype(tensor_type(self.op.res[0]).get_element_type()).itemsize
        if kind == "reshape":
            return 1, [(self.operands[0], math.prod(self.shapes[0]) * size)]
        d = self.dim("dim", len(self.shapes[0]))
        outer = math.prod(self.shapes[0][:d])
        return outer, [
            (ref, math.prod(shape[d:]) * size)
            for ref, shape in zip(self.operands, self.shapes, strict=True)
        ]

    def compute(self) -> None:
        """A binary kernel is one element loop with its broadcasts resolved here (the runtime
        walk over shape arrays gave wrong products on the H200 for f32 [1, 4096] operands)."""
        kind = self.op.kind.data
        if kind not in BINARY_ENUM:
            super().compute()
            return
        n = math.prod(self.out_shape)

        def read(i: int) -> str:
            at = f"a{i}[{element_offset(self.out_shape, self.shapes[i])}]"
            return at if is_float(self.op.operands[i].type) else f"static_cast<float>({at})"

        value = f"mk::gpu::binary(mk::gpu::{BINARY_ENUM[kind]}, {read(0)}, {read(1)})"
        self.lines += [
            f"r.resize({n});",
            f"{{  // {kind}",
            f"MK_FOR_EACH_U32(e, {n}) r[e] = {value};",
            "__syncthreads();",
            "}",
        ]

    def cache_write_failure(self, dim: int, n: int, extent: int) -> None:
        self.lines.append("if (bad >= 0) return static_cast<int32_t>(bad) + 1;")

    def embedding_failure(self) -> None:
        self.lines.append("if (bad >= 0) return static_cast<int32_t>(bad) + 1;")


def _temporaries(kernel: GraphDefOp | KernelOp, tiles: int) -> int:
    """Scratch bytes the helpers take beyond the declared tiles (as_float copies, norms, the
    online-softmax probabilities, attention scores): bounded by twice the tiles, plus scores."""
    extra = 2 * tiles
    if isinstance(kernel, KernelOp) and kernel.kind.data == "attention":
        q, k = (tuple(v.type.get_shape()) for v in kernel.operands[:2])  # type: ignore[union-attr]
        extra += 2 * 4 * q[0] * q[1] * q[2] * k[2] + 64
    return extra


def emit_cuda(graph: GraphOp | ModuleOp) -> CudaSource:
    """The CUDA source of one scheduled task.graph and its per-CTA scratch need; deterministic."""
    g = _graph_of(graph)
    buffers = [op for op in g.body.block.ops if isinstance(op, BufferOp)]
    grids = [op for op in g.body.block.ops if isinstance(op, GridOp)]
    refs = {
        b.sym_name.data: BufferRef(i, dtype_code(b.buffer_type, b), b.shape)
        for i, b in enumerate(buffers)
    }
    profile = op_marks.enabled()
    out = [_PRELUDE.format(name=g.sym_name.data, defines=_defines(profile))]
    # A tail task runs at its producer's signal, not at a queue position: nothing stages it ahead.
    bodies = [_grid_body(grid, refs, staging() and tail_edge(grid) is None) for grid in grids]
    front = max((need.smem for _, need in bodies), default=0)
    if ring_layout(front, max((need.staged for _, need in bodies), default=0)) is None:
        bodies = [_grid_body(grid, refs, False) for grid in grids]  # no room: nothing staged
    shared = SharedBodies(slot_format="bp[{k}]")
    staged: dict[str, int] = {}  # per function, its weights' bytes in the staging ring
    for gi, (grid, (lines, need)) in enumerate(zip(grids, bodies, strict=True)):
        fn = shared.add(f"task_{gi}_{_ident(grid.sym_name.data)}", grid.sym_name.data, lines)
        staged[fn.name] = need.staged
    scratch = max((need.scratch for _, need in bodies), default=0)
    front = max((need.smem for _, need in bodies), default=0)
    labels: dict[str, tuple[str, ...]] | None = None
    if profile:
        marked = {fn.name: op_marks.mark_statements(fn.body) for fn in shared.functions}
        for fn in shared.functions:
            fn.body = marked[fn.name][0]
        labels = {grid: tuple(marked[fn.name][1]) for grid, fn, _ in shared.calls}
    out += [device_function(fn) for fn in shared.functions]
    batch, pipe = switches.flag("MK_CUDA_WAIT_BATCH"), switches.flag("MK_CUDA_POLL_PIPE")
    out.append(
        dispatch_struct(shared, front, staged, len(buffers), prefetch_at_wait(), batch, pipe)
    )
    out.append("}  // namespace\n")
    out.append("MK_CUDA_ENTRY_POINTS(Dispatch)\n")
    return CudaSource(
        "\n".join(out),
        scratch + SCRATCH_SLACK,
        labels,
        slot_rows(shared),
        body_slots(shared),
        len(buffers),
    )


@dataclass(frozen=True)
class _Need:
    """Per-CTA memory of one task body, in bytes: global scratch, dynamic shared memory at the
    front, and weights staged in the ring."""

    scratch: int
    smem: int
    staged: int = 0


def _grid_body(grid: GridOp, refs: dict[str, BufferRef], stage: bool) -> tuple[list[str], _Need]:
    gk = grid_kernel(grid, refs, "CUDA")
    kernel = gk.kernel
    smem = staged = 0
    if isinstance(kernel, GraphDefOp):
        emitter = DeviceGraphDefEmitter(kernel, gk.operands, gk.result_buffers(), stage)
        body = emitter.emit()
        sizes = {n: _numel(v) for v, n in emitter.names.items()}
        smem, staged = 4 * emitter.smem_floats, emitter.staged_bytes
    else:
        body = DeviceLibraryEmitter(kernel, gk.operands, gk.library_results(grid)).emit()
        sizes = {f"a{i}": _numel(v) for i, v in enumerate(kernel.operands)}
        sizes["r"] = _numel(kernel.res[0])
    lines, tiles = device_lines(body, sizes)
    return lines, _Need(tiles + _temporaries(kernel, tiles), smem, staged)
