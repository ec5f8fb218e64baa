// Decode-shaped linear layers on the GPU: a task reduces its rows of one to four weights
// against a few activation rows (M <= 16) by streaming every weight byte from HBM exactly once
// with 16-byte non-allocating loads, many of them in flight per lane.
// (A TMA-ring variant, cp.async.bulk of 2 KiB row panels into six 16 KiB stages, measured
// 2-3x slower on the H200 than these register streams and was dropped.) The activation side
// (x, or x * g for a fused RMSNorm) is staged once per chunk of K in shared memory as floats,
// so the weight stream never waits on it; Σx² for the norm is taken in the same pass.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "mk/cuda_copy.cuh"
#include "mk/cuda_kernels.h"
#include "mk/cuda_stage.cuh"
#include "mk/cuda_wait.cuh"

namespace mk {
namespace gpu {

constexpr int kStreamMaxWeights = 4;
constexpr int kStreamMaxRows = 16;               // activation rows (M)
constexpr uint32_t kStreamSmemBytes = 160 << 10;  // the staged activation chunk, floats

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
  Arena* arena;       // for the op marks of a profile build
  bool x_ready;       // the staging area already holds the activation (one chunk, as floats)
  // The sums and Σx² are written, not added to (the body did not zero them): the first chunk's
  // sums are stored, later chunks add; Σx² is written at the last chunk's staging barrier.
  // CUDA-core products only (tensor cores add with atomics).
  bool assign;
};

__device__ inline const void* elem_at(const void* base, int32_t dtype, int64_t i) {
  return static_cast<const unsigned char*>(base) + i * dtype_size(dtype);
}

// 16 bytes that nothing else in the launch writes: no L1 allocation, 256-byte L2 fetches (and
// the L2's evict-first priority in builds with MK_STREAM_EVICT_FIRST: a step reads far more
// weight bytes than the L2 holds, each once).
__device__ inline uint4 load_stream(const uint16_t* p) {
  uint4 v;
#if defined(MK_STREAM_EVICT_FIRST)
  uint64_t policy;  // not volatile: the same value every time, so the compiler may share it
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(policy));
#else
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
#endif
  return v;
}

