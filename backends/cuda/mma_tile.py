"""Tensor-core forms of generic bodies' products: a 2-D matmul of float tiles holding 16-bit
floats (mk::gpu::mma_tile), and a linear whose loop only multiplies rows of bf16/f16 x and w
(mk::gpu::gemm_tile: the whole K loop staged through shared memory, the sums in registers)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_scalar import dtype_code
from mk.dialects.mugraph import GraphDefOp, InputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import AccumOp, MatmulOp

_PAIRS = {"mk::DTYPE_BF16": "true", "mk::DTYPE_F16": "false"}  # the device calls' BF16 parameter
# gemm_tile's staging (runtime/include/mk/cuda_mma_tile.cuh): chunks of 64 columns, rows padded
# to 72 elements, three chunks in flight.
GEMM_KC, GEMM_LD, GEMM_STAGES = 64, 72, 3


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
    """A loop of exactly: load x [TM, tile_k], load w [TN, tile_k], x·wᵀ in f32, sum it."""

    x: InputOp
    w: InputOp
    matmul: MatmulOp
    acc: AccumOp

    def streamed(self) -> set[SSAValue]:
        """The values gemm_tile never holds as float tiles."""
        return {self.x.tile, self.w.tile, self.matmul.res}

    def kind(self) -> str:
        return _PAIRS[dtype_code(self.x.tile.type)]

    def smem_bytes(self) -> int:
        rows = _round_up(self.x.tile_shape()[0], 16) + _round_up(self.w.tile_shape()[0], 8)
        return GEMM_STAGES * rows * GEMM_LD * 2


def _rows_operand(op: object, kind: str) -> InputOp | None:
    """`op` when it loads 2-D rows of a 16-bit float buffer as they are, the loop walking K."""
    if not isinstance(op, InputOp) or len(op.tile_shape()) != 2 or len(shape_of(op.source)) != 2:
        return None
    if op.fmap_dim() != 1 or dtype_code(op.tile.type) != kind:
        return None
    return op if dtype_code(op.source.type) == kind else None


def plan_gemm(op: GraphDefOp) -> GemmPlan | None:
    """The gemm_tile form of `op`'s loop, or None when the loop does anything else."""
    loop = op.loop_ops()
    matmuls = [o for o in loop if isinstance(o, MatmulOp)]
    accs = [o for o in loop if isinstance(o, AccumOp)]
    if len(loop) != 4 or len(matmuls) != 1 or len(accs) != 1:
        return None
    mm, acc = matmuls[0], accs[0]
    kind = dtype_code(mm.a.type)
    if mm.transpose_b is None or kind not in _PAIRS or dtype_code(mm.res.type) != "mk::DTYPE_F32":
        return None
    if acc.kind.data != "sum" or acc.x != mm.res or len(list(mm.res.uses)) != 1:
        return None
    x, w = _rows_operand(mm.a.owner, kind), _rows_operand(mm.b.owner, kind)
    if x is None or w is None or x is w or x.tile_shape()[1] != w.tile_shape()[1]:
        return None
    if len(list(x.tile.uses)) != 1 or len(list(w.tile.uses)) != 1:
        return None
    return GemmPlan(x, w, mm, acc)


def gemm_call(
    plan: GemmPlan, first: Callable[[InputOp], tuple[str, str, int]], k: int, acc: str
) -> str:
    """The gemm_tile statement; `first(input)` gives the buffer-table row, the element offset
    of the operand's first element and its row stride."""
    (xb, xo, xld), (wb, wo, wld) = first(plan.x), first(plan.w)
    tm, tn = plan.x.tile_shape()[0], plan.w.tile_shape()[0]
    x = f"static_cast<const uint16_t*>(buffers[{xb}]) + {xo}"
    w = f"static_cast<const uint16_t*>(buffers[{wb}]) + {wo}"
    return (
        f"mk::gpu::gemm_tile<{plan.kind()}, {tm}, {tn}>({acc}.data(), {x}, {xld}, {w}, {wld}, {k});"
    )
