"""The device emitter of a graph_def's task body: the CPU backend's statement emitters (same
ops, same order, same rounding) with tiles as fixed-capacity `mk::gpu::Tile`s in the CTA's
scratch, the cooperative helpers of mk/cuda_kernels.h, element loops strided over the CTA's
threads, and the decode linears, attention and merges streamed."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_ops import (
    BINARY_ENUM,
    BLOCK_COORDS,
    REDUCE_ENUM,
    UNARY_ENUM,
    BufferRef,
)
from mk.backends.cpu.emit_scalar import dtype_code, float_literal, is_float
from mk.backends.cuda import switches
from mk.backends.cuda.barriers import PLACEHOLDER, Loop, every_loop, place_barriers
from mk.backends.cuda.elementwise import box_runs, element_offset, flat_offset
from mk.backends.cuda.emit_attention import StreamAttentionEmitter, plain
from mk.backends.cuda.fuse_loops import fuse_element_loops
from mk.backends.cuda.launch_words import LaunchStep
from mk.backends.cuda.load_groups import group_loads
from mk.backends.cuda.local_tiles import localise_tiles
from mk.backends.cuda.mma_tile import GemmPlan, gemm_lines, mma_tile, plan_gemm
from mk.backends.cuda.pair_loops import pair_loops
from mk.backends.cuda.row_ops import static_row_op
from mk.backends.cuda.rows_add import RowsAdd, plan_rows_add
from mk.backends.cuda.split_merge import MergedX, MergePlan, merge_lines, plan_merge
from mk.backends.cuda.stream import StreamPlan, plan_stream
from mk.backends.cuda.stream_attention import AttentionPlan, plan_attention
from mk.backends.cuda.whole_calls import whole_calls
from mk.diagnostics import MkError, op_location
from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph import GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import (
    AccumOp,
    BinaryOp,
    ReduceOp,
    ReshapeOp,
    ThreadMapOp,
    UnaryOp,
)

# One activation row of a streamed accumulating product goes to tensor cores from this many
# weight columns a row (MK_CUDA_ROWS_DOT=mma): llama-3.2-1b's 64 at batch 1, 1.1368 -> 1.1278
# ms/token on the H100; qwen3-0.6b's 24 stay on lanes (+2.3 % on tensor cores).
MMA_ONE_ROW_COLUMNS = 64


def numel(value: SSAValue) -> int:
    ty = value.type
    return math.prod(ty.get_shape()) if isinstance(ty, TensorType) else 1


class DeviceGraphDefEmitter(StreamAttentionEmitter):
    """The CPU emitter with thread_map's element loop spread over the CTA's threads, and the
    loop of a decode-shaped linear (stream.py) or of decode attention (stream_attention.py)
    streamed."""

    def __init__(
        self,
        op: GraphDefOp,
        operands: Sequence[BufferRef],
        results: dict[int, list[BufferRef]],
        repeated: bool = False,
        room: int = 0,
        launch_steps: Mapping[int, LaunchStep] | None = None,
    ) -> None:
        super().__init__(op, operands, results)
        self.launch_steps = launch_steps or {}
        stream = plan_stream(op)
        self.stream_chunks = 0  # chunks a streamed linear walks its activation in
        if stream is not None and repeated:
            stream = dataclasses.replace(stream, repeated=True)
        if stream is not None and room:
            stream = dataclasses.replace(stream, x_bytes=room)
        if stream is not None and isinstance(stream.x, MergedX):
            k = op.forloop_range() * shape_of(stream.x.tile)[1]
            if stream.chunk(k) < k:
                stream = None  # the merge writes the whole activation: it must be one chunk
        self.plan: StreamPlan | AttentionPlan | MergePlan | GemmPlan | None = (
            stream
            or plan_attention(op)
            or (None if switches.merge_tiles() else plan_merge(op))
            or plan_gemm(op)
        )
        self.rows_add = plan_rows_add(op)
        scope = switches.launch_steps()
        if scope == ("writes" if isinstance(self.plan, AttentionPlan) else "attention"):
            self.launch_steps = {}
        # Accumulators the streamed loop writes whole (StreamLinear::assign): not zeroed first.
        self.assigned: set[SSAValue] = set()
        if isinstance(self.plan, GemmPlan):  # gemm_lines: gw.assign
            self.assigned = {acc.res for _, _, acc in self.plan.products}
        elif isinstance(self.plan, StreamPlan) and switches.lean_linears():
            k = op.forloop_range() * shape_of(self.plan.x.tile)[1]
            if not self.plan.tensor_cores(k):
                self.assigned = {acc.res for _, acc in self.plan.products}
                if self.plan.sum_sq is not None:
                    self.assigned.add(self.plan.sum_sq.res)
        self.smem_floats = 0
        self.views: set[SSAValue] = set()
        self.loops: list[Loop] = []

    def after_loop(self, loop: Sequence[Operation], epilogue: Sequence[Operation]) -> list[InputOp]:
        return []  # a streamed loop loads its invariant inputs after the stream (plan.invariant)

    def materialised(self, value: SSAValue) -> bool:
        if self.rows_add is not None and value in self.rows_add.streamed():
            return False
        return self.plan is None or value not in self.plan.streamed()

    def emit(self) -> list[str]:
        """The body's lines."""
        if (calls := whole_calls(self)) is not None:
            self.lines += [*BLOCK_COORDS, *calls]
            return self.lines
        # The megakernel's __syncthreads() after every task covers the body's last loops.
        body, loops = super().emit(), self.loops
        if switches.fuse_loops() and not every_loop():
            body, loops = fuse_element_loops(body, loops)
            if switches.local_tiles():
                body, loops = localise_tiles(body, loops)
            if least := switches.pair_stores():
                loops = pair_loops(loops, least)
        return group_loads(place_barriers(body, loops, trailing=False))

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
        elif isinstance(self.plan, GemmPlan):
            self.gemm(self.plan)
        else:
            # An iteration's inputs read only the kernel's operands: loading them all first
            # puts their loads in one round trip instead of one behind each step's barrier.
            loads = [op for op in loop if isinstance(op, InputOp)]
            super().emit_loop([*loads, *(op for op in loop if not isinstance(op, InputOp))])

    def gemm(self, plan: GemmPlan) -> None:
        def first(op: InputOp) -> tuple[str, str, int]:
            ref = self.operands[op.source_index()]
            return str(ref.index), flat_offset(ref.shape, self.input_starts(op, "0")), ref.shape[-1]

        self.smem_floats = -(-plan.smem_bytes() // 4)
        k = self.forloop * plan.x.tile_shape()[1]
        self.lines += gemm_lines(plan, first, k, self.var)
        for op in plan.invariant:
            self.load(op, "0")

    def split_merge(self, plan: MergePlan, loop: Sequence[Operation]) -> None:
        """The merge call (forloop 1, so no loop around it), then the loop's other ops."""

        def source(op: InputOp) -> str:
            ref = plain(self.operands[op.source_index()], self.op, "as merge partials")
            return f"static_cast<const float*>(buffers[{ref.index}]) + {self.flat_start(op)}"

        self.lines += merge_lines(plan, self.var, source)
        for op in loop:
            if op not in plan.handled:
                self.step(op, "0")

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
        line = static_row_op(op, self.var, self.f) or mma_tile(op, self.var)
        if line is None:
            super().tile_op(op, it)
        else:
            self.lines.append(line)

    def step(self, op: Operation, it: str) -> None:
        if self.rows_add is not None and op is self.rows_add.matmul:
            self.rows_dot(self.rows_add)
            return
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
        if isinstance(self.plan, AttentionPlan) and op is self.plan.acc and switches.lean_linears():
            # stream_attention writes o, m and l whole from its own start (m = -inf, l = o = 0):
            # zeroing them first cost three element loops and barriers on the critical path.
            for value in op.results:
                self.lines.append(f"{self.var(value)}.resize({math.prod(shape_of(value))});")
            return
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
        if not self.materialised(op.tile):
            return
        ref = self.operands[op.source_index()]
        runs = box_runs(ref.shape, op.tile_shape())
        if runs is None:
            plain(ref, self.op, "as a box")
            super().load(op, it)
            return
        first = flat_offset(ref.shape, self.input_starts(op, it))
        n, tile = runs.rows * runs.cols, self.var(op.tile)
        self.lines.append(f"{tile}.resize({n});")
        if (step := self.launch_steps.get(ref.index)) is not None and runs.rows == 1:
            value = step.value(f"{first} + e")
            self.element_loop(n, [], [op.tile], [f"{tile}[e] = {value};  // step"])
            return
        load = (
            f"mk::gpu::load_flag_runs<{n}, {runs.cols}>({tile}, buffers[{ref.index}], "
            f"{first}, {runs.ld}, arena);  // load, waiting on the flags"
            if ref.flagged
            else f"mk::gpu::load_runs<{ref.dtype}, {n}, {runs.cols}>({tile}, buffers[{ref.index}], "
            f"{first}, {runs.ld});  // load"
        )
        self.element_loop(n, [], [op.tile], [load], whole=True)
        if dtype_code(op.tile.type) != ref.dtype:
            self.round(op.tile)

    def position_check(self, op: OutputOp, pos: str, n: int, extent: int, d: int) -> None:
        # Every thread reads the same position: the whole block returns (the host names the task).
        self.lines.append(f"if ({pos} < 0 || {pos} + {n} > {extent}) return 1;")

    def store_box(self, ref: BufferRef, starts: Sequence[str], op: OutputOp) -> None:
        runs = box_runs(ref.shape, shape_of(op.tile))
        if runs is None:
            super().store_box(plain(ref, self.op, "as a box"), starts, op)
            return
        at = f"{flat_offset(ref.shape, starts)}, {runs.ld}, e, {self.var(op.tile)}[e]"
        store = (
            f"mk::gpu::store_flag_run_elem<{ref.dtype}, {runs.cols}>(buffers[{ref.index}], "
            f"{at}, arena.flag);  // store with the flag"
            if ref.flagged
            else f"mk::gpu::store_run_elem<{ref.dtype}, {runs.cols}>(buffers[{ref.index}], "
            f"{at});  // store"
        )
        self.element_loop(runs.rows * runs.cols, [(op.tile, "e")], [], [store])

    def add_box(self, ref: BufferRef, starts: Sequence[str], op: OutputOp) -> None:
        """The tile added into its f32 result: the fused down projection's whole product at once,
        else by runs."""
        ref = plain(ref, self.op, "added to")
        first = flat_offset(ref.shape, starts)
        if self.rows_add is not None and op is self.rows_add.out:
            tile = f"{self.var(op.tile)}.data(), {math.prod(shape_of(op.tile))}"
            self.lines.append(
                f"mk::gpu::add_tile_v4(static_cast<float*>(buffers[{ref.index}]) + {first}, "
                f"{tile});  // add"
            )
            return
        runs = box_runs(ref.shape, shape_of(op.tile))
        if runs is None:
            raise MkError(
                "an accumulating output's tile must be runs of its result", op_location(self.op)
            )
        at = f"{first}, {runs.ld}, e, {self.var(op.tile)}[e]"
        add = f"mk::gpu::add_run_elem<{runs.cols}>(buffers[{ref.index}], {at});  // add"
        self.element_loop(runs.rows * runs.cols, [(op.tile, "e")], [], [add])

    def rows_dot_kind(self, plan: RowsAdd) -> str:
        """How the product streams its weight columns: switches.rows_dot, where tensor cores
        take the rows (one row only from 64 columns, unless mma-all) and a tile's registers
        hold the columns, else lanes."""
        m, kc = shape_of(plan.matmul.operands[0])
        how = switches.rows_dot()
        if how in ("mma", "mma-all"):
            least = 1 if how == "mma-all" or kc >= MMA_ONE_ROW_COLUMNS else 2
            fits = least <= m <= 16 and kc % 8 == 0 and kc <= 128
            how = "mma" if fits else "lanes"
        return how

    def rows_dot(self, plan: RowsAdd) -> None:
        """The product tile, its weight columns streamed (not loaded as a tile)."""
        w = self.operands[plan.w.source_index()]
        n0, k0 = self.input_starts(plan.w, "last")
        m, kc = shape_of(plan.matmul.operands[0])
        n = shape_of(plan.w.tile)[0]
        bf16 = "true" if w.dtype == "mk::DTYPE_BF16" else "false"
        d = self.var(plan.matmul.res)
        how = self.rows_dot_kind(plan)
        name = {"threads": "rows_dot_threads", "mma": "rows_dot_mma"}.get(how, "rows_dot_lanes")
        packed = ", true" if how == "packed" else ""
        at = f"static_cast<const uint16_t*>(buffers[{w.index}]) + ({n0}) * {w.shape[1]} + {k0}"
        self.lines.append(f"{d}.resize({m * n});")
        self.lines.append(
            f"mk::gpu::{name}<{m}, {kc}, {n}, {bf16}{packed}>("
            f"{self.var(plan.matmul.operands[0])}.data(), {at}, {w.shape[1]}, {d}.data());"
            "  // the product, its weight streamed"
        )
