// Flagged buffers: each element is one 8-byte word holding the value's float bits and the flag
// of the iteration that wrote it, stored at once. A reader's load of the value is its wait: the
// writer needs no fence and no counter, the reader no poll of its own before the load (NCCL's
// LL protocol, per element).
#pragma once

#include <stdint.h>

#include "mk/cuda_kernels.h"
#include "mk/cuda_wait.cuh"

namespace mk {
namespace gpu {

// A run status's counter when a flagged value never came (beside real counter ids).
constexpr int32_t kFlagCounter = -2;
// The sleep between two looks at a missing flagged word.
constexpr unsigned kFlagSleepNs = 96;

__device__ __forceinline__ uint64_t flag_word_load(const uint64_t* w) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(w) : "memory");
  return v;
}

__device__ __forceinline__ float flag_value(uint64_t w) {
  return __uint_as_float(static_cast<uint32_t>(w));
}

// Whether to give up on a flag: the watchdog's timeout (recorded as the task's failure) or
// another CTA's failure. The caller returns stale values; the launch stops at its next wait.
__device__ inline bool flag_stuck(const Arena& a, uint64_t& start, uint32_t seen) {
  const LaunchParams& p = *static_cast<const LaunchParams*>(a.params);
  const uint64_t now = globaltimer();
  if (start == 0) start = now;
  if (aborted(p)) return true;
  const uint64_t waited = now - start;
  if (static_cast<int64_t>(waited) <= p.timeout_ns) return false;
  record_failure(p, RunStatus{RUN_TIMEOUT, static_cast<int32_t>(blockIdx.x), a.task, kFlagCounter, a.t,
                              seen, a.flag, static_cast<int32_t>(waited / 1000000)});
  return true;
}

// Words at[k] (null: none) into v[k] once each carries the task's flag; every load of a round
// in flight at once. Between rounds the thread watches one missing word alone, with short
// sleeps: a consumer reaches its reads while its producers still stream their weights, and every
// thread of every waiting SM loading all its words each round would crowd the L2 they stream
// through.
template <int G>
__device__ inline void flag_poll(uint64_t (&v)[G], const uint64_t* const (&at)[G], const Arena& a) {
  uint32_t pending = 0;
#pragma unroll
  for (int k = 0; k < G; ++k) pending |= at[k] ? 1u << k : 0u;
  uint64_t start = 0;
  for (uint32_t round = 1; pending; ++round) {
#pragma unroll
    for (int k = 0; k < G; ++k)
      if (pending >> k & 1u) v[k] = flag_word_load(at[k]);
    const uint64_t* watch = nullptr;
#pragma unroll
    for (int k = 0; k < G; ++k) {
      if ((pending >> k & 1u) && static_cast<uint32_t>(v[k] >> 32) == a.flag) pending &= ~(1u << k);
      if (!watch && (pending >> k & 1u)) watch = at[k];
    }
    if (!watch) return;
    for (uint32_t look = 1;; ++look) {
      __nanosleep(kFlagSleepNs);
      const uint32_t flag = static_cast<uint32_t>(flag_word_load(watch) >> 32);
      if (flag == a.flag) break;
      if ((look & 63) == 0 && flag_stuck(a, start, flag)) return;
    }
  }
}

template <uint32_t Cols>
__device__ __forceinline__ int64_t run_index(int64_t first, int64_t ld, uint32_t e) {
  const uint32_t r = e / Cols;
  return first + r * ld + (e - r * Cols);
}

// store_run_elem for a flagged buffer: the value rounded to the buffer's dtype, with the flag.
template <int32_t Dtype, uint32_t Cols, class T>
__device__ inline void store_flag_run_elem(void* base, int64_t first, int64_t ld, uint32_t e, T value,
                                           uint32_t flag) {
  const float v = round_to(static_cast<float>(value), Dtype);
  const uint64_t w = static_cast<uint64_t>(flag) << 32 | __float_as_uint(v);
  uint64_t* at = static_cast<uint64_t*>(base) + run_index<Cols>(first, ld, e);
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(at), "l"(w) : "memory");
}

// load_runs for a flagged buffer: element e by thread e mod kCudaThreads, no barrier.
template <uint32_t N, uint32_t Cols, class T>
__device__ inline void load_flag_runs(Tile<T>& tile, const void* base, int64_t first, int64_t ld,
                                      const Arena& a) {
  constexpr uint32_t kPer = (N + kCudaThreads - 1) / kCudaThreads, kGroup = kPer < 16 ? kPer : 16;
  const uint64_t* w = static_cast<const uint64_t*>(base);
  for (uint32_t g = 0; g < kPer; g += kGroup) {
    uint64_t v[kGroup];
    const uint64_t* at[kGroup];
#pragma unroll
    for (uint32_t k = 0; k < kGroup; ++k) {
      const uint32_t e = threadIdx.x + (g + k) * kCudaThreads;
      at[k] = e < N ? w + run_index<Cols>(first, ld, e) : nullptr;
    }
    flag_poll<kGroup>(v, at, a);
#pragma unroll
    for (uint32_t k = 0; k < kGroup; ++k) {
      const uint32_t e = threadIdx.x + (g + k) * kCudaThreads;
      if (e < N) tile.p[e] = static_cast<T>(flag_value(v[k]));
    }
  }
}

}  // namespace gpu
}  // namespace mk
