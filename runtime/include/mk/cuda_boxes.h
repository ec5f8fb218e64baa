// Boxes of buffers in and out of tiles: generic shapes walked at run time (load_box, store_box,
// store_region) and runs whose shape and dtype the emitter resolved (load_runs, *_run_elem).
#pragma once

#include <stdint.h>

#include <type_traits>

#include "mk/cuda_kernels.h"

namespace mk {
namespace gpu {

// Offset in a row-major tensor of shape `full` of element `e` of a box at `start`.
__device__ inline int64_t box_offset(int64_t e, const Dims& full, const Dims& start, const Dims& box) {
  int64_t off = 0, stride = 1;
  uint32_t r = u32(e);
  for (int d = box.n - 1; d >= 0; --d) {
    const uint32_t n = u32(box.v[d]);
    off += (start.v[d] + r % n) * stride;
    r /= n;
    stride *= full.v[d];
  }
  return off;
}

// The unsigned integer of `Bytes` bytes: an element copied as it is.
template <int Bytes>
using ElemBits = typename std::conditional<
    Bytes == 1, uint8_t,
    typename std::conditional<Bytes == 2, uint16_t,
                              typename std::conditional<Bytes == 4, uint32_t, uint64_t>::type>::type>::type;

// A box of `src` (shape `full`, elements of `Bytes` bytes) into the whole buffer `out`, each
// element read where the box has it: a slice without a tile of all of its source in between.
template <int Bytes>
__device__ inline void slice_copy(void* out, const void* src, const Dims& full, const Dims& start,
                                  const Dims& box) {
  using Elem = ElemBits<Bytes>;
  int64_t n = 1;
  for (int d = 0; d < box.n; ++d) n *= box.v[d];
  MK_FOR_EACH(e, n) {
    static_cast<Elem*>(out)[e] = static_cast<const Elem*>(src)[box_offset(e, full, start, box)];
  }
  __syncthreads();
}

// n elements of `Bytes` each from runs of `src` (s_cols elements every s_ld from s_first) into
// runs of `dst`, element e to element e: 16-byte units where both sides' runs and starts keep
// them whole and aligned; else element by element. A graph_def that only copies
// (backends/cuda/copy_runs.py); the megakernel's barrier follows. A unit a thread at a time:
// with four loads in flight a thread here, ptxas spilled the prefill's gemm and attention
// bodies (every body shares the megakernel's registers), and qwen3-0.6b's prefill of 999
// positions ran 11.62 -> 12.66 ms on the H200 (bench/RESULTS.md, session 57).
template <int Bytes>
__device__ inline void copy_runs(void* dst, int64_t d_first, int64_t d_cols, int64_t d_ld,
                                 const void* src, int64_t s_first, int64_t s_cols, int64_t s_ld,
                                 int64_t n) {
  constexpr int V = 16 / Bytes;
  const auto d_at = [&](int64_t e) { return d_first + (e / d_cols) * d_ld + e % d_cols; };
  const auto s_at = [&](int64_t e) { return s_first + (e / s_cols) * s_ld + e % s_cols; };
  const bool vec = n % V == 0 && d_cols % V == 0 && s_cols % V == 0 && d_ld % V == 0 &&
                   s_ld % V == 0 && d_first % V == 0 && s_first % V == 0 &&
                   ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0;
  if (vec) {
    MK_FOR_EACH(v, n / V) {
      static_cast<uint4*>(dst)[d_at(v * V) / V] = static_cast<const uint4*>(src)[s_at(v * V) / V];
    }
    return;
  }
  using Elem = ElemBits<Bytes>;
  MK_FOR_EACH(e, n) static_cast<Elem*>(dst)[d_at(e)] = static_cast<const Elem*>(src)[s_at(e)];
}

// A graph_def that only normalises rows (backends/cuda/norm_runs.py): `rows` rows of H 16-bit
// floats, row r at src[s_first + r * s_ld], into dst[d_first + r * d_ld], each x / root · g
// rounded to the type, root = sqrt(mean(x²) + eps) with the squares summed in double: the
// arithmetic of rms_norm_rows, without its f32 tiles. A warp a row: where H is a multiple of 256
// (up to 4,096) and every row and g are 16-byte aligned, a lane holds its H / 256 units of the
// row in registers (one round trip in, one out); else it walks the row twice. (Through tiles, a
// prefill's norm of 9 rows of 1,024 took ~20 us a task on the H200, session 47.)
template <int H, bool BF16>
__device__ inline void rms_norm_runs(void* dst, int64_t d_first, int64_t d_ld, const void* src,
                                     int64_t s_first, int64_t s_ld, const void* g, int rows,
                                     float eps) {
  static_assert(H % 32 == 0, "rms_norm_runs: rows of a multiple of 32");
  constexpr int U = H % 256 == 0 && H <= 4096 ? H / 256 : 0;
  const uint16_t* const x = static_cast<const uint16_t*>(src);
  uint16_t* const y = static_cast<uint16_t*>(dst);
  const uint16_t* const w = static_cast<const uint16_t*>(g);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const bool vec = U > 0 && (s_first | s_ld | d_first | d_ld) % 8 == 0 &&
                   ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y) |
                     reinterpret_cast<uintptr_t>(w)) & 15) == 0;
  auto root_of = [&](double s) {
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    return sqrtf(static_cast<float>(s) / static_cast<float>(H) + eps);
  };
  for (int r = static_cast<int>(threadIdx.x >> 5); r < rows; r += static_cast<int>(blockDim.x >> 5)) {
    const uint16_t* const in = x + s_first + r * s_ld;
    uint16_t* const out = y + d_first + r * d_ld;
    if constexpr (U > 0) {
      if (vec) {
        uint4 v[U];
#pragma unroll
        for (int j = 0; j < U; ++j) v[j] = reinterpret_cast<const uint4*>(in)[j * 32 + lane];
        double s = 0;
#pragma unroll
        for (int j = 0; j < U; ++j) {
          const uint16_t* h = reinterpret_cast<const uint16_t*>(&v[j]);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float f = half_bits_float<BF16>(h[e]);
            const float sq = f * f;
            s += sq;
          }
        }
        const float root = root_of(s);
#pragma unroll
        for (int j = 0; j < U; ++j) {
          const uint4 gv = reinterpret_cast<const uint4*>(w)[j * 32 + lane];
          const uint16_t* gh = reinterpret_cast<const uint16_t*>(&gv);
          uint16_t* h = reinterpret_cast<uint16_t*>(&v[j]);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            h[e] = float_half_bits<BF16>(half_bits_float<BF16>(h[e]) / root * half_bits_float<BF16>(gh[e]));
          }
          reinterpret_cast<uint4*>(out)[j * 32 + lane] = v[j];
        }
        continue;
      }
    }
    double s = 0;
    for (int c = lane; c < H; c += 32) {
      const float f = half_bits_float<BF16>(in[c]);
      const float sq = f * f;
      s += sq;
    }
    const float root = root_of(s);
    for (int c = lane; c < H; c += 32) {
      out[c] = float_half_bits<BF16>(half_bits_float<BF16>(in[c]) / root * half_bits_float<BF16>(w[c]));
    }
  }
}

