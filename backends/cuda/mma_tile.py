"""Tensor-core forms of generic bodies' products: a 2-D matmul of float tiles holding 16-bit
floats (mk::gpu::mma_tile), and a linear whose loop only multiplies rows of bf16/f16 x and w
(the whole K loop staged through shared memory, the sums in registers: wgmma through CuTe,
mk::gpu::wgmma_gemm_tile, or mma.sync, mk::gpu::gemm_tile, with MK_CUDA_GEMM=mma)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_scalar import dtype_code
from mk.backends.cuda import switches
from mk.backends.cuda.stream import epilogue_input
from mk.dialects.mugraph import GraphDefOp, InputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import AccumOp, BinaryOp, MatmulOp

_PAIRS = {"mk::DTYPE_BF16": "true", "mk::DTYPE_F16": "false"}  # the device calls' BF16 parameter
# gemm_tile (runtime/include/mk/cuda_mma_tile.cuh): a ring of three chunks whose rows are padded
# to 72 elements, at most four weights.
GEMM_LD, GEMM_STAGES, GEMM_MAX_WEIGHTS = 72, 3, 4
GEMM_MAX_BLOCKS = 128  # 16x8 output blocks a tile may have: 16 a warp, 64 registers of sums
GEMM_MAX_SMEM = 144 * 1024  # bytes its staging may take of the dynamic shared memory
# wgmma_gemm_tile (runtime/include/mk/cuda_wgmma_tile.cuh): stages of 64 columns, 128 bytes a
# row (swizzled, unpadded), behind 1 KiB of alignment; x's rows padded to 64 a warpgroup.
WGMMA_KC_BYTES, WGMMA_ALIGN = 128, 1024
WGMMA_HEADER = '#include "mk/cuda_wgmma_tile.cuh"'
SUM_SQ = "sum_sq_last", "mean_sq_last"  # Σx² of x's rows (the mean divided after the loop)


def mma_tile(op: Operation, var: Callable[[SSAValue], str]) -> str | None:
    """The mma_tile call of a matmul without batch dimensions whose operands share a 16-bit
    float type (packing their f32 tiles back into pairs is then exact), or None (the generic
    matmul_tile, which also serves f32 operands at full precision)."""
    if not isinstance(op, MatmulOp):
        return None
    a, b = shape_of(op.a), shape_of(op.b)
    kind = dtype_code(op.a.type)
    if len(a) != 2 or len(b) != 2 or kind not in _PAIRS or dtype_code(op.b.type) != kind:
        return None
    m, k = a
    n = b[0] if op.transpose_b is not None else b[1]
    if (b[1] if op.transpose_b is not None else b[0]) != k:
        return None
    tb = "true" if op.transpose_b is not None else "false"
    return (
        f"mk::gpu::mma_tile<{_PAIRS[kind]}>({var(op.res)}, {m}, {n}, {k}, "
        f"{var(op.a)}, {var(op.b)}, {tb});"
    )


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


@dataclass(frozen=True)
class GemmPlan:
    """A loop of exactly: load x [TM, tile_k] (times a norm weight g, in f32), load each weight
    [TN_i, tile_k], multiply (x or x·g)·w_iᵀ in f32 and sum it; and optionally Σx² of x."""

    x: InputOp
    g: InputOp | None
    scaled: BinaryOp | None
    products: tuple[tuple[InputOp, MatmulOp, AccumOp], ...]
    sum_sq: AccumOp | None
    wgmma: bool = True
    invariant: tuple[InputOp, ...] = ()  # loop-invariant tiles only the epilogue reads

    def streamed(self) -> set[SSAValue]:
        """The values gemm_tile never holds as float tiles."""
        values: set[SSAValue] = {self.x.tile}
        if self.g is not None and self.scaled is not None:
            values |= {self.g.tile, self.scaled.res}
        for w, mm, _ in self.products:
            values |= {w.tile, mm.res}
        return values

    def kind(self) -> str:
        return _PAIRS[dtype_code(self.x.tile.type)]

    def weight_rows(self) -> int:
        """NT: the weights' rows, each rounded up to 8."""
        return sum(_round_up(w.tile_shape()[0], 8) for w, _, _ in self.products)

    def wgmma_rows(self) -> int:
        """x's rows padded for wgmma: 64, or a multiple of 128 (one warpgroup each 64)."""
        tm = self.x.tile_shape()[0]
        return 64 if tm <= 64 else _round_up(tm, 128)

    def wgmma_stage_bytes(self) -> int:
        return (self.wgmma_rows() + self.weight_rows()) * WGMMA_KC_BYTES

    def wgmma_stages(self) -> int:
        """The most stages (MK_CUDA_GEMM_STAGES, 4) that fit the shared memory; fewer than 2
        do not run."""
        return min(
            switches.gemm_stages(), (GEMM_MAX_SMEM - WGMMA_ALIGN) // self.wgmma_stage_bytes()
        )

    def mma_smem_bytes(self) -> int:
        rows = _round_up(self.x.tile_shape()[0], 16) + self.weight_rows()
        return GEMM_STAGES * rows * GEMM_LD * 2

    def smem_bytes(self) -> int:
        """The mma.sync tile's, or with wgmma the larger of both (a build without CuTe's
        headers runs the mma.sync tile in the wgmma call's place)."""
        if not self.wgmma:
            return self.mma_smem_bytes()
        wgmma = WGMMA_ALIGN + self.wgmma_stages() * self.wgmma_stage_bytes()
        return max(wgmma, self.mma_smem_bytes())

    def fits(self) -> bool:
        """Whether the sums fit the registers and the ring the shared memory (with wgmma, the
        mma.sync tile's too)."""
        blocks = _round_up(self.x.tile_shape()[0], 16) // 16 * self.weight_rows() // 8
        mma = blocks <= GEMM_MAX_BLOCKS and self.mma_smem_bytes() <= GEMM_MAX_SMEM
        if not self.wgmma:
            return mma
        wgmma_blocks = self.wgmma_rows() * self.weight_rows() // 128
        return mma and wgmma_blocks <= GEMM_MAX_BLOCKS and self.wgmma_stages() >= 2


