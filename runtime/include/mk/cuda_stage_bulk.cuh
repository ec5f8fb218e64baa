// A tensor-core task's activation chunks copied into shared memory in bulk (cp.async.bulk on an
// mbarrier, mk/cuda_stage.cuh): raw ones used as they land (mma_raw_chunks), normed ones
// rewritten in place first (stage_chunk_bulk). stream_linear (mk/cuda_stream.cuh) calls both.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "mk/cuda_kernels.h"
#include "mk/cuda_mma.cuh"
#include "mk/cuda_stage.cuh"
#include "mk/cuda_stream_rows.cuh"

namespace mk {
namespace gpu {

// How a chunk is staged: floats (CUDA cores), or packed pairs of the weights' 16-bit type
// (tensor cores; the same rounding the mma operands had when packed at each use).
struct Packing {
  bool on;
  bool bf16;
};

// stage_chunk's `after_loads` where nothing runs there.
struct NoLoads {
  __device__ void operator()() const {}
};

// The columns of chunk c of a streamed activation: s.kc, the last one's what is left of K.
__device__ inline int chunk_columns(const StreamLinear& s, int64_t c) {
  return static_cast<int>(s.k - c < s.kc ? s.k - c : s.kc);
}

// Thread 0: chunk c's M rows into buf, `s.kc` apart, by bulk copies that complete on `bar`
// (nothing past the last chunk), for a raw or a Bulk activation. The fences order, for the
// copies (the async proxy), the activation's generic writes by producer tasks (which the
// dispatcher's acquire made visible here) before their reads, and where buf held an earlier
// chunk, the generic reads of it by that chunk's products (published by a __syncthreads())
// before their writes.
template <int M>
__device__ inline void copy_chunk_bulk(const StreamLinear& s, uint16_t* buf, int64_t c, uint64_t* bar) {
  if (c >= s.k) return;
  const uint32_t bytes = 2 * static_cast<uint32_t>(chunk_columns(s, c));
  const uint16_t* x = static_cast<const uint16_t*>(s.x) + c;
  // The producers' writes were ordered before every copy of the task once, at its first
  // (a fence before each chunk measured no different).
  if (c == 0) asm volatile("fence.proxy.async.global;" ::: "memory");
  // A buffer refilled was read by the generic proxy: expect_bytes' proxy fence orders those
  // reads before this copy.
  expect_bytes(smem_address(bar), M * bytes);
#pragma unroll
  for (int m = 0; m < M; ++m) bulk_copy(buf + m * s.kc, x + m * s.x_ld, bytes, smem_address(bar));
}

// ------------------------------------------------------------------ normed activations (Bulk)
// stream_linear's Bulk: a 16-bit activation and norm weight, 16-byte aligned, unflagged, every
// chunk packed (the emitter proves it). Thread 0 copies a chunk's M rows into shared memory as
// they are, while each thread loads its groups of eight columns of the norm weight; once they
// land each thread rewrites its groups of every row in place, times g and packed in the
// weights' type, and adds their squares (before g) to ss. The activation crosses to the SM
// once and g once per CTA, in one round trip, where stage_chunk_16bit's register loads take
// M·kc/(8·XB·threads) dependent rounds and load g for every row.

// The mbarrier a Bulk staging's copies complete on, and the parity of its first phase: one of
// each task's own (thread 0 initialises it), or with MK_RAW_BARS_LAUNCH the launch-long one
// whose phases mma_raw_chunks counts too.
struct BulkBar {
  uint64_t* bar;
  uint32_t phase;  // phases completed before this staging's first
};
__device__ inline void bulk_bar_done(const BulkBar& b, uint32_t chunks) {
  if (threadIdx.x != 0) return;  // after a barrier every thread passed after its last wait
#if defined(MK_RAW_BARS_LAUNCH)
  raw_phases[0] += chunks;
#else
  (void)chunks;
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_address(b.bar)) : "memory");
#endif
}

// This thread's first two groups of chunk c's norm weight (a chunk of up to 16·threads
// columns), asked for before the wait; rewrite_rows loads any further ones at their turn.
struct NormGroups {
  uint4 first, second;
};
__device__ inline uint4 norm_group(const StreamLinear& s, int64_t c, int kc, int e) {
  const uint16_t* g = static_cast<const uint16_t*>(s.g);
  return g && e < kc / 8 ? *reinterpret_cast<const uint4*>(g + c + 8 * e) : make_uint4(0, 0, 0, 0);
}
__device__ inline NormGroups norm_groups(const StreamLinear& s, int64_t c, int kc) {
  const int e = static_cast<int>(threadIdx.x);
  return NormGroups{norm_group(s, c, kc, e), norm_group(s, c, kc, e + static_cast<int>(MK_CTA_THREADS))};
}

