// The decode attention's task descriptor (StreamAttention) and the rows a task prepares before
// its keys: q's rows and the new K/V rows, loaded once (by vector loads where the emitter proved
// them aligned, polled where they are flagged) and taken through their per-head RMSNorm and RoPE
// into shared memory (prepare_rows), for mk/cuda_attention.cuh's streamed key loop.
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "mk/cuda_stream.cuh"

namespace mk {
namespace gpu {

constexpr int kAttentionMaxRows = 8;

// A head row's optional RMSNorm (weight g) and RoPE (tables of D/2), then its rounding.
struct RowOps {
  const void* g = nullptr;
  int32_t g_dtype = DTYPE_F32;
  float eps = 0.0f;
  const void* cos = nullptr;
  const void* sin = nullptr;
  int32_t t_dtype = DTYPE_F32;
  int32_t out_dtype = DTYPE_F32;
};

struct StreamAttention {
  const void* q;         // the task's [R][D] query rows, contiguous
  int32_t q_dtype;
  const uint16_t* k;     // the task's first key row: bf16 or f16, D contiguous elements per key
  const uint16_t* v;
  int32_t kv_dtype;
  int64_t ld;            // elements between consecutive keys
  int32_t keys;          // keys of this task
  int64_t key0;          // position of the first one (what the score function is given)
  float* o;              // [R][D]
  float* m;              // [R]
  float* l;              // [R]
  RowOps q_ops;          // q's per-head norm and RoPE, applied as the rows are loaded
  // The new K / V row (D elements each, or null) standing for the cache's row at position
  // new_key, the K row through k_ops: the cache write lands after the attention's reads, off
  // its critical path.
  const void* k_new = nullptr;
  int32_t k_new_dtype = DTYPE_F32;
  RowOps k_ops;
  const void* v_new = nullptr;
  int32_t v_new_dtype = DTYPE_F32;
  int64_t new_key = -1;
  // The emitter proved k and v 16-byte aligned (StreamLinear::aligned's contract), so the
  // paths for unaligned caches are not compiled into the body.
  bool aligned = false;
  // The emitter proved every row prepare_rows reads (q, k_new, v_new and the ops' g, cos and
  // sin) aligned at each lane's 8 elements, so each is one or two vector loads, not 8 scalar
  // loads and their addresses (a batch-1 QK-norm + RoPE: ~6 KB of SASS less).
  bool rows_aligned = false;
  // Rows whose buffers are flagged (flag-rows: kFlagQ, kFlagKNew, kFlagVNew): q, k_new and
  // v_new then point at 8-byte words, which each lane polls until they carry the task's flag
  // (`flags`' flag): the load is the wait on the q/k/v projection.
  uint32_t flagged = 0;
  const Arena* flags = nullptr;
#if defined(MK_OP_MARKS)
  // A profile build's marks between the phases (op_marks.py's ATTENTION_PHASES).
  Arena* arena = nullptr;
#endif
};

constexpr uint32_t kFlagQ = 1, kFlagKNew = 2, kFlagVNew = 4;

// Op marks between a streamed attention's phases: its rows prepared, its keys, its merge. A
// program that times the bodies by itself (bench/attention_alone.cu) defines its own.
#if defined(MK_ATTN_MARK)
#elif defined(MK_OP_MARKS)
#define MK_ATTN_MARK(a) do { if ((a).arena) ::mk::gpu::op_mark(*(a).arena); } while (0)
#else
#define MK_ATTN_MARK(a) ((void)0)
#endif

__device__ inline void round_row(float (&x)[8], int32_t dtype) {
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = round_to(x[i], dtype);
}

// What a lane needs of a row's ops besides the row: its 8 elements of the norm weight and of
// the RoPE tables (the half its elements pair over). Loaded before anything is computed, so
// all the loads of a task's rows share one round trip.
struct RowOperands {
  float g[8], c[8], s[8];
};

template <int L>
__device__ inline void load_row_operands(RowOperands& o, const RowOps& ops, int lane, bool vec) {
  const int j0 = (L % 2 == 0 && lane >= L / 2 ? lane - L / 2 : lane) * 8;
  if (ops.g != nullptr) {
    load8_f(o.g, ops.g, ops.g_dtype, lane * 8, vec);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) o.g[i] = 1.0f;
  }
  if (ops.cos != nullptr) {
    load8_f(o.c, ops.cos, ops.t_dtype, j0, vec);
    load8_f(o.s, ops.sin, ops.t_dtype, j0, vec);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      o.c[i] = 1.0f;
      o.s[i] = 0.0f;
    }
  }
}

