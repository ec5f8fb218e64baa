// The epilogue product of a block that splits a linear's K (passes/mugraph_fuse_accumulate.py):
// the block's activation rows a [M][KC] times its KC columns of every weight row, then added
// into the f32 result with vector reductions.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "mk/cuda_mma.cuh"
#include "mk/cuda_stream_rows.cuh"

namespace mk {
namespace gpu {

// How rows_dot_lanes lays a row's kVec 16-byte pieces on lanes: kGroup lanes take a row, kChunks
// pieces each (piece p + kGroup·i for lane p of the group), 32 / kGroup rows a warp load.
// Unpacked: one piece a lane, kGroup the power of two at or above kVec (idle lanes when kVec is
// not one: 24 of 32 busy for 3 or 12 pieces a row). Packed: the (kGroup, kChunks) that keeps
// the most lanes busy with kChunks · M <= 4 (registers for a's columns) and at least two lanes
// a row (whole rows a lane is rows_dot_threads, slower), fewest chunks first.
struct RowsLayout {
  int group;
  int chunks;
};

__host__ __device__ constexpr RowsLayout rows_layout(int vec, int m, bool packed) {
  if (vec > 32) return RowsLayout{32, vec / 32};  // a warp a row, 32 pieces a lane apart
  RowsLayout best{pow2_at_least(vec), 1};
  if (!packed) return best;
  int busy = (32 / best.group) * vec;
  for (int c = 1; c <= vec && c * m <= 4; ++c) {
    if (vec % c != 0 || vec / c > 32 || vec / c < 2) continue;  // a lane alone: as `threads`
    const int g = vec / c, lanes = (32 / g) * g;
    if (lanes > busy) busy = lanes, best = RowsLayout{g, c};
  }
  return best;
}

// d[m][n] = Σ_k a[m][k] · w[n][k] for the N weight rows (KC columns each, `ld` apart; a and d
// floats), lanes sharing rows as rows_layout says: one warp load covers whole runs of a few rows
// instead of 32 scattered pieces. Each lane keeps up to kBatch loads in flight and issues the
// next batch before it uses the last; the lanes of a row then sum by shuffles. A lane holds its
// columns of a in registers: the rows' products and sums are then independent of each other and
// of the stores, and their latencies overlap. Cooperative: every thread calls it.
template <int M, int KC, int N, bool BF16, bool Packed = false>
__device__ __noinline__ void rows_dot_lanes(const float* __restrict__ a,
                                            const uint16_t* __restrict__ w, int64_t ld,
                                            float* __restrict__ d) {
  static_assert(KC % 8 == 0 && (KC <= 256 || (KC % 256 == 0 && KC <= 1024)),
                "a row's columns: at most 32 16-byte loads, or whole runs of 32 up to 128");
  constexpr int kVec = KC / 8;
  constexpr RowsLayout kLayout = rows_layout(kVec, M, Packed);
  constexpr int kGroup = kLayout.group, kChunks = kLayout.chunks;
  constexpr bool kPow2 = (kGroup & (kGroup - 1)) == 0;
  constexpr int kRowsPerWarp = 32 / kGroup;
  constexpr int kRowsPerStep = (kCudaThreads / 32) * kRowsPerWarp;
  constexpr int kSteps = (N + kRowsPerStep - 1) / kRowsPerStep;
  constexpr int kMost = (M > 4 ? 4 : 16) / kChunks;  // loads in flight a batch: registers for M sums
  constexpr int kBatch = kSteps < kMost ? kSteps : kMost;
  const int lane = static_cast<int>(threadIdx.x & 31u), part = lane % kGroup;
  const int row0 = static_cast<int>(threadIdx.x >> 5) * kRowsPerWarp + lane / kGroup;
  constexpr bool kAllRows = kRowsPerWarp * kGroup == 32;  // no lanes past the warp's last row
  const bool active = part < kVec && (kAllRows || lane < kRowsPerWarp * kGroup);
  struct Pieces {
    uint4 v[kChunks];
  };
  auto load = [&](int step) {
    const int row = row0 + step * kRowsPerStep;
    Pieces x;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = 8 * part + 8 * kGroup * c;
      x.v[c] = active && row < N ? load_stream(w + row * ld + col) : make_uint4(0, 0, 0, 0);
    }
    return x;
  };
  float4 lo[M][kChunks], hi[M][kChunks];  // this lane's columns of every row of a
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const float* am = a + m * KC + 8 * (active ? part + kGroup * c : 0);
      lo[m][c] = *reinterpret_cast<const float4*>(am);
      hi[m][c] = *reinterpret_cast<const float4*>(am + 4);
    }
  }
  auto use = [&](int step, const Pieces& x) {
    const int row = row0 + step * kRowsPerStep;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = dot8(x.v[0], lo[m][0], hi[m][0], BF16);
#pragma unroll
      for (int c = 1; c < kChunks; ++c) s += dot8(x.v[c], lo[m][c], hi[m][c], BF16);
      if constexpr (kPow2) {  // every lane of the group gets the sum: the stores spread
#pragma unroll
        for (int o = kGroup / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (part == m % kGroup && row < N) d[m * N + row] = s;
      } else {  // the group's first lane gets the sum
#pragma unroll
        for (int o = 1; o < kGroup; o <<= 1) {
          const float t = __shfl_down_sync(0xffffffffu, s, o);
          if (part + o < kGroup) s += t;
        }
        if (part == 0 && active && row < N) d[m * N + row] = s;
      }
    }
  };
  Pieces cur[kBatch > 0 ? kBatch : 1], next[kBatch > 0 ? kBatch : 1];