// 16 bytes from L2, not L1: data other SMs wrote earlier in the same launch (the KV caches).
__device__ inline uint4 load_l2(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Eight 16-bit elements: one 16-byte load when Vec (aligned), read-only (load_stream) or
// written in this launch (load_l2); else element by element.
template <bool Vec, bool ReadOnly = true>
__device__ inline uint4 load8(const uint16_t* p) {
  if constexpr (Vec) {
    return ReadOnly ? load_stream(p) : load_l2(p);
  } else {
    uint4 v;
    v.x = p[0] | (static_cast<uint32_t>(p[1]) << 16);
    v.y = p[2] | (static_cast<uint32_t>(p[3]) << 16);
    v.z = p[4] | (static_cast<uint32_t>(p[5]) << 16);
    v.w = p[6] | (static_cast<uint32_t>(p[7]) << 16);
    return v;
  }
}

__device__ inline float2 unpack2(uint32_t u, bool bf16) {
  if (bf16) return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  const __half2 h = *reinterpret_cast<const __half2*>(&u);
  return __half22float2(h);
}

__device__ inline uint32_t pack2(float lo, float hi, bool bf16) {
  if (bf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
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

// Eight weight elements: from the staging area (Shared) or streamed from global memory.
template <bool Vec, bool Shared>
__device__ inline uint4 load_weight8(const uint16_t* p) {
  if constexpr (Shared) {
    return *reinterpret_cast<const uint4*>(p);
  } else {
    return load8<Vec>(p);
  }
}

// The 16 bytes at column k of each of RG rows (zeros past the chunk or for a missing row).
template <int RG, bool Vec, bool Shared>
__device__ inline void load_rows(uint4 (&v)[RG], const uint16_t* const (&wp)[RG], int k, int kc) {
#pragma unroll
  for (int j = 0; j < RG; ++j) {
    v[j] = wp[j] && k < kc ? load_weight8<Vec, Shared>(wp[j] + k) : make_uint4(0, 0, 0, 0);
  }
}

template <int M, int RG>
__device__ inline void fma_rows(float (&acc)[RG][M], const uint4 (&v)[RG], const float* xs,
                                int stride, int k, bool bf16) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float4 a0 = *reinterpret_cast<const float4*>(xs + m * stride + k);
    const float4 a1 = *reinterpret_cast<const float4*>(xs + m * stride + k + 4);
#pragma unroll
    for (int j = 0; j < RG; ++j) acc[j][m] += dot8(v[j], a0, a1, bf16);
  }
}

// Row `row` of the concatenated weights at column c (null past the last, or when `row` is
// negative), the address of its sums and the row count of its weight. Every descriptor field is
// read at a constant index and the choice is made on the values: a choice between field
// addresses (an early exit per weight) made the compiler keep the whole descriptor in local
// memory, ~40 stores per thread before every task of a multi-weight linear.
__device__ inline const uint16_t* weight_row(const StreamLinear& s, int row, int64_t c, float** out,
                                             int32_t* rows) {
  const uint16_t* at = nullptr;
  float* sums = nullptr;
  int32_t n_of = 0;
  #pragma unroll
  for (int i = 0; i < kStreamMaxWeights; ++i) {
    if (i < s.nw) {
      const int32_t n = s.w[i].rows;
      const bool here = row >= 0 && row < n;
      at = here ? s.w[i].w + row * s.w[i].ld + c : at;
      sums = here ? s.w[i].out + row : sums;
      n_of = here ? n : n_of;
      row -= n;
    }
  }
  *out = sums;
  *rows = n_of;
  return at;
}

// Weight rows r0.. r0 + RG of the concatenated weights at chunk column c (null past `end`),
// their output sums and the row count of the weight each belongs to.
template <int RG>
__device__ inline void round_rows(const StreamLinear& s, int64_t c, int r0, int end,
                                  const uint16_t* (&wp)[RG], float* (&op)[RG], int32_t (&os)[RG]) {
#pragma unroll
  for (int j = 0; j < RG; ++j) wp[j] = weight_row(s, r0 + j < end ? r0 + j : -1, c, &op[j], &os[j]);
}

// Asks the L2 for the 16 bytes of each load of a warp's first round (rows begin.., chunk 0)
// before the activation is staged, so that their HBM round trip overlaps the staging
// (stream_linear's Early). Prefetches hold no registers: the loads themselves would keep S·RG
// of them live across the staging, past the 255 a thread has.
template <int RG, int S>
__device__ inline void prefetch_first_round(const StreamLinear& s, int kc, int begin, int end) {
  const int lane = threadIdx.x & 31;
  const uint16_t* wp[RG];
  float* op[RG];
  int32_t os[RG];
  round_rows<RG>(s, 0, begin, end, wp, op, os);
#pragma unroll
  for (int t = 0; t < S; ++t) {
    const int k = lane * 8 + t * 256;
#pragma unroll
    for (int j = 0; j < RG; ++j) {
      if (wp[j] && k < kc) asm volatile("prefetch.global.L2 [%0];" ::"l"(wp[j] + k));
    }
  }
}

// One lane's first round of a warp's rows [begin, end) at chunk column 0: S 256-column steps
// of RG rows, as stream_rows loads them.
template <int RG, int S>
__device__ __forceinline__ void first_round(uint4 (&v)[S][RG], const StreamLinear& s, int kc,
                                            int begin, int end) {
  const uint16_t* wp[RG];
  float* op[RG];
  int32_t os[RG];
  round_rows<RG>(s, 0, begin, end, wp, op, os);
  const int k = (threadIdx.x & 31) * 8;
#pragma unroll
  for (int t = 0; t < S; ++t) load_rows<RG, true, false>(v[t], wp, k + t * 256, kc);
}

// One warp: weight rows r0.. r0 + RG (before `end`) against the staged chunk `xs` ([M][stride]
// floats, columns [0, kc)). Each lane issues the loads of S 256-column steps of all RG rows
// before it multiplies any: a decode task is short, so what bounds it is how many round trips to
// HBM it waits for, and S·RG loads per lane in flight make a task of up to S·256 columns one
// round trip (and keep ~64 KB in flight per SM). With Pre, `pre` holds the first round
// (first_round, loaded before the task's wait).
template <int M, int RG, int S, bool Vec, bool Shared, bool Pre>
__device__ __forceinline__ void stream_group(const StreamLinear& s, const float* xs, int stride,
                                             int kc, int64_t c, int r0, int end,
                                             const uint4 (&pre)[S][RG]) {
  const int lane = threadIdx.x & 31;
  const bool bf16 = s.w_dtype == DTYPE_BF16;
  const uint16_t* wp[RG];
  float* op[RG];
  int32_t os[RG];
  round_rows<RG>(s, c, r0, end, wp, op, os);
  float acc[RG][M];
#pragma unroll
  for (int j = 0; j < RG; ++j)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[j][m] = 0.0f;
  int k0 = lane * 8;
  if constexpr (Pre) {
#pragma unroll
    for (int t = 0; t < S; ++t) {
      if (k0 + t * 256 < kc) fma_rows<M, RG>(acc, pre[t], xs, stride, k0 + t * 256, bf16);
    }
    k0 += S * 256;
  }
  for (int k = k0; k < kc; k += S * 256) {
    uint4 v[S][RG];
#pragma unroll
    for (int t = 0; t < S; ++t) load_rows<RG, Vec, Shared>(v[t], wp, k + t * 256, kc);
#pragma unroll
    for (int t = 0; t < S; ++t) {
      if (k + t * 256 < kc) fma_rows<M, RG>(acc, v[t], xs, stride, k + t * 256, bf16);
    }
  }
#pragma unroll
  for (int j = 0; j < RG; ++j)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float v = warp_sum(acc[j][m]);
      if (lane == 0 && op[j]) op[j][m * os[j]] = s.assign && c == 0 ? v : op[j][m * os[j]] + v;
    }
}

