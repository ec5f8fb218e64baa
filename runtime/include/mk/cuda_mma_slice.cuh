// A 16-bit activation's product on tensor cores without staged chunks (MK_CUDA_MMA_SLICE): each
// warp takes one slice of K for all of its row group's weight rows, and its cp.async ring carries
// the activation's columns (and a norm weight's) beside the weights', so no warp waits for
// another before its sums.
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

// Most blocks of 8 weight rows a warp takes (its sums: 8 registers a block).
constexpr int kSliceMaxBlocks = 6;

// A stage: B·8 weight rows, then M activation rows, then with Norm the norm weight's row, each
// kSliceCols columns (128 bytes).
template <int M, int B, bool Norm>
constexpr int slice_stage_bytes() {
  return (8 * B + M + (Norm ? 1 : 0)) * kSliceCols * 2;
}

// Every warp's D-stage ring (backends/cuda/stream.py: slice_bytes).
template <int M, int B, int D, bool Norm>
constexpr int slice_bytes() {
  return kCudaThreads / 32 * D * slice_stage_bytes<M, B, Norm>();
}

// A warp's fill cursor over its slice [k, k1) of K. Lane l copies 16 bytes at column 8·(l % 8)
// of rows 4j + l / 8, so each warp-wide copy is four whole 128-byte lines; it keeps those rows'
// pointers (null for a missing row). The activation's rows follow the weights' (row M: the norm
// weight, with Norm).
template <int M, int B, bool Norm>
struct SliceFill {
  static constexpr int kW = 2 * B, kLines = M + (Norm ? 1 : 0), kX = (kLines + 3) / 4;
  const uint16_t* w[kW];
  const uint16_t* x[kX];
  const uint16_t* any;  // a readable address for zero-filled copies (nothing is read there)
  int k, k1;