// A lane's 8 consecutive elements of a head row (D = 8·L) through the row's ops, computed as
// rms_norm_tile and lib_rope compute them: x / sqrt(mean(x²) + eps) · g (squares summed in
// double), then RoPE pairing element j with j + D/2 (held by lane ^ L/2), then rounding. The
// shuffles run whether or not the row has each op: the groups of one warp may hold rows with
// different ops (prepare_rows).
template <int L>
__device__ inline void row_ops(float (&x)[8], const RowOps& ops, const RowOperands& o, int lane) {
  double s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float sq = x[i] * x[i];
    s += sq;
  }
#pragma unroll
  for (int off = L / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (ops.g != nullptr) {
    // One division a row: eight IEEE divisions, each with its slow path, were 2 KB of code.
    const float inv = 1.0f / sqrtf(static_cast<float>(s) / static_cast<float>(8 * L) + ops.eps);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = x[i] * inv * o.g[i];
  }
  if constexpr (L % 2 == 0) {  // RoPE pairs the halves of a row: D >= 16 (the planner's rule)
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = __shfl_xor_sync(0xffffffffu, x[i], L / 2);
    if (ops.cos != nullptr) {
      const bool low = lane < L / 2;
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = low ? x[i] * o.c[i] - y[i] * o.s[i] : x[i] * o.c[i] + y[i] * o.s[i];
    }
  }
  round_row(x, ops.out_dtype);
}

// A lane's 8 elements of the row starting at element `first` (`vec`: by vector loads).
__device__ inline void load_row8(float (&x)[8], const void* base, int32_t dtype, int64_t first,
                                 int lane, bool vec) {
  load8_f(x, base, dtype, first + lane * 8, vec);
}