// One warp: rows [begin, end) of the concatenated weights against the staged chunk, RG rows at
// a time (stream_group).
template <int M, int RG, int S, bool Vec, bool Shared>
__device__ void stream_rows(const StreamLinear& s, const float* xs, int stride, int kc, int64_t c,
                            int begin, int end) {
  const uint4 none[S][RG] = {};
  for (int r0 = begin; r0 < end; r0 += RG) {
    stream_group<M, RG, S, Vec, Shared, false>(s, xs, stride, kc, c, r0, end, none);
  }
}

// stream_rows of the first chunk with the first group's first round in `pre`. The group is
// peeled: inside the loop `pre` would stay live beside every later round's loads.
template <int M, int RG, int S>
__device__ __forceinline__ void stream_rows_ahead(const StreamLinear& s, const float* xs,
                                                  int stride, int kc, int begin, int end,
                                                  const uint4 (&pre)[S][RG]) {
  if (begin < end) stream_group<M, RG, S, true, false, true>(s, xs, stride, kc, 0, begin, end, pre);
  stream_rows<M, RG, S, true, false>(s, xs, stride, kc, 0, begin + RG, end);
}

// Eight consecutive elements as floats: 16-byte loads when `vec` (the address is 16-byte aligned
// for bf16/f16, 32-byte for f32), else element by element. Plain loads: the activation may have
// been written earlier in this launch.
__device__ inline void load8_f(float (&f)[8], const void* base, int32_t dtype, int64_t i, bool vec) {
  if (vec && (dtype == DTYPE_BF16 || dtype == DTYPE_F16)) {
    unpack8(f, *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + i),
            dtype == DTYPE_BF16);
  } else if (vec && dtype == DTYPE_F32) {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = load_elem_f(base, dtype, i + j);
  }
}

__device__ inline bool vec8_ok(const void* p, int32_t dtype) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return dtype == DTYPE_F32 ? (a & 31) == 0 : (a & 15) == 0;
}

// How a chunk is staged: floats (CUDA cores), or packed pairs of the weights' 16-bit type
// (tensor cores; the same rounding the mma operands had when packed at each use).
struct Packing {
  bool on;
  bool bf16;
};

