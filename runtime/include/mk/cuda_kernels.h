// Device tile kernels of the CUDA backend: the CPU reference kernels (mk/cpu_kernels.h) made
// cooperative. Every function is called by all threads of a CTA with the same arguments; each
// loops over its outputs with a stride of MK_CTA_THREADS and ends with __syncthreads(), so the next
// call sees the results. Values compute as on the CPU (float32, sums in double, bf16/f16 by
// round-to-nearest-even), so both backends agree with the NumPy interpreters.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>

#include "mk/cuda_arena.h"
#include "mk/tables.h"

namespace mk {
namespace gpu {

// The cooperative tile functions are inlined into each body. (As shared __noinline__ calls they
// made the H200 decode step twice as slow, measured.)
#define MK_COOPERATIVE __device__ inline

// ------------------------------------------------------------------------------ shapes, memory

constexpr int kMaxDims = 8;

struct Dims {
  int64_t v[kMaxDims];
  int n;
  // An explicit empty constructor, and bcast_strides below copies `out` instead of building from
  // an empty Dims: the earlier form (one variadic constructor) gave 0 for the outer stride of a
  // full-rank input when inlined under nvcc 13.0 for sm_90a (correct when not inlined), so every
  // row of an elementwise op read row 0. Kept this way; the GPU tests cover it.
  __device__ Dims() : v{}, n(0) {}
  template <class A0, class... A>
  __device__ Dims(A0 a0, A... a) : v{static_cast<int64_t>(a0), static_cast<int64_t>(a)...}, n(1 + sizeof...(A)) {}
  __device__ int size() const { return n; }
  __device__ bool empty() const { return n == 0; }
  __device__ int64_t operator[](int i) const { return v[i]; }
  __device__ int64_t back() const { return v[n - 1]; }
};

__device__ inline int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int i = 0; i < d.n; ++i) n *= d.v[i];
  return n;
}

__device__ inline Dims dims_range(const Dims& d, int begin, int end) {
  Dims r;
  for (int i = begin; i < end; ++i) r.v[r.n++] = d.v[i];
  return r;
}

// Row-major strides of `in` seen from `out` (right-aligned, 0 where `in` broadcasts).
__device__ inline Dims bcast_strides(const Dims& in, const Dims& out) {
  Dims s = out;
  int64_t stride = 1;
  for (int d = out.n - 1, di = in.n - 1; d >= 0; --d, --di) {
    if (di < 0) {
      s.v[d] = 0;
      continue;
    }
    s.v[d] = in.v[di] == 1 ? 0 : stride;
    stride *= in.v[di];
  }
  return s;
}

// Index arithmetic inside a tile runs in 32 bits (tiles hold far fewer than 2^32 elements): a
// 64-bit division is a long software routine on the GPU, and these run per element and per
// dimension. Offsets into buffers stay 64-bit.
__device__ inline uint32_t u32(int64_t x) { return static_cast<uint32_t>(x); }

// The flat offset of output element `e` (row-major in `out`) in an input with `strides`.
__device__ inline int64_t bcast_offset(int64_t e, const Dims& out, const Dims& strides) {
  int64_t off = 0;
  uint32_t r = u32(e);
  for (int d = out.n - 1; d >= 0; --d) {
    const uint32_t n = u32(out.v[d]);
    off += static_cast<int64_t>(r % n) * strides.v[d];
    r /= n;
  }
  return off;
}

template <class T>
MK_COOPERATIVE void copy_tile(Tile<T>& out, const Tile<T>& x) {
  out.resize(x.n);
  MK_FOR_EACH(e, x.n) out.p[e] = x.p[e];
  __syncthreads();
}

__device__ inline Tile<float> as_float(Arena& a, const Tile<int64_t>& t) {
  Tile<float> r(a, t.n);
  r.resize(t.n);
  MK_FOR_EACH(e, t.n) r.p[e] = static_cast<float>(t.p[e]);
  __syncthreads();
  return r;
}
__device__ inline const Tile<float>& as_float(Arena&, const Tile<float>& t) { return t; }

