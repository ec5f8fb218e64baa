"""The device statements of a streamed decode attention (stream_attention.py's plan): the
mk::gpu::StreamAttention descriptor, the norm and RoPE of its head rows, and the call; and the
check that what a body reads in place or as keys is a plain buffer."""

from __future__ import annotations

from collections.abc import Mapping

from xdsl.ir import Operation

from mk.backends.cpu.emit_ops import BufferRef
from mk.backends.cpu.emit_scalar import dtype_code, float_literal
from mk.backends.cuda import attention_switches, op_marks
from mk.backends.cuda.emit_stream import StreamLinearEmitter
from mk.backends.cuda.launch_words import LaunchStep
from mk.backends.cuda.stream_attention import (
    THREADS,
    AttentionPlan,
    HeadRow,
    mma_chunk_keys,
    mma_chunks,
    mma_smem_floats,
    query_runs,
    score_lambda,
)
from mk.diagnostics import MkError, op_location
from mk.dialects.mugraph import InputOp

SIXTEEN_BIT = ("mk::DTYPE_BF16", "mk::DTYPE_F16")


def plain(ref: BufferRef, kernel: Operation, how: str) -> BufferRef:
    """`ref`, which this access reads plainly: a flagged buffer here is a compiler bug (the
    flagging in mugraph-to-task promised only accesses that wait on the flags)."""
    if ref.flagged:
        raise MkError(
            f"a flagged buffer (buffers[{ref.index}]) is read {how}, which cannot wait on its "
            "flags: compile without flag-values and flag-rows",
            op_location(kernel),
        )
    return ref