// load_row8 of a flagged row (words of value bits and flag): each lane's 8 words polled until
// they carry the task's flag (16-byte loads where the rows are aligned).
__device__ inline void load_row8_flagged(float (&x)[8], const void* base, int64_t first, int lane,
                                         bool vec, const Arena& flags) {
  const uint64_t* w = static_cast<const uint64_t*>(base) + first + lane * 8;
  uint64_t v[1][8];
  if (vec) {
    const uint64_t* const runs[1] = {w};
    flag_poll8<1>(v, runs, flags, flags.flag);
  } else {
    flag_poll<8>(v[0], [&](int k) -> const uint64_t* { return w + k; }, flags, flags.flag);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = flag_value(v[0][i]);
}

// Whether the query rows go through ops (q's per-head norm and RoPE folded into the attention).
__device__ inline bool has_ops(const RowOps& ops) { return ops.g != nullptr || ops.cos != nullptr; }

// Whether the call takes its query rows through prepare_rows (into shared memory) rather than
// loading q itself: for their ops, for the new key's rows, or to wait on q's flags.
__device__ inline bool prepares_rows(const StreamAttention& a, int jn) {
  return has_ops(a.q_ops) || jn < a.keys || (a.flagged & kFlagQ) != 0;
}

// x or y field by field: the fields both hold the same (dtypes, in a body) stay constants, which
// a select of the structs' addresses would turn into loads (and every element load into a switch
// over dtypes).
__device__ inline RowOps pick_ops(bool take_x, const RowOps& x, const RowOps& y) {
  RowOps r;
  r.g = take_x ? x.g : y.g;
  r.g_dtype = take_x ? x.g_dtype : y.g_dtype;
  r.eps = take_x ? x.eps : y.eps;
  r.cos = take_x ? x.cos : y.cos;
  r.sin = take_x ? x.sin : y.sin;
  r.t_dtype = take_x ? x.t_dtype : y.t_dtype;
  r.out_dtype = take_x ? x.out_dtype : y.out_dtype;
  return r;
}

// The new K/V row's key among the task's, a.keys when it is not one of them: its rows come
// from prepare_rows, not from the cache (whose row the write fills after the attention's reads).
__device__ inline int new_key_index(const StreamAttention& a) {
  const int64_t at = a.new_key - a.key0;
  const bool has_new = a.k_new != nullptr || a.v_new != nullptr;
  return has_new && at >= 0 && at < a.keys ? static_cast<int>(at) : a.keys;
}

// One lane's part of a prepare_rows job (a row through its ops): the row's 8 elements and the
// ops' operands, loaded; the row it fills (a lane group past the last job repeats the last row
// without storing: its warp's shuffles need every lane).
struct RowJob {
  float x[8];
  RowOperands o;
  RowOps ops;
  int row;
  bool store;
};

template <int R, int D>
__device__ inline RowJob load_row_job(const StreamAttention& a, int jobs, int job, int jn, int lane) {
  const bool cache_vec = a.aligned && a.ld % 8 == 0;
  RowJob j;
  j.row = job < jobs ? job : jobs - 1;
  j.store = job == j.row;
  const bool q = j.row < R, k = j.row == R;
  const void* fresh = k ? a.k_new : a.v_new;  // the new row (K or V), or null
  const uint16_t* cached = (k ? a.k : a.v) + jn * a.ld;
  const void* src = q ? a.q : fresh != nullptr ? fresh : cached;
  const int32_t dtype = q ? a.q_dtype : fresh == nullptr ? a.kv_dtype : k ? a.k_new_dtype : a.v_new_dtype;
  // A row without ops (the V row, or a cached K row) is rounded to its own type: the same
  // values. Its other dtypes are q's, unused: the fields then hold the same constant whichever
  // row a lane group takes, so the loads and the rounding compile for one type, not a switch
  // over them (qwen3-0.6b's batch-1 attention body 31.4 → 30.7 KB of SASS).
  RowOps none = a.q_ops;
  none.g = none.cos = none.sin = nullptr;
  none.out_dtype = dtype;
  j.ops = pick_ops(q, a.q_ops, pick_ops(k && fresh != nullptr, a.k_ops, none));
  const uint32_t flag_bit = q ? kFlagQ : fresh == nullptr ? 0u : k ? kFlagKNew : kFlagVNew;
  if (a.flagged & flag_bit) {
    load_row8_flagged(j.x, src, q ? j.row * D : 0, lane, a.rows_aligned, *a.flags);
  } else {
    load_row8(j.x, src, dtype, q ? j.row * D : 0, lane, q || fresh != nullptr ? a.rows_aligned : cache_vec);
  }
  load_row_operands<D / 8>(j.o, j.ops, lane, a.rows_aligned);
  return j;
}

template <int D>
__device__ inline void finish_row_job(RowJob& j, int lane, float* rows) {
  row_ops<D / 8>(j.x, j.ops, j.o, lane);
  if (j.store) {
#pragma unroll
    for (int i = 0; i < 8; ++i) rows[j.row * D + lane * 8 + i] = j.x[i];
  }
}

// The rows the folded attention computes before its stream, into shared memory `rows` ([R + 2][D]
// floats): the R query rows through q_ops and, in the task that holds the new key jn (`owns_new`),
// the new K row through k_ops and the new V row as it is (the cache's rows at jn, as they are,
// where there are no new ones). One lane group a row, all rows' loads in one round trip, so a
// task runs the ops' code once, not once per row in every thread: that code runs once per layer
// from a cold instruction cache (unrolled over two query rows in every thread, it took ~2.5 µs
// of a qwen3-0.6b attention task on the H200). Ends with __syncthreads().
template <int R, int D>
__device__ void prepare_rows(const StreamAttention& a, bool owns_new, int jn, float* rows) {
  constexpr int L = D / 8;
  const int groups = static_cast<int>(MK_CTA_THREADS) / L, lane = static_cast<int>(threadIdx.x) % L;
  const int jobs = R + (owns_new ? 2 : 0), warp_group = static_cast<int>(threadIdx.x & ~31u) / L;
  for (int j0 = 0; j0 < jobs && j0 + warp_group < jobs; j0 += groups) {
    RowJob j = load_row_job<R, D>(a, jobs, j0 + static_cast<int>(threadIdx.x) / L, jn, lane);
    finish_row_job<D>(j, lane, rows);
  }
  __syncthreads();
}

// prepare_rows where all of its jobs fit one pass ((R + 2)·D/8 <= the CTA's threads), with
// `early` run by every thread between the rows' loads and their ops (MK_CUDA_ATTN_KV_EARLY: the
// keys' first round), after a barrier, so that every warp's row loads go out before any of the
// keys' loads: an SM's loads land in about the order it asks for them, and the rows are needed
// first. Ends with __syncthreads().
template <int R, int D, class Early>
__device__ void prepare_rows_early(const StreamAttention& a, bool owns_new, int jn, float* rows,
                                   Early early) {
  constexpr int L = D / 8;
  static_assert((R + 2) * L <= kCudaThreads, "prepare_rows_early: one pass of jobs");
  const int lane = static_cast<int>(threadIdx.x) % L;
  const int jobs = R + (owns_new ? 2 : 0), warp_group = static_cast<int>(threadIdx.x & ~31u) / L;
  const bool has_job = warp_group < jobs;  // the same for a whole warp
  RowJob j{};
  if (a.flagged) {
    // The rows come when their producers store them: the keys need not wait behind them.
    early();
    if (has_job) j = load_row_job<R, D>(a, jobs, static_cast<int>(threadIdx.x) / L, jn, lane);
  } else {
    if (has_job) j = load_row_job<R, D>(a, jobs, static_cast<int>(threadIdx.x) / L, jn, lane);
    __syncthreads();
    early();
  }
  if (has_job) finish_row_job<D>(j, lane, rows);
  __syncthreads();
}

}  // namespace gpu
}  // namespace mk