// ------------------------------------------------------------------------------ elements

// Round to nearest even: one cvt.rn.bf16.f32 (sm_80 on), where the rounding written out in
// integer steps was ~100 bytes of code at each of a body's conversions.
__device__ inline uint16_t f32_to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ inline float bf16_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
__device__ inline uint16_t f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ inline float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
// The 16-bit float type's bits as f32 and back (BF16: bf16, else f16), rounding to nearest.
template <bool BF16>
__device__ inline float half_bits_float(uint16_t v) {
  return BF16 ? bf16_to_f32(v) : f16_to_f32(v);
}
template <bool BF16>
__device__ inline uint16_t float_half_bits(float v) {
  return BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

// Eight bf16 (or f16) values packed in 16 bytes, as floats.
__device__ inline void unpack8(float (&f)[8], uint4 u, bool bf16) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (bf16) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      f[2 * i] = h.x;
      f[2 * i + 1] = h.y;
    }
  }
}

__device__ inline float round_to(float x, int32_t dtype) {
  switch (dtype) {
    case DTYPE_BF16: return bf16_to_f32(f32_to_bf16(x));
    case DTYPE_F16: return f16_to_f32(f32_to_f16(x));
    default: return x;
  }
}

MK_COOPERATIVE void round_tile(Tile<float>& t, int32_t dtype) {
  if (dtype != DTYPE_F32) {
    MK_FOR_EACH(e, t.n) t.p[e] = round_to(t.p[e], dtype);
  }
  __syncthreads();
}
MK_COOPERATIVE void round_tile(Tile<int64_t>&, int32_t) {}

template <class T>
__device__ inline T from_float(float x) { return static_cast<T>(x); }
template <>
__device__ inline int64_t from_float<int64_t>(float x) { return isfinite(x) ? static_cast<int64_t>(x) : 0; }

__device__ inline float load_elem_f(const void* base, int32_t dtype, int64_t i) {
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

__device__ inline int64_t load_elem_i(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case DTYPE_I32: return static_cast<const int32_t*>(base)[i];
    case DTYPE_I64: return static_cast<const int64_t*>(base)[i];
    case DTYPE_I8: return static_cast<const int8_t*>(base)[i];
    case DTYPE_U8: return static_cast<const uint8_t*>(base)[i];
    default: return from_float<int64_t>(load_elem_f(base, dtype, i));
  }
}

