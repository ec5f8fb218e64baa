"""Per-row norm and RoPE tile ops with static sizes: device calls sized at emit time instead of
the generic shape-walking library calls (a QK-norm + RoPE body was ~18 KB of SASS)."""

from __future__ import annotations

import math
from collections.abc import Callable

from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_scalar import float_literal
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import RMSNormOp, RopeOp

WARPS = 8  # kCudaThreads / 32: rms_norm_rows takes a row per warp

Name = Callable[[SSAValue], str]


def rms_norm_rows(op: RMSNormOp, var: Name, f: Name) -> str | None:
    """mk::gpu::rms_norm_rows<H> for rows of H (a multiple of 32) against a norm weight of H, one
    per warp, or <H, true> where the warps walk more rows; None otherwise (the generic
    rms_norm_tile)."""
    shape, g = shape_of(op.x), shape_of(op.g)
    if not shape or shape != shape_of(op.res) or g != (shape[-1],):
        return None
    h = shape[-1]
    rows = math.prod(shape) // h
    if h % 32:
        return None
    eps = float_literal(float(op.epsilon.value.data))
    many = ", true" if rows > WARPS else ""
    return f"mk::gpu::rms_norm_rows<{h}{many}>({var(op.res)}, {f(op.x)}, {f(op.g)}, {rows}, {eps});"


def rope_rows(op: RopeOp, var: Name, f: Name) -> str | None:
    """mk::gpu::rope_rows<D> when cos and sin are one row of D/2 shared by every row, or
    <D, true> when they are [P, D/2] and x's second-last dim has those P positions (a prefill's
    rows); None otherwise (the generic lib_rope)."""
    shape = shape_of(op.x)
    if not shape or shape[-1] % 2:
        return None
    d = shape[-1]
    rows = math.prod(shape) // d
    args = f"{var(op.res)}, {f(op.x)}, {f(op.cos)}, {f(op.sin)}, {rows}"
    tables = {shape_of(t) for t in (op.cos, op.sin)}
    if all(math.prod(t) == d // 2 for t in tables):
        return f"mk::gpu::rope_rows<{d}>({args});"
    if len(tables) != 1 or len(shape) < 2:
        return None
    (table,) = tables
    positions = shape[-2]
    if table[-2:] != (positions, d // 2) or math.prod(table) != positions * d // 2:
        return None
    return f"mk::gpu::rope_rows<{d}, true>({args}, {positions});"


def static_row_op(op: Operation, var: Name, f: Name) -> str | None:
    """The sized device call of a norm or RoPE tile op, or None (the generic call)."""
    if isinstance(op, RMSNormOp):
        return rms_norm_rows(op, var, f)
    if isinstance(op, RopeOp):
        return rope_rows(op, var, f)
    return None