// rms_norm_runs followed by RoPE (cat(n1 cos - n2 sin, n2 cos + n1 sin) over the row's halves,
// the normalised row unrounded in between, as rms_norm_rows then rope_rows): a QK-norm's rows.
// cos_rows and sin_rows are 16-bit tables from t_first, one row of D/2 for every row
// (kRowTables: row r takes table row r % positions, a prefill's positions) or one row for all.
// A warp a row, a lane the same D/64 elements of each half, so a rotated pair stays in one lane.
template <int D, bool BF16, bool kRowTables>
__device__ inline void rms_norm_rope_runs(void* dst, int64_t d_first, int64_t d_ld, const void* src,
                                          int64_t s_first, int64_t s_ld, const void* g,
                                          const void* cos_rows, const void* sin_rows,
                                          int64_t t_first, int rows, int positions, float eps) {
  static_assert(D % 64 == 0, "rms_norm_rope_runs: halves of a multiple of 32");
  constexpr int kHalf = D / 2, E = kHalf / 32;
  const uint16_t* const x = static_cast<const uint16_t*>(src);
  uint16_t* const y = static_cast<uint16_t*>(dst);
  const uint16_t* const w = static_cast<const uint16_t*>(g);
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int r = static_cast<int>(threadIdx.x >> 5); r < rows; r += static_cast<int>(blockDim.x >> 5)) {
    const uint16_t* const in = x + s_first + r * s_ld;
    float a[E], b[E];  // the lane's elements of the first and the second half
    double s = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      a[e] = half_bits_float<BF16>(in[lane * E + e]);
      b[e] = half_bits_float<BF16>(in[kHalf + lane * E + e]);
      const float sa = a[e] * a[e], sb = b[e] * b[e];
      s += sa;
      s += sb;
    }
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    const float root = sqrtf(static_cast<float>(s) / static_cast<float>(D) + eps);
    const int64_t t = t_first + (kRowTables ? (r % positions) * kHalf : 0);
    uint16_t* const out = y + d_first + r * d_ld;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int j = lane * E + e;
      const float n1 = a[e] / root * half_bits_float<BF16>(w[j]);
      const float n2 = b[e] / root * half_bits_float<BF16>(w[kHalf + j]);
      const float c = half_bits_float<BF16>(static_cast<const uint16_t*>(cos_rows)[t + j]);
      const float sn = half_bits_float<BF16>(static_cast<const uint16_t*>(sin_rows)[t + j]);
      out[j] = float_half_bits<BF16>(n1 * c - n2 * sn);
      out[kHalf + j] = float_half_bits<BF16>(n2 * c + n1 * sn);
    }
  }
}

