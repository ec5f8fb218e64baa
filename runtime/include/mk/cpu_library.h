// Library kernels of the CPU backend (`mugraph.kernel` on whole tensors), nn semantics of
// interp/nn_ops.py: float32 compute; the caller rounds to the result type when it stores.
#pragma once

#include "mk/cpu_kernels.h"

namespace mk {
namespace cpu {

// ------------------------------------------------------------------------------------------
// Library kernels (`mugraph.kernel`): whole tensors, nn semantics (interp/nn_ops.py)
// ------------------------------------------------------------------------------------------

inline void lib_softmax(std::vector<float>& out, const std::vector<float>& x, const Dims& shape,
                        int64_t dim) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[dim];
  out.assign(x.size(), 0.0f);
  std::vector<float> e(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * n * inner + i;
      float peak = -INFINITY;
      for (int64_t k = 0; k < n; ++k) peak = nan_max(peak, x[base + k * inner]);
      if (!std::isfinite(peak)) peak = 0.0f;  // fully masked rows give zeros, not NaN
      double total = 0;
      for (int64_t k = 0; k < n; ++k) {
        e[k] = std::exp(x[base + k * inner] - peak);
        total += e[k];
      }
      const float t = static_cast<float>(total);
      for (int64_t k = 0; k < n; ++k) out[base + k * inner] = t > 0 ? e[k] / t : 0.0f;
    }
  }
}

// cat(x1*cos - x2*sin, x2*cos + x1*sin) on the last dim; cos/sin broadcast against the halves.
inline void lib_rope(std::vector<float>& out, const std::vector<float>& x, const Dims& xshape,
                     const std::vector<float>& c, const Dims& cshape, const std::vector<float>& s,
                     const Dims& sshape) {
  const int64_t dfull = xshape.back(), half = dfull / 2;
  Dims hshape(xshape);
  hshape.back() = half;
  out.assign(x.size(), 0.0f);
  Walk w(hshape, {cshape, sshape});
  const int64_t rows = numel(hshape) / half;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < half; ++j, w.next()) {
      const float x1 = x[r * dfull + j], x2 = x[r * dfull + half + j];
      const float cv = c[w.at(0)], sv = s[w.at(1)];
      out[r * dfull + j] = x1 * cv - x2 * sv;
      out[r * dfull + half + j] = x2 * cv + x1 * sv;
    }
  }
}

// Row gather by bytes (`row_bytes` per row of a table of `rows`); returns the index of the
// first id out of range, or -1 (nothing written then).
inline int64_t gather_rows(void* out, const void* table, const std::vector<int64_t>& ids,
                           int64_t rows, int64_t row_bytes) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= rows) return static_cast<int64_t>(i);
  for (size_t i = 0; i < ids.size(); ++i)
    memcpy(static_cast<char*>(out) + i * row_bytes,
           static_cast<const char*>(table) + ids[i] * row_bytes, static_cast<size_t>(row_bytes));
  return -1;
}

// ids[at] of an integer ids table of `rows` rows of `row_elems` each: the rows at the positions
// `at` holds, one after another, into `out`; returns the index in `at` of the first position out
// of range, or -1.
inline int64_t pick_ids(std::vector<int64_t>& out, const void* ids, int32_t dtype, int64_t rows,
                        int64_t row_elems, const std::vector<int64_t>& at) {
  for (size_t i = 0; i < at.size(); ++i)
    if (at[i] < 0 || at[i] >= rows) return static_cast<int64_t>(i);
  out.resize(at.size() * static_cast<size_t>(row_elems));
  for (size_t i = 0; i < at.size(); ++i)
    for (int64_t k = 0; k < row_elems; ++k)
      out[i * static_cast<size_t>(row_elems) + static_cast<size_t>(k)] =
          load_elem_i(ids, dtype, at[i] * row_elems + k);
  return -1;
}

// base + add broadcast to `oshape` (NumPy rules): the value of a decode-loop step.
inline void lib_step(std::vector<int64_t>& out, const Dims& oshape, const std::vector<int64_t>& base,
                     const Dims& bshape, int64_t add) {
  out.assign(static_cast<size_t>(numel(oshape)), 0);
  Walk w(oshape, {bshape});
  for (size_t e = 0; e < out.size(); ++e, w.next()) out[e] = base[w.at(0)] + add;
}

// The rows of a cache write: `outer` runs of `n` positions along the written dim, each run of
// `inner` bytes per position; run o of the source goes to positions starts[o * rows / outer] +
// [0, n) of a dim of `extent` positions (rows = starts.size(), 1 when all runs share a start).
struct CacheRuns {
  int64_t outer, extent, n, inner;
};

