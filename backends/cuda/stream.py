"""The streamed form of a decode-shaped linear graph_def, and the device call that runs its loop.

A graph_def whose for-loop only multiplies a few activation rows (optionally scaled by a norm
weight) with the K-tiles of one to four weights, summing the products and Σx², does not need
its tiles: `mk::gpu::stream_linear` (mk/cuda_stream.cuh) computes the accumulators' final
states in one pass over the weights, and the epilogue runs as usual on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_scalar import dtype_code
from mk.backends.cuda import switch_values, switches
from mk.backends.cuda.split_merge import MergedX, plan_merged_x
from mk.dialects.mugraph import GraphDefOp, InputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import AccumOp, BinaryOp, MatmulOp

MAX_ROWS = 16  # activation rows the streamed loop takes (decode batches)
MAX_WEIGHTS = 4
WARPS = 8  # mk::kCudaThreads / 32
SMEM_BYTES = 160 << 10  # mk::gpu::kStreamSmemBytes: most the activation chunk takes
# The room a streamed body with tiny tiles may take where it then walks its activation in fewer
# chunks (switches.wide_room): the arena's shared-memory part behind it keeps what is left.
WIDE_ROOM = 208 << 10
MMA_LOADS = 16  # 16-byte weight loads a lane of a tensor-core warp keeps in flight
RING_COLS = 256  # mk::gpu::kRingCols: columns of a ring stage's row
SLICE_COLS = 64  # mk::gpu::kSliceCols: columns of a K-slice ring stage's row
SLICE_ROWS = 32  # weight rows a task with a raw activation may have for K slices
SLICE_MAX_BLOCKS = 6  # mk::gpu::kSliceMaxBlocks: blocks of 8 weight rows a K-slice warp takes
# What a body returns (the run status's detail is one less) when its bulk copies never landed.
STAGE_LOST = 0x7FFFFFFE
_WEIGHT_DTYPES = ("mk::DTYPE_BF16", "mk::DTYPE_F16")
_FLOAT_DTYPES = ("mk::DTYPE_BF16", "mk::DTYPE_F16", "mk::DTYPE_F32")
# Accumulators of x's Σx² the streamed loop sums at its staging barrier: nn-to-mugraph's fused
# norm (the epilogue divides) and the search's Mirage kernel (the accumulator's finish divides).
SUM_SQ_KINDS = ("sum_sq_last", "mean_sq_last")


def loads_in_flight(rows: int, repeated: bool = False) -> int:
    """16-byte weight loads a lane keeps in flight: about 24 for one or two activation rows,
    fewer as the sums take registers; MK_CUDA_LOADS (1-64) sets it for every batch (what one SM
    keeps in flight bounds a streamed task: 24 loads × 256 threads is 96 KB). A repeated body
    takes layer_loads' instead, where that is not 0."""
    return _loads(24 if rows <= 2 else 16 if rows <= 8 else 8, repeated, rows)


def _loads(default: int, repeated: bool, rows: int) -> int:
    """MK_CUDA_LOADS' count (`default` unless set), or for a repeated body of `rows` activation
    rows layer_loads' where that is not 0."""
    loads = switch_values.count("MK_CUDA_LOADS", default, 1, 64, "loads")
    return (layer_loads(rows) or loads) if repeated else loads


LAYER_LOADS = 8  # a repeated body's loads in flight by default
LAYER_LOADS_ONE_ROW = 16  # ... and with one activation row (batch 1)


