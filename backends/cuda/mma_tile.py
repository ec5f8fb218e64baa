"""The tensor-core form of a generic body's 2-D matmul tile: mk::gpu::mma_tile when both operands
hold 16-bit floats of one type (values loaded from bf16/f16 buffers or rounded to them)."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_scalar import dtype_code
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import MatmulOp

_PAIRS = {"mk::DTYPE_BF16": "true", "mk::DTYPE_F16": "false"}  # mma_tile's BF16 parameter


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