// Eight columns of a 16-bit activation row (and of a 16-bit norm weight) into xs as floats,
// their squares added to ss[m].
template <int M>
__device__ inline void stage_group(float* xs, int stride, int m, int k, uint4 xv, bool x_bf16,
                                   bool has_g, uint4 gv, bool g_bf16, const Packing& pack,
                                   float (&ss)[M]) {
  float x[8], g[8];
  unpack8(x, xv, x_bf16);
  unpack8(g, gv, g_bf16);
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sq = fmaf(x[j], x[j], sq);
    if (has_g) x[j] *= g[j];
  }
  if (pack.on) {
    *reinterpret_cast<uint4*>(reinterpret_cast<uint16_t*>(xs) + m * stride + k) =
        make_uint4(pack2(x[0], x[1], pack.bf16), pack2(x[2], x[3], pack.bf16),
                   pack2(x[4], x[5], pack.bf16), pack2(x[6], x[7], pack.bf16));
  } else {
    float4* out = reinterpret_cast<float4*>(xs + m * stride + k);
    out[0] = make_float4(x[0], x[1], x[2], x[3]);
    out[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
#pragma unroll
  for (int mm = 0; mm < M; ++mm) {
    if (mm == m) ss[mm] += sq;
  }
}

// stage_chunk for 16-bit, 16-byte aligned rows: each thread issues the loads of up to XB
// groups of eight columns before it converts any (the compiler cannot move a load above the
// shared-memory store of an earlier group), so a batch of 8 rows × 4,096 columns costs two
// round trips instead of sixteen (XB = 8).
template <int M, int XB>
__device__ void stage_chunk_16bit(const StreamLinear& s, float* xs, int stride, int kc, int64_t c,
                                  const Packing& pack, float (&ss)[M]) {
  const uint16_t* x = static_cast<const uint16_t*>(s.x) + c;
  const uint16_t* g = s.g ? static_cast<const uint16_t*>(s.g) + c : nullptr;
  const bool x_bf16 = s.x_dtype == DTYPE_BF16, g_bf16 = s.g_dtype == DTYPE_BF16;
  const int groups = kc / 8, items = M * groups, step = static_cast<int>(blockDim.x);
  for (int e0 = threadIdx.x; e0 < items; e0 += XB * step) {
    uint4 xv[XB], gv[XB];
#pragma unroll
    for (int b = 0; b < XB; ++b) {
      const int e = e0 + b * step, m = e / groups, k = (e - m * groups) * 8;
      xv[b] = gv[b] = make_uint4(0, 0, 0, 0);
      if (e < items) {
        xv[b] = *reinterpret_cast<const uint4*>(x + m * s.x_ld + k);
        if (g) gv[b] = *reinterpret_cast<const uint4*>(g + k);
      }
    }
#pragma unroll
    for (int b = 0; b < XB; ++b) {
      const int e = e0 + b * step, m = e / groups, k = (e - m * groups) * 8;
      if (e < items) {
        stage_group<M>(xs, stride, m, k, xv[b], x_bf16, g != nullptr, gv[b], g_bf16, pack, ss);
      }
    }
  }
}

// Stages columns [c, c + kc) of the activation side into xs and adds their squares to ss. Each
// thread takes eight columns per step with one 16-byte load (two with the norm weight); 16-bit
// aligned rows go through stage_chunk_16bit, several steps' loads in flight at once.
template <int M, int XB>
__device__ void stage_chunk(const StreamLinear& s, float* xs, int stride, int kc, int64_t c,
                            const Packing& pack, float (&ss)[M]) {
  const bool vec = kc % 8 == 0 && s.x_ld % 8 == 0 && c % 8 == 0 && vec8_ok(s.x, s.x_dtype) &&
                   (!s.g || vec8_ok(s.g, s.g_dtype));
  const bool narrow = s.x_dtype == DTYPE_BF16 || s.x_dtype == DTYPE_F16;
  if (vec && narrow && stride % 4 == 0 && (!s.g || s.g_dtype == DTYPE_BF16 || s.g_dtype == DTYPE_F16)) {
    stage_chunk_16bit<M, XB>(s, xs, stride, kc, c, pack, ss);
    return;
  }
  const int groups = (kc + 7) / 8;
  for (int e = threadIdx.x; e < M * groups; e += blockDim.x) {
    const int m = e / groups, k = (e % groups) * 8;
    float x[8], g[8];
    if (vec || k + 8 <= kc) {
      load8_f(x, s.x, s.x_dtype, m * s.x_ld + c + k, vec);
      if (s.g) load8_f(g, s.g, s.g_dtype, c + k, vec);
    } else {  // the ragged end of an unaligned chunk
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        x[j] = k + j < kc ? load_elem_f(s.x, s.x_dtype, m * s.x_ld + c + k + j) : 0.0f;
        g[j] = s.g && k + j < kc ? load_elem_f(s.g, s.g_dtype, c + k + j) : 1.0f;
      }
    }
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      sq = fmaf(x[j], x[j], sq);
      if (k + j >= kc) continue;
      const float v = s.g ? x[j] * g[j] : x[j];
      if (pack.on) {
        reinterpret_cast<uint16_t*>(xs)[m * stride + k + j] =
            static_cast<uint16_t>(pack2(v, 0.0f, pack.bf16) & 0xffffu);
      } else {
        xs[m * stride + k + j] = v;
      }
    }
#pragma unroll
    for (int mm = 0; mm < M; ++mm) {
      if (mm == m) ss[mm] += sq;
    }
  }
}

