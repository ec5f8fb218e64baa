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
// The sleep between two looks at a missing flagged word (MK_CUDA_FLAG_SLEEP; 0 spins).
#if defined(MK_FLAG_SLEEP_NS)
constexpr unsigned kFlagSleepNs = MK_FLAG_SLEEP_NS;
#else
constexpr unsigned kFlagSleepNs = 96;
#endif

__device__ __forceinline__ void flag_sleep() {
  if constexpr (kFlagSleepNs > 0) __nanosleep(kFlagSleepNs);
}

__device__ __forceinline__ uint64_t flag_word_load(const uint64_t* w) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(w) : "memory");
  return v;
}

__device__ __forceinline__ float flag_value(uint64_t w) {
  return __uint_as_float(static_cast<uint32_t>(w));
}

// The flag a word carries.
__device__ __forceinline__ uint32_t flag_tag(uint64_t w) { return static_cast<uint32_t>(w >> 32); }

// Whether to give up on a flag: the watchdog's timeout (recorded as the task's failure, with the
// tag seen and the one wanted) or another CTA's failure. The caller returns stale values; the
// launch stops at its next wait.
__device__ inline bool flag_stuck(const Arena& a, uint64_t& start, uint32_t seen, uint32_t want) {
  const LaunchParams& p = *static_cast<const LaunchParams*>(a.params);
  const uint64_t now = globaltimer();
  if (start == 0) start = now;
  if (aborted(p)) return true;
  const uint64_t waited = now - start;
  if (static_cast<int64_t>(waited) <= p.timeout_ns) return false;
  record_failure(p, RunStatus{RUN_TIMEOUT, static_cast<int32_t>(blockIdx.x), a.task, kFlagCounter, a.t,
                              seen, want, static_cast<int32_t>(waited / 1000000)});
  return true;
}

// Between two rounds of a poll, with `watch` a word still missing: by default the thread waits
// until that word carries the flag, with short sleeps and one word alone, because a consumer
// reaches its reads while its producers still stream their weights, and every thread of every
// waiting SM loading all its words each round would crowd the L2 they stream through. With
// MK_FLAG_POLL_ALL (MK_CUDA_FLAG_POLL=all) it only sleeps, and the next round loads every
// missing word again: one round trip less after the last word lands. False once the watchdog
// gives up.
__device__ inline bool flag_between_rounds(const uint64_t* watch, const Arena& a, uint64_t& start,
                                           uint32_t& rounds, uint32_t want) {
#if defined(MK_FLAG_POLL_ALL)
  flag_sleep();
  return (++rounds & 63) != 0 || !flag_stuck(a, start, flag_tag(flag_word_load(watch)), want);
#else
  for (;;) {
    flag_sleep();
    const uint32_t tag = flag_tag(flag_word_load(watch));
    if (tag == want) return true;
    if ((++rounds & 63) == 0 && flag_stuck(a, start, tag, want)) return false;
  }
#endif
}

// Words at(k) (null: none), k < G, into v[k] once each carries the flag `want` (the task's);
// every load of a round in flight at once. Addresses come from `at` each round
// rather than from an array: a poll's registers add to the heaviest body's, and the megakernel
// has 255 for all of them.
template <int G, class At>
__device__ inline void flag_poll(uint64_t (&v)[G], At at, const Arena& a, uint32_t want) {
  static_assert(G <= 32, "a poll group is one bit mask");
  uint32_t pending = 0;
#pragma unroll
  for (int k = 0; k < G; ++k) pending |= at(k) ? 1u << k : 0u;
  uint64_t start = 0;
  uint32_t rounds = 0;
  while (pending) {
#pragma unroll
    for (int k = 0; k < G; ++k)
      if (pending >> k & 1u) v[k] = flag_word_load(at(k));
#pragma unroll
    for (int k = 0; k < G; ++k)
      if ((pending >> k & 1u) && flag_tag(v[k]) == want) pending &= ~(1u << k);
    if (pending && !flag_between_rounds(at(__ffs(pending) - 1), a, start, rounds, want)) return;
  }
}

// Two consecutive words (16-byte aligned) in one load; each word is read whole, with its flag.
__device__ __forceinline__ void flag_pair_load(uint64_t& lo, uint64_t& hi, const uint64_t* w) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(w) : "memory");
}

// R runs of eight consecutive words (base[r], 16-byte aligned; null: none) into v[r] once every
// word carries the flag `want`: four 16-byte loads a run, every pending pair of a round in flight
// at once.
template <int R>
__device__ inline void flag_poll8(uint64_t (&v)[R][8], const uint64_t* const (&base)[R], const Arena& a,
                                  uint32_t want) {
  static_assert(R <= 8, "a poll group is one bit mask");
  uint32_t pending = 0;  // bit 4r + q: words 2q, 2q + 1 of run r
#pragma unroll
  for (int r = 0; r < R; ++r) pending |= base[r] ? 0xFu << 4 * r : 0u;
  uint64_t start = 0;
  uint32_t rounds = 0;
  while (pending) {
#pragma unroll
    for (int b = 0; b < 4 * R; ++b)
      if (pending >> b & 1u) flag_pair_load(v[b / 4][b % 4 * 2], v[b / 4][b % 4 * 2 + 1], base[b / 4] + b % 4 * 2);
    const uint64_t* watch = nullptr;
#pragma unroll
    for (int b = 0; b < 4 * R; ++b) {
      if (!(pending >> b & 1u)) continue;
      const uint64_t lo = v[b / 4][b % 4 * 2], hi = v[b / 4][b % 4 * 2 + 1];
      if (flag_tag(lo) != want) {
        if (!watch) watch = base[b / 4] + b % 4 * 2;
      } else if (flag_tag(hi) != want) {
        if (!watch) watch = base[b / 4] + b % 4 * 2 + 1;
      } else {
        pending &= ~(1u << b);
      }
    }
    if (watch && !flag_between_rounds(watch, a, start, rounds, want)) return;
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
  const uint32_t want = a.flag;
  constexpr uint32_t kPer = (N + kCudaThreads - 1) / kCudaThreads, kGroup = kPer < 8 ? kPer : 8;
  const uint64_t* w = static_cast<const uint64_t*>(base);
  for (uint32_t g = 0; g < kPer; g += kGroup) {
    const uint32_t e0 = threadIdx.x + g * kCudaThreads;
    uint64_t v[kGroup];
    flag_poll<kGroup>(v, [&](int k) -> const uint64_t* {
      const uint32_t e = e0 + k * kCudaThreads;
      return e < N ? w + run_index<Cols>(first, ld, e) : nullptr;
    }, a, want);
#pragma unroll
    for (uint32_t k = 0; k < kGroup; ++k) {
      const uint32_t e = e0 + k * kCudaThreads;
      if (e < N) tile.p[e] = static_cast<T>(flag_value(v[k]));
    }
  }
}

}  // namespace gpu
}  // namespace mk
