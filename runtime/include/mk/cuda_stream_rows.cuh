// The weight side of a decode-shaped linear (cuda_stream.cuh): the task's descriptor, the
// 16-byte streaming loads, the CUDA-core products of RG rows at a time and the weights' L2
// prefetches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "mk/cuda_copy.cuh"
#include "mk/cuda_kernels.h"
#include "mk/warp_sums.h"

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
  uint32_t x_flag;    // non-zero: x is a flagged buffer (cuda_flags.cuh), read at this flag
  // The sums and Σx² are written, not added to (the body did not zero them): the first chunk's
  // sums are stored, later chunks add; Σx² is written at the last chunk's staging barrier.
  // CUDA-core products only (tensor cores add with atomics).
  bool assign;
  // The emitter proved the weight rows and the activation 16-byte aligned (their buffers are,
  // by the host's contract: backends/cuda/host.py), so stream_linear compiles no path for
  // unaligned ones. Set as a constant in the body, where the call is inlined: at batch 8 those
  // paths were two thirds of a streamed body's machine code, which a decode step fetches into
  // a cold instruction cache at every layer.
  bool aligned;
};

__device__ inline const void* elem_at(const void* base, int32_t dtype, int64_t i) {
  return static_cast<const unsigned char*>(base) + i * dtype_size(dtype);
}

// One 16-byte load `op` (a PTX ld with its qualifiers) of address p into the uint4 v.
#define MK_LOAD16(op, v, p)                                                              \
  asm volatile(op " {%0, %1, %2, %3}, [%4];"                                              \
               : "=r"((v).x), "=r"((v).y), "=r"((v).z), "=r"((v).w)                       \
               : "l"(p))

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
  MK_LOAD16("ld.global.nc.L1::no_allocate.L2::256B.v4.u32", v, p);
#endif
  return v;
}



// 16 read-only bytes through the L1: tensor-core fragment loads (cuda_mma.cuh, MK_MMA_L1).
__device__ inline uint4 load_stream_l1(const uint16_t* p) {
  uint4 v;
  MK_LOAD16("ld.global.nc.L2::256B.v4.u32", v, p);
  return v;
}