// Σx² of the task's columns, in two halves around a barrier: each warp's sums into `part`,
// then threads m < M add the warps' parts into sum_sq[m] (written when s.assign).
template <int M>
__device__ void sum_sq_parts(float (&part)[32][M], float (&ss)[M]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float v = warp_sum(ss[m]);
    if (lane == 0) part[warp][m] = v;
  }
}

template <int M>
__device__ void sum_sq_total(const StreamLinear& s, const float (&part)[32][M]) {
  if (threadIdx.x < M) {
    float total = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += part[w][threadIdx.x];
    s.sum_sq[threadIdx.x] = s.assign ? total : s.sum_sq[threadIdx.x] + total;
  }
}

// ------------------------------------------------------------------------------ prefetch

// Asks the L2 to fetch the 16-byte-aligned part of [p, p + bytes) with bulk prefetches: one
// instruction per 32 KB from one thread, nothing waits for them. Not inlined, as prefetch_rows:
// each body calls them once, and inlined copies made every linear body ~30 KB larger.
__device__ inline __noinline__ void prefetch_l2(const void* p, uint64_t bytes) {
  const uint64_t a = reinterpret_cast<uint64_t>(p);
  const uint64_t end = (a + bytes) & ~uint64_t{15};
  for (uint64_t at = (a + 15) & ~uint64_t{15}; at < end; at += 32768) {
    const uint32_t n = static_cast<uint32_t>(end - at < 32768 ? end - at : 32768);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "r"(n) : "memory");
  }
}

// A decode task's weights (`rows` rows of `cols` 16-bit elements, `ld` apart), requested before
// the task waits for its inputs: HBM streams them while the producers finish.
__device__ inline __noinline__ void prefetch_rows(const uint16_t* w, int rows, int64_t ld, int64_t cols) {
  if (ld == cols) {
    prefetch_l2(w, 2 * static_cast<uint64_t>(rows) * cols);
    return;
  }
  for (int r = 0; r < rows; ++r) prefetch_l2(w + r * ld, 2 * static_cast<uint64_t>(cols));
}

// ------------------------------------------------------------------------------ tensor cores

// D += A·B for one m16n8k16 tile: A 16×16 (four packed pairs per lane), B 16×8 (two), D f32.
template <bool BF16>
__device__ inline void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Columns [k, k + 8) of staged activation row m, packed when staged (four pairs of the
// weights' 16-bit type); zeros for m >= M.
template <int M>
__device__ inline uint4 act8(const uint16_t* xs, int stride, int m, int k) {
  if (m >= M) return make_uint4(0, 0, 0, 0);
  return *reinterpret_cast<const uint4*>(xs + m * stride + k);
}

#if defined(MK_MMA_PIPE)
constexpr bool kMmaPipe = true;
#else
constexpr bool kMmaPipe = false;
#endif

// One lane's weight vectors of N 32-column steps from column k of each of its G rows (zeros
// past k1 or for a missing row: no load).
template <int N, int G, bool Shared>
__device__ inline void mma_load(uint4 (&w)[N][G], const uint16_t* const (&wp)[G], int k, int k1,
                                int t) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
#pragma unroll
    for (int i = 0; i < G; ++i) {
      const bool in = wp[i] && k + 32 * u < k1;
      w[u][i] = in ? load_weight8<true, Shared>(wp[i] + k + 32 * u + 8 * t) : make_uint4(0, 0, 0, 0);
    }
  }
}

