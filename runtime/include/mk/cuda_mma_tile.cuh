// The tensor-core form of a generic body's 2-D matmul tile (more activation rows than the
// streamed decode products take): operands held as float tiles whose values are 16-bit floats,
// products on m16n8k16 mma with f32 sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "mk/cuda_arena.h"
#include "mk/cuda_mma.cuh"

namespace mk {
namespace gpu {

// Two consecutive-k elements of a float tile packed as a pair of 16-bit floats (low half the
// first); zero past the tile's edge. The values are 16-bit floats held as f32, so the packing
// is exact.
template <bool BF16>
__device__ inline uint32_t mma_tile_pair(const float* t, int row, int rows, int col, int cols,
                                         int ld, int col_step) {
  const float lo = row < rows && col < cols ? t[row * ld + col * col_step] : 0.0f;
  const float hi = row < rows && col + 1 < cols ? t[row * ld + (col + 1) * col_step] : 0.0f;
  if constexpr (BF16) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&p);
  } else {
    const __half2 p = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&p);
  }
}

// out[m, n] = a[m, k] · b (b is [n, k] when transpose_b, else [k, n]). Each warp takes 16×8
// blocks of the output in turn and runs its k in steps of 16.
template <bool BF16>
MK_COOPERATIVE void mma_tile(Tile<float>& out, int m, int n, int k, const Tile<float>& a,
                             const Tile<float>& b, bool transpose_b) {
  out.resize(static_cast<int64_t>(m) * n);
  const int lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const int warps = blockDim.x >> 5, row_blocks = (m + 15) / 16, blocks = row_blocks * ((n + 7) / 8);
  // b's element (kk, col) as a row of a [rows, cols] tile with a stride per column step.
  const int b_ld = transpose_b ? k : 1, b_step = transpose_b ? 1 : n;
  for (int blk = threadIdx.x >> 5; blk < blocks; blk += warps) {
    const int r0 = (blk % row_blocks) * 16, c0 = (blk / row_blocks) * 8;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < k; k0 += 16) {
      const uint32_t a0 = mma_tile_pair<BF16>(a.p, r0 + g, m, k0 + t2, k, k, 1);
      const uint32_t a1 = mma_tile_pair<BF16>(a.p, r0 + g + 8, m, k0 + t2, k, k, 1);
      const uint32_t a2 = mma_tile_pair<BF16>(a.p, r0 + g, m, k0 + t2 + 8, k, k, 1);
      const uint32_t a3 = mma_tile_pair<BF16>(a.p, r0 + g + 8, m, k0 + t2 + 8, k, k, 1);
      const uint32_t b0 = mma_tile_pair<BF16>(b.p, c0 + g, n, k0 + t2, k, b_ld, b_step);
      const uint32_t b1 = mma_tile_pair<BF16>(b.p, c0 + g, n, k0 + t2 + 8, k, b_ld, b_step);
      mma16816<BF16>(d, a0, a1, a2, a3, b0, b1);
    }
    const int col = c0 + t2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r0 + g + 8 * h;
      if (row >= m) continue;
      if (col < n) out.p[row * n + col] = d[2 * h];
      if (col + 1 < n) out.p[row * n + col + 1] = d[2 * h + 1];
    }
  }
  __syncthreads();
}

}  // namespace gpu
}  // namespace mk
