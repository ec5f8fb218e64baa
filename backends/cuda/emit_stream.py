"""The device statements of a streamed decode linear (stream.py's plan): the StreamLinear
descriptor and the mk::gpu::stream_linear call with its template arguments."""

from __future__ import annotations

import math

from xdsl.ir import SSAValue

from mk.backends.cpu.emit_ops import GraphDefEmitter
from mk.backends.cpu.emit_scalar import dtype_code
from mk.backends.cuda import switches
from mk.backends.cuda.split_merge import (
    MergedX,
    idle_warps,
    merged_x_lines,
    mostly_idle,
)
from mk.backends.cuda.stream import STAGE_LOST, SlicePlan, StreamPlan
from mk.dialects.mugraph import InputOp
from mk.dialects.mugraph_base import shape_of

# 16-byte loads a thread may hold through the activation's staging when it loads its weights'
# first step early by default (MK_CUDA_STAGE_FIRST unset): the first step's rows plus its own
# activation loads. On the H100 at batch 1 (bench/RESULTS.md, session 80) 7 built without spills
# on every preset (qwen3-0.6b's q and fused MLP, llama-3.2-1b's q) and made qwen3-0.6b −1.45 %
# and −0.90 % faster in two calls (llama-3.2-1b level, +0.12 %); 8 (qwen3-8b's q) spilled 24 B,
# and every eligible body (up to 10) spilled up to 160 B.
STAGE_FIRST_HELD = 7


def _bool(value: bool) -> str:
    return "true" if value else "false"