// Independent accumulators per group on tensor cores: consecutive mma of a group go to
// different ones, so a warp's mma are not one chain of dependent instructions (ncu on the gated
// MLP at batch 8 with a single accumulator: "wait" and short-scoreboard stalls led, DRAM 42 %).
// Four chains in all: G groups are G chains already.
constexpr int kMmaChains = 4;
template <int G>
constexpr int kMmaAccumulators = G >= kMmaChains ? 1 : kMmaChains / G;

// The mma of N 32-column steps from column k (none past k1) on weight vectors w.
template <int M, int N, int G, bool BF16>
__device__ inline void mma_steps(float (&d)[kMmaAccumulators<G>][G][4], const uint4 (&w)[N][G],
                                 const uint16_t* xs, int stride, int g, int t, int k, int k1) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
    if (k + 32 * u >= k1) break;  // the same for the whole warp
    const int kk = k + 32 * u + 8 * t;
    const uint4 lo = act8<M>(xs, stride, g, kk), hi = act8<M>(xs, stride, g + 8, kk);
    constexpr int A = kMmaAccumulators<G>;
#pragma unroll
    for (int i = 0; i < G; ++i) {
      mma16816<BF16>(d[(2 * u) % A][i], lo.x, hi.x, lo.y, hi.y, w[u][i].x, w[u][i].y);
      mma16816<BF16>(d[(2 * u + 1) % A][i], lo.z, hi.z, lo.w, hi.w, w[u][i].z, w[u][i].w);
    }
  }
}

// One warp on tensor cores: weight rows [r0, r0 + 8G) (G groups of 8) times the staged
// activation rows (M <= 16, the A operand padded to 16 with zeros) over columns [k0, k1) of the
// chunk, multiples of 32. Lane (g, t) = (lane / 4, lane % 4) streams weight row r0 + 8i + g of
// group i, 16 bytes at column k + 8t of each 32-column step. Inside a step the k order is
// permuted alike for A and B (a sum does not mind), so both operands are plain 16-byte vectors:
// for mma j, B is the lane's weight pairs 2j and 2j + 1 and A the packed activation pairs 2j
// and 2j + 1 of the same eight columns (rows g and g + 8). The A fragments of a step serve all
// G groups. U steps' loads of all groups are in flight before the first mma; with MK_MMA_PIPE
// (MK_CUDA_MMA_PIPE=1) two halves of U/2 steps alternate, one half's loads in flight while the
// other's mma run.
template <int M, int U, int G, bool BF16, bool Shared>
__device__ void mma_rows(const StreamLinear& s, const uint16_t* xs, int stride, int64_t c, int r0,
                         int rows, int k0, int k1) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float* unused;
  int32_t unused_rows;
  const uint16_t* wp[G];
#pragma unroll
  for (int i = 0; i < G; ++i) {
    const int row = r0 + 8 * i + g;
    wp[i] = row < rows ? weight_row(s, row, c, &unused, &unused_rows) : nullptr;
  }
  constexpr int A = kMmaAccumulators<G>;
  float d[A][G][4];
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int i = 0; i < G; ++i) d[a][i][0] = d[a][i][1] = d[a][i][2] = d[a][i][3] = 0.0f;
  if constexpr (kMmaPipe && U > 1) {
    constexpr int H = U / 2;
    uint4 wa[H][G], wb[H][G];
    mma_load<H, G, Shared>(wa, wp, k0, k1, t);
    for (int k = k0; k < k1; k += 64 * H) {
      mma_load<H, G, Shared>(wb, wp, k + 32 * H, k1, t);
      mma_steps<M, H, G, BF16>(d, wa, xs, stride, g, t, k, k1);
      mma_load<H, G, Shared>(wa, wp, k + 64 * H, k1, t);
      mma_steps<M, H, G, BF16>(d, wb, xs, stride, g, t, k + 32 * H, k1);
    }
  } else {
    for (int k = k0; k < k1; k += 32 * U) {
      uint4 w[U][G];
      mma_load<U, G, Shared>(w, wp, k, k1, t);
      mma_steps<M, U, G, BF16>(d, w, xs, stride, g, t, k, k1);
    }
  }