#pragma unroll
  for (int i = 0; i < kBatch; ++i) cur[i] = load(i);
#pragma unroll 1
  for (int b = 0; b < kSteps; b += kBatch) {
#pragma unroll
    for (int i = 0; i < kBatch; ++i) next[i] = b + kBatch + i < kSteps ? load(b + kBatch + i) : cur[i];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (b + i < kSteps) use(b + i, cur[i]);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) cur[i] = next[i];
  }
  __syncthreads();  // a cooperative helper: d is whole when it returns
}

// The rows_layout choices, checked where nvcc compiles this header.
static_assert(rows_layout(3, 1, false).group == 4 && rows_layout(3, 1, true).group == 3);
static_assert(rows_layout(12, 1, true).group == 4 && rows_layout(12, 1, true).chunks == 3);
static_assert(rows_layout(12, 8, true).group == 16 && rows_layout(8, 1, true).group == 8);
static_assert(rows_layout(64, 1, false).group == 32 && rows_layout(64, 1, false).chunks == 2);

// rows_dot_lanes' product by threads taking four whole rows each: a warp's load takes 16 bytes
// of 32 rows, but a thread issues all of its rows' loads (up to 16) before it uses any.
template <int M, int KC, int N, bool BF16>
__device__ __noinline__ void rows_dot_threads(const float* __restrict__ a,
                                              const uint16_t* __restrict__ w, int64_t ld,
                                              float* __restrict__ d) {
  static_assert(KC % 8 == 0 && N % 4 == 0, "whole 16-byte loads, rows in fours");
  constexpr int kVec = KC / 8;
  constexpr int kRows = kVec <= 4 ? 4 : kVec <= 8 ? 2 : 1;  // rows loaded together
  for (int g = static_cast<int>(threadIdx.x) * 4; g < N; g += kCudaThreads * 4) {
    float acc[M][4];
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[m][r] = 0.0f;
    }
#pragma unroll
    for (int r0 = 0; r0 < 4; r0 += kRows) {
      uint4 v[kRows][kVec];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int c = 0; c < kVec; ++c) v[r][c] = load_stream(w + (g + r0 + r) * ld + 8 * c);
      }
#pragma unroll
      for (int c = 0; c < kVec; ++c) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float4 lo = *reinterpret_cast<const float4*>(a + m * KC + 8 * c);
          const float4 hi = *reinterpret_cast<const float4*>(a + m * KC + 8 * c + 4);
#pragma unroll
          for (int r = 0; r < kRows; ++r) acc[m][r0 + r] += dot8(v[r][c], lo, hi, BF16);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      *reinterpret_cast<float4*>(d + m * N + g) = make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
    }
  }
  __syncthreads();  // a cooperative helper: d is whole when it returns
}

// Eight columns [c, c + 8) of row m of a (M rows of KC floats) as four packed pairs of the
// weights' 16-bit type, the tensor cores' operand; zeros past M or KC.
template <int M, int KC, bool BF16>
__device__ inline uint4 packed_cols(const float* a, int m, int c) {
  if (m >= M || c >= KC) return make_uint4(0, 0, 0, 0);
  const float4 x = *reinterpret_cast<const float4*>(a + m * KC + c);
  const float4 y = *reinterpret_cast<const float4*>(a + m * KC + c + 4);
  return make_uint4(pack2(x.x, x.y, BF16), pack2(x.z, x.w, BF16), pack2(y.x, y.y, BF16),
                    pack2(y.z, y.w, BF16));
}

