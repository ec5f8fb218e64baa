// Decode-shaped linear layers on the GPU: a task reduces its rows of one to four weights
// against a few activation rows (M <= 16) by streaming every weight byte from HBM exactly once
// with 16-byte non-allocating loads, several rows in flight per warp. The activation side
// (x, or x * g for a fused RMSNorm) is staged once per chunk of K in shared memory as floats,
// so the weight stream never waits on it; Σx² for the norm is taken in the same pass.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "mk/cuda_kernels.h"

namespace mk {
namespace gpu {

constexpr int kStreamMaxWeights = 4;
constexpr int kStreamMaxRows = 16;  // activation rows (M)
// Dynamic shared memory: a ring of weight panels filled by the TMA engine, then the staged
// activation chunk (floats). Six 16 KiB panels keep 80-96 KiB of weights in flight per SM.
constexpr int kRingStages = 6;
constexpr uint32_t kPanelBytes = 16 << 10;
constexpr uint32_t kRingBytes = kRingStages * kPanelBytes;

extern __shared__ __align__(16) unsigned char mk_dynamic_smem[];

struct StreamWeight {
  const uint16_t* w;  // element (first row, first column) of this task's part: bf16 or f16
  int64_t ld;         // elements between rows
  int32_t rows;
  float* out;         // [M][rows] sums, added to
};

struct StreamLinear {
  const void* x;      // element (first row, first column) of the activation
  int32_t x_dtype;
  int64_t x_ld;
  const void* g;      // the norm weight at the first column, or null
  int32_t g_dtype;
  int32_t w_dtype;    // DTYPE_BF16 or DTYPE_F16
  int64_t k;          // columns reduced by this task
  int32_t kc;         // columns per staged chunk (a multiple of 8)
  float* sum_sq;      // [M] Σx² over the task's columns, or null
  int32_t nw;
  StreamWeight w[kStreamMaxWeights];
};

__device__ inline int64_t elem_bytes(int32_t dtype) {
  switch (dtype) {
    case DTYPE_F16:
    case DTYPE_BF16: return 2;
    case DTYPE_F64:
    case DTYPE_I64: return 8;
    case DTYPE_F32:
    case DTYPE_I32: return 4;
    default: return 1;
  }
}

__device__ inline const void* elem_at(const void* base, int32_t dtype, int64_t i) {
  return static_cast<const unsigned char*>(base) + i * elem_bytes(dtype);
}

// Eight 16-bit weights from an address that may not be 16-byte aligned.
__device__ inline uint4 load8(const uint16_t* p) {
  uint4 v;
  v.x = p[0] | (static_cast<uint32_t>(p[1]) << 16);
  v.y = p[2] | (static_cast<uint32_t>(p[3]) << 16);
  v.z = p[4] | (static_cast<uint32_t>(p[5]) << 16);
  v.w = p[6] | (static_cast<uint32_t>(p[7]) << 16);
  return v;
}

__device__ inline float2 unpack2(uint32_t u, bool bf16) {
  if (bf16) return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  const __half2 h = *reinterpret_cast<const __half2*>(&u);
  return __half22float2(h);
}

__device__ inline float dot8(uint4 w, const float4& a, const float4& b, bool bf16) {
  const float2 w0 = unpack2(w.x, bf16), w1 = unpack2(w.y, bf16);
  const float2 w2 = unpack2(w.z, bf16), w3 = unpack2(w.w, bf16);
  float s = w0.x * a.x;
  s = fmaf(w0.y, a.y, s);
  s = fmaf(w1.x, a.z, s);
  s = fmaf(w1.y, a.w, s);
  s = fmaf(w2.x, b.x, s);
  s = fmaf(w2.y, b.y, s);
  s = fmaf(w3.x, b.z, s);
  return fmaf(w3.y, b.w, s);
}

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Stages columns [c, c + kc) of the activation side into xs and adds their squares to ss.
template <int M>
__device__ void stage_chunk(const StreamLinear& s, float* xs, int stride, int kc, int64_t c,
                            float (&ss)[M]) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    for (int k = threadIdx.x; k < kc; k += blockDim.x) {
      float v = load_elem_f(s.x, s.x_dtype, m * s.x_ld + c + k);
      ss[m] = fmaf(v, v, ss[m]);
      if (s.g) v *= load_elem_f(s.g, s.g_dtype, c + k);
      xs[m * stride + k] = v;
    }
  }
}

