// Bulk copies into shared memory that complete on mbarriers (cp.async.bulk), as a raw
// activation's chunks take them (mma_raw_chunks), and how a thread waits for them without
// hanging the launch.
#pragma once

#include <stdint.h>

#include "mk/cuda_arena.h"

namespace mk {
namespace gpu {

// How long a body waits for its bulk copies before it fails the task (a copy that never lands
// is a bug, and must not hang the launch).
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

// The issuing thread: `bytes` into shared memory at dst from global src (both 16-byte aligned,
// bytes a multiple of 16), completing on barrier `bar`.
__device__ inline void bulk_copy(void* dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(smem_address(dst)), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

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

}  // namespace gpu
}  // namespace mk