#pragma unroll
  for (int a = 1; a < A; ++a)
#pragma unroll
    for (int i = 0; i < G; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) d[0][i][e] += d[a][i][e];
  // d[0][i][2h + e]: activation row g + 8h, weight row r0 + 8i + 2t + e. Other warps may add to
  // the same sums (their own columns), hence the atomics.
#pragma unroll
  for (int i = 0; i < G; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = g + 8 * h, row = r0 + 8 * i + 2 * t + e;
        float* out;
        int32_t n;
        if (m < M && row < rows && weight_row(s, row, c, &out, &n)) atomicAdd(out + m * n, d[0][i][2 * h + e]);
      }
    }
  }
}

__device__ inline int gcd_int(int a, int b) {
  while (b) {
    const int r = a % b;
    a = b;
    b = r;
  }
  return a;
}

// All warps on tensor cores over one staged chunk: (block of G 8-row groups, column slice)
// units, as many slices as make the units a multiple of the warp count so every warp gets the
// same share; U steps' loads of the block in flight per lane.
template <int M, bool Shared, int G, int U>
__device__ void mma_chunk(const StreamLinear& s, const uint16_t* xs, int stride, int kc, int64_t c,
                          int rows) {
  const int warps = static_cast<int>(blockDim.x >> 5), warp = static_cast<int>(threadIdx.x >> 5);
  const int blocks = ((rows + 7) / 8 + G - 1) / G, steps = kc / 32;
  int slices = warps / gcd_int(blocks, warps);
  slices = slices < steps ? slices : (steps > 0 ? steps : 1);
  const bool bf16 = s.w_dtype == DTYPE_BF16;
  for (int unit = warp; unit < blocks * slices; unit += warps) {
    const int rb = unit % blocks, sl = unit / blocks;
    const int k0 = steps * sl / slices * 32, k1 = steps * (sl + 1) / slices * 32;
    if (bf16) {
      mma_rows<M, U, G, true, Shared>(s, xs, stride, c, rb * 8 * G, rows, k0, k1);
    } else {
      mma_rows<M, U, G, false, Shared>(s, xs, stride, c, rb * 8 * G, rows, k0, k1);
    }
  }
}

// All threads of the CTA: out[m][row] += Σ_k xside[m][k] · w[row][k] for every weight row of
// the task, and sum_sq[m] += Σ_k x[m][k]². With Mma (batches of 2..16 rows) the products run on
// tensor cores, the activation rounded to the weights' 16-bit type. With Staged the weights
// point into the staging ring (cuda_stage.cuh), copied there ahead of the task's turn; the
// products wait for them once the first chunk of the activation is staged. A lane keeps the
// loads of S steps in flight: 256-column steps of RG rows on CUDA cores, 32-column steps of a
// block on tensor cores. G > 1 gives each warp blocks of G 8-row groups on tensor cores (the
// activation fragments of a step serve them all). Each thread stages up to XB groups of eight
// activation columns at once (the emitter sizes it to the chunk: unrolled code the task does not
// need costs instruction fetches). With Ahead (one chunk on CUDA cores, s.arena->turn set by
// the dispatcher) each lane issues its first round of weight loads and only then waits for the
// task's turn. Ends with __syncthreads(); false if staged weights never landed or the launch
// stopped during the wait.
template <int M, int RG, int S, int XB, bool Mma = false, bool Staged = false, int G = 1,
          bool Early = false, bool Ahead = false>