__device__ inline void store_elem(void* base, int32_t dtype, int64_t i, float x) {
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

__device__ inline void store_elem(void* base, int32_t dtype, int64_t i, int64_t x) {
  switch (dtype) {
    case DTYPE_I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(x); break;
    case DTYPE_I64: static_cast<int64_t*>(base)[i] = x; break;
    case DTYPE_I8: static_cast<int8_t*>(base)[i] = static_cast<int8_t>(x); break;
    case DTYPE_U8: static_cast<uint8_t*>(base)[i] = x != 0; break;
    default: store_elem(base, dtype, i, static_cast<float>(x)); break;
  }
}

__device__ inline void load_into(float& dst, const void* base, int32_t dtype, int64_t i) { dst = load_elem_f(base, dtype, i); }
__device__ inline void load_into(int64_t& dst, const void* base, int32_t dtype, int64_t i) { dst = load_elem_i(base, dtype, i); }

MK_COOPERATIVE void position_tile(Tile<int64_t>& out, const Dims& shape, int64_t dim, int64_t start) {
  int64_t inner = 1;
  for (int d = dim + 1; d < shape.n; ++d) inner *= shape.v[d];
  out.resize(numel(shape));
  MK_FOR_EACH(e, out.n) out.p[e] = start + (u32(e) / u32(inner)) % u32(shape.v[dim]);
  __syncthreads();
}

// ------------------------------------------------------------------------------ elementwise

// NaN if either is (as NumPy's maximum and minimum): one instruction since sm_80.
__device__ inline float nan_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ inline float nan_min(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ inline float sigmoid(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
__device__ inline float gelu_tile(float x) {
  const float u = x / static_cast<float>(sqrt(2.0));
  return 0.5f * x * (1.0f + static_cast<float>(erf(static_cast<double>(u))));
}
__device__ inline float gelu_nn(float x) {
  const double d = x;
  return static_cast<float>(0.5 * d * (1.0 + erf(d / sqrt(2.0))));
}

enum Unary : int32_t {
  U_EXP, U_SQRT, U_RSQRT, U_SQUARE, U_NEG, U_RELU, U_SIGMOID, U_SILU, U_GELU, U_RECIP, U_SCALE,
  U_CAST, U_GELU_NN,
};

__device__ inline float unary(int32_t kind, float x, float factor) {
  switch (kind) {
    case U_EXP: return expf(x);
    case U_SQRT: return sqrtf(x);
    case U_RSQRT: return 1.0f / sqrtf(x);
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

__device__ inline float binary(int32_t kind, float a, float b) {
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
MK_COOPERATIVE void unary_tile(Tile<T>& out, const Tile<float>& x, int32_t kind, float factor) {
  out.resize(x.n);
  MK_FOR_EACH(i, x.n) out.p[i] = from_float<T>(unary(kind, x.p[i], factor));
  __syncthreads();
}

MK_COOPERATIVE void binary_tile(Tile<float>& out, const Dims& oshape, const Tile<float>& a,
                                   const Dims& ashape, const Tile<float>& b, const Dims& bshape,
                                   int32_t kind) {
  out.resize(numel(oshape));
  const Dims sa = bcast_strides(ashape, oshape), sb = bcast_strides(bshape, oshape);
  MK_FOR_EACH(e, out.n) {
    out.p[e] = binary(kind, a.p[bcast_offset(e, oshape, sa)], b.p[bcast_offset(e, oshape, sb)]);
  }
  __syncthreads();
}

// ------------------------------------------------------------------------------ reductions

enum Reduce : int32_t { R_SUM, R_MAX, R_MEAN };

__device__ inline float reduce_line(const float* p, int64_t n, int64_t inner, int32_t kind, bool square) {
  if (kind == R_MAX) {
    float r = n ? (square ? p[0] * p[0] : p[0]) : -INFINITY;
    for (int64_t k = 1; k < n; ++k) r = nan_max(r, square ? p[k * inner] * p[k * inner] : p[k * inner]);
    return r;
  }
  double s = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float x = square ? p[k * inner] * p[k * inner] : p[k * inner];
    s += x;
  }
  float r = static_cast<float>(s);
  if (kind == R_MEAN) r = r / static_cast<float>(n);
  return r;
}

__device__ inline void outer_inner(const Dims& shape, int64_t dim, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int64_t d = 0; d < dim; ++d) *outer *= shape.v[d];
  for (int d = dim + 1; d < shape.n; ++d) *inner *= shape.v[d];
}

MK_COOPERATIVE void reduce_tile(Tile<float>& out, const Tile<float>& x, const Dims& shape,
                                   int64_t dim, int32_t kind) {
  int64_t outer, inner;
  outer_inner(shape, dim, &outer, &inner);
  const int64_t n = shape.v[dim];
  out.resize(outer * inner);
  MK_FOR_EACH(e, out.n) {
    const int64_t o = u32(e) / u32(inner), i = u32(e) % u32(inner);
    out.p[e] = reduce_line(x.p + o * n * inner + i, n, inner, kind, false);
  }
  __syncthreads();
}

MK_COOPERATIVE void matmul_tile(Tile<float>& out, const Dims& oshape, const Tile<float>& a,
                                   const Dims& ashape, const Tile<float>& b, const Dims& bshape,
                                   bool transpose_b, bool skip_zero_a = false) {
  const int64_t m = ashape.v[ashape.n - 2], k = ashape.back();
  const int64_t n = transpose_b ? bshape.v[bshape.n - 2] : bshape.back();
  const Dims obatch = dims_range(oshape, 0, oshape.n - 2);
  const Dims sa = bcast_strides(dims_range(ashape, 0, ashape.n - 2), obatch);
  const Dims sb = bcast_strides(dims_range(bshape, 0, bshape.n - 2), obatch);
  out.resize(numel(oshape));
  MK_FOR_EACH(e, out.n) {
    const int64_t bi = u32(e) / u32(m * n), i = (u32(e) / u32(n)) % u32(m), j = u32(e) % u32(n);
    const float* pa = a.p + bcast_offset(bi, obatch, sa) * m * k;
    const float* pb = b.p + bcast_offset(bi, obatch, sb) * k * n;
    double s = 0;
    for (int64_t q = 0; q < k; ++q) {
      if (skip_zero_a && pa[i * k + q] == 0.0f) continue;
      s += static_cast<double>(pa[i * k + q]) * (transpose_b ? pb[j * k + q] : pb[q * n + j]);
    }
    out.p[e] = static_cast<float>(s);
  }
  __syncthreads();
}

MK_COOPERATIVE void rms_norm_tile(Tile<float>& out, const Dims& oshape, const Tile<float>& x,
                                     const Dims& xshape, const Tile<float>& g, const Dims& gshape,
                                     float eps, Arena& arena) {
  const int64_t h = xshape.empty() ? 1 : xshape.back();
  const ArenaMark mark = arena.mark();
  Tile<float> normed(arena, x.n);
  normed.resize(x.n);
  const int64_t rows = x.n / h;
  if (rows <= MK_CTA_THREADS / 32 && h >= 64) {  // few long rows: a warp per row
    const int64_t r = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r < rows) {
      double s = 0;
      for (int64_t c = lane; c < h; c += 32) {
        const float sq = x.p[r * h + c] * x.p[r * h + c];
        s += sq;
      }
      for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
      const float root = sqrtf(static_cast<float>(s) / static_cast<float>(h) + eps);
      for (int64_t c = lane; c < h; c += 32) normed.p[r * h + c] = x.p[r * h + c] / root;
    }
  } else {
    MK_FOR_EACH(r, rows) {
      double s = 0;
      for (int64_t c = 0; c < h; ++c) {
        const float sq = x.p[r * h + c] * x.p[r * h + c];
        s += sq;
      }
      const float root = sqrtf(static_cast<float>(s) / static_cast<float>(h) + eps);
      for (int64_t c = 0; c < h; ++c) normed.p[r * h + c] = x.p[r * h + c] / root;
    }
  }
  __syncthreads();
  binary_tile(out, oshape, normed, xshape, g, gshape, B_MUL);
  arena.reset(mark);
}

// rms_norm_tile for rows of H elements (a multiple of 32) and a norm weight of H, a row per
// warp (kManyRows: the warps walk any number of rows, a prefill's): the arithmetic of its
// warp-per-row path (squares summed in double), with the sizes known to the compiler, so a
// per-head norm (QK-norm) is a few hundred bytes of code instead of the generic shape walk and
// broadcast multiply.
template <int H, bool kManyRows = false>
MK_COOPERATIVE void rms_norm_rows(Tile<float>& out, const Tile<float>& x, const Tile<float>& g,
                                  int rows, float eps) {
  static_assert(H % 32 == 0, "rms_norm_rows: rows of a multiple of 32");
  out.resize(x.n);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  auto row = [&](int r) {
    double s = 0;
#pragma unroll
    for (int c = lane; c < H; c += 32) {
      const float sq = x.p[r * H + c] * x.p[r * H + c];
      s += sq;
    }
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    const float inv = 1.0f / sqrtf(static_cast<float>(s) / static_cast<float>(H) + eps);
#pragma unroll
    for (int c = lane; c < H; c += 32) out.p[r * H + c] = x.p[r * H + c] * inv * g.p[c];
  };
  if constexpr (kManyRows) {
    for (int r = warp; r < rows; r += kCudaThreads / 32) row(r);
  } else if (warp < rows) {
    row(warp);
  }
  __syncthreads();
}

template <class T, int N>
MK_COOPERATIVE void concat_tile(Tile<T>& out, const Tile<T>* const (&parts)[N], const Dims (&shapes)[N],
                            int64_t dim) {
  int64_t outer, inner, total = 0;
  outer_inner(shapes[0], dim, &outer, &inner);
  for (int p = 0; p < N; ++p) total += shapes[p].v[dim];
  out.resize(outer * total * inner);
  MK_FOR_EACH(e, out.n) {
    const int64_t o = u32(e) / u32(total * inner);
    int64_t at = u32(e) % u32(total * inner);
    for (int p = 0; p < N; ++p) {
      const int64_t len = shapes[p].v[dim] * inner;
      if (at < len) {
        out.p[e] = parts[p]->p[o * len + at];
        break;
      }
      at -= len;
    }
  }
  __syncthreads();
}

// Whether candidate (x, kx) beats (y, ky) under argmax's rule: the first NaN, else the largest
// value, ties to the lower index (what the sequential scan below picks).
__device__ inline bool argmax_better(float x, int64_t kx, float y, int64_t ky) {
  const bool xn = x != x, yn = y != y;
  if (xn || yn) return xn && (!yn || kx < ky);
  return x > y || (x == y && kx < ky);
}

// argmax_tile for few, long lines: each line gets the CTA's warps / lines warps (at batch 1 an
// lm_head epilogue's one line gets all eight, not one warp while seven idle); a warp's lanes
// stride over its share and a butterfly of shuffles combines them, then the first warp of a
// line combines its warps' bests through shared memory, lowest share first.
__device__ inline void argmax_combine(float& bv, long long& bk, float ov, long long ok) {
  if (ok >= 0 && (bk < 0 || argmax_better(ov, ok, bv, bk))) {
    bv = ov;
    bk = ok;
  }
}

template <class P>
MK_COOPERATIVE void argmax_lines_by_warp(Tile<float>& vmax, Tile<P>& arg, const Tile<float>& v,
                                     const Tile<P>& payload, int64_t outer, int64_t inner,
                                     int64_t n) {
  constexpr int kMaxWarps = 32;
  __shared__ float share_v[kMaxWarps];
  __shared__ long long share_k[kMaxWarps];
  const int64_t warps = MK_CTA_THREADS / 32, lines = outer * inner;
  const int64_t per_line = warps / lines;  // >= 1: argmax_tile takes this path only then
  const int64_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t line = warp / per_line, part = warp % per_line;
  const int64_t o = line / inner, i = line % inner;
  float bv = 0.0f;
  long long bk = -1;
  if (line < lines) {
    for (int64_t k = part * 32 + lane; k < n; k += 32 * per_line) {
      argmax_combine(bv, bk, v.p[(o * n + k) * inner + i], k);
    }
    for (int s = 16; s > 0; s >>= 1) {
      argmax_combine(bv, bk, __shfl_xor_sync(0xffffffffu, bv, s), __shfl_xor_sync(0xffffffffu, bk, s));
    }
    if (lane == 0) {
      share_v[warp] = bv;
      share_k[warp] = bk;
    }
  }
  __syncthreads();
  if (line < lines && part == 0 && lane == 0) {
    for (int64_t w = warp + 1; w < warp + per_line; ++w) argmax_combine(bv, bk, share_v[w], share_k[w]);
    vmax.p[line] = v.p[(o * n + bk) * inner + i];
    arg.p[line] = payload.p[(o * n + bk) * inner + i];
  }
  __syncthreads();
}

template <class P>
MK_COOPERATIVE void argmax_tile(Tile<float>& vmax, Tile<P>& arg, const Tile<float>& v,
                            const Tile<P>& payload, const Dims& shape, int64_t dim) {
  int64_t outer, inner;
  outer_inner(shape, dim, &outer, &inner);
  const int64_t n = shape.v[dim];
  vmax.resize(outer * inner);
  arg.resize(outer * inner);
  if (outer * inner <= MK_CTA_THREADS / 32 && n >= 64) {  // few long lines: a warp per line
    argmax_lines_by_warp(vmax, arg, v, payload, outer, inner, n);
    return;
  }
  MK_FOR_EACH(e, outer * inner) {
    const int64_t o = u32(e) / u32(inner), i = u32(e) % u32(inner);
    int64_t best = 0;
    for (int64_t k = 0; k < n; ++k) {
      const float x = v.p[(o * n + k) * inner + i], y = v.p[(o * n + best) * inner + i];
      if (y != y) break;
      if (x != x || x > y) best = k;
    }
    vmax.p[e] = v.p[(o * n + best) * inner + i];
    arg.p[e] = payload.p[(o * n + best) * inner + i];
  }
  __syncthreads();
}

// ------------------------------------------------------------------------------ accumulators

MK_COOPERATIVE void accum_update(Tile<float>& state, const Tile<float>& x, const Dims& xshape,
                                    bool square, bool reduce_last, bool is_max) {
  const int64_t h = reduce_last && !xshape.empty() ? xshape.back() : 1;
  MK_FOR_EACH(i, state.n) {
    float v;
    if (reduce_last) {
      v = reduce_line(x.p + i * h, h, 1, is_max ? R_MAX : R_SUM, square);
    } else {
      v = square ? x.p[i] * x.p[i] : x.p[i];
    }
    state.p[i] = is_max ? nan_max(state.p[i], v) : state.p[i] + v;
  }
  __syncthreads();
}

MK_COOPERATIVE void accum_softmax_update(Tile<float>& o, Tile<float>& m, Tile<float>& l,
                                            const Dims& oshape, const Tile<float>& s,
                                            const Dims& sshape, const Tile<float>& v,
                                            const Dims& vshape, Arena& arena) {
  const int64_t kv = sshape.back(), d = oshape.back();
  const ArenaMark mark = arena.mark();
  Tile<float> p(arena, s.n), pv(arena, o.n);
  p.resize(s.n);
  MK_FOR_EACH(r, m.n) {
    float peak = -INFINITY;
    for (int64_t c = 0; c < kv; ++c) peak = nan_max(peak, s.p[r * kv + c]);
    const float m_new = nan_max(m.p[r], peak);
    const float shift = isfinite(m_new) ? m_new : 0.0f;
    const float rescale = expf(m.p[r] - shift);
    double sum = 0;
    for (int64_t c = 0; c < kv; ++c) {
      p.p[r * kv + c] = expf(s.p[r * kv + c] - shift);
      sum += p.p[r * kv + c];
    }
    l.p[r] = l.p[r] * rescale + static_cast<float>(sum);
    for (int64_t c = 0; c < d; ++c) o.p[r * d + c] = o.p[r * d + c] * rescale;
    m.p[r] = m_new;
  }
  __syncthreads();
  // A masked key weighs exactly 0 and its value row may hold anything (NaN past kv_len): skip it.
  matmul_tile(pv, oshape, p, sshape, v, vshape, false, true);
  MK_FOR_EACH(i, o.n) o.p[i] = o.p[i] + pv.p[i];
  __syncthreads();
  arena.reset(mark);
}

template <class A, class B>
__device__ inline auto imax(A a, B b) { return a > b ? a : b; }
template <class A, class B>
__device__ inline auto imin(A a, B b) { return a < b ? a : b; }

MK_COOPERATIVE void div_tile(Tile<float>& t, float d) {
  MK_FOR_EACH(i, t.n) t.p[i] = t.p[i] / d;
  __syncthreads();
}

}  // namespace gpu
}  // namespace mk

#include "mk/cuda_boxes.h"
#include "mk/cuda_library.h"