inline CacheRuns cache_runs(const Dims& cshape, int64_t dim, int64_t n, int64_t esize) {
  CacheRuns c{1, cshape[dim], n, esize};
  for (int64_t d = 0; d < dim; ++d) c.outer *= cshape[d];
  for (size_t d = dim + 1; d < cshape.size(); ++d) c.inner *= cshape[d];
  return c;
}

// Writes `src` into `out` (a copy of `cache` unless they are the same bytes, the in-place write
// of a donated argument) at the positions `starts` gives; returns the first run whose positions
// fall outside the dim, or -1 (nothing written then).
inline int64_t cache_write_bytes(void* out, const void* cache, const void* src,
                                 const std::vector<int64_t>& starts, const Dims& cshape,
                                 int64_t dim, int64_t n, int64_t esize) {
  const CacheRuns c = cache_runs(cshape, dim, n, esize);
  const int64_t rows = static_cast<int64_t>(starts.size());
  for (int64_t o = 0; o < c.outer; ++o) {
    const int64_t s = starts[o * rows / c.outer];
    if (s < 0 || s + n > c.extent) return o;
  }
  char* dst = static_cast<char*>(out);
  if (out != cache) memcpy(dst, cache, static_cast<size_t>(c.outer * c.extent * c.inner));
  const char* from = static_cast<const char*>(src);
  for (int64_t o = 0; o < c.outer; ++o) {
    const int64_t s = starts[o * rows / c.outer];
    memcpy(dst + (o * c.extent + s) * c.inner, from + o * n * c.inner,
                static_cast<size_t>(n * c.inner));
  }
  return -1;
}

inline void lib_argmax(std::vector<int64_t>& out, const std::vector<float>& x, const Dims& shape,
                       int64_t dim) {
  std::vector<int64_t> iota(x.size());
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  for (size_t e = 0; e < x.size(); ++e) iota[e] = (static_cast<int64_t>(e) / inner) % shape[dim];
  std::vector<float> vmax;
  argmax_tile(vmax, out, x, iota, shape, dim);
}

template <class T>
void lib_transpose(std::vector<T>& out, const std::vector<T>& x, const Dims& shape,
                   const Dims& perm) {
  Dims oshape(perm.size()), xstrides(shape.size(), 1), ostrides(perm.size());
  for (size_t d = shape.size(); d-- > 1;) xstrides[d - 1] = xstrides[d] * shape[d];
  for (size_t d = 0; d < perm.size(); ++d) {
    oshape[d] = shape[perm[d]];
    ostrides[d] = xstrides[perm[d]];
  }
  out.resize(x.size());
  Dims idx(oshape.size(), 0);
  for (size_t e = 0; e < out.size(); ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * ostrides[d];
    out[e] = x[off];
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < oshape[d]) break;
      idx[d] = 0;
    }
  }
}

template <class T>
void lib_slice(std::vector<T>& out, const std::vector<T>& x, const Dims& shape,
               const Dims& offsets, const Dims& sizes) {
  Dims strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  out.resize(static_cast<size_t>(numel(sizes)));
  Dims idx(sizes.size(), 0);
  for (size_t e = 0; e < out.size(); ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += (offsets[d] + idx[d]) * strides[d];
    out[e] = x[off];
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
}

// softmax(q k^T * scale) v with grouped-query heads, kv_len masking and causal masking.
inline void lib_attention(std::vector<float>& out, const std::vector<float>& q, const Dims& qs,
                          const std::vector<float>& k, const Dims& ks, const std::vector<float>& v,
                          const std::vector<int64_t>* kv_len, float scale, bool causal) {
  const int64_t batch = qs[0], hq = qs[1], sq = qs[2], d = qs[3];
  const int64_t hkv = ks[1], s = ks[2], group = hq / hkv;
  out.assign(static_cast<size_t>(batch * hq * sq * d), 0.0f);
  std::vector<float> scores(static_cast<size_t>(s)), p;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = kv_len ? (*kv_len)[b] : s;
    for (int64_t h = 0; h < hq; ++h) {
      const float* kh = k.data() + (b * hkv + h / group) * s * d;
      const float* vh = v.data() + (b * hkv + h / group) * s * d;
      for (int64_t i = 0; i < sq; ++i) {
        const float* qi = q.data() + ((b * hq + h) * sq + i) * d;
        const int64_t query_pos = length - sq + i;
        for (int64_t j = 0; j < s; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(qi[c]) * kh[j * d + c];
          const bool visible = j < length && (!causal || j <= query_pos);
          scores[j] = visible ? static_cast<float>(dot) * scale : -INFINITY;
        }
        lib_softmax(p, scores, Dims{s}, 0);
        float* oi = out.data() + ((b * hq + h) * sq + i) * d;
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < s; ++j) {
            if (p[j] != 0.0f) acc += static_cast<double>(p[j]) * vh[j * d + c];
          }
          oi[c] = static_cast<float>(acc);
        }
      }
    }
  }
}

}  // namespace cpu
}  // namespace mk