def layer_loads(rows: int = 0) -> int:
    """MK_CUDA_LAYER_LOADS: the 16-byte loads a lane keeps in flight in a body that several grids
    run (a model's layers) of `rows` activation rows; unless set, 16 for one row and 8 for more
    (0 for MK_CUDA_LOADS' count). Each such body runs once per layer from an instruction cache
    that a layer's bodies share (an SM keeps 128-160 KB of code, bench/icache.py), and fewer
    loads in flight are less unrolled code. On the H200 with 8 against 24 (batch 1) or 16
    (batch 8), while the bodies outgrew that cache: qwen3-8b 5.24 -> 5.19 ms/token at batch 1
    and 8.18 -> 7.32 at batch 8, qwen3-0.6b 1.104 -> 1.085 (1.940 -> 1.909 at batch 8),
    llama-3.2-1b 1.168 -> 1.143; 4 (qwen3-8b 5.50 at batch 1) and 12 (7.50 at batch 8) were
    slower. On the H100 with today's smaller bodies (session 79), 16 against 8 at batch 1:
    qwen3-8b −3.16 %, llama-3.2-1b −1.51 %, qwen3-0.6b −0.47 % (24: −2.07 % on llama-3.2-1b,
    −0.01 % on qwen3-0.6b); at batch 8 qwen3-0.6b +5.30 % (24: +8.78 %), so batch 8 keeps 8."""
    default = LAYER_LOADS_ONE_ROW if rows == 1 else LAYER_LOADS
    return switch_values.count("MK_CUDA_LAYER_LOADS", default, 0, 64, "loads")


@dataclass(frozen=True)
class SlicePlan:
    """A task's K slices (mk::gpu::mma_slices): blocks of 8 weight rows a warp, ring stages,
    whether the activation is normed on the way (its norm weight in the ring, Σx² taken), and
    the row groups its warps form (mk::gpu::slice_groups finds the same count)."""

    blocks: int
    stages: int
    norm: bool
    groups: int = 1


