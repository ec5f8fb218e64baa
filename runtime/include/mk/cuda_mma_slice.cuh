// A raw activation's product on tensor cores without staged chunks (MK_CUDA_MMA_SLICE): each
// warp takes one slice of K for all of the task's weight rows, and its cp.async ring carries the
// activation's columns beside the weights', so no warp waits for another before its sums.
#pragma once

#include <stdint.h>

#include "mk/cuda_arena.h"
#include "mk/cuda_mma.cuh"
#include "mk/cuda_stage.cuh"
#include "mk/cuda_stream_rows.cuh"

namespace mk {
namespace gpu {

// Columns a stage holds: two 32-column steps, one 128-byte line of each row. A warp's rows are
// all of the task's (B blocks of 8), so each activation column comes through its ring once per
// task, where mma_ring_walk's 8-row units would each need it again.
constexpr int kSliceCols = 64;

// A stage: B·8 weight rows, then M activation rows, each kSliceCols columns (128 bytes).
template <int M, int B>
constexpr int slice_stage_bytes() {
  return (8 * B + M) * kSliceCols * 2;
}

// Every warp's D-stage ring (backends/cuda/stream.py: slice_bytes).
template <int M, int B, int D>
constexpr int slice_bytes() {
  return kCudaThreads / 32 * D * slice_stage_bytes<M, B>();
}

// A warp's fill cursor over its slice [k, k1) of K. Lane l copies 16 bytes at column 8·(l % 8)
// of rows 4j + l / 8, so each warp-wide copy is four whole 128-byte lines; it keeps those rows'
// pointers (null for a missing row).
template <int M, int B>
struct SliceFill {
  static constexpr int kW = 2 * B, kX = (M + 3) / 4;
  const uint16_t* w[kW];
  const uint16_t* x[kX];
  const uint16_t* any;  // a readable address for zero-filled copies (nothing is read there)
  int k, k1;

  __device__ SliceFill(const StreamLinear& s, int rows, int k0, int k1_) : k(k0), k1(k1_) {
    const int r = static_cast<int>((threadIdx.x & 31) >> 3);
    any = static_cast<const uint16_t*>(s.x);
    float* unused;
    int32_t unused_rows;
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      const int row = 4 * j + r;
      w[j] = row < rows ? weight_row(s, row, 0, &unused, &unused_rows) : nullptr;
    }
#pragma unroll
    for (int j = 0; j < kX; ++j) {
      const int m = 4 * j + r;
      x[j] = m < M ? static_cast<const uint16_t*>(s.x) + m * s.x_ld : nullptr;
    }
  }

  // The next stage into `stage` (zeros past k1 or for a missing row), one commit group.
  __device__ void fill(uint16_t* stage) {
    const int lane = static_cast<int>(threadIdx.x & 31), r = lane >> 3, c = 8 * (lane & 7);
    const int col = k + c;
    const bool live = col < k1;
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      const int row = 4 * j + r;
      const bool in = live && w[j] != nullptr;
      cp_async16(smem_address(stage + row * kSliceCols + ring_col(row, c)), in ? w[j] + col : any, in);
    }
    uint16_t* const xs = stage + 8 * B * kSliceCols;
#pragma unroll
    for (int j = 0; j < kX; ++j) {
      const int m = 4 * j + r;
      if (m < M) {
        const bool in = live && x[j] != nullptr;
        cp_async16(smem_address(xs + m * kSliceCols + ring_col(m, c)), in ? x[j] + col : any, in);
      }
    }
    k += kSliceCols;
    cp_async_commit();
  }
};

// The 16 bytes at column `col` of row `row` of a stage's block (ring_col's swizzle).
__device__ inline uint4 slice_vec(const uint16_t* block, int row, int col) {
  return *reinterpret_cast<const uint4*>(block + row * kSliceCols + ring_col(row, col));
}

