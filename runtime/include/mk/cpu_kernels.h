// Reference tile kernels of the CPU backend: the helpers the emitted per-program C++ calls.
//
// Everything mirrors mk's NumPy interpreters (interp/mugraph_tiles.py, interp/nn_ops.py):
// values compute in float32, bf16/f16 are emulated by rounding a float to the nearest
// representable value (round to nearest, ties to even) exactly where the interpreter rounds.
// Sums and dot products accumulate in double and round once: NumPy sums float32 pairwise, so
// a correctly rounded sum is closer to it than a naive float32 loop.
#pragma once

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "mk/tables.h"

namespace mk {
namespace cpu {

// ------------------------------------------------------------------------------------------
// Element conversions
// ------------------------------------------------------------------------------------------

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (au >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (au < 0x38800000u) {
    // Subnormal half: scale so that the half's unit lands on an integer, then round to even.
    float a;
    memcpy(&a, &au, 4);
    const float scaled = a * 16777216.0f;  // 2^24: half subnormal unit is 2^-24
    const float r = std::nearbyint(scaled);  // default rounding mode: ties to even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  const uint32_t exp = ((au >> 23) - 112u) << 10;
  const uint32_t mant = au & 0x7fffffu;
  uint32_t h = exp | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
  return static_cast<uint16_t>(sign | h);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  uint32_t u = exp == 31 ? (sign | 0x7f800000u | (mant << 13))
                         : (sign | ((exp + 112u) << 23) | (mant << 13));
  memcpy(&f, &u, 4);
  return f;
}

// A float rounded to the element type `dtype` and widened back (what NumPy's astype does).
inline float round_to(float x, int32_t dtype) {
  switch (dtype) {
    case DTYPE_BF16: return bf16_to_f32(f32_to_bf16(x));
    case DTYPE_F16: return f16_to_f32(f32_to_f16(x));
    default: return x;
  }
}

inline void round_tile(std::vector<float>& t, int32_t dtype) {
  if (dtype == DTYPE_F32) return;
  for (float& x : t) x = round_to(x, dtype);
}

inline void round_tile(std::vector<int64_t>&, int32_t) {}

// Float to integer as NumPy's astype does for in-range values (truncation).
template <class T>
inline T from_float(float x) { return static_cast<T>(x); }
template <>
inline int64_t from_float<int64_t>(float x) { return std::isfinite(x) ? static_cast<int64_t>(x) : 0; }

inline float load_elem_f(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case DTYPE_F32: return static_cast<const float*>(base)[i];
    case DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DTYPE_F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DTYPE_F64: return static_cast<float>(static_cast<const double*>(base)[i]);
    case DTYPE_I32: return static_cast<float>(static_cast<const int32_t*>(base)[i]);
    case DTYPE_I64: return static_cast<float>(static_cast<const int64_t*>(base)[i]);
    case DTYPE_I8: return static_cast<float>(static_cast<const int8_t*>(base)[i]);
    default: return static_cast<float>(static_cast<const uint8_t*>(base)[i]);
  }
}

inline int64_t load_elem_i(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case DTYPE_I32: return static_cast<const int32_t*>(base)[i];
    case DTYPE_I64: return static_cast<const int64_t*>(base)[i];
    case DTYPE_I8: return static_cast<const int8_t*>(base)[i];
    case DTYPE_U8: return static_cast<const uint8_t*>(base)[i];
    default: return from_float<int64_t>(load_elem_f(base, dtype, i));
  }
}

inline void store_elem(void* base, int32_t dtype, int64_t i, float x) {
  switch (dtype) {
    case DTYPE_F32: static_cast<float*>(base)[i] = x; break;
    case DTYPE_BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(x); break;
    case DTYPE_F16: static_cast<uint16_t*>(base)[i] = f32_to_f16(x); break;
    case DTYPE_F64: static_cast<double*>(base)[i] = x; break;
    case DTYPE_I32: static_cast<int32_t*>(base)[i] = from_float<int32_t>(x); break;
    case DTYPE_I64: static_cast<int64_t*>(base)[i] = from_float<int64_t>(x); break;
    case DTYPE_I8: static_cast<int8_t*>(base)[i] = from_float<int8_t>(x); break;
    default: static_cast<uint8_t*>(base)[i] = x != 0.0f; break;
  }
}

inline void store_elem(void* base, int32_t dtype, int64_t i, int64_t x) {
  switch (dtype) {
    case DTYPE_I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(x); break;
    case DTYPE_I64: static_cast<int64_t*>(base)[i] = x; break;
    case DTYPE_I8: static_cast<int8_t*>(base)[i] = static_cast<int8_t>(x); break;
    case DTYPE_U8: static_cast<uint8_t*>(base)[i] = x != 0; break;
    default: store_elem(base, dtype, i, static_cast<float>(x)); break;
  }
}

inline void load_into(float& dst, const void* base, int32_t dtype, int64_t i) {
  dst = load_elem_f(base, dtype, i);
}
inline void load_into(int64_t& dst, const void* base, int32_t dtype, int64_t i) {
  dst = load_elem_i(base, dtype, i);
}

// ------------------------------------------------------------------------------------------
// Shapes and strided walks
// ------------------------------------------------------------------------------------------

using Dims = std::vector<int64_t>;

inline int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

// Row-major strides of `in` seen from `out` (right-aligned, 0 where `in` broadcasts).
inline Dims bcast_strides(const Dims& in, const Dims& out) {
  Dims s(out.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < in.size(); ++k) {
    const size_t di = in.size() - 1 - k;
    const size_t dout = out.size() - 1 - k;
    s[dout] = in[di] == 1 ? 0 : stride;
    stride *= in[di];
  }
  return s;
}

// Flat offsets into each of several inputs while walking `out` in row-major order.
class Walk {
 public:
  Walk(const Dims& out, std::initializer_list<Dims> ins) : out_(out), idx_(out.size(), 0) {
    for (const Dims& d : ins) {
      strides_.push_back(bcast_strides(d, out));
      off_.push_back(0);
    }
  }
  int64_t at(size_t k) const { return off_[k]; }
  void next() {
    for (size_t d = out_.size(); d-- > 0;) {
      for (size_t k = 0; k < off_.size(); ++k) off_[k] += strides_[k][d];
      if (++idx_[d] < out_[d]) return;
      for (size_t k = 0; k < off_.size(); ++k) off_[k] -= strides_[k][d] * out_[d];
      idx_[d] = 0;
    }
  }