@dataclass(frozen=True)
class StreamPlan:
    """The loop of a graph_def in streamed form."""

    x: InputOp | MergedX  # [M, tk] tiles of a [rows, K] activation along K, or merged partials
    g: InputOp | None  # [tk] tiles of the norm weight, multiplied into x before the products
    scaled: BinaryOp | None
    products: tuple[tuple[InputOp, AccumOp], ...]  # each weight's tiles and its sum
    sum_sq: AccumOp | None  # sum_sq_last or mean_sq_last of x (Σx², divided after the loop)
    invariant: tuple[InputOp, ...]  # loop-invariant tiles only the epilogue reads
    x_bytes: int = SMEM_BYTES  # most the staged activation chunk takes (and the mma ring)
    repeated: bool = False  # the body runs for several grids (loads_in_flight)

    @property
    def rows(self) -> int:
        return shape_of(self.x.tile)[0]

    def streamed(self) -> set[SSAValue]:
        """The values the streamed loop never holds as tiles."""
        values: set[SSAValue] = {self.x.tile}
        if isinstance(self.x, MergedX):
            values |= {r for op in self.x.handled for r in op.results}
        if self.g is not None and self.scaled is not None:
            values |= {self.g.tile, self.scaled.res}
        for w, acc in self.products:
            values |= {w.tile, acc.x}
        return values

    def rows_per_round(self) -> int:
        """Weight rows a warp streams at once: all of its share in as few equal rounds as fit
        the registers (RG · M sums and 4 · RG loads per thread)."""
        total = sum(w.tile_shape()[0] for w, _ in self.products)
        share = -(-total // WARPS)
        most = max(1, min(8, 160 // (self.rows + 16)))  # sums plus four loads' registers
        return -(-share // -(-share // most))

    def steps_in_flight(self, k: int) -> int:
        """256-column steps whose loads a lane issues before multiplying: up to
        loads_in_flight(rows) 16-byte loads per lane; no more steps than a chunk has, split
        evenly over the rounds (every unrolled step costs instructions even when its columns
        are past the end)."""
        most = max(1, loads_in_flight(self.rows, self.repeated) // self.rows_per_round())
        steps = -(-self.chunk(k) // 256)
        rounds = -(-steps // most)
        return -(-steps // rounds)

    def loads_per_thread(self, k: int) -> int:
        """Eight-column groups of the activation chunk each thread loads at once when staging it
        (mk::gpu::stage_chunk_16bit's XB): all of its share, up to 8. Each one is unrolled code in
        the body, and a decode step runs each body from a cold instruction cache."""
        groups = -(-self.rows * self.chunk(k) // 8)
        return max(1, min(8, -(-groups // (32 * WARPS))))

    def tensor_cores(self, k: int) -> bool:
        """Whether the products run on tensor cores (mma m16n8k16): batches of 2..16 rows, the
        columns in 32-wide steps. One row stays on CUDA cores: on tensor cores
        (MK_CUDA_MMA_ONE_ROW=1, retired) whole models at batch 1 ran 13 % slower."""
        if isinstance(self.x, MergedX):  # merged into the chunk as floats
            return False
        return 2 <= self.rows <= MAX_ROWS and k % 32 == 0 and self._float_chunk(k) % 32 == 0

    def ring_stages(self, k: int) -> int:
        """Stages of each warp's cp.async ring on tensor cores (mk::gpu::mma_ring_walk, the
        stream_linear's Ring), 0 for none: switches.mma_ring on the weight bytes a warp
        streams. A warp-wide load straight into mma fragments reads 64 bytes of each of eight
        rows and waits for a whole round of them; the ring copies whole 512-byte row segments
        and refills a stage as soon as one is used. On the H200 (bench/RESULTS.md): 21 GB/s per
        SM from registers, 31 with 2 stages on a 32-row task (bench/mma_product.py, batch 8);
        the gated MLP at batch 8 0.1465 -> 0.1293 ms with 2; whole models at batch 8, whose
        linears stream 4-12 KB a warp, slower with a ring on every task (1.92 -> 2.08 ms/token)
        and with one on the lm_head alone (1.92 -> 1.97)."""
        if not self.tensor_cores(k):
            return 0
        total = sum(w.tile_shape()[0] for w, _ in self.products)
        stages = switches.mma_ring(2 * total * k // WARPS, k)
        # The ring leaves room for a chunk of 256 columns in each packed buffer.
        least = self._packed_buffers() * 2 * self.rows * 256
        while stages >= 2 and ring_bytes(stages) + least > self.x_bytes:
            stages -= 1
        return stages if stages >= 2 else 0

    def slices(self, k: int) -> SlicePlan | None:
        """K slices for the task (stream_linear's Slice, Ring and SliceNorm), or None:
        switches.mma_slice on tensor cores, an activation not merged and either raw (no norm,
        no Σx²: at most SLICE_ROWS weight rows, one row group) or, as switches.mma_slice_norm
        allows, times a norm weight with its Σx² taken (the fewest row groups whose blocks fit a
        warp and whose rings fit the stream's room). A warp's ring is no deeper than its slice
        has stages. Under `auto` a raw activation's only where the rings take no more shared
        memory than the chunked path (smem_bytes). The emitter also proves the activation (and
        norm weight) aligned and of the weights' 16-bit type (emit_stream.slices)."""
        stages, auto = switches.mma_slice()
        if not stages or not self.tensor_cores(k) or isinstance(self.x, MergedX):
            return None
        if self.g is None and self.sum_sq is None:
            return self._sliced(k, stages, (1,), self.smem_bytes(k) if auto else self.x_bytes)
        mode = switches.mma_slice_norm()
        if self.g is None or self.sum_sq is None or mode == "0":
            return None
        plan = self._sliced(k, stages, (1, 2, 4, 8), self.x_bytes)
        if plan is None or mode == "1":
            return plan
        few = plan.groups <= switches.SLICE_NORM_AUTO_GROUPS
        long = self._warp_stages(k, plan.groups) >= switches.SLICE_NORM_AUTO_STAGES
        return plan if few and long else None

    def _sliced(self, k: int, stages: int, groups: tuple[int, ...], room: int) -> SlicePlan | None:
        """The plan of the fewest of `groups` row groups whose blocks fit a warp and whose rings
        fit `room`."""
        total = sum(w.tile_shape()[0] for w, _ in self.products)
        norm = self.g is not None
        most = SLICE_MAX_BLOCKS if norm else SLICE_ROWS // 8
        for n in groups:
            blocks = -(-total // (8 * n))
            if blocks > most:
                continue
            plan = SlicePlan(blocks, max(2, min(stages, self._warp_stages(k, n))), norm, n)
            if self.slice_bytes(plan) <= room:
                return plan
        return None

    @staticmethod
    def _warp_stages(k: int, groups: int) -> int:
        """SLICE_COLS-column stages in the longest slice of K a warp of `groups` row groups takes."""
        return math.ceil(math.ceil(k / SLICE_COLS) / (WARPS // groups))

    def slice_bytes(self, plan: SlicePlan) -> int:
        """Every warp's K-slice ring (mk::gpu::slice_bytes): stages of `blocks` · 8 weight rows,
        the activation's rows and with a norm its weight's row, SLICE_COLS columns each."""
        lines = 8 * plan.blocks + self.rows + (1 if plan.norm else 0)
        return WARPS * plan.stages * lines * SLICE_COLS * 2

    def mma_steps(self) -> int:
        """32-column steps whose loads a lane of a tensor-core warp issues before its first mma
        (mk::gpu::mma_chunk's U): MMA_LOADS 16-byte loads (MK_CUDA_LOADS sets them). More made
        the gated MLP at batch 8 slower on the H200 (24: 0.160, 32: 0.164 against 0.157 ms)."""
        return max(1, _loads(MMA_LOADS, self.repeated, self.rows))

    def chunk(self, k: int) -> int:
        """Columns staged per chunk: all of the task's K when the shared memory holds it (as
        floats, or packed beside the mma ring: two packed buffers where the activation may be
        copied raw, mk::gpu::mma_raw_chunks)."""
        stages = self.ring_stages(k)
        if stages:
            room = self.x_bytes - ring_bytes(stages)
            if 2 * self.rows * k <= room:
                return k  # one buffer holds it all: nothing to double-buffer
            return min(k, room // self._packed_buffers() // 2 // self.rows // 256 * 256)
        return self._float_chunk(k)

    def _float_chunk(self, k: int) -> int:
        return min(k, self.x_bytes // 4 // self.rows // 256 * 256)

    def _packed_buffers(self) -> int:
        """Packed activation buffers the tensor cores' loop may use: two where nothing is
        computed on the activation on its way in (no norm, no Σx², not merged), so its chunks
        may be bulk-copied raw; one where they are staged by the threads."""
        raw = not isinstance(self.x, MergedX) and self.g is None and self.sum_sq is None
        return 2 if raw else 1

    def smem_bytes(self, k: int) -> int:
        """Dynamic shared memory the streamed loop takes: the chunk, and the ring behind it."""
        stages = self.ring_stages(k)
        if stages:
            chunk = self.chunk(k)
            buffers = 1 if chunk == k else self._packed_buffers()
            packed = buffers * self.rows * chunk * 2
            return -(-packed // 128) * 128 + ring_bytes(stages)
        return 4 * self.rows * self.chunk(k)


def stream_room() -> int:
    """MK_CUDA_STREAM_KB: KiB of shared memory a streamed body's activation chunk and mma ring
    take (SMEM_BYTES unless set); the arena's shared-memory part gets what they leave, up to
    its cap."""
    return switch_values.count("MK_CUDA_STREAM_KB", SMEM_BYTES >> 10, 32, 208, "KiB") << 10


def ring_bytes(stages: int) -> int:
    """Every warp's cp.async ring (mk::gpu::ring_bytes): eight rows of RING_COLS columns a
    stage."""
    return WARPS * stages * 8 * RING_COLS * 2


def plan_stream(op: GraphDefOp) -> StreamPlan | None:
    """The streamed form of `op`'s loop, or None when the loop does anything else."""
    loop = op.loop_ops()
    in_loop = set(loop)
    matmuls = [o for o in loop if isinstance(o, MatmulOp)]
    if not 1 <= len(matmuls) <= MAX_WEIGHTS or any(not _is_product(m) for m in matmuls):
        return None
    lhs = matmuls[0].a
    if any(m.a != lhs for m in matmuls):
        return None
    side = _activation_side(lhs)
    if side is None:
        merged = plan_merged_x(loop, lhs, op.forloop_range())
        if merged is None:
            return None
        side = (merged, None, None)
    x, g, scaled = side
    products = []
    for m in matmuls:
        w = m.b.owner
        acc = sole_user(m.res)
        if not isinstance(w, InputOp) or not isinstance(acc, AccumOp) or acc.kind.data != "sum":
            return None
        if sole_user(w.tile) is not m or not _weight_ok(w, x):
            return None
        products.append((w, acc))
    if len({dtype_code(w.tile.type) for w, _ in products}) != 1:
        return None
    sum_sq = None
    handled: set[Operation] = {*(p for pair in products for p in pair), *matmuls}
    handled |= set(x.handled) if isinstance(x, MergedX) else {x}
    handled |= {o for o in (g, scaled) if o is not None}
    invariant = []
    for o in loop:
        if o in handled:
            continue
        if isinstance(o, AccumOp) and o.kind.data in SUM_SQ_KINDS and o.x == x.tile:
            if isinstance(x, MergedX):
                return None
            if sum_sq is not None:
                return None
            sum_sq = o
        elif epilogue_input(o, in_loop):
            invariant.append(o)
        else:
            return None
    if any(u.operation not in handled | {sum_sq} for u in x.tile.uses):
        return None
    return StreamPlan(x, g, scaled, tuple(products), sum_sq, tuple(invariant), stream_room())


def _is_product(m: MatmulOp) -> bool:
    return m.transpose_b is not None and dtype_code(m.res.type) == "mk::DTYPE_F32"


def sole_user(value: SSAValue) -> Operation | None:
    """The one op that reads `value`, or None."""
    users = {u.operation for u in value.uses}
    return users.pop() if len(users) == 1 else None


def epilogue_input(op: Operation, in_loop: set[Operation]) -> TypeGuard[InputOp]:
    """Whether `op` loads a loop-invariant tile (not walking K) that only ops after the loop
    read: the streamed and gemm-tile forms load it once, after their loop."""
    return (
        isinstance(op, InputOp)
        and op.fmap_dim() < 0
        and all(u.operation not in in_loop for u in op.tile.uses)
    )


def _activation_side(lhs: SSAValue) -> tuple[InputOp, InputOp | None, BinaryOp | None] | None:
    """(x, g, x·g) when the matmuls' left side is x's tile or x's tile times g's tile."""
    owner = lhs.owner
    if isinstance(owner, InputOp):
        return (owner, None, None) if _activation_ok(owner) else None
    if not isinstance(owner, BinaryOp) or owner.kind.data != "mul":
        return None
    if dtype_code(owner.res.type) != "mk::DTYPE_F32":
        return None
    a, b = owner.a.owner, owner.b.owner
    if not isinstance(a, InputOp) or not isinstance(b, InputOp):
        return None
    x, g = (a, b) if len(a.tile_shape()) == 2 else (b, a)
    if not _activation_ok(x) or len(g.tile_shape()) != 1 or g.fmap_dim() != 0:
        return None
    if len(shape_of(g.source)) != 1 or g.tile_shape()[0] != x.tile_shape()[1]:
        return None
    if not _same_dtype(g) or dtype_code(g.tile.type) not in _FLOAT_DTYPES:
        return None
    if sole_user(g.tile) is not owner:
        return None
    return x, g, owner


def _same_dtype(op: InputOp) -> bool:
    return dtype_code(op.tile.type) == dtype_code(op.source.type)


def _activation_ok(x: InputOp) -> bool:
    tile = x.tile_shape()
    return (
        len(tile) == 2
        and len(shape_of(x.source)) == 2
        and x.fmap_dim() == 1
        and 1 <= tile[0] <= MAX_ROWS
        and tile[1] % 8 == 0
        and _same_dtype(x)
        and dtype_code(x.tile.type) in _FLOAT_DTYPES
    )


def _weight_ok(w: InputOp, x: InputOp | MergedX) -> bool:
    tile, shape = w.tile_shape(), shape_of(w.source)
    return (
        len(tile) == 2
        and len(shape) == 2
        and w.fmap_dim() == 1
        and tile[1] == shape_of(x.tile)[1]
        and _same_dtype(w)
        and dtype_code(w.tile.type) in _WEIGHT_DTYPES
        and math.prod(tile) > 0
    )
