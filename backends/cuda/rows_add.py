"""The streamed epilogue product of an accumulating output (mugraph-fuse-accumulate): the
block's few activation rows times its columns of every weight row (`mk::gpu::rows_dot`,
mk/cuda_rows_add.cuh, with no tile for the weight columns), added into the f32 result with
vector reductions (`mk::gpu::add_tile_v4`)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import SSAValue

from mk.backends.cpu.emit_scalar import dtype_code
from mk.backends.cuda.stream import MAX_ROWS, sole_user
from mk.dialects.mugraph import GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import MatmulOp

WEIGHT_DTYPES = ("mk::DTYPE_BF16", "mk::DTYPE_F16")


@dataclass(frozen=True)
class RowsAdd:
    """`out` adds `matmul(a, w)^T`: a [M, KC] tile, w an input tile [N, KC] of a [N, K] weight."""

    out: OutputOp
    matmul: MatmulOp
    w: InputOp

    def streamed(self) -> set[SSAValue]:
        return {self.w.tile}


def plan_rows_add(op: GraphDefOp) -> RowsAdd | None:
    """The streamed form of `op`'s accumulating output, or None."""
    for out in op.output_ops():
        mm = out.tile.owner
        if out.accumulate is None or not isinstance(mm, MatmulOp) or mm.transpose_b is None:
            continue
        w = mm.operands[1].owner
        if not isinstance(w, InputOp) or w.fmap_dim() >= 0 or sole_user(w.tile) is not mm:
            continue
        m, kc = shape_of(mm.operands[0])
        n = shape_of(w.tile)[0]
        whole = shape_of(out.tile) == shape_of(out.dest)
        if (
            sole_user(mm.res) is out and whole and m <= MAX_ROWS and kc % 8 == 0 and kc <= 256 and n % 4 == 0
            and dtype_code(w.tile.type) in WEIGHT_DTYPES and len(shape_of(w.source)) == 2
        ):  # fmt: skip
            return RowsAdd(out, mm, w)
    return None