 private:
  Dims out_, idx_;
  std::vector<Dims> strides_;
  Dims off_;
};

// Copy a box of a row-major tensor (`full` shape) starting at `start` into a dense tile, or back.
template <class T>
void load_box(std::vector<T>& tile, const void* base, int32_t dtype, const Dims& full,
              const Dims& start, const Dims& box) {
  tile.resize(static_cast<size_t>(numel(box)));
  if (tile.empty()) return;
  Dims strides(full.size(), 1);
  for (size_t d = full.size(); d-- > 1;) strides[d - 1] = strides[d] * full[d];
  Dims idx(box.size(), 0);
  for (size_t e = 0; e < tile.size(); ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < box.size(); ++d) off += (start[d] + idx[d]) * strides[d];
    load_into(tile[e], base, dtype, off);
    for (size_t d = box.size(); d-- > 0;) {
      if (++idx[d] < box[d]) break;
      idx[d] = 0;
    }
  }
}

// f(e, offset) for the first n elements of a box at `start` of a row-major tensor of shape
// `full`, e counting the box's elements row-major.
template <class F>
void walk_box(const Dims& full, const Dims& start, const Dims& box, size_t n, F&& f) {
  Dims strides(full.size(), 1);
  for (size_t d = full.size(); d-- > 1;) strides[d - 1] = strides[d] * full[d];
  Dims idx(box.size(), 0);
  for (size_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < box.size(); ++d) off += (start[d] + idx[d]) * strides[d];
    f(e, off);
    for (size_t d = box.size(); d-- > 0;) {
      if (++idx[d] < box[d]) break;
      idx[d] = 0;
    }
  }
}

template <class T>
void store_box(void* base, int32_t dtype, const Dims& full, const Dims& start, const Dims& box,
               const std::vector<T>& tile) {
  walk_box(full, start, box, tile.size(),
           [&](size_t e, int64_t off) { store_elem(base, dtype, off, tile[e]); });
}