def _rows_operand(op: object, kind: str, dims: int = 2) -> InputOp | None:
    """`op` when it loads rows of a 16-bit float buffer as they are, the loop walking K."""
    if not isinstance(op, InputOp) or len(op.tile_shape()) != dims:
        return None
    if len(shape_of(op.source)) != dims or op.fmap_dim() != dims - 1:
        return None
    if dtype_code(op.tile.type) != kind or dtype_code(op.source.type) != kind:
        return None
    return op


def _users(value: SSAValue) -> set[Operation]:
    return {u.operation for u in value.uses}


def _left_side(lhs: SSAValue, kind: str) -> tuple[InputOp, InputOp | None, BinaryOp | None] | None:
    """(x, g, x·g) when the products' left side is x's tile or x's tile times a norm weight g."""
    owner = lhs.owner
    if not isinstance(owner, BinaryOp):
        x = _rows_operand(owner, kind)
        return None if x is None else (x, None, None)
    if owner.kind.data != "mul" or dtype_code(owner.res.type) != "mk::DTYPE_F32":
        return None
    a, b = owner.a.owner, owner.b.owner
    x, g = _rows_operand(a, kind), _rows_operand(b, kind, 1)
    if x is None or g is None:
        x, g = _rows_operand(b, kind), _rows_operand(a, kind, 1)
    if x is None or g is None or _users(g.tile) != {owner}:
        return None
    if g.tile_shape()[0] != x.tile_shape()[1]:
        return None
    return x, g, owner


def plan_gemm(op: GraphDefOp) -> GemmPlan | None:
    """The gemm_tile form of `op`'s loop, or None when the loop does anything else."""
    loop = op.loop_ops()
    matmuls = [o for o in loop if isinstance(o, MatmulOp)]
    if not 1 <= len(matmuls) <= GEMM_MAX_WEIGHTS:
        return None
    lhs = matmuls[0].a
    kind = dtype_code(lhs.owner.a.type if isinstance(lhs.owner, BinaryOp) else lhs.type)
    if kind not in _PAIRS or any(m.a != lhs for m in matmuls):
        return None
    side = _left_side(lhs, kind)
    if side is None:
        return None
    x, g, scaled = side
    products = []
    for mm in matmuls:
        w, acc = _rows_operand(mm.b.owner, kind), _users(mm.res)
        if mm.transpose_b is None or dtype_code(mm.res.type) != "mk::DTYPE_F32" or w is None:
            return None
        if len(acc) != 1 or _users(w.tile) != {mm} or w.tile_shape()[1] != x.tile_shape()[1]:
            return None
        (a,) = acc
        if not isinstance(a, AccumOp) or a.kind.data != "sum":
            return None
        products.append((w, mm, a))
    handled: set[Operation] = {x, *(o for p in products for o in p)}
    handled |= {o for o in (g, scaled) if o is not None}
    # Loop-invariant inputs only the epilogue reads (a residual): loaded after the tile.
    inside = set(loop)
    invariant = [o for o in loop if epilogue_input(o, inside)]
    rest = [o for o in loop if o not in handled and o not in invariant]  # Σx², beside a norm
    sum_sq = rest[0] if len(rest) == 1 else None
    if len(rest) > 1 or (rest and (g is None or not _is_sum_sq(sum_sq, x))):
        return None
    if _users(x.tile) - handled - set(rest):
        return None
    ss = sum_sq if isinstance(sum_sq, AccumOp) else None
    plan = GemmPlan(x, g, scaled, tuple(products), ss, switches.gemm() == "wgmma", tuple(invariant))
    return plan if plan.fits() else None


def _is_sum_sq(op: Operation | None, x: InputOp) -> bool:
    return isinstance(op, AccumOp) and op.kind.data in SUM_SQ and op.x == x.tile


def gemm_lines(
    plan: GemmPlan,
    first: Callable[[InputOp], tuple[str, str, int]],
    k: int,
    var: Callable[[SSAValue], str],
) -> list[str]:
    """The gemm_tile statements; `first(input)` gives the buffer-table row, the element offset
    of the operand's first element and its row stride."""

    def pointer(op: InputOp) -> tuple[str, int]:
        index, offset, ld = first(op)
        return f"static_cast<const uint16_t*>(buffers[{index}]) + {offset}", ld

    # The accumulators' zeroing loop is left out (emit.py's `assigned`): the tile writes them.
    lines = ["{", "mk::gpu::GemmWeights gw;", "gw.assign = true;"]
    for w, _, acc in plan.products:
        at, ld = pointer(w)
        lines.append(f"gw.add({at}, {ld}, {w.tile_shape()[0]}, {var(acc.res)}.data());")
    x, x_ld = pointer(plan.x)
    g = pointer(plan.g)[0] if plan.g is not None else "nullptr"
    ss = f"{var(plan.sum_sq.res)}.data()" if plan.sum_sq is not None else "nullptr"
    tm, nt = plan.x.tile_shape()[0], plan.weight_rows()
    if plan.wgmma:
        call = f"wgmma_gemm_tile<{plan.kind()}, {tm}, {nt}, {plan.wgmma_stages()}>"
    else:
        call = f"gemm_tile<{plan.kind()}, {tm}, {nt}>"
    lines.append(f"mk::gpu::{call}({x}, {x_ld}, {g}, {ss}, gw, {k});")
    return [*lines, "}"]