template <int M>
__device__ void store_sum_sq(const StreamLinear& s, float (&ss)[M]) {
  __shared__ float part[32][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float v = warp_sum(ss[m]);
    if (lane == 0) part[warp][m] = v;
  }
  __syncthreads();
  if (threadIdx.x < M) {
    float total = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += part[w][threadIdx.x];
    s.sum_sq[threadIdx.x] += total;
  }
}

// ------------------------------------------------------------------------------ mbarrier, TMA

__device__ inline uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ inline void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ inline void mbar_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ inline void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ inline void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ inline void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}
// `bytes` (a multiple of 16) from global `src` (16-byte aligned) to shared `dst`, counted on bar.
__device__ inline void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// The order in which a task's weight panels stream: chunks of K (the staged activation), then
// groups of 8·RPW rows, then panels of PK = 1024 / RPW columns. The producer walks it ahead of
// the consumers with its own cursor.
template <int RPW>
struct PanelCursor {
  static constexpr int kRows = 8 * RPW;
  static constexpr int kCols = 1024 / RPW;
  int64_t c = 0;  // first column of the chunk
  int g = 0;      // row group
  int p = 0;      // panel within the chunk
  __device__ int chunk_cols(const StreamLinear& s) const {
    return static_cast<int>(s.k - c < s.kc ? s.k - c : s.kc);
  }
  __device__ int width(const StreamLinear& s) const {
    const int left = chunk_cols(s) - p * kCols;
    return left < kCols ? left : kCols;
  }
  __device__ void next(const StreamLinear& s, int groups) {
    if (++p * kCols < chunk_cols(s)) return;
    p = 0;
    if (++g < groups) return;
    g = 0;
    c += s.kc;
  }
};

// The row of weight row `row` (concatenated over the task's weights) at column c, or null.
__device__ inline const uint16_t* weight_row(const StreamLinear& s, int row, int64_t c) {
  for (int i = 0; i < s.nw; ++i) {
    if (row < s.w[i].rows) return s.w[i].w + row * s.w[i].ld + c;
    row -= s.w[i].rows;
  }
  return nullptr;
}

template <int RPW>
__device__ void issue_panel(const StreamLinear& s, const PanelCursor<RPW>& at, int rows,
                            unsigned char* slot, uint64_t* full) {
  using C = PanelCursor<RPW>;
  const int first = at.g * C::kRows;
  const int n = rows - first < C::kRows ? rows - first : C::kRows;
  const int width = at.width(s);
  mbar_expect_tx(full, static_cast<uint32_t>(n * width * 2));
  for (int r = 0; r < n; ++r) {
    const uint16_t* src = weight_row(s, first + r, at.c + at.p * C::kCols);
    bulk_copy(slot + r * C::kCols * 2, src, static_cast<uint32_t>(width * 2), full);
  }
}