// Whether a box's elements are one contiguous run of `full` (every dim inside its outermost
// partial dim spans the whole extent, every dim outside it is 1), and where the run starts.
__device__ inline bool box_run(const Dims& full, const Dims& start, const Dims& box, int64_t* first) {
  bool run = true, partial = false;
  int64_t off = 0, stride = 1;
  for (int d = box.n - 1; d >= 0; --d) {
    if (partial) {
      run = run && box.v[d] == 1;
    } else if (box.v[d] != full.v[d]) {
      partial = true;
    }
    off += start.v[d] * stride;
    stride *= full.v[d];
  }
  *first = off;
  return run;
}

template <class T>
MK_COOPERATIVE void load_box(Tile<T>& tile, const void* base, int32_t dtype, const Dims& full,
                         const Dims& start, const Dims& box) {
  tile.resize(numel(box));
  int64_t first = 0;
  if (box_run(full, start, box, &first)) {
    MK_FOR_EACH(e, tile.n) load_into(tile.p[e], base, dtype, first + e);
  } else {
    MK_FOR_EACH(e, tile.n) load_into(tile.p[e], base, dtype, box_offset(e, full, start, box));
  }
  __syncthreads();
}

template <class T>
MK_COOPERATIVE void store_box(void* base, int32_t dtype, const Dims& full, const Dims& start,
                          const Dims& box, const Tile<T>& tile) {
  int64_t first = 0;
  if (box_run(full, start, box, &first)) {
    MK_FOR_EACH(e, tile.n) store_elem(base, dtype, first + e, tile.p[e]);
  } else {
    MK_FOR_EACH(e, tile.n) store_elem(base, dtype, box_offset(e, full, start, box), tile.p[e]);
  }
  __syncthreads();
}

// Element e of a box whose shape and dtype the emitter resolved: runs of Cols contiguous
// elements, `ld` apart, from element `first`. Constant Cols turn the index into a multiply; the
// emitter writes the loop over e (and its barriers, backends/cuda/barriers.py).
template <int32_t Dtype, uint32_t Cols, class T>
__device__ inline void load_run_elem(T& dst, const void* base, int64_t first, int64_t ld, uint32_t e) {
  const uint32_t r = e / Cols;
  load_into(dst, base, Dtype, first + r * ld + (e - r * Cols));
}

template <int32_t Dtype, uint32_t Cols, class T>
__device__ inline void store_run_elem(void* base, int64_t first, int64_t ld, uint32_t e, T value) {
  const uint32_t r = e / Cols;
  store_elem(base, Dtype, first + r * ld + (e - r * Cols), value);
}

// Elements e and e + 1 (e even) of runs of Cols (even) 16-bit elements, as store_run_elem
// stores them one by one: one 4-byte store where the pair's address allows (emitted by
// backends/cuda/pair_loops.py).
template <int32_t Dtype, uint32_t Cols>
__device__ inline void store_run_pair(void* base, int64_t first, int64_t ld, uint32_t e, float a, float b) {
  static_assert(Cols % 2 == 0 && (Dtype == DTYPE_BF16 || Dtype == DTYPE_F16), "pairs of 16-bit runs");
  const uint32_t r = e / Cols;
  uint16_t* const at = static_cast<uint16_t*>(base) + first + r * ld + (e - r * Cols);
  const uint16_t lo = float_half_bits<Dtype == DTYPE_BF16>(a);
  const uint16_t hi = float_half_bits<Dtype == DTYPE_BF16>(b);
  if ((reinterpret_cast<uintptr_t>(at) & 3) == 0) {
    *reinterpret_cast<uint32_t*>(at) = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  } else {
    at[0] = lo;
    at[1] = hi;
  }
}

