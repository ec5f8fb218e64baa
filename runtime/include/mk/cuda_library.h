// Device library kernels of the CUDA backend (`mugraph.kernel` on whole tensors): the nn
// semantics of mk/cpu_library.h, made cooperative like mk/cuda_kernels.h.
#pragma once

#include "mk/cuda_flags.cuh"
#include "mk/cuda_kernels.h"

namespace mk {
namespace gpu {

// Softmax of the line of n values at p (stride inner) into q (same layout).
__device__ inline void softmax_line(float* q, const float* p, int64_t n, int64_t inner) {
  float peak = -INFINITY;
  for (int64_t k = 0; k < n; ++k) peak = nan_max(peak, p[k * inner]);
  if (!isfinite(peak)) peak = 0.0f;  // fully masked rows give zeros, not NaN
  double total = 0;
  for (int64_t k = 0; k < n; ++k) total += expf(p[k * inner] - peak);
  const float t = static_cast<float>(total);
  for (int64_t k = 0; k < n; ++k) q[k * inner] = t > 0 ? expf(p[k * inner] - peak) / t : 0.0f;
}

__device__ inline void lib_softmax(Tile<float>& out, const Tile<float>& x, const Dims& shape,
                                   int64_t dim) {
  int64_t outer, inner;
  outer_inner(shape, dim, &outer, &inner);
  const int64_t n = shape.v[dim];
  out.resize(x.n);
  MK_FOR_EACH(e, outer * inner) {
    const int64_t base = (u32(e) / u32(inner)) * n * inner + u32(e) % u32(inner);
    softmax_line(out.p + base, x.p + base, n, inner);
  }
  __syncthreads();
}

__device__ inline void lib_rope(Tile<float>& out, const Tile<float>& x, const Dims& xshape,
                                const Tile<float>& c, const Dims& cshape, const Tile<float>& s,
                                const Dims& sshape) {
  const int64_t dfull = xshape.back(), half = dfull / 2;
  Dims hshape = xshape;
  hshape.v[hshape.n - 1] = half;
  const Dims sc = bcast_strides(cshape, hshape), ss = bcast_strides(sshape, hshape);
  out.resize(x.n);
  MK_FOR_EACH(e, numel(hshape)) {
    const int64_t r = u32(e) / u32(half), j = u32(e) % u32(half);
    const float x1 = x.p[r * dfull + j], x2 = x.p[r * dfull + half + j];
    const float cv = c.p[bcast_offset(e, hshape, sc)], sv = s.p[bcast_offset(e, hshape, ss)];
    out.p[r * dfull + j] = x1 * cv - x2 * sv;
    out.p[r * dfull + half + j] = x2 * cv + x1 * sv;
  }
  __syncthreads();
}

// lib_rope for rows of D elements whose cos and sin are one row of D/2 shared by all rows (or,
// kRowTables, a row of each for every `positions` rows, row r taking row r % positions: a
// prefill's): the same arithmetic, without the broadcast walk.
template <int D, bool kRowTables = false>
__device__ inline void rope_rows(Tile<float>& out, const Tile<float>& x, const Tile<float>& c,
                                 const Tile<float>& s, int rows, int positions = 1) {
  constexpr int half = D / 2;
  out.resize(x.n);
  MK_FOR_EACH(e, rows * half) {
    const int r = static_cast<int>(e) / half, j = static_cast<int>(e) % half;
    const float x1 = x.p[r * D + j], x2 = x.p[r * D + half + j];
    const int t = kRowTables ? (r % positions) * half + j : j;
    const float cv = c.p[t], sv = s.p[t];
    out.p[r * D + j] = x1 * cv - x2 * sv;
    out.p[r * D + half + j] = x2 * cv + x1 * sv;
  }
  __syncthreads();
}

// Row gather by bytes, by every thread of the CTA (16 bytes at a time where rows allow it);
// returns (to every thread) the index of the first id out of range, or -1 (nothing written).
// The threads check the ids together (each thread walking all of a prefill's 999 ids had taken
// most of a 64 us gather of RoPE table rows on the H200); only a bad id costs the serial walk.
// A unit a thread at a time, not several loads in flight a thread: with eight (or even two)
// here ptxas gave the whole megakernel 255 registers and spills in the bodies that run every
// layer (q, r, y_acc, the lm_head), and qwen3-0.6b's decode ran 1.91 -> 2.07 ms/token at batch
// 8 (bench/RESULTS.md, session 57). A decode gathers one row a batch row (a unit a thread).
__device__ inline int64_t gather_rows(void* out, const void* table, const Tile<int64_t>& ids,
                                      int64_t rows, int64_t row_bytes) {
  int bad = 0;
  MK_FOR_EACH(i, ids.n) bad |= ids.p[i] < 0 || ids.p[i] >= rows;
  if (__syncthreads_or(bad)) {
    for (int64_t i = 0; i < ids.n; ++i)
      if (ids.p[i] < 0 || ids.p[i] >= rows) return i;
  }
  const char* from = static_cast<const char*>(table);
  char* to = static_cast<char*>(out);
  if (row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(table) % 16 == 0) {
    const int64_t per_row = row_bytes / 16;
    MK_FOR_EACH(v, ids.n * per_row) {
      const int64_t i = u32(v) / u32(per_row), k = u32(v) % u32(per_row);
      reinterpret_cast<uint4*>(to)[v] =
          reinterpret_cast<const uint4*>(from + ids.p[i] * row_bytes)[k];
    }
  } else {
    MK_FOR_EACH(b, ids.n * row_bytes) {
      const int64_t i = u32(b) / u32(row_bytes), k = u32(b) % u32(row_bytes);
      to[b] = from[ids.p[i] * row_bytes + k];
    }
  }
  __syncthreads();
  return -1;
}

// ids[at] (gather_rows' ids, picked from an integer ids table of `rows` rows of `row_elems`)
// into `out`, by every thread of the CTA; returns (to every thread) the index in `at` of the
// first position out of range, or -1.
__device__ inline int64_t pick_ids(Tile<int64_t>& out, const void* ids, int32_t dtype, int64_t rows,
                                   int64_t row_elems, const Tile<int64_t>& at) {
  int bad = 0;
  MK_FOR_EACH(i, at.n) bad |= at.p[i] < 0 || at.p[i] >= rows;
  if (__syncthreads_or(bad)) {
    for (int64_t i = 0; i < at.n; ++i)
      if (at.p[i] < 0 || at.p[i] >= rows) return i;
  }
  out.resize(at.n * row_elems);
  MK_FOR_EACH(e, out.n) {
    const int64_t i = u32(e) / u32(row_elems), k = u32(e) % u32(row_elems);
    out.p[e] = load_elem_i(ids, dtype, at.p[i] * row_elems + k);
  }
  __syncthreads();
  return -1;
}

// base + add broadcast to `oshape` (NumPy rules): the value of a decode-loop step.
__device__ inline void lib_step(Tile<int64_t>& out, const Dims& oshape, const Tile<int64_t>& base,
                                const Dims& bshape, int64_t add) {
  const Dims s = bcast_strides(bshape, oshape);
  out.resize(numel(oshape));
  MK_FOR_EACH(e, out.n) out.p[e] = base.p[bcast_offset(e, oshape, s)] + add;
  __syncthreads();
}

// Byte copy by every thread of the CTA, 16 bytes at a time when both ends allow it.
__device__ inline void copy_bytes(void* dst, const void* src, int64_t bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    MK_FOR_EACH(v, bytes / 16) static_cast<uint4*>(dst)[v] = static_cast<const uint4*>(src)[v];
    MK_FOR_EACH(b, bytes % 16) {
      const int64_t at = bytes / 16 * 16 + b;
      static_cast<char*>(dst)[at] = static_cast<const char*>(src)[at];
    }
  } else {
    MK_FOR_EACH(b, bytes) static_cast<char*>(dst)[b] = static_cast<const char*>(src)[b];
  }
}

// A failed cache write's task code: the bad start (never 0, as n <= the dim's extent), clamped
// into ±2^30 so that it stays clear of the dispatcher's own codes near 2^31. The host words it
// as the CPU executor does (backends/cuda/failures.py).
__device__ inline int32_t cache_write_code(int64_t start) {
  constexpr int64_t limit = int64_t{1} << 30;
  return static_cast<int32_t>(start < -limit ? -limit : start > limit ? limit : start);
}

// The cache write of mk/cpu_library.h (`cache_write_bytes`), by every thread of the CTA: a copy
// of the cache first unless it is written in place, then the new positions, 4 bytes at a time
// where the runs allow it. Returns (to every thread) the first bad run, or -1.
// A cache write's runs: `outer` runs along dim, `inner` elements after it, run o starting at
// starts[o·rows/outer].
struct CacheRuns {
  int64_t outer = 1, inner = 1, extent = 0, rows = 0;
};

// What both cache writes do first: the runs, the first run whose start leaves the cache
// (returned, or -1), and the copy of the cache when the write is not in place. (Checking each
// start once instead, and finding a run's start in 32 bits, left the batch-8 V-cache write's
// 5.8 us as it was on the H200.)
__device__ inline int64_t cache_write_begin(CacheRuns& r, void* out, const void* cache,
                                            const Tile<int64_t>& starts, const Dims& cshape,
                                            int64_t dim, int64_t n, int64_t esize) {
  for (int64_t d = 0; d < dim; ++d) r.outer *= cshape.v[d];
  for (int64_t d = dim + 1; d < cshape.n; ++d) r.inner *= cshape.v[d];
  r.extent = cshape.v[dim];
  r.rows = starts.n;
  for (int64_t o = 0; o < r.outer; ++o) {
    const int64_t s = starts.p[o * r.rows / r.outer];
    if (s < 0 || s + n > r.extent) return o;
  }
  if (out != cache) {
    copy_bytes(out, cache, r.outer * r.extent * r.inner * esize);
    __syncthreads();
  }
  return -1;
}

__device__ inline int64_t cache_write_bytes(void* out, const void* cache, const void* src,
                                            const Tile<int64_t>& starts, const Dims& cshape,
                                            int64_t dim, int64_t n, int64_t esize) {
  CacheRuns r;
  const int64_t bad = cache_write_begin(r, out, cache, starts, cshape, dim, n, esize);
  if (bad >= 0) return bad;
  const int64_t outer = r.outer, inner = r.inner * esize, extent = r.extent, rows = r.rows;
  const auto start_of = [&](int64_t o) { return starts.p[o * rows / outer]; };
  const int64_t run = n * inner;
  char* dst = static_cast<char*>(out);
  const char* from = static_cast<const char*>(src);
  if (run % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0 &&
      reinterpret_cast<uintptr_t>(src) % 4 == 0 && inner % 4 == 0) {
    MK_FOR_EACH(w, outer * run / 4) {
      const int64_t o = u32(w) / u32(run / 4), k = u32(w) % u32(run / 4);
      const int64_t s = start_of(o);
      reinterpret_cast<uint32_t*>(dst + (o * extent + s) * inner)[k] =
          reinterpret_cast<const uint32_t*>(from + o * run)[k];
    }
  } else {
    MK_FOR_EACH(b, outer * run) {
      const int64_t o = u32(b) / u32(run), k = u32(b) % u32(run);
      dst[(o * extent + start_of(o)) * inner + k] = from[o * run + k];
    }
  }
  __syncthreads();
  return -1;
}

// cache_write_bytes for new rows in a flagged buffer (flag-rows): words of value bits and flag,
// each polled until it carries the task's flag (four a thread in flight) and stored in the
// cache's dtype. Returns (to every thread) the first bad run, or -1.
__device__ inline int64_t cache_write_flagged(void* out, const void* cache, const void* src,
                                              const Tile<int64_t>& starts, const Dims& cshape,
                                              int64_t dim, int64_t n, int32_t dtype, int64_t esize,
                                              const Arena& a) {
  constexpr int kGroup = 4;
  CacheRuns r;
  const int64_t bad = cache_write_begin(r, out, cache, starts, cshape, dim, n, esize);
  if (bad >= 0) return bad;
  const int64_t outer = r.outer, inner = r.inner, extent = r.extent, rows = r.rows;
  const int64_t run = n * inner, total = outer * run, step = MK_CTA_THREADS;
  const uint64_t* words = static_cast<const uint64_t*>(src);
  for (int64_t e0 = threadIdx.x; e0 < total; e0 += kGroup * step) {
    uint64_t v[kGroup];
    flag_poll<kGroup>(v, [&](int k) -> const uint64_t* {
      return e0 + k * step < total ? words + e0 + k * step : nullptr;
    }, a, a.flag);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const int64_t e = e0 + k * step;
      if (e >= total) break;
      const int64_t o = e / run, at = starts.p[o * rows / outer];
      store_elem(out, dtype, (o * extent + at) * inner + e % run, flag_value(v[k]));
    }
  }
  __syncthreads();
  return -1;
}

