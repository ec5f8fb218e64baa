// The tensor-core forms of a generic body's products (more activation rows than the streamed
// decode products take): a 2-D matmul of float tiles whose values are 16-bit floats, and a whole
// linear's K loop (gemm_tile) over bf16/f16 operands staged through shared memory. Both run
// m16n8k16 mma with f32 sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "mk/cuda_arena.h"
#include "mk/cuda_mma.cuh"
#include "mk/cuda_stage.cuh"
#include "mk/cuda_stream_rows.cuh"

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

// gemm_tile stages K in chunks of kGemmKc columns in a ring of kGemmStages (one fewer in
// flight); a staged row is padded to kGemmLd elements so that the eight rows one mma fragment
// reads start in different banks.
constexpr int kGemmKc = 64, kGemmLd = kGemmKc + 8, kGemmStages = 3, kGemmMaxWeights = 4;

__host__ __device__ constexpr int gemm_rows(int rows, int unit) { return (rows + unit - 1) / unit * unit; }

// The weights of one gemm_tile, each `rows` rows of 16-bit floats `ld` elements apart, its sums
// added to `acc` ([TM, rows] f32, row-major), or written there with `assign` (the emitter then
// leaves out the accumulators' zeroing loop: every element has one owner in the tile). They
// stage one after another, each from row `start` (its rows rounded up to 8 before the next).
struct GemmWeights {
  int n = 0;
  bool assign = false;
  const uint16_t* w[kGemmMaxWeights];
  int64_t ld[kGemmMaxWeights];
  int rows[kGemmMaxWeights];
  int start[kGemmMaxWeights];
  float* acc[kGemmMaxWeights];
  __device__ void add(const uint16_t* p, int64_t l, int r, float* a) {
    w[n] = p;
    ld[n] = l;
    rows[n] = r;
    start[n] = n ? gemm_rows(start[n - 1] + rows[n - 1], 8) : 0;
    acc[n++] = a;
  }
};

// Columns [k0, k0 + kGemmKc) of `rows` rows of `src` into a stage, row r's column c at
// `at(r, c)` (8 consecutive elements from a multiple of 8), `pad` rows in all (zeros past `rows`
// and past column k). 16-byte copies when `aligned`, else element by element.
template <class At>
__device__ inline void gemm_stage(At at, const uint16_t* src, int64_t ld, int rows, int pad,
                                  int k0, int k, bool aligned) {
  for (int i = threadIdx.x; i < pad * (kGemmKc / 8); i += blockDim.x) {
    const int r = i / (kGemmKc / 8), c = (i % (kGemmKc / 8)) * 8;
    const bool in = r < rows && k0 + c < k;
    uint16_t* to = at(r, c);
    if (aligned) {
      cp_async16(smem_address(to), in ? src + r * ld + k0 + c : src, in);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) to[j] = in && k0 + c + j < k ? src[r * ld + k0 + c + j] : uint16_t{0};
    }
  }
}

// Norm partials a thread keeps for a staged x of `Rows` rows: eight threads a row, the same
// rows every chunk.
template <int Rows>
constexpr int kNormSlots = (Rows * 8 + kCudaThreads - 1) / kCudaThreads;

// A fused RMSNorm's part of one staged chunk of x (Rows rows, row r's column c at `at(r, c)`,
// 8 consecutive elements from a multiple of 8, 16-byte aligned): Σx² of each row's elements
// into the thread's partials, and x·g rounded to the 16-bit type in place. A thread's units are
// all at the same 8 columns (kCudaThreads is a multiple of 8), so it reads those 8 elements of
// g once, and each unit as one 16-byte load and store. Element by element, with g read per
// element from global memory, a prefill's tiles with the norm ran ~4.9 us a chunk on the H200
// against ~0.6 for those without it (session 46's timeline: q/k/v 78 us for 16 chunks, the
// down projection 30 us for 48).
template <bool BF16, int Rows, class At>
__device__ inline void gemm_norm_chunk(At at, const uint16_t* g, int k0, int k,
                                       float (&ss)[kNormSlots<Rows>]) {
  static_assert(kCudaThreads % 8 == 0, "a thread's units share their columns");
  const int c = k0 + (static_cast<int>(threadIdx.x) % 8) * 8;
  float gf[8];
  if (c + 8 <= k && (reinterpret_cast<uintptr_t>(g + c) & 15) == 0) {
    const uint4 raw = *reinterpret_cast<const uint4*>(g + c);
    const uint16_t* h = reinterpret_cast<const uint16_t*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) gf[j] = half_bits_float<BF16>(h[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) gf[j] = c + j < k ? half_bits_float<BF16>(g[c + j]) : 0.0f;
  }
#pragma unroll
  for (int p = 0; p < kNormSlots<Rows>; ++p) {
    const int i = threadIdx.x + p * kCudaThreads;
    if (i >= Rows * 8) break;
    uint4* v = reinterpret_cast<uint4*>(at(i / 8, (i % 8) * 8));
    uint4 raw = *v;
    uint16_t* h = reinterpret_cast<uint16_t*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float x = half_bits_float<BF16>(h[j]);
      ss[p] += x * x;
      h[j] = float_half_bits<BF16>(c + j < k ? x * gf[j] : 0.0f);
    }
    *v = raw;
  }
}