// Adds `v` to the f32 at `p` atomically: the blocks of an accumulating output add at once.
inline void atomic_add_f32(float* p, float v) {
  uint32_t* word = reinterpret_cast<uint32_t*>(p);
  uint32_t old = __atomic_load_n(word, __ATOMIC_RELAXED);
  for (;;) {
    float f;
    std::memcpy(&f, &old, sizeof f);
    f += v;
    uint32_t next;
    std::memcpy(&next, &f, sizeof next);
    if (__atomic_compare_exchange_n(word, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      return;
    }
  }
}

// A tile added into the box at `start` of an f32 tensor (an accumulating output).
template <class T>
void add_box(float* base, const Dims& full, const Dims& start, const Dims& box,
             const std::vector<T>& tile) {
  walk_box(full, start, box, tile.size(), [&](size_t e, int64_t off) {
    atomic_add_f32(base + off, static_cast<float>(tile[e]));
  });
}

template <class T>
void load_all(std::vector<T>& t, const void* base, int32_t dtype, const Dims& shape) {
  load_box(t, base, dtype, shape, Dims(shape.size(), 0), shape);
}

// The part of a whole tensor `t` (shape `full`) inside a box, stored at the box's place.
template <class T>
void store_region(void* base, int32_t dtype, const Dims& full, const Dims& start, const Dims& box,
                  const std::vector<T>& t) {
  Dims strides(full.size(), 1);
  for (size_t d = full.size(); d-- > 1;) strides[d - 1] = strides[d] * full[d];
  Dims idx(box.size(), 0);
  for (int64_t e = 0; e < numel(box); ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < box.size(); ++d) off += (start[d] + idx[d]) * strides[d];
    store_elem(base, dtype, off, t[static_cast<size_t>(off)]);
    for (size_t d = box.size(); d-- > 0;) {
      if (++idx[d] < box[d]) break;
      idx[d] = 0;
    }
  }
}

inline std::vector<float> as_float(const std::vector<int64_t>& t) {
  return std::vector<float>(t.begin(), t.end());
}

// Global positions along `dim` of a tile whose first element along it is at `start`.
inline void position_tile(std::vector<int64_t>& out, const Dims& shape, int64_t dim, int64_t start) {
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  out.resize(static_cast<size_t>(numel(shape)));
  for (size_t e = 0; e < out.size(); ++e) {
    out[e] = start + (static_cast<int64_t>(e) / inner) % shape[dim];
  }
}

// `(i, j, ...)` of a flat index, as NumPy prints a tuple index.
inline std::string format_index(int64_t flat, const Dims& shape) {
  Dims idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::string s = "(";
  for (size_t d = 0; d < idx.size(); ++d) {
    s += std::to_string(idx[d]);
    s += d + 1 < idx.size() || idx.size() == 1 ? "," : "";
    if (d + 1 < idx.size()) s += " ";
  }
  return s + ")";
}

// ------------------------------------------------------------------------------------------
// Elementwise math as the interpreters define it
// ------------------------------------------------------------------------------------------