__device__ bool stream_linear(const StreamLinear& s) {
  static_assert(!Ahead || (!Mma && !Staged), "loads ahead of the wait: CUDA cores, unstaged");
  static_assert(M >= 1 && M <= kStreamMaxRows, "stream_linear takes 1..16 activation rows");
  float* xs = reinterpret_cast<float*>(mk_dynamic_smem);
  bool vec = true;
  #pragma unroll
  for (int i = 0; i < kStreamMaxWeights; ++i) {
    if (i >= s.nw) break;  // constant indices: the descriptors can stay in registers
    vec = vec && (reinterpret_cast<uintptr_t>(s.w[i].w) & 15) == 0 && s.w[i].ld % 8 == 0;
  }
  int rows = 0;
  #pragma unroll
  for (int i = 0; i < kStreamMaxWeights; ++i) {
    if (i < s.nw) rows += s.w[i].rows;
  }
  const int warps = static_cast<int>(blockDim.x >> 5), warp = static_cast<int>(threadIdx.x >> 5);
  const int per_warp = (rows + warps - 1) / warps;
  const int begin = warp * per_warp, end = begin + per_warp < rows ? begin + per_warp : rows;
  float ss[M];
#pragma unroll
  for (int m = 0; m < M; ++m) ss[m] = 0.0f;
  __shared__ float part[32][M];  // the warps' Σx²
  uint4 pre[S][RG];
  if constexpr (Ahead) {
    if (vec) first_round<RG, S>(pre, s, static_cast<int>(s.k < s.kc ? s.k : s.kc), begin, end);
    if (s.arena->turn && !turn_wait(*static_cast<Turn*>(s.arena->turn))) return false;
  }
  MK_MARK(*s.arena);
  if constexpr (Early && !Mma && !Staged) {
    if (vec) prefetch_first_round<RG, S>(s, static_cast<int>(s.k < s.kc ? s.k : s.kc), begin, end);
  }
  for (int64_t c = 0; c < s.k; c += s.kc) {
    const int kc = static_cast<int>(s.k - c < s.kc ? s.k - c : s.kc);
    // Tensor cores take the activation in the weights' 16-bit type: staged that way, once.
    const Packing pack{Mma && vec && kc % 32 == 0 && s.kc % 8 == 0, s.w_dtype == DTYPE_BF16};
    __syncthreads();
    if (!s.x_ready) stage_chunk<M, XB>(s, xs, s.kc, kc, c, pack, ss);
    // With assign the last chunk's staging barrier also publishes the warps' Σx² parts, so the
    // total is written before the products instead of behind a barrier of its own after them.
    const bool early_sum_sq = s.assign && s.sum_sq && c + kc >= s.k;
    if (early_sum_sq) sum_sq_parts<M>(part, ss);
    if (c == 0) MK_MARK(*s.arena);
    __syncthreads();
    if (early_sum_sq) sum_sq_total<M>(s, part);
    if (c == 0) {
      if constexpr (Staged) {
        if (!stage_wait(*s.arena)) return false;
      }
      MK_MARK(*s.arena);
    }
    if (pack.on) {
      mma_chunk<M, Staged, G, S>(s, reinterpret_cast<const uint16_t*>(xs), s.kc, kc, c, rows);
    } else if (vec && !Mma) {
      if constexpr (Ahead) {
        stream_rows_ahead<M, RG, S>(s, xs, s.kc, kc, begin, end, pre);
      } else {
        stream_rows<M, RG, S, true, Staged>(s, xs, s.kc, kc, c, begin, end);
      }
    } else {
      // Weights not 16-byte aligned (the emitter plans tensor cores only for aligned chunks):
      // rare, so this loop is not unrolled. Every unrolled variant adds kilobytes of code to
      // each body that streams, and a decode step runs each body once per layer, from a cold
      // instruction cache.
      stream_rows<M, 1, 1, false, Staged>(s, xs, s.kc, kc, c, begin, end);
    }
  }
  MK_MARK(*s.arena);
  if (s.sum_sq && !s.assign) {
    sum_sq_parts<M>(part, ss);
    __syncthreads();
    sum_sq_total<M>(s, part);
  }
  __syncthreads();
  return true;
}

}  // namespace gpu
}  // namespace mk