// Element e of an accumulating output's runs added into its f32 result: a `red.global.add.f32`,
// since the blocks of the output add into the same elements at once.
template <uint32_t Cols, class T>
__device__ inline void add_run_elem(void* base, int64_t first, int64_t ld, uint32_t e, T value) {
  const uint32_t r = e / Cols;
  atomicAdd(static_cast<float*>(base) + first + r * ld + (e - r * Cols), static_cast<float>(value));
}

// The whole box into `tile`, element e by thread e mod kCudaThreads (MK_FOR_EACH's mapping), no
// barrier. Each thread issues up to 16 loads before it stores any: the compiler cannot move a
// load above the store of an earlier element (the tile might alias the buffer), so a plain loop
// waits one L2 round trip per element.
template <int32_t Dtype, uint32_t N, uint32_t Cols, class T>
__device__ inline void load_runs(Tile<T>& tile, const void* base, int64_t first, int64_t ld) {
  constexpr uint32_t kPer = (N + kCudaThreads - 1) / kCudaThreads, kGroup = kPer < 16 ? kPer : 16;
  for (uint32_t g = 0; g < kPer; g += kGroup) {
    T v[kGroup];
#pragma unroll
    for (uint32_t k = 0; k < kGroup; ++k) {
      const uint32_t e = threadIdx.x + (g + k) * kCudaThreads;
      if (e < N) load_run_elem<Dtype, Cols>(v[k], base, first, ld, e);
    }
#pragma unroll
    for (uint32_t k = 0; k < kGroup; ++k) {
      const uint32_t e = threadIdx.x + (g + k) * kCudaThreads;
      if (e < N) tile.p[e] = v[k];
    }
  }
}

// One load_runs of a load_runs_together: its tile, source and runs, and the values this thread
// holds between the group's loads and its stores.
template <int32_t Dtype, uint32_t N, uint32_t Cols, class T>
struct RunLoad {
  static constexpr uint32_t kPer = (N + kCudaThreads - 1) / kCudaThreads;
  Tile<T>& tile;
  const void* base;
  int64_t first, ld;
  T v[kPer];

  __device__ void load() {
#pragma unroll
    for (uint32_t k = 0; k < kPer; ++k) {
      const uint32_t e = threadIdx.x + k * kCudaThreads;
      if (e < N) load_run_elem<Dtype, Cols>(v[k], base, first, ld, e);
    }
  }
  __device__ void store() const {
#pragma unroll
    for (uint32_t k = 0; k < kPer; ++k) {
      const uint32_t e = threadIdx.x + k * kCudaThreads;
      if (e < N) tile.p[e] = v[k];
    }
  }
};

template <int32_t Dtype, uint32_t N, uint32_t Cols, class T>
__device__ inline RunLoad<Dtype, N, Cols, T> run_load(Tile<T>& tile, const void* base, int64_t first,
                                                      int64_t ld) {
  return {tile, base, first, ld, {}};
}

// A run load whose loads go out now and whose stores wait for store_loaded: an epilogue's
// input loaded before a streamed product and stored after it (backends/cuda/load_groups.py).
template <class L>
__device__ inline L load_early(L l) {
  l.load();
  return l;
}
template <class L>
__device__ inline void store_loaded(const L& l) {
  l.store();
}

// Several load_runs at once (backends/cuda/load_groups.py): every load of every run before the
// first store, so the group waits one L2 round trip instead of one per run. No barrier.
template <class... Loads>
__device__ inline void load_runs_together(Loads&&... loads) {
  (loads.load(), ...);
  (loads.store(), ...);
}

template <class T>
MK_COOPERATIVE void load_all(Tile<T>& t, const void* base, int32_t dtype, const Dims& shape) {
  Dims zero;
  zero.n = shape.n;
  for (int i = 0; i < shape.n; ++i) zero.v[i] = 0;
  load_box(t, base, dtype, shape, zero, shape);
}

template <class T>
MK_COOPERATIVE void store_region(void* base, int32_t dtype, const Dims& full, const Dims& start,
                             const Dims& box, const Tile<T>& t) {
  MK_FOR_EACH(e, numel(box)) {
    const int64_t off = box_offset(e, full, start, box);
    store_elem(base, dtype, off, t.p[off]);
  }
  __syncthreads();
}

}  // namespace gpu
}  // namespace mk
