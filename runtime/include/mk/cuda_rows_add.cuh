// The epilogue product of a block that splits a linear's K (passes/mugraph_fuse_accumulate.py):
// the block's activation rows a [M][KC] times its KC columns of every weight row, then added
// into the f32 result with vector reductions.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "mk/cuda_stream_rows.cuh"

namespace mk {
namespace gpu {

// d[m][n] = Σ_k a[m][k] · w[n][k] for the N weight rows (KC columns each, `ld` apart; a and d
// floats), lanes sharing rows. A row's columns are a short run: kLanes lanes (KC/8 rounded up to
// a power of two) take 16 bytes of a row each, so one warp load covers 32 / kLanes rows' whole
// runs instead of 32 scattered pieces. Each lane keeps up to kBatch loads in flight and issues
// the next batch before it uses the last; the lanes of a row then sum by shuffles. A lane holds
// its columns of a in registers: the rows' products and sums are then independent of each
// other and of the stores, and their latencies overlap. Cooperative: every thread calls it.
template <int M, int KC, int N, bool BF16>
__device__ __noinline__ void rows_dot_lanes(const float* __restrict__ a,
                                            const uint16_t* __restrict__ w, int64_t ld,
                                            float* __restrict__ d) {
  static_assert(KC % 8 == 0 && KC <= 256, "a row's columns are at most 32 16-byte loads");
  constexpr int kVec = KC / 8;
  constexpr int kLanes = kVec <= 1 ? 1 : kVec <= 2 ? 2 : kVec <= 4 ? 4 : kVec <= 8 ? 8
                         : kVec <= 16 ? 16 : 32;
  constexpr int kRowsPerStep = (kCudaThreads / 32) * (32 / kLanes);
  constexpr int kSteps = (N + kRowsPerStep - 1) / kRowsPerStep;
  constexpr int kMost = M > 4 ? 4 : 16;  // loads in flight a batch: registers for M sums
  constexpr int kBatch = kSteps < kMost ? kSteps : kMost;
  const int lane = static_cast<int>(threadIdx.x & 31u), part = lane % kLanes;
  const int row0 = static_cast<int>(threadIdx.x >> 5) * (32 / kLanes) + lane / kLanes;
  const bool active = part < kVec;
  auto load = [&](int step) {
    const int row = row0 + step * kRowsPerStep;
    return active && row < N ? load_stream(w + row * ld + 8 * part) : make_uint4(0, 0, 0, 0);
  };
  float4 lo[M], hi[M];  // this lane's 8 columns of every row of a
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float* am = a + m * KC + 8 * (active ? part : 0);
    lo[m] = *reinterpret_cast<const float4*>(am);
    hi[m] = *reinterpret_cast<const float4*>(am + 4);
  }
  auto use = [&](int step, uint4 v) {
    const int row = row0 + step * kRowsPerStep;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = dot8(v, lo[m], hi[m], BF16);
#pragma unroll
      for (int o = kLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (part == m % kLanes && row < N) d[m * N + row] = s;
    }
  };
  uint4 cur[kBatch], next[kBatch];
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

// out[e] += t[e] for the n elements of a tile (n a multiple of 4, both 16-byte aligned): one
// red.global.add.v4.f32 per four elements, spread over the CTA's threads.
__device__ inline void add_tile_v4(float* out, const float* t, int32_t n) {
  for (int32_t e = static_cast<int32_t>(threadIdx.x) * 4; e < n; e += kCudaThreads * 4) {
    atomicAdd(reinterpret_cast<float4*>(out + e), *reinterpret_cast<const float4*>(t + e));
  }
}

}  // namespace gpu
}  // namespace mk
