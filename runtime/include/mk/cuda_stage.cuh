// A task's weights copied into shared memory before it waits for its inputs: thread 0 issues
// bulk copies (cp.async.bulk, one per weight when its rows are one contiguous slab, else one per
// row) that complete on the CTA's stage barrier while the producers finish, so once the inputs
// are ready the products read shared memory instead of waiting on HBM. Rows land `ld` elements
// apart; for tensor cores the emitter pads `ld` so that the eight rows one step reads fall in
// different banks.
#pragma once

#include <stdint.h>

#include "mk/cuda_arena.h"

namespace mk {
namespace gpu {

// What a task body does when the dispatcher calls it before the task's turn.
constexpr int32_t kAheadNone = 0;   // run the task
constexpr int32_t kAheadL2 = 1;     // ask the L2 for its weights (the next task of the queue)
constexpr int32_t kAheadStage = 2;  // copy its weights into shared memory (the current task)

// How long a body waits for its staged weights before it fails the task (a copy that never
// lands is a bug, and must not hang the launch).
constexpr uint64_t kStageTimeoutNs = 2000000000ull;

__device__ inline uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Thread 0, once per launch.
__device__ inline void stage_barrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Thread 0: the bytes this task's copies will bring. The fence orders the previous task's
// ordinary accesses to the staging area before the copies overwrite it.
__device__ inline void stage_expect(const Arena& a, uint32_t bytes) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               ::"r"(smem_address(a.stage_bar)), "r"(bytes)
               : "memory");
}

// Thread 0: `rows` rows of `cols` 16-bit elements, `ld` apart in global memory, to the staging
// area at byte `offset`, `dst_ld` elements apart. Addresses the bulk copy cannot take (not
// 16-byte aligned) are copied here element by element; the dispatcher's __syncthreads() after
// the wait publishes them, and the barrier is told their bytes arrived.
__device__ inline void stage_rows(const Arena& a, uint32_t offset, const uint16_t* src, int rows,
                                  int64_t ld, int64_t cols, int64_t dst_ld) {
  uint16_t* dst = reinterpret_cast<uint16_t*>(mk_dynamic_smem + offset);
  const uint32_t bar = smem_address(a.stage_bar);
  const uint32_t bytes = static_cast<uint32_t>(2 * cols);
  const bool bulk = (reinterpret_cast<uintptr_t>(src) & 15) == 0 && ld % 8 == 0 && cols % 8 == 0;
  if (bulk && ld == cols && dst_ld == cols) {  // a whole-K slab: one copy
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(smem_address(dst)), "l"(src), "r"(bytes * rows), "r"(bar)
        : "memory");
    return;
  }
  for (int r = 0; r < rows; ++r) {
    if (bulk) {
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
          ::"r"(smem_address(dst + r * dst_ld)), "l"(src + r * ld), "r"(bytes), "r"(bar)
          : "memory");
    } else {
      for (int64_t c = 0; c < cols; ++c) dst[r * dst_ld + c] = src[r * ld + c];
      asm volatile("mbarrier.complete_tx.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes)
                   : "memory");
    }
  }
}

// Every thread: waits until the staged weights of the current task have landed; false after
// kStageTimeoutNs.
__device__ inline bool stage_wait(const Arena& a) {
  const uint32_t bar = smem_address(a.stage_bar);
  const uint64_t start = mark_clock();
  for (;;) {
    uint32_t done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(a.stage_parity)
        : "memory");
    if (done) return true;
    if (mark_clock() - start > kStageTimeoutNs) return false;
  }
}

}  // namespace gpu
}  // namespace mk