// Every thread, once chunk c has landed in `rows`: its groups of every row times g, packed in
// the weights' type, in place; their squares added to ss. The group loop stays rolled: its
// body, eight columns of all M rows, is what a chunk's staging costs in code.
template <int M>
__device__ inline void rewrite_rows(const StreamLinear& s, uint16_t* rows, int stride, int kc,
                                    int64_t c, const NormGroups& gs, bool bf16, float (&ss)[M]) {
  const bool x_bf16 = s.x_dtype == DTYPE_BF16, g_bf16 = s.g_dtype == DTYPE_BF16, has_g = s.g;
  const int groups = kc / 8, step = static_cast<int>(MK_CTA_THREADS);
  int i = 0;
#pragma unroll 1
  for (int e = static_cast<int>(threadIdx.x); e < groups; e += step, ++i) {
    float gf[8];
    unpack8(gf, i == 0 ? gs.first : i == 1 ? gs.second : norm_group(s, c, kc, e), g_bf16);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      uint4* at = reinterpret_cast<uint4*>(rows + m * stride + 8 * e);
      float v[8];
      unpack8(v, *at, x_bf16);
      float sq = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sq = fmaf(v[j], v[j], sq);
        if (has_g) v[j] *= gf[j];
      }
      *at = make_uint4(pack2(v[0], v[1], bf16), pack2(v[2], v[3], bf16), pack2(v[4], v[5], bf16),
                       pack2(v[6], v[7], bf16));
      ss[m] += sq;
    }
  }
}

__device__ inline BulkBar bulk_bar(uint64_t* own) {
#if defined(MK_RAW_BARS_LAUNCH)
  (void)own;
  return BulkBar{&raw_bars[0], raw_phases[0]};
#else
  return BulkBar{own, 0};
#endif
}

// stage_chunk on tensor cores with Bulk: chunk c staged as above. `after_loads` runs once on
// every thread behind its own loads (stream_linear's early weights). Ends with a barrier; false
// if the copies never landed.
template <int M, class AfterLoads = NoLoads>
__device__ bool stage_chunk_bulk(const StreamLinear& s, float* xs, int64_t c, const Packing& pack,
                                 float (&ss)[M], const AfterLoads& after_loads = AfterLoads{}) {
  __shared__ uint64_t own;
  const BulkBar b = bulk_bar(&own);
  uint16_t* const rows = reinterpret_cast<uint16_t*>(xs);
  const int kc = chunk_columns(s, c);
  if (threadIdx.x == 0) {
    if constexpr (!kRawBarsLaunch) stage_barrier_init(b.bar);
    copy_chunk_bulk<M>(s, rows, c, b.bar);
  }
  const NormGroups gs = norm_groups(s, c, kc);
  after_loads();
  __syncthreads();  // the barrier's init, before any thread waits on it
  const bool landed = barrier_wait(smem_address(b.bar), b.phase & 1u);
  if (landed) rewrite_rows<M>(s, rows, static_cast<int>(s.kc), kc, c, gs, pack.bf16, ss);
  const bool failed = __syncthreads_or(!landed);  // every thread has read the phase, too
  bulk_bar_done(b, 1);
  return !failed;
}

// ------------------------------------------------------------------ raw activations (mma)

// Whether the activation is already the tensor cores' packed operand: 16-bit of the weights'
// type, no norm weight or Σx², 16-byte aligned rows and chunks of whole 32-column steps. Its
// chunks are then copied into shared memory as they are (mma_raw_chunks).
__device__ inline bool raw_activation(const StreamLinear& s) {
  return !s.x_ready && !s.x_flag && !s.g && !s.sum_sq && s.x_dtype == s.w_dtype &&
         s.k % 32 == 0 && s.kc % 32 == 0 && s.x_ld % 8 == 0 &&
         (s.aligned || (reinterpret_cast<uintptr_t>(s.x) & 15) == 0);
}