// One warp over its slice of K, D stages deep: the mma of both 32-column steps of a stage for
// each block of 8 weight rows, the activation's fragment read once for all B blocks. The k
// order inside a step is permuted alike for both operands, as in mma_steps.
template <int M, int B, int D, bool BF16>
__device__ void mma_slice_walk(const StreamLinear& s, int rows, uint16_t* ring, int k0, int k1) {
  static_assert(D >= 2, "a ring has at least two stages");
  constexpr int kStage = slice_stage_bytes<M, B>() / 2;  // elements
  const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  SliceFill<M, B> fill(s, rows, k0, k1);
#pragma unroll 1
  for (int j = 0; j < D - 1; ++j) fill.fill(ring + j * kStage);
  float d[B][2][4];
#pragma unroll
  for (int b = 0; b < B; ++b)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[b][0][e] = d[b][1][e] = 0.0f;
  int st = 0;
  for (int k = k0; k < k1; k += kSliceCols, ++st) {
    cp_async_wait<D - 2>();
    __syncwarp();  // every lane's copies of stage st landed; every lane read stage st - 1
    fill.fill(ring + (st + D - 1) % D * kStage);
    const uint16_t* const stage = ring + st % D * kStage;
    const uint16_t* const xs = stage + 8 * B * kSliceCols;
#pragma unroll
    for (int v = 0; v < kSliceCols / 32; ++v) {
      const int col = 32 * v + 8 * t;
      const uint4 lo = g < M ? slice_vec(xs, g, col) : make_uint4(0, 0, 0, 0);
      const uint4 hi = g + 8 < M ? slice_vec(xs, g + 8, col) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const uint4 w = slice_vec(stage, 8 * b + g, col);
        mma16816<BF16>(d[b][0], lo.x, hi.x, lo.y, hi.y, w.x, w.y);
        mma16816<BF16>(d[b][1], lo.z, hi.z, lo.w, hi.w, w.z, w.w);
      }
    }
  }
  cp_async_wait<0>();
  // d[b][·][2h + e]: activation row g + 8h, weight row 8b + 2t + e. The other warps add their
  // slices' sums to the same outputs, hence the atomics.
#pragma unroll
  for (int b = 0; b < B; ++b) {
#pragma unroll
    for (int e4 = 0; e4 < 4; ++e4) {
      const int m = g + 8 * (e4 >> 1), row = 8 * b + 2 * t + (e4 & 1);
      float* out;
      int32_t n;
      if (m < M && row < rows && weight_row(s, row, 0, &out, &n)) {
        atomicAdd(out + m * n, d[b][0][e4] + d[b][1][e4]);
      }
    }
  }
}

// Warp `warp` of `warps`' slice [k0, k1) of K columns: near-equal runs of whole kSliceCols
// stages, in order, the last one ending at K (which may end a stage early). Host-callable, so
// a CPU test runs it.
__host__ __device__ inline void slice_columns(int64_t k, int warp, int warps, int& k0, int& k1) {
  const int stages = static_cast<int>((k + kSliceCols - 1) / kSliceCols);
  k0 = stages * warp / warps * kSliceCols;
  const int end = stages * (warp + 1) / warps * kSliceCols;
  k1 = end < k ? end : static_cast<int>(k);
}

// stream_linear on tensor cores for a raw activation (raw_activation) of a task of at most
// B·8 weight rows: warp w takes the w-th of eight near-equal slices of K in whole stages, its
// ring at its own place in the dynamic shared memory. Ends with __syncthreads().
template <int M, int B, int D>
__device__ void mma_slices_raw(const StreamLinear& s, int rows) {
  constexpr int warps = kCudaThreads / 32;
  const int warp = static_cast<int>(threadIdx.x >> 5);
  int k0, k1;
  slice_columns(s.k, warp, warps, k0, k1);
  uint16_t* const ring =
      reinterpret_cast<uint16_t*>(mk_dynamic_smem) + warp * D * (slice_stage_bytes<M, B>() / 2);
  if (s.w_dtype == DTYPE_BF16) {
    mma_slice_walk<M, B, D, true>(s, rows, ring, k0, k1);
  } else {
    mma_slice_walk<M, B, D, false>(s, rows, ring, k0, k1);
  }
  __syncthreads();
}

}  // namespace gpu
}  // namespace mk