// rows_dot_lanes' product on tensor cores for 2..16 rows of a (MK_CUDA_ROWS_DOT=mma): each
// warp takes 8-row tiles of w, lane (g, t) loading 16 bytes at column 32s + 8t of tile row g
// for each 32-column step s (the k order permuted alike in a and w, as in mma_steps), and
// every tile's loads of a batch are in flight before its first mma. The rows of a, rounded to
// the weights' type as the mma operand (a product's input already is), stay in registers for
// every tile: a tile costs a load and two mma a step, where CUDA cores spend M dot products and
// their shuffles on every row.
template <int M, int KC, int N, bool BF16>
__device__ __noinline__ void rows_dot_mma(const float* __restrict__ a,
                                          const uint16_t* __restrict__ w, int64_t ld,
                                          float* __restrict__ d) {
  static_assert(M >= 1 && M <= 16 && KC % 8 == 0 && KC <= 128, "rows of a on one mma tile");
  constexpr int kSteps = (KC + 31) / 32;
  constexpr int kWarps = kCudaThreads / 32;
  constexpr int kPerWarp = ((N + 7) / 8 + kWarps - 1) / kWarps;  // tiles a warp takes
  // 16 loads in flight a lane, one batch at a time. (Two half batches, the next one's loads out
  // while this one's mma run, measured no faster on the gated MLP at batch 8.)
  constexpr int kMost = 16 / kSteps;  // kSteps <= 4
  constexpr int kBatch = kPerWarp < kMost ? kPerWarp : kMost;
  const int lane = static_cast<int>(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
  const int warp = static_cast<int>(threadIdx.x >> 5);
  uint4 lo[kSteps], hi[kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    lo[s] = packed_cols<M, KC, BF16>(a, g, 32 * s + 8 * t);
    hi[s] = packed_cols<M, KC, BF16>(a, g + 8, 32 * s + 8 * t);
  }
  auto load = [&](int i0, uint4 (&v)[kBatch][kSteps]) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int row = (warp + kWarps * (i0 + b)) * 8 + g;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const int c = 32 * s + 8 * t;
        const bool in = i0 + b < kPerWarp && row < N && c < KC;
        v[b][s] = in ? load_stream(w + row * ld + c) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  auto use = [&](int i0, const uint4 (&v)[kBatch][kSteps]) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int tile = warp + kWarps * (i0 + b);
      if (i0 + b >= kPerWarp || tile * 8 >= N) break;  // the same for the whole warp
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        mma16816<BF16>(acc, lo[s].x, hi[s].x, lo[s].y, hi[s].y, v[b][s].x, v[b][s].y);
        mma16816<BF16>(acc, lo[s].z, hi[s].z, lo[s].w, hi[s].w, v[b][s].z, v[b][s].w);
      }
      // acc[2h + e]: row g + 8h of a, weight row 8 tile + 2t + e.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = g + 8 * h, n = tile * 8 + 2 * t + e;
          if (m < M && n < N) d[m * N + n] = acc[2 * h + e];
        }
      }
    }
  };
#pragma unroll 1
  for (int i0 = 0; i0 < kPerWarp; i0 += kBatch) {
    uint4 v[kBatch][kSteps];
    load(i0, v);
    use(i0, v);
  }
  __syncthreads();  // a cooperative helper: d is whole when it returns
}

// out[e] += t[e] for the n elements of a tile (n a multiple of 4, both 16-byte aligned): one
// red.global.add.v4.f32 per four elements, spread over the CTA's threads. A batch-8 fused down
// projection's 128 tasks each add a whole [8, N] product, all in the same order and mostly at
// the same time, so the L2 takes their reductions into one group of lines after another (add
// and signal: 3.0 µs of a qwen3-0.6b task at batch 8 against 1.2 at batch 1). Starting each
// CTA at its own part of the tile measured level (H200, session 71), and one bulk reduction of
// the tile by the copy engine slower (H100, session 87).
__device__ inline void add_tile_v4(float* out, const float* t, int32_t n) {
  const int32_t units = n / 4;
  for (int32_t u = static_cast<int32_t>(threadIdx.x); u < units; u += kCudaThreads) {
    atomicAdd(reinterpret_cast<float4*>(out) + u, reinterpret_cast<const float4*>(t)[u]);
  }
}

}  // namespace gpu
}  // namespace mk