// Whether K slices (mma_slices) take the activation: as raw_activation asks, or with `norm` a
// norm weight of the same type, 16-byte aligned (checked here: `aligned` covers x and the
// weights), and a Σx² to take, in place of neither.
__device__ inline bool sliced_activation(const StreamLinear& s, bool norm) {
  const bool x_ok = !s.x_ready && !s.x_flag && s.x_dtype == s.w_dtype && s.k % 32 == 0 &&
                    s.x_ld % 8 == 0 && (s.aligned || (reinterpret_cast<uintptr_t>(s.x) & 15) == 0);
  if (!norm) return x_ok && !s.g && !s.sum_sq;
  const bool g_ok = s.g && s.g_dtype == s.w_dtype && (reinterpret_cast<uintptr_t>(s.g) & 15) == 0;
  return x_ok && g_ok && s.sum_sq;
}

// mma_raw_chunks with a ring: each warp's Ring-stage cp.async ring (behind both buffers) walks
// every chunk as one stream (mma_ring_walk; restarting it at each chunk, MK_CUDA_RING_WALK=0,
// took the gated MLP at batch 8 0.1245 -> 0.1333 ms on the H200 and was retired). Chunks 0
// and 1 are copied first; a warp waits for chunk i to land before its products, and once
// every warp is done reading chunk i (a CTA barrier: the copies in flight in the rings go on
// through it) thread 0 copies chunk i + 2 into its buffer.
template <int M, int Ring, bool BF16>
__device__ bool mma_raw_ring(const StreamLinear& s, int rows, uint16_t* const (&buf)[2],
                             uint16_t* ring, uint64_t* bars, const uint32_t (&phase)[2]) {
  const int warp = static_cast<int>(threadIdx.x >> 5);
  uint16_t* const mine = ring + warp * Ring * (kRingStageBytes / 2);
  const RingChunks all(0, s.k, static_cast<int>(s.kc), (rows + 7) / 8);
  bool landed = true;
  const auto act = [&](int i) {
    landed = landed && barrier_wait(smem_address(&bars[i & 1]), (phase[i & 1] + (i >> 1)) & 1);
    if (i == 0) {
      MK_MARK(*s.arena);
      MK_MARK(*s.arena);
    }
    return static_cast<const uint16_t*>(buf[i & 1]);
  };
  const auto leave = [&](int i) {
    __syncthreads();  // every warp's reads of chunk i's buffer are done
    if (threadIdx.x == 0) copy_chunk_bulk<M>(s, buf[i & 1], all.column(i + 2), &bars[i & 1]);
  };
  mma_ring_walk<M, Ring, BF16>(s, all, static_cast<int>(s.kc), rows, mine, act, leave);
  return !__syncthreads_or(!landed);
}

// stream_linear on tensor cores for a raw activation: its chunks land in two packed buffers
// (the room of one float chunk) by bulk copies that one thread issues, so no thread's loads
// wait behind them and chunk i + 1 streams in while chunk i's products run. The register
// path's staging round trips (three chunks of the gated MLP's down projection at batch 8)
// leave the critical path. With Ring > 0 each warp's cp.async ring sits behind both buffers and
// walks them all (mma_raw_ring). Ends with __syncthreads(); false if a chunk never landed.
template <int M, int U, int Ring>
__device__ bool mma_raw_chunks(const StreamLinear& s, int rows) {
#if defined(MK_RAW_BARS_LAUNCH)
  uint64_t* const bars = raw_bars;
  const uint32_t phase[2] = {raw_phases[0], raw_phases[1]};
#else
  __shared__ uint64_t own[2];
  uint64_t* const bars = own;
  const uint32_t phase[2] = {0, 0};
#endif
  uint16_t* const buf[2] = {reinterpret_cast<uint16_t*>(mk_dynamic_smem),
                            reinterpret_cast<uint16_t*>(mk_dynamic_smem) + M * s.kc};
  if (threadIdx.x == 0) {
    if constexpr (!kRawBarsLaunch) {
      stage_barrier_init(&bars[0]);
      stage_barrier_init(&bars[1]);
    }
    copy_chunk_bulk<M>(s, buf[0], 0, &bars[0]);
    if (Ring > 0) copy_chunk_bulk<M>(s, buf[1], s.kc, &bars[1]);
  }
  __syncthreads();
  bool landed = true;
  if constexpr (Ring > 0) {
    // The ring sits behind the buffers: one where a chunk is all of K (the emitter then
    // reserves one).
    const int64_t packed = (s.kc < s.k ? 2 : 1) * M * s.kc * 2;
    uint16_t* const ring = reinterpret_cast<uint16_t*>(mk_dynamic_smem + ((packed + 127) & ~127));
    landed = s.w_dtype == DTYPE_BF16 ? mma_raw_ring<M, Ring, true>(s, rows, buf, ring, bars, phase)
                                     : mma_raw_ring<M, Ring, false>(s, rows, buf, ring, bars, phase);
  } else {
    int i = 0;
    for (int64_t c = 0; c < s.k; c += s.kc, ++i) {
      const int kc = chunk_columns(s, c);
      landed = barrier_wait(smem_address(&bars[i & 1]), (phase[i & 1] + (i >> 1)) & 1);
      if (c == 0) MK_MARK(*s.arena);
      // Chunk i - 1's products are done everywhere: its buffer takes chunk i + 1.
      if (__syncthreads_or(!landed)) {
        landed = false;
        break;
      }
      if (threadIdx.x == 0) copy_chunk_bulk<M>(s, buf[(i + 1) & 1], c + s.kc, &bars[(i + 1) & 1]);
      if (c == 0) MK_MARK(*s.arena);
      mma_chunk<M, U>(s, buf[i & 1], s.kc, kc, c, rows);
    }
  }
#if defined(MK_RAW_BARS_LAUNCH)
  // Each chunk completes one phase of its barrier (chunk i: barrier i % 2). Every thread read
  // the counts before the barrier behind the first copies, and the one below publishes them to
  // the next call, which may follow in the same body.
  if (threadIdx.x == 0) {
    const uint32_t chunks = static_cast<uint32_t>((s.k + s.kc - 1) / s.kc);
    raw_phases[0] += (chunks + 1) / 2;
    raw_phases[1] += chunks / 2;
  }
  __syncthreads();
#else
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_address(&bars[0])) : "memory");
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_address(&bars[1])) : "memory");
  }