class StreamLinearEmitter(GraphDefEmitter):
    """The statements of a streamed decode linear, for the device emitter (emit.py), which sets
    these attributes."""

    assigned: set[SSAValue]  # accumulators stream_linear writes whole (StreamLinear::assign)
    smem_floats: int

    def flat_start(self, op: InputOp) -> str:
        """The element offset of `op`'s first tile (iteration 0) in its row-major source."""
        ref = self.operands[op.source_index()]
        strides = [math.prod(ref.shape[d + 1 :]) for d in range(len(ref.shape))]
        terms = [f"({s}) * {n}" for s, n in zip(self.input_starts(op, "0"), strides, strict=True)]
        return " + ".join(terms)

    def rows_aligned(self, op: InputOp) -> bool:
        """Whether every tile of `op` (any block, any iteration) and each of its rows start 16
        bytes' worth of 16-bit elements into its row-major source: the row length and each term
        of the start (start_terms' steps times the dimension's stride) multiples of 8."""
        shape = shape_of(op.source)
        strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
        return shape[-1] % 8 == 0 and all(
            step * stride % 8 == 0
            for terms, stride in zip(self.start_terms(op, "0"), strides, strict=True)
            for step, _ in terms
        )

    def aligned(self, plan: StreamPlan) -> bool:
        """StreamLinear::aligned: the weights' rows and a 16-bit activation's start 16-byte
        aligned wherever the task is. Every buffer is (the arena places its own at 128 bytes,
        and the host aligns what it is given: host.py), so the offsets decide."""
        x = plan.x
        x_ok = isinstance(x, MergedX) or (
            not self.operands[x.source_index()].flagged and self.rows_aligned(x)
        )
        return x_ok and all(self.rows_aligned(w) for w, _ in plan.products)

    def merged_x(self, x: MergedX, beside: str = "") -> None:
        """The partials merged straight into the staged activation (one chunk: all of K); with
        `beside`, what the threads that do not merge run meanwhile (merged_x_lines)."""

        def source(op: InputOp) -> str:
            ref = self.operands[op.source_index()]
            return f"static_cast<const float*>(buffers[{ref.index}]) + {self.flat_start(op)}"

        into = "reinterpret_cast<float*>(mk::gpu::mk_dynamic_smem)"
        self.lines += merged_x_lines(x, dtype_code(x.norm.res[0].type), into, source, beside)
        self.lines.append("sl.x_ready = true;")

    def merge_early(self, plan: StreamPlan, mma: bool) -> str:
        """Where the body asks for the stream's weights, if not after the merge that
        makes its activation (switches.merge_early): `beside` by the warps that do not merge
        while the others load the partials (where some do not), else "". CUDA cores, weights
        from global memory, aligned rows."""
        mode, x = switches.merge_early(), plan.x
        if mode == "0" or not isinstance(x, MergedX):
            return ""
        if mma or not self.aligned(plan):
            return ""
        if mode == "auto":
            return "beside" if mostly_idle(x) else ""
        return mode if idle_warps(x) else ""

    def stage_first(self, plan: StreamPlan, k: int, mma: bool) -> int | None:
        """Whether the body loads its weights' first round behind the activation's first loads
        (switches.stage_first): None where it does not; else the 16-byte loads a thread may hold
        through the staging, 0 for no bound (the whole step). CUDA cores, aligned weights in
        global memory, and an activation it stages that is not flagged; by default (auto) only
        where a thread holds at most STAGE_FIRST_HELD loads through the staging (the first
        step's rows and its own activation loads) and no lane ring takes the stream, and past
        that, with MK_CUDA_STAGE_FIRST_HELD=H, the step's first H - XB rows."""
        first = switches.stage_first()
        if not first or mma or isinstance(plan.x, MergedX):
            return None
        if not self.aligned(plan):
            return None
        if self.operands[plan.x.source_index()].flagged:
            return None
        if first != switches.STAGE_FIRST_AUTO:
            return 0
        if plan.rows_per_round() + plan.loads_per_thread(k) <= STAGE_FIRST_HELD:
            return 0
        return switches.stage_first_held() or None

    def stage_bulk(self, plan: StreamPlan, k: int, chunk: int, mma: bool) -> bool:
        """stream_linear's Bulk: a tensor-core stream stages its activation by bulk copies
        (switches.stage_bulk) where it is an aligned, unflagged 16-bit one with a norm (a raw
        one takes mma_raw_chunks), its norm weight is 16-bit and aligned or absent, its weights
        bf16 (mma_chunk_early's products), and every chunk packs (whole 32-column steps): the
        body then keeps no register staging."""
        x = plan.x
        if not (mma and switches.stage_bulk()) or isinstance(x, MergedX):
            return False
        if (plan.g is None and plan.sum_sq is None) or k % 32 or chunk % 32:
            return False
        narrow = ("mk::DTYPE_BF16", "mk::DTYPE_F16")
        g = plan.g
        g_ok = g is None or (
            self.operands[g.source_index()].dtype in narrow and self.rows_aligned(g)
        )
        x_ref = self.operands[x.source_index()]
        bf16_weights = all(dtype_code(w.tile.type) == "mk::DTYPE_BF16" for w, _ in plan.products)
        return (
            self.aligned(plan)
            and x_ref.dtype in narrow
            and not x_ref.flagged
            and g_ok
            and bf16_weights
        )

    def slices(self, plan: StreamPlan, k: int) -> SlicePlan | None:
        """The task's K slices (StreamPlan.slices), where the activation is also proven as
        mk::gpu::sliced_activation asks: unflagged, of the weights' 16-bit type, its rows and the
        weights' 16-byte aligned, and a norm weight of that type too; else None."""
        if isinstance(plan.x, MergedX):
            return None
        sliced = plan.slices(k)
        if sliced is None or not self.aligned(plan):
            return None
        x = self.operands[plan.x.source_index()]
        types = {dtype_code(w.tile.type) for w, _ in plan.products}
        if plan.g is not None:
            g = self.operands[plan.g.source_index()]
            if not self.rows_aligned(plan.g):
                return None
            types.add(g.dtype)
        return sliced if not x.flagged and types == {x.dtype} else None

    def stream_linear(self, plan: StreamPlan) -> None:
        k = self.forloop * shape_of(plan.x.tile)[1]
        sliced = self.slices(plan, k)
        # K slices take the activation through their rings: one chunk, never staged.
        chunk = k if sliced else plan.chunk(k)
        smem = plan.slice_bytes(sliced) if sliced else plan.smem_bytes(k)
        self.smem_floats = -(-smem // 4)
        self.stream_chunks = -(-k // chunk)
        self.lines += ["{", "mk::gpu::StreamLinear sl{};", "sl.arena = &arena;"]
        mma = plan.tensor_cores(k)
        early = self.merge_early(plan, mma)
        if not isinstance(plan.x, MergedX):
            self.stream_activation(plan)
        elif not early:  # else after the weights' descriptors and their first round
            self.merged_x(plan.x)
        self.stream_norm_weight(plan)
        self.stream_fields(plan, k, chunk, mma)
        self.stream_weights(plan)
        self.stream_call(plan, k, chunk, mma, early, sliced)
        for op in plan.invariant:
            self.load(op, "0")

    def stream_activation(self, plan: StreamPlan) -> None:
        """sl.x: the activation's first element, its type and row length."""
        assert not isinstance(plan.x, MergedX)
        x = self.operands[plan.x.source_index()]
        r0, c0 = self.input_starts(plan.x, "0")
        at = f"({r0}) * {x.shape[1]} + {c0}"
        # A flagged activation: 8-byte words of float bits and flag, staged as they come.
        dtype = "mk::DTYPE_F64" if x.flagged else x.dtype
        self.lines += [
            f"sl.x = mk::gpu::elem_at(buffers[{x.index}], {dtype}, {at});",
            f"sl.x_dtype = {'mk::DTYPE_F32' if x.flagged else x.dtype};",
            f"sl.x_ld = {x.shape[1]};",
        ]
        if x.flagged:
            self.lines.append("sl.x_flag = arena.flag;")

    def stream_norm_weight(self, plan: StreamPlan) -> None:
        """sl.g: the norm weight's first element (none without a norm)."""
        if plan.g is None:
            return
        g = self.operands[plan.g.source_index()]
        (g0,) = self.input_starts(plan.g, "0")
        g_at = f"mk::gpu::elem_at(buffers[{g.index}], {g.dtype}, {g0})"
        self.lines += [f"sl.g = {g_at};", f"sl.g_dtype = {g.dtype};"]

    def stream_fields(self, plan: StreamPlan, k: int, chunk: int, mma: bool) -> None:
        """The descriptor's scalars: weight type, K and its chunk, Σx², weights, alignment."""
        emit = self.lines.append
        emit(f"sl.w_dtype = {dtype_code(plan.products[0][0].tile.type)};")
        if self.assigned:
            emit("sl.assign = true;")
        emit(f"sl.k = {k};")
        emit(f"sl.kc = {chunk};")
        if plan.sum_sq is not None:
            emit(f"sl.sum_sq = {self.var(plan.sum_sq.res)}.data();")
        emit(f"sl.nw = {len(plan.products)};")
        if self.aligned(plan):
            emit("sl.aligned = true;")

    def stream_weights(self, plan: StreamPlan) -> None:
        """sl.w: each weight's rows in global memory."""
        for i, (w, acc) in enumerate(plan.products):
            ref = self.operands[w.source_index()]
            n0, k0 = self.input_starts(w, "0")
            at = f"static_cast<const uint16_t*>(buffers[{ref.index}]) + ({n0}) * {ref.shape[1]} + {k0}"
            rows = w.tile_shape()[0]
            self.lines.append(
                f"sl.w[{i}] = mk::gpu::StreamWeight{{{at}, {ref.shape[1]}, {rows}, {self.var(acc.res)}.data()}};"
            )

    def stream_call(
        self, plan: StreamPlan, k: int, chunk: int, mma: bool, early: str, sliced: SlicePlan | None
    ) -> None:
        """The mk::gpu::stream_linear call (after the merge where MK_CUDA_MERGE_EARLY asks the
        weights first) and the descriptor's closing brace; `sliced` for K slices (slices)."""
        emit = self.lines.append
        steps = plan.mma_steps() if mma else plan.steps_in_flight(k)
        call = (
            f"mk::gpu::stream_linear<{plan.rows}, {plan.rows_per_round()}, {steps}, "
            f"{plan.loads_per_thread(k)}, {_bool(mma)}"
        )
        if early:  # the weights asked into L2 beside the partials' loads
            assert isinstance(plan.x, MergedX)
            self.merged_x(plan.x, "mk::gpu::prefetch_rows_l2_by(sl, t, n);")
        # The template's trailing arguments (Ring, First, Held, Bulk, Early, Slice, SliceNorm),
        # defaults left off. K slices' Ring is their rings' stages; they stage nothing.
        tail = [str(sliced.stages if sliced else plan.ring_stages(k))]
        # First: the first round loaded behind the activation's loads (2), else 0; Held: the
        # loads a thread keeps of it through the staging (0: all of the step).
        held = self.stage_first(plan, k, mma)
        tail.append("0" if held is None else "2")
        tail.append(str(held or 0))  # Held
        bulk = not sliced and self.stage_bulk(plan, k, chunk, mma)
        tail.append(_bool(bulk))  # Bulk
        # Early: the weights' first steps (or ring fills) behind the activation's bulk copies,
        # in a lone body.
        ahead = bulk and not plan.repeated
        tail.append(str(switches.mma_early() if ahead else 0))
        tail.append(str(sliced.blocks if sliced else 0))  # Slice
        tail.append(_bool(sliced is not None and sliced.norm))  # SliceNorm
        defaults = ("0", "0", "0", "false", "0", "0", "false")
        while tail and tail[-1] == defaults[len(tail) - 1]:
            tail.pop()
        call += "".join(f", {a}" for a in tail)
        if not mma:
            emit(f"{call}>(sl);")
        else:  # a raw activation's bulk copies on tensor cores may not land
            emit(f"if (!{call}>(sl)) return {STAGE_LOST};")
        emit("}")