inline float nan_max(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
inline float nan_min(float a, float b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }

inline float sigmoid(float x) {
  const float e = std::exp(-std::fabs(x));
  return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

// The tile op's gelu: float32 steps, erf through double.
inline float gelu_tile(float x) {
  const float u = x / static_cast<float>(std::sqrt(2.0));
  const float erf_u = static_cast<float>(std::erf(static_cast<double>(u)));
  return 0.5f * x * (1.0f + erf_u);
}

// The nn kernel's gelu: all in double, rounded once.
inline float gelu_nn(float x) {
  const double d = x;
  return static_cast<float>(0.5 * d * (1.0 + std::erf(d / std::sqrt(2.0))));
}

enum Unary : int32_t {
  U_EXP, U_SQRT, U_RSQRT, U_SQUARE, U_NEG, U_RELU, U_SIGMOID, U_SILU, U_GELU, U_RECIP, U_SCALE,
  U_CAST, U_GELU_NN,
};

inline float unary(int32_t kind, float x, float factor) {
  switch (kind) {
    case U_EXP: return std::exp(x);
    case U_SQRT: return std::sqrt(x);
    case U_RSQRT: return 1.0f / std::sqrt(x);
    case U_SQUARE: return x * x;
    case U_NEG: return -x;
    case U_RELU: return nan_max(x, 0.0f);
    case U_SIGMOID: return sigmoid(x);
    case U_SILU: return x * sigmoid(x);
    case U_GELU: return gelu_tile(x);
    case U_RECIP: return 1.0f / x;
    case U_SCALE: return x * factor;
    case U_GELU_NN: return gelu_nn(x);
    default: return x;
  }
}

enum Binary : int32_t { B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN };

inline float binary(int32_t kind, float a, float b) {
  switch (kind) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_MAX: return nan_max(a, b);
    default: return nan_min(a, b);
  }
}

template <class T>
void unary_tile(std::vector<T>& out, const std::vector<float>& x, int32_t kind, float factor) {
  out.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = from_float<T>(unary(kind, x[i], factor));
}
inline void unary_tile(std::vector<float>& out, const std::vector<float>& x, int32_t kind,
                       float factor) {
  out.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = unary(kind, x[i], factor);
}

inline void binary_tile(std::vector<float>& out, const Dims& oshape, const std::vector<float>& a,
                        const Dims& ashape, const std::vector<float>& b, const Dims& bshape,
                        int32_t kind) {
  out.resize(static_cast<size_t>(numel(oshape)));
  Walk w(oshape, {ashape, bshape});
  for (size_t e = 0; e < out.size(); ++e, w.next()) out[e] = binary(kind, a[w.at(0)], b[w.at(1)]);
}

// ------------------------------------------------------------------------------------------
// Reductions, matmul, norms
// ------------------------------------------------------------------------------------------

enum Reduce : int32_t { R_SUM, R_MAX, R_MEAN };

// Reduce `x` (shape) along `dim`; the result is dense in the remaining dims (keepdim or not).
inline void reduce_tile(std::vector<float>& out, const std::vector<float>& x, const Dims& shape,
                        int64_t dim, int32_t kind) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[dim];
  out.assign(static_cast<size_t>(outer * inner), 0.0f);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const float* p = x.data() + o * n * inner + i;
      float r;
      if (kind == R_MAX) {
        r = n ? p[0] : -INFINITY;
        for (int64_t k = 1; k < n; ++k) r = nan_max(r, p[k * inner]);
      } else {
        double s = 0;
        for (int64_t k = 0; k < n; ++k) s += p[k * inner];
        r = static_cast<float>(s);
        if (kind == R_MEAN) r = r / static_cast<float>(n);
      }
      out[o * inner + i] = r;
    }
  }
}

// a[..., m, k] x b[..., k, n] (b[..., n, k] with transpose_b), batch dims broadcast.
inline void matmul_tile(std::vector<float>& out, const Dims& oshape, const std::vector<float>& a,
                        const Dims& ashape, const std::vector<float>& b, const Dims& bshape,
                        bool transpose_b, bool skip_zero_a = false) {
  const int64_t m = ashape[ashape.size() - 2], k = ashape.back();
  const int64_t n = transpose_b ? bshape[bshape.size() - 2] : bshape.back();
  const Dims obatch(oshape.begin(), oshape.end() - 2);
  const Dims abatch(ashape.begin(), ashape.end() - 2), bbatch(bshape.begin(), bshape.end() - 2);
  const int64_t batches = numel(obatch);
  out.assign(static_cast<size_t>(numel(oshape)), 0.0f);
  Walk w(obatch, {abatch, bbatch});
  for (int64_t bi = 0; bi < batches; ++bi, w.next()) {
    const float* pa = a.data() + w.at(0) * m * k;
    const float* pb = b.data() + w.at(1) * k * n;
    float* po = out.data() + bi * m * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) {
          if (skip_zero_a && pa[i * k + q] == 0.0f) continue;
          s += static_cast<double>(pa[i * k + q]) * (transpose_b ? pb[j * k + q] : pb[q * n + j]);
        }
        po[i * n + j] = static_cast<float>(s);
      }
    }
  }
}

// x / sqrt(mean(x^2, -1) + eps) * g, float32 steps; g broadcasts against x.
inline void rms_norm_tile(std::vector<float>& out, const Dims& oshape, const std::vector<float>& x,
                          const Dims& xshape, const std::vector<float>& g, const Dims& gshape,
                          float eps) {
  const int64_t h = xshape.empty() ? 1 : xshape.back();
  std::vector<float> normed(x.size());
  for (size_t r = 0; r < x.size() / static_cast<size_t>(h); ++r) {
    double s = 0;
    for (int64_t c = 0; c < h; ++c) {
      const float sq = x[r * h + c] * x[r * h + c];
      s += sq;
    }
    const float mean = static_cast<float>(s) / static_cast<float>(h);
    const float root = std::sqrt(mean + eps);
    for (int64_t c = 0; c < h; ++c) normed[r * h + c] = x[r * h + c] / root;
  }
  binary_tile(out, oshape, normed, xshape, g, gshape, B_MUL);
}

