// A task's weights copied into shared memory ahead of its turn: while the task before it waits
// and runs, the dispatcher's loader thread issues bulk copies (cp.async.bulk, one per weight
// when its rows are one contiguous slab, else one per row) into the CTA's staging ring. They
// complete on a barrier of their own, so HBM streams the next task's weights through the gaps
// between tasks, and once the inputs are ready the products read shared memory. Rows land `ld`
// elements apart; for tensor cores the emitter pads `ld` so that the eight rows one step reads
// fall in different banks.
#pragma once

#include <stdint.h>

#include "mk/cuda_arena.h"

namespace mk {
namespace gpu {

// What a task body does when the dispatcher calls it before the task's turn.
constexpr int32_t kAheadNone = 0;   // run the task
constexpr int32_t kAheadStage = 2;  // copy its weights into shared memory (at arena.stage_base)

// How long a body waits for its staged weights before it fails the task (a copy that never
// lands is a bug, and must not hang the launch).
constexpr uint64_t kStageTimeoutNs = 2000000000ull;

__device__ inline uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Thread 0, once per launch, for each barrier.
__device__ inline void stage_barrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

#if defined(MK_RAW_BARS_LAUNCH)
constexpr bool kRawBarsLaunch = true;
// MK_CUDA_RAW_BARS=launch: the two barriers a raw activation's bulk copies complete on
// (mma_raw_chunks), live for the whole launch, and the phases each has completed: a task's
// chunk i waits for phase raw_phases[i % 2] + i / 2 of barrier i % 2. Thread 0 counts them
// after the task's last barrier; the others read them at the next task, behind the
// dispatcher's barriers.
__shared__ uint64_t raw_bars[2];
__shared__ uint32_t raw_phases[2];
#else
constexpr bool kRawBarsLaunch = false;
#endif

// Thread 0 at the launch's start: the raw chunks' launch-long barriers, where kept.
__device__ inline void raw_bars_init() {
#if defined(MK_RAW_BARS_LAUNCH)
  for (int i = 0; i < 2; ++i) {
    stage_barrier_init(&raw_bars[i]);
    raw_phases[i] = 0;
  }
#endif
}

// The issuing thread: the bytes the copies completing on barrier `bar` (a shared address) will
// bring. The fence orders ordinary accesses to their destination (published by a
// __syncthreads()) before the copies overwrite it.
__device__ inline void expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// The issuing thread: the bytes this task's copies will bring into the ring.
__device__ inline void stage_expect(const Arena& a, uint32_t bytes) {
  expect_bytes(smem_address(a.stage_bar), bytes);
}

// The issuing thread: `bytes` into shared memory at dst from global src (both 16-byte aligned,
// bytes a multiple of 16), completing on barrier `bar`.
__device__ inline void bulk_copy(void* dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(smem_address(dst)), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// The issuing thread: `rows` rows of `cols` 16-bit elements, `ld` apart in global memory, to
// byte `offset` of the task's place in the ring, `dst_ld` elements apart. Addresses the bulk copy
// cannot take (not 16-byte aligned) are copied here element by element; the dispatcher's
// __syncthreads() before the task's turn publishes them, and the barrier is told they arrived.
// Not inlined: one thread runs it once a task, and a copy in every staging body cost ~3 KB each.
__device__ inline __noinline__ void stage_rows(const Arena& a, uint32_t offset, const uint16_t* src,
                                               int rows, int64_t ld, int64_t cols, int64_t dst_ld) {
  uint16_t* dst = reinterpret_cast<uint16_t*>(a.stage_base + offset);
  const uint32_t bar = smem_address(a.stage_bar);
  const uint32_t bytes = static_cast<uint32_t>(2 * cols);
  const bool bulk = (reinterpret_cast<uintptr_t>(src) & 15) == 0 && ld % 8 == 0 && cols % 8 == 0;
  if (bulk && ld == cols && dst_ld == cols) {  // a whole-K slab: one copy
    bulk_copy(dst, src, bytes * rows, bar);
    return;
  }
  for (int r = 0; r < rows; ++r) {
    if (bulk) {
      bulk_copy(dst + r * dst_ld, src + r * ld, bytes, bar);
    } else {
      for (int64_t c = 0; c < cols; ++c) dst[r * dst_ld + c] = src[r * ld + c];
      asm volatile("mbarrier.complete_tx.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes)
                   : "memory");
    }
  }
}

// Where a task staged ahead lands in the ring of `ring` bytes while the task before it, at
// [before_at, before_at + before_bytes), still runs: right behind it, else at the front when
// that task sits far enough in; -1 when neither has room (the task is then staged at its own
// turn, at the front, once the ring is free).
__device__ inline int32_t ring_place(uint32_t before_at, uint32_t before_bytes, uint32_t bytes,
                                     uint32_t ring) {
  const uint32_t behind = (before_at + before_bytes + 127u) & ~127u;
  if (behind + bytes <= ring) return static_cast<int32_t>(behind);
  if (bytes <= before_at) return 0;
  return -1;
}

// What the dispatcher knows of the weights staged for one of its three task sets.
struct StagePlace {
  uint32_t at;        // byte offset in the ring
  uint32_t bytes;     // 0: the task stages nothing
  uint32_t parity;    // the barrier phase that means they landed
  uint32_t deferred;  // no room ahead: thread 0 stages them at the task's turn
};

// Every thread: waits until the phase of barrier `bar` (a shared address) with `parity` has
// completed; false after kStageTimeoutNs.
__device__ inline bool barrier_wait(uint32_t bar, uint32_t parity) {
  const uint64_t start = mark_clock();
  for (;;) {
    uint32_t done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return true;
    if (mark_clock() - start > kStageTimeoutNs) return false;
  }
}

// Every thread: waits until the staged weights of the current task have landed.
__device__ inline bool stage_wait(const Arena& a) {
  return barrier_wait(smem_address(a.stage_bar), a.stage_parity);
}

}  // namespace gpu
}  // namespace mk