// The partials' row sums added to sum_sq's first `tm` rows.
template <int Rows>
__device__ inline void add_row_sums(const float (&ss)[kNormSlots<Rows>], float* sum_sq, int tm) {
#pragma unroll
  for (int p = 0; p < kNormSlots<Rows>; ++p) {
    float v = ss[p];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    const int i = threadIdx.x + p * kCudaThreads, row = i / 8;
    if (i % 8 == 0 && i < Rows * 8 && row < tm) sum_sq[row] += v;
  }
}

// For every weight i: ws.acc[i] += x[TM, k] · ws.w[i][rows, k]ᵀ; x rows of 16-bit floats (BF16:
// bf16, else f16) `x_ld` apart, NT the weights' rows rounded up to 8 and summed. With a norm
// weight g (x's type), x·g is the product's left side and sum_sq[r] += Σ x[r]². Each warp keeps
// the sums of its 16×8 output blocks in registers over the whole of k.
template <bool BF16, int TM, int NT>
__device__ void gemm_tile(const uint16_t* x, int64_t x_ld, const uint16_t* g, float* sum_sq,
                          const GemmWeights& ws, int k) {
  constexpr int M16 = gemm_rows(TM, 16), kRowBlocks = M16 / 16, kBlocks = kRowBlocks * (NT / 8);
  constexpr int kWarps = kCudaThreads / 32, kPerWarp = (kBlocks + kWarps - 1) / kWarps;
  uint16_t* const sa = reinterpret_cast<uint16_t*>(mk_dynamic_smem);
  uint16_t* const sb = sa + kGemmStages * M16 * kGemmLd;
  bool aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (x_ld & 7) == 0;
  for (int i = 0; i < ws.n; ++i) {
    aligned = aligned && (reinterpret_cast<uintptr_t>(ws.w[i]) & 15) == 0 && (ws.ld[i] & 7) == 0;
  }
  const int chunks = (k + kGemmKc - 1) / kGemmKc;
  auto stage = [&](int c) {
    if (c < chunks) {
      const int s = c % kGemmStages;
      uint16_t* const a = sa + s * M16 * kGemmLd;
      gemm_stage([=](int r, int col) { return a + r * kGemmLd + col; }, x, x_ld, TM, M16,
                 c * kGemmKc, k, aligned);
      for (int i = 0; i < ws.n; ++i) {
        const int pad = (i + 1 < ws.n ? ws.start[i + 1] : NT) - ws.start[i];
        uint16_t* const b = sb + (s * NT + ws.start[i]) * kGemmLd;
        gemm_stage([=](int r, int col) { return b + r * kGemmLd + col; }, ws.w[i], ws.ld[i],
                   ws.rows[i], pad, c * kGemmKc, k, aligned);
      }
    }
    cp_async_commit();  // empty past the last chunk: the wait below counts every group
  };
#pragma unroll
  for (int c = 0; c < kGemmStages - 1; ++c) stage(c);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t2 = (lane & 3) * 2;
  float d[kPerWarp][4] = {};
  float ss[kNormSlots<M16>] = {};
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<kGemmStages - 2>();
    __syncthreads();  // chunk c has landed, and chunk c - 1's stage is free again
    stage(c + kGemmStages - 1);
    const int s = c % kGemmStages;
    uint16_t* const a = sa + s * M16 * kGemmLd;
    const uint16_t* b = sb + s * NT * kGemmLd;
    if (g != nullptr) {
      gemm_norm_chunk<BF16, M16>([=](int r, int col) { return a + r * kGemmLd + col; }, g,
                                 c * kGemmKc, k, ss);
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < kPerWarp; ++j) {
      const int blk = warp + j * kWarps;
      if (blk >= kBlocks) break;
      const int r0 = (blk % kRowBlocks) * 16, c0 = (blk / kRowBlocks) * 8;
      const uint32_t* a0 = reinterpret_cast<const uint32_t*>(a + (r0 + gr) * kGemmLd + t2);
      const uint32_t* a8 = reinterpret_cast<const uint32_t*>(a + (r0 + gr + 8) * kGemmLd + t2);
      const uint32_t* b0 = reinterpret_cast<const uint32_t*>(b + (c0 + gr) * kGemmLd + t2);
#pragma unroll
      for (int kk = 0; kk < kGemmKc / 2; kk += 8) {  // 16 columns: 8 words of a row
        mma16816<BF16>(d[j], a0[kk], a8[kk], a0[kk + 4], a8[kk + 4], b0[kk], b0[kk + 4]);
      }
    }
  }
  if (g != nullptr && sum_sq != nullptr) add_row_sums<M16>(ss, sum_sq, TM);
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
    const int blk = warp + j * kWarps;
    if (blk >= kBlocks) break;
    const int r0 = (blk % kRowBlocks) * 16, c0 = (blk / kRowBlocks) * 8;
    int i = 0;
    while (i + 1 < ws.n && ws.start[i + 1] <= c0) ++i;
    const int col = c0 - ws.start[i] + t2, rows = ws.rows[i];
    float* const acc = ws.acc[i];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r0 + gr + 8 * h;
      if (row >= TM) continue;
      if (col < rows) acc[row * rows + col] = d[j][2 * h] + (ws.assign ? 0.0f : acc[row * rows + col]);
      if (col + 1 < rows) {
        acc[row * rows + col + 1] = d[j][2 * h + 1] + (ws.assign ? 0.0f : acc[row * rows + col + 1]);
      }
    }
  }
  __syncthreads();
}

}  // namespace gpu
}  // namespace mk