  // Weight rows [r0, rows) of the task (r0: the warp's row group).
  __device__ SliceFill(const StreamLinear& s, int r0, int rows, int k0, int k1_) : k(k0), k1(k1_) {
    const int r = static_cast<int>((threadIdx.x & 31) >> 3);
    any = static_cast<const uint16_t*>(s.x);
    float* unused;
    int32_t unused_rows;
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      const int row = r0 + 4 * j + r;
      w[j] = row < rows ? weight_row(s, row, 0, &unused, &unused_rows) : nullptr;
    }
#pragma unroll
    for (int j = 0; j < kX; ++j) {
      const int m = 4 * j + r;
      x[j] = m < M ? static_cast<const uint16_t*>(s.x) + m * s.x_ld
                   : Norm && m == M ? static_cast<const uint16_t*>(s.g) : nullptr;
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
      if (m < kLines) {
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

// With Norm: the eight activation values of v squared into *sq (their squares' sum), then
// multiplied by the norm weight's gv, packed again in the 16-bit type (the values bulk staging
// packs: rewrite_rows).
template <bool BF16>
__device__ inline uint4 norm8(uint4 v, uint4 gv, float* sq) {
  uint32_t in[4] = {v.x, v.y, v.z, v.w}, gw[4] = {gv.x, gv.y, gv.z, gv.w}, out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = unpack2(in[i], BF16), g = unpack2(gw[i], BF16);
    *sq = fmaf(x.x, x.x, *sq);
    *sq = fmaf(x.y, x.y, *sq);
    out[i] = pack2(x.x * g.x, x.y * g.y, BF16);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// One warp over its slice [k0, k1) of K for weight rows [r0, r0 + 8B) (none past `rows`), D
// stages deep: the mma of both 32-column steps of a stage for each block of 8 weight rows, the
// activation's fragment read once for all B blocks. The k order inside a step is permuted alike
// for both operands, as in mma_steps. With Norm the fragment is x·g and sq[h] gathers Σx² of
// activation row g + 8h over the lane's columns.
template <int M, int B, int D, bool BF16, bool Norm>
__device__ void mma_slice_walk(const StreamLinear& s, int r0, int rows, uint16_t* ring, int k0, int k1,
                               float (&sq)[2]) {
  static_assert(D >= 2, "a ring has at least two stages");
  constexpr int kStage = slice_stage_bytes<M, B, Norm>() / 2;  // elements
  const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  SliceFill<M, B, Norm> fill(s, r0, rows, k0, k1);
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
      uint4 lo = g < M ? slice_vec(xs, g, col) : make_uint4(0, 0, 0, 0);
      uint4 hi = g + 8 < M ? slice_vec(xs, g + 8, col) : make_uint4(0, 0, 0, 0);
      if constexpr (Norm) {
        const uint4 gv = slice_vec(xs, M, col);
        lo = norm8<BF16>(lo, gv, &sq[0]);
        if constexpr (M > 8) hi = norm8<BF16>(hi, gv, &sq[1]);
      }
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const uint4 w = slice_vec(stage, 8 * b + g, col);
        mma16816<BF16>(d[b][0], lo.x, hi.x, lo.y, hi.y, w.x, w.y);
        mma16816<BF16>(d[b][1], lo.z, hi.z, lo.w, hi.w, w.z, w.w);
      }
    }
  }
  cp_async_wait<0>();
  // d[b][·][2h + e]: activation row g + 8h, weight row r0 + 8b + 2t + e. The other warps add
  // their slices' sums to the same outputs, hence the atomics.
#pragma unroll
  for (int b = 0; b < B; ++b) {
#pragma unroll
    for (int e4 = 0; e4 < 4; ++e4) {
      const int m = g + 8 * (e4 >> 1), row = r0 + 8 * b + 2 * t + (e4 & 1);
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

// The row groups a task of `rows` weight rows splits its warps into for blocks of B·8 rows a
// warp: 1, 2, 4 or 8 (each group's warps take near-equal slices of K), or 0 where no such
// count covers them. Host-callable, as slice_columns.
__host__ __device__ inline int slice_groups(int rows, int b, int warps) {
  for (int groups = 1; groups <= warps; groups *= 2) {
    if (rows <= groups * 8 * b) return groups;
  }
  return 0;
}

// stream_linear on tensor cores without staged chunks for a 16-bit activation of the weights'
// type, 16-byte aligned (raw_activation; with Norm times its norm weight g, of the same type,
// and its Σx² into s.sum_sq): warp w of row group w / S (S = 8 / groups) takes the (w % S)-th
// of S near-equal slices of K in whole stages for its group's B·8 rows, its ring at its own
// place in the dynamic shared memory. False where the task's rows need more than 8 groups.
// Ends with __syncthreads().
template <int M, int B, int D, bool Norm>
__device__ bool mma_slices(const StreamLinear& s, int rows) {
  static_assert(B >= 1 && B <= kSliceMaxBlocks, "K slices: 1..kSliceMaxBlocks blocks a warp");
  constexpr int warps = kCudaThreads / 32;
  // A raw activation's slices are planned in one group (backends/cuda/stream.py: slices).
  const int groups = Norm ? slice_groups(rows, B, warps) : rows <= 8 * B ? 1 : 0;
  if (groups == 0) return false;
  const int warp = static_cast<int>(threadIdx.x >> 5), per = Norm ? warps / groups : warps;
  const int slice = Norm ? warp % per : warp, r0 = Norm ? warp / per * 8 * B : 0;
  int k0, k1;
  slice_columns(s.k, slice, per, k0, k1);
  uint16_t* const ring =
      reinterpret_cast<uint16_t*>(mk_dynamic_smem) + warp * D * (slice_stage_bytes<M, B, Norm>() / 2);
  float sq[2] = {0.0f, 0.0f};
  if (s.w_dtype == DTYPE_BF16) {
    mma_slice_walk<M, B, D, true, Norm>(s, r0, rows, ring, k0, k1, sq);
  } else {
    mma_slice_walk<M, B, D, false, Norm>(s, r0, rows, ring, k0, k1, sq);
  }
  if constexpr (Norm) {
    // Row group 0's warps cover K once: their lanes' squares, summed over the four lanes of a
    // row, then over the slices in order.
    __shared__ float part[kCudaThreads / 32][M];
    const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sq[h] += __shfl_xor_sync(0xffffffffu, sq[h], 1);
      sq[h] += __shfl_xor_sync(0xffffffffu, sq[h], 2);
    }
    if (warp < per && (lane & 3) == 0) {
      if (g < M) part[slice][g] = sq[0];
      if (g + 8 < M) part[slice][g + 8] = sq[1];
    }
    __syncthreads();
    if (threadIdx.x < M) {
      float total = 0.0f;
      for (int w = 0; w < per; ++w) total += part[w][threadIdx.x];
      s.sum_sq[threadIdx.x] += total;
    }
  }
  __syncthreads();
  return true;
}

}  // namespace gpu
}  // namespace mk