// All warps: every weight row of the task streamed through the TMA ring; warp w reduces rows
// w·RPW .. w·RPW + RPW − 1 of each group. Needs 16-byte aligned rows (checked by the caller).
template <int M, int RPW>
__device__ void stream_ring(const StreamLinear& s, float (&ss)[M]) {
  using C = PanelCursor<RPW>;
  __shared__ __align__(8) uint64_t full[kRingStages], empty[kRingStages];
  unsigned char* ring = mk_dynamic_smem;
  float* xs = reinterpret_cast<float*>(mk_dynamic_smem + kRingBytes);
  int rows = 0;
  for (int i = 0; i < s.nw; ++i) rows += s.w[i].rows;
  const int groups = (rows + C::kRows - 1) / C::kRows;
  int64_t total = 0;  // panels in the whole task
  for (int64_t c = 0; c < s.k; c += s.kc) {
    const int64_t cols = s.k - c < s.kc ? s.k - c : s.kc;
    total += groups * ((cols + C::kCols - 1) / C::kCols);
  }
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const bool producer = threadIdx.x == 0;
  if (producer) {
    for (int i = 0; i < kRingStages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], blockDim.x >> 5);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  PanelCursor<RPW> ahead;
  if (producer) {
    for (int64_t j = 0; j < total && j < kRingStages; ++j) {
      issue_panel<RPW>(s, ahead, rows, ring + j * kPanelBytes, &full[j]);
      ahead.next(s, groups);
    }
  }
  const bool bf16 = s.w_dtype == DTYPE_BF16;
  PanelCursor<RPW> at;
  float acc[RPW][M];
  for (int64_t i = 0; i < total; ++i) {
    if (at.g == 0 && at.p == 0) {  // a new chunk: stage its activation columns
      __syncthreads();
      stage_chunk<M>(s, xs, s.kc, at.chunk_cols(s), at.c, ss);
      __syncthreads();
    }
    if (at.p == 0) {
#pragma unroll
      for (int q = 0; q < RPW; ++q)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[q][m] = 0.0f;
    }
    const int slot = static_cast<int>(i % kRingStages);
    mbar_wait(&full[slot], static_cast<uint32_t>((i / kRingStages) & 1));
    const uint16_t* panel = reinterpret_cast<const uint16_t*>(ring + slot * kPanelBytes);
    const int width = at.width(s);
    const float* xc = xs + at.p * C::kCols;
    for (int k = lane * 8; k < width; k += 256) {
      uint4 wv[RPW];
#pragma unroll
      for (int q = 0; q < RPW; ++q) {
        wv[q] = *reinterpret_cast<const uint4*>(panel + (warp * RPW + q) * C::kCols + k);
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float4 a0 = *reinterpret_cast<const float4*>(xc + m * s.kc + k);
        const float4 a1 = *reinterpret_cast<const float4*>(xc + m * s.kc + k + 4);
#pragma unroll
        for (int q = 0; q < RPW; ++q) acc[q][m] += dot8(wv[q], a0, a1, bf16);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
    const bool row_done = (at.p + 1) * C::kCols >= at.chunk_cols(s);
    if (row_done) {
#pragma unroll
      for (int q = 0; q < RPW; ++q) {
        const int row = at.g * C::kRows + warp * RPW + q;
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float v = warp_sum(acc[q][m]);
          if (lane == 0 && row < rows) {
            int r = row;
            for (int w = 0; w < s.nw; ++w) {
              if (r < s.w[w].rows) {
                s.w[w].out[m * s.w[w].rows + r] += v;
                break;
              }
              r -= s.w[w].rows;
            }
          }
        }
      }
    }
    if (producer && i + kRingStages < total) {
      mbar_wait(&empty[slot], static_cast<uint32_t>((i / kRingStages) & 1));
      issue_panel<RPW>(s, ahead, rows, ring + slot * kPanelBytes, &full[slot]);
      ahead.next(s, groups);
    }
    at.next(s, groups);
  }
  __syncthreads();
  if (producer) {
    for (int i = 0; i < kRingStages; ++i) {
      mbar_inval(&full[i]);
      mbar_inval(&empty[i]);
    }
  }
}

// Unaligned weights, one warp: rows [begin, end) of the concatenated weights against the staged chunk `xs`
// ([M][stride] floats, columns [0, kc)), RG rows at a time, two 256-column steps per round.
template <int M, int RG>
__device__ void stream_rows(const StreamLinear& s, const float* xs, int stride, int kc, int64_t c,
                            int begin, int end) {
  const int lane = threadIdx.x & 31;
  const bool bf16 = s.w_dtype == DTYPE_BF16;
  for (int r0 = begin; r0 < end; r0 += RG) {
    const uint16_t* wp[RG];
    float* op[RG];
    int32_t os[RG];
#pragma unroll
    for (int j = 0; j < RG; ++j) {
      wp[j] = nullptr;
      op[j] = nullptr;
      os[j] = 0;
      int row = r0 + j;
      if (row >= end) continue;
      for (int i = 0; i < s.nw; ++i) {
        if (row < s.w[i].rows) {
          wp[j] = s.w[i].w + row * s.w[i].ld + c;
          op[j] = s.w[i].out + row;
          os[j] = s.w[i].rows;
          break;
        }
        row -= s.w[i].rows;
      }
    }
    float acc[RG][M];
#pragma unroll
    for (int j = 0; j < RG; ++j)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[j][m] = 0.0f;
    for (int k = lane * 8; k < kc; k += 512) {
      const int k2 = k + 256;
      uint4 wa[RG], wb[RG];
#pragma unroll
      for (int j = 0; j < RG; ++j) {
        wa[j] = wp[j] ? load8(wp[j] + k) : make_uint4(0, 0, 0, 0);
        wb[j] = wp[j] && k2 < kc ? load8(wp[j] + k2) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float* xr = xs + m * stride;
        const float4 a0 = *reinterpret_cast<const float4*>(xr + k);
        const float4 a1 = *reinterpret_cast<const float4*>(xr + k + 4);
#pragma unroll
        for (int j = 0; j < RG; ++j) acc[j][m] += dot8(wa[j], a0, a1, bf16);
        if (k2 < kc) {
          const float4 b0 = *reinterpret_cast<const float4*>(xr + k2);
          const float4 b1 = *reinterpret_cast<const float4*>(xr + k2 + 4);
#pragma unroll
          for (int j = 0; j < RG; ++j) acc[j][m] += dot8(wb[j], b0, b1, bf16);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < RG; ++j)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float v = warp_sum(acc[j][m]);
        if (lane == 0 && op[j]) op[j][m * os[j]] += v;
      }
  }
}

// All threads of the CTA: out[m][row] += Σ_k xside[m][k] · w[row][k] for every weight row of
// the task, and sum_sq[m] += Σ_k x[m][k]². 16-byte aligned rows stream through the TMA ring,
// others through plain loads. Ends with __syncthreads().
template <int M, int RPW>
__device__ void stream_linear(const StreamLinear& s) {
  static_assert(M >= 1 && M <= kStreamMaxRows, "stream_linear takes 1..16 activation rows");
  static_assert(RPW == 1 || RPW == 2 || RPW == 4, "rows per warp in a panel: 1, 2 or 4");
  bool aligned = true;
  for (int i = 0; i < s.nw; ++i) {
    aligned = aligned && (reinterpret_cast<uintptr_t>(s.w[i].w) & 15) == 0 && s.w[i].ld % 8 == 0;
  }
  float ss[M];
#pragma unroll
  for (int m = 0; m < M; ++m) ss[m] = 0.0f;
  if (aligned) {
    stream_ring<M, RPW>(s, ss);
  } else {
    float* xs = reinterpret_cast<float*>(mk_dynamic_smem + kRingBytes);
    int rows = 0;
    for (int i = 0; i < s.nw; ++i) rows += s.w[i].rows;
    const int warps = static_cast<int>(blockDim.x >> 5), warp = static_cast<int>(threadIdx.x >> 5);
    const int per_warp = (rows + warps - 1) / warps;
    const int begin = warp * per_warp, end = begin + per_warp < rows ? begin + per_warp : rows;
    for (int64_t c = 0; c < s.k; c += s.kc) {
      const int kc = static_cast<int>(s.k - c < s.kc ? s.k - c : s.kc);
      __syncthreads();
      stage_chunk<M>(s, xs, s.kc, kc, c, ss);
      __syncthreads();
      stream_rows<M, 4>(s, xs, s.kc, kc, c, begin, end);
    }
  }
  if (s.sum_sq) store_sum_sq<M>(s, ss);
  __syncthreads();
}

}  // namespace gpu
}  // namespace mk