// 16 bytes from L2, not L1: data other SMs wrote earlier in the same launch (the KV caches).
__device__ inline uint4 load_l2(const uint16_t* p) {
  uint4 v;
  MK_LOAD16("ld.global.cg.v4.u32", v, p);
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

// The lanes' exchange for mk/warp_sums.h: the x of lane ^ d.
struct ShuffleXor {
  __device__ float operator()(float x, int d) const { return __shfl_xor_sync(0xffffffffu, x, d); }
};

// A row group's sums (acc[j][m]: row j, activation row m) reduced over the warp (group_sums,
// transposed) and written (or added, !store) to op[j][m * os[j]] by one lane each.
template <int M, int RG>
__device__ inline void group_sums_out(const float (&acc)[RG][M], float* const (&op)[RG],
                                      const int32_t (&os)[RG], bool store) {
  group_sums<M, RG>(acc, static_cast<int>(threadIdx.x & 31), ShuffleXor{}, [&](int j, int m, float total) {
    // The row's pointer picked by value: a register array indexed at run time would go to
    // local memory.
    float* out = nullptr;
    int32_t stride = 0;
#pragma unroll
    for (int k = 0; k < RG; ++k) {
      out = j == k ? op[k] : out;
      stride = j == k ? os[k] : stride;
    }
    if (out) {
      float* const at = out + m * stride;
      *at = store ? total : *at + total;
    }
  });
}

// The 16 bytes at column k of row w (zeros past the chunk or for a missing row).
template <bool Vec>
__device__ inline uint4 load_row(const uint16_t* w, int k, int kc) {
  return w && k < kc ? load8<Vec>(w + k) : make_uint4(0, 0, 0, 0);
}

// load_row of each of the first N of RG rows.
template <int RG, bool Vec, int N = RG>
__device__ inline void load_rows(uint4 (&v)[RG], const uint16_t* const (&wp)[RG], int k, int kc) {
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = load_row<Vec>(wp[j], k, kc);
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

// cp.async of 16 bytes into shared memory, zero-filled when !in (nothing is read then).
__device__ inline void cp_async16(uint32_t dst, const void* src, bool in) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(in ? 16 : 0)
               : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// A warp's row group: its weight rows at chunk column c (null past `end`), their sums' outputs
// and row counts, and the lane's sums, zeroed. Indexed at constant indices only: registers.
template <int M, int RG>
struct RowGroup {
  const uint16_t* wp[RG];
  float* op[RG];
  int32_t os[RG];
  float acc[RG][M];
  __device__ __forceinline__ RowGroup(const StreamLinear& s, int64_t c, int r0, int end) {
    round_rows<RG>(s, c, r0, end, wp, op, os);
#pragma unroll
    for (int j = 0; j < RG; ++j)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[j][m] = 0.0f;
  }
  // The sums reduced over the warp and written (or added, !store) by one lane each.
  __device__ __forceinline__ void finish(bool store) { group_sums_out<M, RG>(acc, op, os, store); }
};

// A lane's loads of one round of a warp's group: S 256-column steps of RG rows.
template <int RG, int S>
struct WeightRound {
  uint4 v[S][RG];
};

// One warp: weight rows r0.. r0 + RG (before `end`) against the staged chunk `xs` ([M][stride]
// floats, columns [0, kc)); `store` writes the sums (StreamLinear::assign at the first pass over
// a row), else they are added. Each lane issues the loads of S 256-column steps of all RG
// rows before it multiplies any: a decode task is short, so what bounds it is how many round trips to
// HBM it waits for, and S·RG loads per lane in flight make a task of up to S·256 columns one
// round trip (and keep ~64 KB in flight per SM). With First, `first` holds the first FS steps
// (of their first FR rows) of the group's first round where `has_first` (loaded before the
// activation was ready: load_first_round).
template <int M, int RG, int S, bool Vec, bool First = false, int FS = S, int FR = RG>
__device__ __forceinline__ void stream_group(const StreamLinear& s, const float* xs, int stride,
                                             int kc, int64_t c, int r0, int end, bool store,
                                             const WeightRound<RG, S>& first, bool has_first) {
  const int lane = threadIdx.x & 31;
  const bool bf16 = s.w_dtype == DTYPE_BF16;
  RowGroup<M, RG> g(s, c, r0, end);
  for (int k = lane * 8; k < kc; k += S * 256) {
    uint4 v[S][RG];
    // One loop either way, the round's steps taken where they were loaded ahead: a branch
    // between two loops made ptxas emit the round's products twice (+3-5 KB a body).
    const bool ahead = First && has_first && k == lane * 8;
#pragma unroll
    for (int t = 0; t < S; ++t) {
      if (t < FS && ahead) {
        // The first FR rows were loaded ahead, the others (if any) go out now.
#pragma unroll
        for (int j = 0; j < RG; ++j) {
          v[t][j] = j < FR ? first.v[t][j] : load_row<Vec>(g.wp[j], k + t * 256, kc);
        }
      } else {
        load_rows<RG, Vec>(v[t], g.wp, k + t * 256, kc);
      }
    }
#pragma unroll
    for (int t = 0; t < S; ++t) {
      if (k + t * 256 < kc) fma_rows<M, RG>(g.acc, v[t], xs, stride, k + t * 256, bf16);
    }
  }
  g.finish(store);
}

// One warp: rows [begin, end) of the concatenated weights against the staged chunk, RG rows at
// a time (stream_group); with First, the first FS steps (FR rows) of the first group's first
// round from `first` where `has_first`.
template <int M, int RG, int S, bool Vec, bool First = false, int FS = S, int FR = RG>
__device__ void stream_rows(const StreamLinear& s, const float* xs, int stride, int kc, int64_t c,
                            int begin, int end, bool store,
                            const WeightRound<RG, S>& first = WeightRound<RG, S>{},
                            bool has_first = false) {
  for (int r0 = begin; r0 < end; r0 += RG) {
    stream_group<M, RG, S, Vec, First, FS, FR>(s, xs, stride, kc, c, r0, end, store, first,
                                               has_first && r0 == begin);
  }
}

// ------------------------------------------------------------------------------ prefetch

// Thread t of n asks the L2 for every n-th 128-byte line of the rows of chunk 0 (no registers
// held, unlike load_first_round; MK_CUDA_MERGE_EARLY=behind: the threads that do not merge),
// so that the stream's own loads find them there.
__device__ inline void prefetch_rows_l2_by(const StreamLinear& s, int t, int n) {
  int rows = 0;
#pragma unroll
  for (int i = 0; i < kStreamMaxWeights; ++i) {
    if (i < s.nw) rows += s.w[i].rows;
  }
  const int64_t kc = s.k < s.kc ? s.k : s.kc;
  const int lines = static_cast<int>((2 * kc + 127) / 128);  // a row's 128-byte lines
  for (int j = t; j < rows * lines; j += n) {
    float* out;
    int32_t of;
    const uint16_t* at = weight_row(s, j / lines, (j % lines) * 64, &out, &of);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
  }
}

}  // namespace gpu
}  // namespace mk