// Concatenate dense parts along `dim`; `shapes[i]` is part i's shape.
template <class T>
void concat_tile(std::vector<T>& out, const std::vector<const std::vector<T>*>& parts,
                 const std::vector<Dims>& shapes, int64_t dim) {
  int64_t outer = 1, inner = 1, total = 0;
  for (int64_t d = 0; d < dim; ++d) outer *= shapes[0][d];
  for (size_t d = dim + 1; d < shapes[0].size(); ++d) inner *= shapes[0][d];
  for (const Dims& s : shapes) total += s[dim];
  out.resize(static_cast<size_t>(outer * total * inner));
  int64_t at = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const int64_t len = shapes[p][dim] * inner;
    for (int64_t o = 0; o < outer; ++o) {
      std::copy(parts[p]->begin() + o * len, parts[p]->begin() + (o + 1) * len,
                out.begin() + o * total * inner + at);
    }
    at += len;
  }
}

// Max along `dim` and the payload at its first occurrence (NaN counts as the maximum).
template <class P>
void argmax_tile(std::vector<float>& vmax, std::vector<P>& arg, const std::vector<float>& v,
                 const std::vector<P>& payload, const Dims& shape, int64_t dim) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[dim];
  vmax.assign(static_cast<size_t>(outer * inner), 0.0f);
  arg.assign(static_cast<size_t>(outer * inner), P());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      for (int64_t k = 0; k < n; ++k) {
        const float x = v[(o * n + k) * inner + i], y = v[(o * n + best) * inner + i];
        if (y != y) break;
        if (x != x || x > y) best = k;
      }
      vmax[o * inner + i] = v[(o * n + best) * inner + i];
      arg[o * inner + i] = payload[(o * n + best) * inner + i];
    }
  }
}

// ------------------------------------------------------------------------------------------
// Accumulators (f32 state across for-loop iterations)
// ------------------------------------------------------------------------------------------

// `mugraph.accum`: optionally square, optionally reduce the last dim, then sum or max into state.
inline void accum_update(std::vector<float>& state, const std::vector<float>& x, const Dims& xshape,
                         bool square, bool reduce_last, bool is_max) {
  std::vector<float> v(x);
  if (square) for (float& e : v) e = e * e;
  if (reduce_last) {
    std::vector<float> r;
    reduce_tile(r, v, xshape.empty() ? Dims{1} : xshape,
                xshape.empty() ? 0 : static_cast<int64_t>(xshape.size()) - 1,
                is_max ? R_MAX : R_SUM);
    v.swap(r);
  }
  for (size_t i = 0; i < state.size(); ++i) {
    state[i] = is_max ? nan_max(state[i], v[i]) : state[i] + v[i];
  }
}

// `mugraph.accum_softmax`: online softmax over scores s[..., q, kv] with values v[..., kv, d].
inline void accum_softmax_update(std::vector<float>& o, std::vector<float>& m, std::vector<float>& l,
                                 const Dims& oshape, const std::vector<float>& s, const Dims& sshape,
                                 const std::vector<float>& v, const Dims& vshape) {
  const int64_t kv = sshape.back();
  const size_t rows = m.size();
  const int64_t d = oshape.back();
  std::vector<float> p(s.size());
  for (size_t r = 0; r < rows; ++r) {
    float peak = -INFINITY;
    for (int64_t c = 0; c < kv; ++c) peak = nan_max(peak, s[r * kv + c]);
    const float m_new = nan_max(m[r], peak);
    const float shift = std::isfinite(m_new) ? m_new : 0.0f;
    const float rescale = std::exp(m[r] - shift);
    double sum = 0;
    for (int64_t c = 0; c < kv; ++c) {
      p[r * kv + c] = std::exp(s[r * kv + c] - shift);
      sum += p[r * kv + c];
    }
    l[r] = l[r] * rescale + static_cast<float>(sum);
    for (int64_t c = 0; c < d; ++c) o[r * d + c] = o[r * d + c] * rescale;
    m[r] = m_new;
  }
  // A masked key weighs exactly 0 and its value row may hold anything (NaN past kv_len): skip it.
  std::vector<float> pv;
  matmul_tile(pv, oshape, p, sshape, v, vshape, false, true);
  for (size_t i = 0; i < o.size(); ++i) o[i] = o[i] + pv[i];
}

}  // namespace cpu
}  // namespace mk

#include "mk/cpu_library.h"
