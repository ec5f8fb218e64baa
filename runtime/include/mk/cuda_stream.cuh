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

#include "mk/cuda_kernels.h"
#include "mk/cuda_flags.cuh"
#include "mk/cuda_mma.cuh"
#include "mk/cuda_mma_slice.cuh"
#include "mk/cuda_stage.cuh"
#include "mk/cuda_stage_bulk.cuh"
#include "mk/cuda_stream_rows.cuh"

namespace mk {
namespace gpu {

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

// The steps of a round that stream_linear<..., First = 2> loads behind the activation's loads
// (MK_STAGE_FIRST_STEPS: MK_CUDA_STAGE_FIRST=N).
#if defined(MK_STAGE_FIRST_STEPS)
constexpr int kStageFirstSteps = MK_STAGE_FIRST_STEPS;
#else
constexpr int kStageFirstSteps = 1;
#endif

// The rows of the first step that stream_linear<RG, ..., XB, ..., First = 2, Held> loads
// early: with Held > 0 (MK_CUDA_STAGE_FIRST_HELD=H on a body past emit_stream's rule) the first
// Held - XB rows of the row group (at least one), so that a thread holds at most Held 16-byte
// loads through the staging, the rest loaded at their turn as usual; Held = 0: every row.
template <int RG, int XB, int Held>
constexpr int stage_first_rows() {
  if (Held <= 0) return RG;
  return Held - XB < 1 ? 1 : Held - XB > RG ? RG : Held - XB;
}

// stage_chunk for 16-bit, 16-byte aligned rows: each thread issues the loads of up to XB
// groups of eight columns before it converts any (the compiler cannot move a load above the
// shared-memory store of an earlier group), so a batch of 8 rows × 4,096 columns costs two
// round trips instead of sixteen (XB = 8).
// `after_loads` runs once, after the thread's first loads are issued and before it converts
// any (at once where the thread stages nothing): stream_linear<..., First = 2> loads the weights'
// first round there, behind the activation's loads.
template <int M, int XB, class AfterLoads = NoLoads>
__device__ void stage_chunk_16bit(const StreamLinear& s, float* xs, int stride, int kc, int64_t c,
                                  const Packing& pack, float (&ss)[M],
                                  const AfterLoads& after_loads = AfterLoads{}) {
  const uint16_t* x = static_cast<const uint16_t*>(s.x) + c;
  const uint16_t* g = s.g ? static_cast<const uint16_t*>(s.g) + c : nullptr;
  const bool x_bf16 = s.x_dtype == DTYPE_BF16, g_bf16 = s.g_dtype == DTYPE_BF16;
  const int groups = kc / 8, items = M * groups, step = static_cast<int>(MK_CTA_THREADS);
  bool asked = false;
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
    if (!asked) after_loads();
    asked = true;
#pragma unroll
    for (int b = 0; b < XB; ++b) {
      const int e = e0 + b * step, m = e / groups, k = (e - m * groups) * 8;
      if (e < items) {
        stage_group<M>(xs, stride, m, k, xv[b], x_bf16, g != nullptr, gv[b], g_bf16, pack, ss);
      }
    }
  }
  if (!asked) after_loads();
}

// Columns k..k+7 of row m (those below kc) into xs, times the norm weight g when has_g, their
// squares (before the weight) added to ss[m].
template <int M>
__device__ __forceinline__ void stage_eight(float* xs, int stride, int m, int k, int kc, const float (&x)[8],
                                            const float (&g)[8], bool has_g, const Packing& pack,
                                            float (&ss)[M]) {
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sq = fmaf(x[j], x[j], sq);
    if (k + j >= kc) continue;
    const float v = has_g ? x[j] * g[j] : x[j];
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

// stage_chunk_flagged's poll where runs are not whole or 16-byte aligned: word by word, and not
// inlined (inlined, its address arithmetic took the megakernel past 255 registers into spills).
template <int R>
__device__ __noinline__ void flag_poll_ragged(uint64_t (&v)[R][8], const uint64_t* const (&run)[R], int kc,
                                              int groups, int e0, int step, const Arena& a, uint32_t want) {
  uint64_t(&flat)[8 * R] = *reinterpret_cast<uint64_t(*)[8 * R]>(&v[0][0]);
  flag_poll<8 * R>(flat, [&](int j) -> const uint64_t* {
    const int e = e0 + (j / 8) * step, k = (e % groups) * 8 + j % 8;
    return run[j / 8] && k < kc ? run[j / 8] + j % 8 : nullptr;
  }, a, want);
}

// stage_chunk for a flagged activation (s.x_flag): each thread polls R runs of eight words at once (16-byte loads where the run is whole and
// aligned), then stages them as the plain path does (the same Σx² order).
template <int M, int R>
__device__ void stage_chunk_flagged(const StreamLinear& s, float* xs, int stride, int kc, int64_t c,
                                    const Packing& pack, float (&ss)[M]) {
  const uint64_t* x = static_cast<const uint64_t*>(s.x) + c;
  const int groups = (kc + 7) / 8, items = M * groups, step = static_cast<int>(MK_CTA_THREADS);
  const bool pairs = kc % 8 == 0 && s.x_ld % 2 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const uint32_t want = s.arena->flag;
  for (int e0 = threadIdx.x; e0 < items; e0 += R * step) {
    uint64_t v[R][8];
    const uint64_t* run[R];
#pragma unroll
    for (int b = 0; b < R; ++b) {
      const int e = e0 + b * step, m = e / groups, k = (e - m * groups) * 8;
      run[b] = e < items ? x + m * s.x_ld + k : nullptr;
    }
    if (pairs) {
      flag_poll8<R>(v, run, *s.arena, want);
    } else {
      flag_poll_ragged<R>(v, run, kc, groups, e0, step, *s.arena, want);
    }
#pragma unroll
    for (int b = 0; b < R; ++b) {
      const int e = e0 + b * step, m = e / groups, k = (e - m * groups) * 8;
      if (e >= items) break;
      float g[8] = {};
      if (s.g) {
        const bool vec = k + 8 <= kc && vec8_ok(elem_at(s.g, s.g_dtype, c + k), s.g_dtype);
        if (vec) {
          load8_f(g, s.g, s.g_dtype, c + k, true);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) g[j] = k + j < kc ? load_elem_f(s.g, s.g_dtype, c + k + j) : 1.0f;
        }
      }
      float xv[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) xv[j] = k + j < kc ? flag_value(v[b][j]) : 0.0f;
      stage_eight<M>(xs, stride, m, k, kc, xv, g, s.g != nullptr, pack, ss);
    }
  }
}

// Stages columns [c, c + kc) of the activation side into xs and adds their squares to ss. Each
// thread takes eight columns per step with one 16-byte load (two with the norm weight); 16-bit
// aligned rows go through stage_chunk_16bit, several steps' loads in flight at once.
// `after_loads` as stage_chunk_16bit's; the other paths run it first.
template <int M, int XB, class AfterLoads = NoLoads>
__device__ void stage_chunk(const StreamLinear& s, float* xs, int stride, int kc, int64_t c,
                            const Packing& pack, float (&ss)[M],
                            const AfterLoads& after_loads = AfterLoads{}) {
  if (s.x_flag) {
    after_loads();
    stage_chunk_flagged<M, 2>(s, xs, stride, kc, c, pack, ss);
    return;
  }
  const bool vec = kc % 8 == 0 && s.x_ld % 8 == 0 && c % 8 == 0 && vec8_ok(s.x, s.x_dtype) &&
                   (!s.g || vec8_ok(s.g, s.g_dtype));
  const bool narrow = s.x_dtype == DTYPE_BF16 || s.x_dtype == DTYPE_F16;
  if (vec && narrow && stride % 4 == 0 && (!s.g || s.g_dtype == DTYPE_BF16 || s.g_dtype == DTYPE_F16)) {
    stage_chunk_16bit<M, XB>(s, xs, stride, kc, c, pack, ss, after_loads);
    return;
  }
  after_loads();
  const int groups = (kc + 7) / 8;
  for (int e = threadIdx.x; e < M * groups; e += MK_CTA_THREADS) {
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
    stage_eight<M>(xs, stride, m, k, kc, x, g, s.g != nullptr, pack, ss);
  }
}

// Σx² of the task's columns, in two halves around a barrier: each warp's sums into `part`,
// then threads m < M add the warps' parts into sum_sq[m] (written when s.assign).
template <int M>
__device__ void sum_sq_parts(float (&part)[32][M], float (&ss)[M]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float sums[1][M];
#pragma unroll
  for (int m = 0; m < M; ++m) sums[0][m] = ss[m];
  group_sums<M, 1>(sums, lane, ShuffleXor{}, [&](int, int m, float total) { part[warp][m] = total; });
}

template <int M>
__device__ void sum_sq_total(const StreamLinear& s, const float (&part)[32][M]) {
  if (threadIdx.x < M) {
    float total = 0.0f;
    for (int w = 0; w < static_cast<int>(MK_CTA_THREADS >> 5); ++w) total += part[w][threadIdx.x];
    s.sum_sq[threadIdx.x] = s.assign ? total : s.sum_sq[threadIdx.x] + total;
  }
}

// This warp's share [begin, end) of rows [first, last), the warps taking equal runs in order.
struct WarpRows {
  int begin, end;
};
__device__ inline WarpRows warp_rows(int first, int last) {
  const int warps = static_cast<int>(MK_CTA_THREADS >> 5), warp = static_cast<int>(threadIdx.x >> 5);
  const int per = (last - first + warps - 1) / warps, begin = first + warp * per;
  return WarpRows{begin, begin + per < last ? begin + per : last};
}

// A lane's first round of the weights its warp streams (the warp's first group, chunk 0, 16-byte
// aligned rows), loaded while the activation is staged: stream_linear<..., First = 2> then
// starts with it.
// Its first FS steps only with FS < S, and of those its first FR rows (the rest load as usual).
template <int RG, int S, int FS = S, int FR = RG>
__device__ inline void load_first_round(const StreamLinear& s, WeightRound<RG, S>& r) {
  int rows = 0;
#pragma unroll
  for (int i = 0; i < kStreamMaxWeights; ++i) {
    if (i < s.nw) rows += s.w[i].rows;
  }
  const WarpRows share = warp_rows(0, rows);
  const uint16_t* wp[RG];
  float* op[RG];
  int32_t os[RG];
  round_rows<RG>(s, 0, share.begin, share.end, wp, op, os);
  const int kc = static_cast<int>(s.k < s.kc ? s.k : s.kc), k = static_cast<int>(threadIdx.x & 31u) * 8;
#pragma unroll
  for (int t = 0; t < FS; ++t) load_rows<RG, true, FR>(r.v[t], wp, k + t * 256, kc);
}

// All threads of the CTA: out[m][row] += Σ_k xside[m][k] · w[row][k] for every weight row of
// the task, and sum_sq[m] += Σ_k x[m][k]². With Mma (batches of 2..16 rows) the products run on
// tensor cores, the activation rounded to the weights' 16-bit type. A lane keeps the
// loads of S steps in flight: 256-column steps of RG rows on CUDA cores, 32-column steps of a
// block of 8 rows on tensor cores. Each thread stages up to XB groups of eight
// activation columns at once (the emitter sizes it to the chunk: unrolled code the task does not
// need costs instruction fetches). With Ring > 0 (tensor cores, weights from global memory)
// each warp copies its weights through a Ring-stage cp.async ring behind the packed chunk
// (mma_ring_walk). With First = 2 (CUDA cores, aligned weights from global memory) each warp's
// first round is loaded ahead (load_first_round; MK_CUDA_STAGE_FIRST=N: its first N steps),
// right behind the activation's
// first loads, so that its round trip to HBM overlaps theirs and the staging instead of
// following the staging barrier; with Held > 0 only the rows of the step that keep a thread
// at Held loads through the staging (stage_first_rows). With Bulk (tensor cores, an aligned
// 16-bit normed activation, every chunk packed) each chunk is staged by bulk copies
// (stage_chunk_bulk), and with Early > 0 each warp's first Early steps of weights are loaded
// behind them (mma_first_round), or with a ring its first fills (mma_bulk_ring).
// With Slice > 0 (a 16-bit activation of the weights' type, raw or with SliceNorm times its
// norm weight and its Σx² taken; Slice blocks of 8 weight rows a warp) each warp streams a slice
// of K for its row group, the activation beside the weights in its Ring-stage ring (mma_slices).
// Ends with __syncthreads(); false if a raw activation's or a Bulk chunk's bulk copies never
// landed.
template <int M, int RG, int S, int XB, bool Mma = false, int Ring = 0, int First = 0,
          int Held = 0, bool Bulk = false, int Early = 0, int Slice = 0, bool SliceNorm = false>
__device__ bool stream_linear(const StreamLinear& s) {
  static_assert(M >= 1 && M <= kStreamMaxRows, "stream_linear takes 1..16 activation rows");
  static_assert(Ring == 0 || Mma, "the ring: tensor cores");
  static_assert(!First || !Mma, "a first round loaded early: CUDA cores");
  static_assert(First == 0 || First == 2, "First: 0, or 2 (the first round loaded here)");
  static_assert(Held == 0 || First == 2, "Held: the loads a partial first step keeps (First = 2)");
  static_assert(!Bulk || Mma, "bulk staging: tensor cores (a packed chunk)");
  static_assert(Early == 0 || Bulk, "early weight steps: behind a bulk staging's copies");
  static_assert(Slice == 0 || (Mma && Ring >= 2), "K slices: tensor cores, a ring");
  static_assert(!SliceNorm || Slice > 0, "a normed activation's slices: K slices");
  float* xs = reinterpret_cast<float*>(mk_dynamic_smem);
  bool vec = true;
  #pragma unroll
  for (int i = 0; i < kStreamMaxWeights; ++i) {
    if (i >= s.nw) break;  // constant indices: the descriptors can stay in registers
    vec = vec && (s.aligned || (reinterpret_cast<uintptr_t>(s.w[i].w) & 15) == 0) && s.w[i].ld % 8 == 0;
  }
  int rows = 0;
  #pragma unroll
  for (int i = 0; i < kStreamMaxWeights; ++i) {
    if (i < s.nw) rows += s.w[i].rows;
  }
  const WarpRows share = warp_rows(0, rows);
  const int begin = share.begin, end = share.end;
  float ss[M];
#pragma unroll
  for (int m = 0; m < M; ++m) ss[m] = 0.0f;
  __shared__ float part[32][M];  // the warps' Σx²
  // First == 2: the round's first steps, loaded behind the activation's loads; held through
  // the staging, the whole round (up to 64 registers) made ptxas spill.
  constexpr int kFirstSteps = First == 2 ? (kStageFirstSteps < S ? kStageFirstSteps : S) : S;
  constexpr int kFirstRows = First == 2 ? stage_first_rows<RG, XB, Held>() : RG;
  WeightRound<RG, S> own;
  // Bulk without a ring, Early > 0: the first Early steps of each warp's first round of weights
  // go out behind the activation's bulk copies (mma_first_round), not after the staging. The
  // emitter gives Bulk to bf16 weights only (mma_chunk_early's products).
  constexpr bool kEarlyMma = Bulk && Ring == 0 && Early > 0;
  constexpr int kEarlySteps = Early < S ? Early : S;
  uint4 first[kEarlyMma ? S : 1];
  MK_MARK(*s.arena);
  if constexpr (Slice > 0) {
    // The emitter gives slices only to what it proved aligned and of the weights' type; anything
    // else fails the task rather than reading past the rings it reserved.
    if (!vec || !sliced_activation(s, SliceNorm)) return false;
    MK_MARK(*s.arena);
    MK_MARK(*s.arena);
    const bool fits = mma_slices<M, Slice, Ring, SliceNorm>(s, rows);
    MK_MARK(*s.arena);
    return fits;
  }
  if constexpr (Mma) {
    if (vec && raw_activation(s)) {
      const bool landed = mma_raw_chunks<M, S, Ring>(s, rows);
      MK_MARK(*s.arena);
      return landed;
    }
  }
  if constexpr (Bulk && Ring > 0 && Early > 0) {
    if (vec) {  // always, under Bulk: the emitter proved the weights aligned
      const bool landed = mma_bulk_ring<M, Ring>(s, rows, ss);
      MK_MARK(*s.arena);
      if (s.sum_sq) {
        sum_sq_parts<M>(part, ss);
        __syncthreads();
        sum_sq_total<M>(s, part);
      }
      __syncthreads();
      return landed;
    }
  }
  for (int64_t c = 0; c < s.k; c += s.kc) {
    const int kc = chunk_columns(s, c);
    // Tensor cores take the activation in the weights' 16-bit type: staged that way, once.
    const Packing pack{Mma && vec && kc % 32 == 0 && s.kc % 8 == 0, s.w_dtype == DTYPE_BF16};
    __syncthreads();
    if constexpr (First == 2) {
      // The round is vectorized: only where every weight row is 16-byte aligned.
      auto ask = [&] {
        if (c == 0 && vec) load_first_round<RG, S, kFirstSteps, kFirstRows>(s, own);
      };
      if (!s.x_ready) {
        stage_chunk<M, XB>(s, xs, s.kc, kc, c, pack, ss, ask);
      } else {
        ask();
      }
    } else if (!s.x_ready) {
      if constexpr (Bulk) {
        const auto ask = [&] {
          if constexpr (kEarlyMma) {
            if (c == 0) mma_first_round<S, kEarlySteps>(s, kc, c, rows, first);
          }
        };
        if (!stage_chunk_bulk<M>(s, xs, c, pack, ss, ask)) return false;
      } else {
        stage_chunk<M, XB>(s, xs, s.kc, kc, c, pack, ss);
      }
    }
    // With assign the last chunk's staging barrier also publishes the warps' Σx² parts, so the
    // total is written before the products instead of behind a barrier of its own after them.
    const bool early_sum_sq = s.assign && s.sum_sq && c + kc >= s.k;
    if (early_sum_sq) sum_sq_parts<M>(part, ss);
    if (c == 0) MK_MARK(*s.arena);
    __syncthreads();
    if (early_sum_sq) sum_sq_total<M>(s, part);
    if (c == 0) MK_MARK(*s.arena);
    if (pack.on) {
      // The ring sits behind the packed chunk (the emitter reserves both).
      uint16_t* ring = reinterpret_cast<uint16_t*>(mk_dynamic_smem + ((M * s.kc * 2 + 127) & ~127));
      const uint16_t* packed = reinterpret_cast<const uint16_t*>(xs);
      if constexpr (kEarlyMma) {
        mma_chunk_early<M, S, kEarlySteps>(s, packed, s.kc, kc, c, rows, first, c == 0);
      } else {
        mma_chunk<M, S, Ring>(s, packed, s.kc, kc, c, rows, ring);
      }
    } else if (vec && !Mma) {
      stream_rows<M, RG, S, true, First != 0, kFirstSteps, kFirstRows>(
          s, xs, s.kc, kc, c, begin, end, s.assign && c == 0, own, c == 0);
    } else {
      // Weights not 16-byte aligned (the emitter plans tensor cores only for aligned chunks):
      // rare, so this loop is not unrolled. Every unrolled variant adds kilobytes of code to
      // each body that streams, and a decode step runs each body once per layer, from a cold
      // instruction cache.
      stream_rows<M, 1, 1, false>(s, xs, s.kc, kc, c, begin, end, s.assign && c == 0);
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