#endif
  return landed;
}

// stream_linear with Bulk, a weight ring and Early (a body of one grid): every chunk staged in
// bulk into one buffer, and each warp's weights walked through its ring as one stream across
// the chunks (mma_ring_walk), whose first fills go out while chunk 0's copies are in flight:
// the weights' first round trip overlaps the staging instead of following it. Chunk i + 1 is
// copied once every warp has left chunk i. Σx² into ss. Ends with a barrier; false if a chunk
// never landed. bf16 weights (the emitter's rule for Bulk).
template <int M, int Ring>
__device__ bool mma_bulk_ring(const StreamLinear& s, int rows, float (&ss)[M]) {
  __shared__ uint64_t own;
  const BulkBar b = bulk_bar(&own);
  uint16_t* const buf = reinterpret_cast<uint16_t*>(mk_dynamic_smem);
  uint16_t* const ring = reinterpret_cast<uint16_t*>(mk_dynamic_smem + ((M * s.kc * 2 + 127) & ~127));
  uint16_t* const mine = ring + (threadIdx.x >> 5) * Ring * (kRingStageBytes / 2);
  const int kc = static_cast<int>(s.kc);
  const RingChunks all(0, s.k, kc, (rows + 7) / 8);
  if (threadIdx.x == 0) {
    if constexpr (!kRawBarsLaunch) stage_barrier_init(b.bar);
    copy_chunk_bulk<M>(s, buf, 0, b.bar);
  }
  __syncthreads();  // the barrier's init, before any thread waits on it
  bool landed = true;
  const auto act = [&](int i) {
    const int64_t c = all.column(i);
    const NormGroups gs = norm_groups(s, c, chunk_columns(s, c));
    landed = landed && barrier_wait(smem_address(b.bar), (b.phase + static_cast<uint32_t>(i)) & 1u);
    if (landed) rewrite_rows<M>(s, buf, kc, chunk_columns(s, c), c, gs, true, ss);
    if (__syncthreads_or(!landed)) landed = false;  // the rewritten chunk, seen by every warp
    if (i == 0) {
      MK_MARK(*s.arena);
      MK_MARK(*s.arena);
    }
    return static_cast<const uint16_t*>(buf);
  };
  const auto leave = [&](int i) {
    if (i + 1 >= all.count()) return;
    __syncthreads();  // every warp's reads of chunk i are done
    if (threadIdx.x == 0) copy_chunk_bulk<M>(s, buf, all.column(i + 1), b.bar);
  };
  mma_ring_walk<M, Ring, true>(s, all, kc, rows, mine, act, leave);
  const bool failed = __syncthreads_or(!landed);
  bulk_bar_done(b, static_cast<uint32_t>(all.count()));
  return !failed;
}

}  // namespace gpu
}  // namespace mk