class StreamAttentionEmitter(StreamLinearEmitter):
    """The statements of a streamed decode attention, for the device emitter (emit.py)."""

    launch_steps: Mapping[int, LaunchStep]  # computed, not loaded (launch_words.py)

    def stream_attention(self, plan: AttentionPlan) -> None:
        """The call, after the loop-invariant ops it reads (their loads first, in one round
        trip) and its scalars."""
        emit = self.lines.append
        q_row = None if isinstance(plan.q, InputOp) else plan.head_row(plan.q)
        loads = [op for op in plan.prologue if isinstance(op, InputOp)] + plan.scalars()
        keys = self.task_keys(plan)
        kv = None if plan.block else self.mma_keys(plan, q_row, mma_chunks(keys))
        ahead = kv is None and self.keys_ahead(plan)
        if ahead:
            self.load_keys_ahead(plan)
        for op in [*loads, *(op for op in plan.prologue if not isinstance(op, InputOp))]:
            self.step(op, "0")
        k, v = (
            plain(self.operands[op.source_index()], self.op, "as keys") for op in (plan.k, plan.v)
        )
        self.smem_floats = plan.smem_floats()
        if plan.block:
            self.block_attention(plan)
            return
        emit("{")
        emit("mk::gpu::StreamAttention sa{};")
        if op_marks.enabled():
            emit("sa.arena = &arena;")  # marks between its phases (op_marks.ATTENTION_PHASES)
        flagged = self.flagged_rows(plan, q_row)
        if flagged:
            emit(f"sa.flagged = {flagged};")
            emit("sa.flags = &arena;")
        if isinstance(plan.q, InputOp):
            self.row_source("sa.q", plan.q, flags=True)
        elif q_row is not None:
            self.row_source("sa.q", q_row.x, flags=True)
            self.row_ops("sa.q_ops", q_row)
        else:
            emit(f"sa.q = {self.var(plan.q)}.data();")
            emit("sa.q_dtype = mk::DTYPE_F32;")
        for name, new in (("k", plan.k_new), ("v", plan.v_new)):
            if new is None:
                continue
            if (row := plan.head_row(new.new)) is not None:
                self.row_source(f"sa.{name}_new", row.x, flags=True)
                if name == "k":
                    self.row_ops("sa.k_ops", row)
            else:
                emit(f"sa.{name}_new = {self.var(new.new)}.data();")
                emit(f"sa.{name}_new_dtype = mk::DTYPE_F32;")
        if (at := plan.new_at()) is not None:
            emit(f"sa.new_key = static_cast<int64_t>({self.var(at.tile)}[0]);")
        if all(map(self.rows_aligned, self.prepared_rows(plan, q_row))):
            emit("sa.rows_aligned = true;")  # StreamAttention::rows_aligned: vector row loads
        self.key_fields("sa", plan, with_dtype=True)
        if plan.length is not None and attention_switches.causal_skip():
            self.length_keys(plan.length)
        self.lines += score_lambda(plan, lambda op: f"{self.var(op.tile)}[0]", self.fresh)
        if kv is not None:
            chunks = mma_chunks(keys, mma_chunk_keys())
            stages = min(chunks, attention_switches.attention_mma_stages())
            self.smem_floats = mma_smem_floats(plan.rows, plan.head_dim, stages)
            bf16 = "true" if kv == "mk::DTYPE_BF16" else "false"
            call = f"stream_attention_mma<{plan.rows}, {plan.head_dim}, {bf16}, {stages}>"
            emit(f"mk::gpu::{call}(sa, score);")
        elif ahead:
            call = f"stream_attention_ahead<{plan.rows}, {plan.head_dim}>"
            emit(f"mk::gpu::{call}(sa, score, keys_ahead);")
        else:
            emit(f"mk::gpu::stream_attention<{plan.rows}, {plan.head_dim}>(sa, score);")
        emit("}")

    def keys_ahead(self, plan: AttentionPlan) -> bool:
        """Whether a task on CUDA cores asks for its first round of keys before its scalars
        (attention_switches.keys_ahead): up to the switch's rows (2 by default,
        mk::gpu::attention_early_round; 4 asked for) from aligned 16-bit caches, with scalars
        (loaded, their round trip overlapped; or computed from launch words, the keys still out
        before the rows: qwen3-0.6b batch 1 -0.90 % on the H100 against the rows first)."""
        most_rows = attention_switches.keys_ahead()
        if plan.block or not plan.scalars() or not most_rows:
            return False
        rows, d = plan.rows, plan.head_dim
        k, v = (self.operands[op.source_index()] for op in (plan.k, plan.v))
        return (
            rows <= most_rows
            and (rows + 2) * (d // 8) <= THREADS
            and k.dtype in SIXTEEN_BIT
            and v.dtype == k.dtype
            and all(map(self.rows_aligned, (plan.k, plan.v)))
        )

    def load_keys_ahead(self, plan: AttentionPlan) -> None:
        """The K rows of the task's first round of keys into `keys_ahead`
        (mk::gpu::load_keys_ahead), before the scalars' loads."""
        k = self.operands[plan.k.source_index()]
        rows, d = plan.rows, plan.head_dim
        at = f"static_cast<const uint16_t*>(buffers[{k.index}]) + {self.flat_start(plan.k)}"
        self.lines += [
            "// the first round's K rows, asked for before the scalars that cut them arrive",
            f"mk::gpu::KeysAhead<mk::gpu::attention_slot_keys<{rows}>()> keys_ahead;",
            f"mk::gpu::load_keys_ahead<{rows}, {d}>({at}, {k.shape[-1]}, "
            f"{self.task_keys(plan)}, keys_ahead);",
        ]

    def flagged_rows(self, plan: AttentionPlan, q_row: HeadRow | None) -> int:
        """StreamAttention::flagged: the bits (kFlagQ 1, kFlagKNew 2, kFlagVNew 4) of the rows
        read from flagged buffers (mugraph-to-task's flag-rows), which the call polls."""
        q = plan.q if isinstance(plan.q, InputOp) else q_row.x if q_row is not None else None
        news = [None if new is None else plan.head_row(new.new) for new in (plan.k_new, plan.v_new)]
        rows = [
            (1, q),
            *((bit, None if r is None else r.x) for bit, r in zip((2, 4), news, strict=True)),
        ]
        return sum(bit for bit, op in rows if op is not None and self.is_flagged(op))

    def is_flagged(self, op: InputOp) -> bool:
        return self.operands[op.source_index()].flagged

    def prepared_rows(self, plan: AttentionPlan, q_row: HeadRow | None) -> list[InputOp]:
        """The inputs whose rows the call reads before its keys, in place: q's rows, the new K
        and V rows, and the ops' norm weights and RoPE tables (a tile's rows are the arena's,
        128-byte aligned)."""
        rows = [plan.q] if isinstance(plan.q, InputOp) else []
        k_row, v_row = (
            None if new is None else plan.head_row(new.new) for new in (plan.k_new, plan.v_new)
        )
        for row in (q_row, k_row):
            if row is not None:
                rows.append(row.x)
                rows += [row.g] if row.norm is not None and row.g is not None else []
                rows += list(row.tables or ())
        return rows + ([v_row.x] if v_row is not None else [])

    def mma_keys(self, plan: AttentionPlan, q_row: HeadRow | None, chunks: int) -> str | None:
        """The keys' dtype where the attention runs on tensor cores (MK_CUDA_ATTN_MMA): the
        query rows that reach the call must be exact in it (rows of that type, or rounded to it
        by their ops), and the head dim 32, 64 or 128 (attention_switches.attention_mma says
        when, from the task's `chunks` of keys and its query rows)."""
        d = plan.head_dim
        if d not in (32, 64, 128) or not attention_switches.attention_mma(d, chunks, plan.rows):
            return None
        kv = self.operands[plan.k.source_index()].dtype
        if q_row is not None:
            q = dtype_code(q_row.out.type)
        elif isinstance(plan.q, InputOp):
            q = self.operands[plan.q.source_index()].dtype
        else:
            return None  # an f32 tile
        return kv if q == kv else None

    def block_attention(self, plan: AttentionPlan) -> None:
        """mk::gpu::block_attention: many query rows (a prefill's) against all the keys."""
        assert isinstance(plan.q, InputOp)
        emit = self.lines.append
        emit("{")
        emit("mk::gpu::BlockAttention ba{};")
        run_rows, run_ld = query_runs(plan.q)
        q = plain(self.operands[plan.q.source_index()], self.op, "in place")
        emit(
            f"ba.q = static_cast<const uint16_t*>(buffers[{q.index}]) + {self.flat_start(plan.q)};"
        )
        emit(f"ba.q_run_rows = {run_rows};")
        emit(f"ba.q_run_ld = {run_ld};")
        emit(f"ba.query0 = {self.input_starts(plan.q, '0')[-2]};")
        self.key_fields("ba", plan)
        if plan.causal is not None and attention_switches.causal_skip():
            self.causal_keys(plan, min(plan.rows, run_rows) - 1)
        if plan.length is not None and attention_switches.causal_skip():
            self.length_keys(plan.length, "ba")
        self.lines += score_lambda(plan, lambda op: f"{self.var(op.tile)}[0]", self.fresh)
        bf16 = "true" if q.dtype == "mk::DTYPE_BF16" else "false"
        emit(f"mk::gpu::block_attention<{plan.rows}, {plan.head_dim}, {bf16}>(ba, score);")
        emit("}")

    def length_keys(self, length: InputOp, name: str = "sa") -> None:
        """The call's keys cut at the kv length (backends/cuda/causal.py's length_bound): a
        task past it loads no keys (a cache longer than the positions written), and rows past
        it, which may hold anything (NaN), are never read."""
        self.lines += [
            "{  // the keys at or past the kv length are masked for every row",
            f"const int64_t len = static_cast<int64_t>({self.var(length.tile)}[0]);",
            f"{name}.keys = static_cast<int32_t>(mk::gpu::imax(int64_t{{0}}, "
            f"mk::gpu::imin(static_cast<int64_t>({name}.keys), len - {name}.key0)));",
            "}",
        ]

    def causal_keys(self, plan: AttentionPlan, last_row: int) -> None:
        """ba.keys cut to the keys a row of the block can see (backends/cuda/causal.py), where
        every row sees the first key; `last_row`: the last query's offset from ba.query0."""
        assert plan.causal is not None
        length, span = self.var(plan.causal.length.tile), plan.causal.span
        self.lines += [
            "{  // a causal mask: the keys past the block's last query are masked for every row",
            f"const int64_t len = static_cast<int64_t>({length}[0]);",
            f"const int64_t first = len - {span} + ba.query0, last = first + {last_row};",
            "if (ba.key0 < len && ba.key0 <= first) {",
            "ba.keys = static_cast<int32_t>(mk::gpu::imin(static_cast<int64_t>(ba.keys), "
            "mk::gpu::imin(len, last + 1) - ba.key0));",
            "}",
            "}",
        ]

    def task_keys(self, plan: AttentionPlan) -> int:
        """The keys of one task (before the kv length cuts them)."""
        k = self.operands[plan.k.source_index()]
        return self.forloop * plan.k.tile_shape()[len(k.shape) - 2]

    def key_fields(self, name: str, plan: AttentionPlan, with_dtype: bool = False) -> None:
        """The K and V pointers (and their dtype), the keys and their first position, and o, m
        and l."""
        emit = self.lines.append
        k, v = (self.operands[op.source_index()] for op in (plan.k, plan.v))
        key_dim = len(k.shape) - 2
        for field, ref, op in (("k", k, plan.k), ("v", v, plan.v)):
            emit(
                f"{name}.{field} = static_cast<const uint16_t*>(buffers[{ref.index}]) + "
                f"{self.flat_start(op)};"
            )
        if with_dtype:
            emit(f"{name}.kv_dtype = {k.dtype};")
        emit(f"{name}.ld = {k.shape[-1]};")
        if name == "sa" and all(map(self.rows_aligned, (plan.k, plan.v))):
            emit("sa.aligned = true;")  # StreamAttention::aligned: no unaligned paths compiled
        emit(f"{name}.keys = {self.task_keys(plan)};")
        emit(f"{name}.key0 = {self.input_starts(plan.k, '0')[key_dim]};")
        for field, value in (("o", plan.acc.o), ("m", plan.acc.m), ("l", plan.acc.l)):
            emit(f"{name}.{field} = {self.var(value)}.data();")

    def row_pointer(self, op: InputOp, flags: bool = False) -> str:
        """A pointer to the first element of an input's tile, in place (with `flags`, to the
        first word of a flagged buffer's tile, which the call polls)."""
        ref = self.operands[op.source_index()]
        if flags and ref.flagged:
            return f"static_cast<const uint64_t*>(buffers[{ref.index}]) + {self.flat_start(op)}"
        plain(ref, self.op, "in place")
        return f"mk::gpu::elem_at(buffers[{ref.index}], {ref.dtype}, {self.flat_start(op)})"

    def row_source(self, field: str, op: InputOp, flags: bool = False) -> None:
        """`field` (a pointer) and its `_dtype` for the rows an input's tile covers, in place
        (a head row of a flagged buffer: its words, StreamAttention::flagged)."""
        self.lines.append(f"{field} = {self.row_pointer(op, flags)};")
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