__device__ inline void lib_argmax(Tile<int64_t>& out, const Tile<float>& x, const Dims& shape,
                                  int64_t dim) {
  int64_t outer, inner;
  outer_inner(shape, dim, &outer, &inner);
  const int64_t n = shape.v[dim];
  out.resize(outer * inner);
  MK_FOR_EACH(e, outer * inner) {
    const int64_t o = u32(e) / u32(inner), i = u32(e) % u32(inner);
    int64_t best = 0;
    for (int64_t k = 0; k < n; ++k) {
      const float a = x.p[(o * n + k) * inner + i], b = x.p[(o * n + best) * inner + i];
      if (b != b) break;
      if (a != a || a > b) best = k;
    }
    out.p[e] = best;
  }
  __syncthreads();
}

template <class T>
__device__ void lib_transpose(Tile<T>& out, const Tile<T>& x, const Dims& shape, const Dims& perm) {
  Dims oshape = perm, xstrides = shape, ostrides = perm;
  int64_t stride = 1;
  for (int d = shape.n - 1; d >= 0; --d) {
    xstrides.v[d] = stride;
    stride *= shape.v[d];
  }
  for (int d = 0; d < perm.n; ++d) {
    oshape.v[d] = shape.v[perm.v[d]];
    ostrides.v[d] = xstrides.v[perm.v[d]];
  }
  out.resize(x.n);
  MK_FOR_EACH(e, out.n) out.p[e] = x.p[bcast_offset(e, oshape, ostrides)];
  __syncthreads();
}

