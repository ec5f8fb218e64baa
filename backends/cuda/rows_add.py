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
# Most bytes of weight columns MK_CUDA_DOWN_L2=smem copies into shared memory: qwen3-0.6b's
# batch-1 block (1,024 rows of 48 bytes) takes 48 KiB beside a 4 KiB activation chunk; of
# llama-3.2-1b's (2,048 rows of 128 bytes) the first 512 rows go.
DOWN_SMEM_MAX = 64 << 10


def lanes_rows_per_step(kc: int, threads: int) -> int:
    """Rows one step of mk::gpu::rows_dot_lanes (unpacked) covers over the CTA: a row's kc / 8
    16-byte pieces on the power of two of lanes at or above them (a warp a row past 32), as
    rows_layout lays them."""
    vec = kc // 8
    group = 32 if vec > 32 else 1 << (vec - 1).bit_length()
    return threads // 32 * (32 // group)


def copied_rows(rows: int, row_bytes: int, kc: int, threads: int) -> int:
    """The rows MK_CUDA_DOWN_L2=smem copies: all `rows` where they fit DOWN_SMEM_MAX, else the
    whole steps of rows_dot_lanes that do (0: none)."""
    if rows * row_bytes <= DOWN_SMEM_MAX:
        return rows
    step = lanes_rows_per_step(kc, threads)
    return DOWN_SMEM_MAX // row_bytes // step * step


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