template <class T>
__device__ void lib_slice(Tile<T>& out, const Tile<T>& x, const Dims& shape, const Dims& offsets,
                          const Dims& sizes) {
  out.resize(numel(sizes));
  MK_FOR_EACH(e, out.n) out.p[e] = x.p[box_offset(e, shape, offsets, sizes)];
  __syncthreads();
}

// softmax(q k^T * scale) v with grouped-query heads, kv_len masking and causal masking; one
// thread per query row, its scores in scratch.
__device__ inline void lib_attention(Tile<float>& out, const Tile<float>& q, const Dims& qs,
                                     const Tile<float>& k, const Dims& ks, const Tile<float>& v,
                                     const Tile<int64_t>* kv_len, float scale, bool causal,
                                     Arena& arena) {
  const int64_t batch = qs.v[0], hq = qs.v[1], sq = qs.v[2], d = qs.v[3];
  const int64_t hkv = ks.v[1], s = ks.v[2], group = hq / hkv;
  const int64_t rows = batch * hq * sq;
  const ArenaMark mark = arena.mark();
  Tile<float> scores(arena, rows * s), probs(arena, rows * s);
  out.resize(rows * d);
  MK_FOR_EACH(row, rows) {
    const int64_t b = row / (hq * sq), h = (row / sq) % hq, i = row % sq;
    const int64_t length = kv_len ? kv_len->p[b] : s;
    const float* kh = k.p + (b * hkv + h / group) * s * d;
    const float* vh = v.p + (b * hkv + h / group) * s * d;
    const float* qi = q.p + row * d;
    float* sc = scores.p + row * s;
    float* pr = probs.p + row * s;
    const int64_t query_pos = length - sq + i;
    for (int64_t j = 0; j < s; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(qi[c]) * kh[j * d + c];
      const bool visible = j < length && (!causal || j <= query_pos);
      sc[j] = visible ? static_cast<float>(dot) * scale : -INFINITY;
    }
    softmax_line(pr, sc, s, 1);
    for (int64_t c = 0; c < d; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < s; ++j) {
        if (pr[j] != 0.0f) acc += static_cast<double>(pr[j]) * vh[j * d + c];
      }
      out.p[row * d + c] = static_cast<float>(acc);
    }
  }
  __syncthreads();
  arena.reset(mark);
}

}  // namespace gpu
}  // namespace mk
