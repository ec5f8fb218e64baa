// The event protocol both executors run: monotonic thresholds, release on signal, acquire on wait.
//
// Counters start at 0 (per run on the CPU, per reset on the GPU: see reached()) and only grow.
// A producer signals an element once per iteration per producer task (`count` signals per
// element per iteration in all), so after every producer finished iteration t the counter is at
// least count * (t + 1). A wait of distance k in iteration t therefore needs count * (t + 1 - k);
// a threshold <= 0 (the first k iterations of a loop-carried wait) is satisfied at once.
//
// Ordering: the signal is a release read-modify-write and the wait an acquire load, so whatever
// a producer wrote before signalling is visible to a consumer once it sees the threshold; since
// every increment continues the release sequence, one acquire that sees count * n synchronises
// with all n * count signals before it.
//
// Exactness caveat the scheduler must uphold: with count > 1 a fast producer that is already an
// iteration ahead adds to the same counter, so a consumer may pass before a slow producer of
// iteration t signalled. The lowering prevents that with loop-carried "free" waits (a producer
// in iteration t + 1 waits, distance 1, for the consumers of iteration t), as task.graph does.
#pragma once

#include <stdint.h>

#include "mk/tables.h"

namespace mk {

// The value counters[w.counter] must reach before a task with wait `w` runs in iteration t.
MK_HOST_DEVICE inline int64_t wait_threshold(int32_t count, int32_t distance, int32_t iteration) {
  return static_cast<int64_t>(count) * (static_cast<int64_t>(iteration) + 1 - distance);
}

// On the GPU counters are not reset between launches (only when the host resets a program): a
// launch's iterations continue the earlier launches' (`base` of them before it), so the value a
// wait needs is count * (base + t + 1 - distance), and every comparison is modulo 2^32.
MK_HOST_DEVICE inline bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// What a wait needs in iteration t: `now` when it is on an iteration of an earlier launch (done
// before this launch began), else the counter value to reach.
struct WaitTarget {
  bool now;
  uint32_t value;
};

MK_HOST_DEVICE inline WaitTarget wait_target(int32_t count, int32_t distance, int32_t t,
                                             uint32_t base) {
  const int64_t local = wait_threshold(count, distance, t);
  return {local <= 0, static_cast<uint32_t>(count) * base + static_cast<uint32_t>(local)};
}

}  // namespace mk

#if !defined(__CUDACC__)
#include <atomic>

namespace mk {

using Counter = std::atomic<uint32_t>;

// MK_EVENTS_BROKEN_RELAXED is for runtime/tests/tsan_stress.cpp only: it drops the ordering so
// that ThreadSanitizer can show the data races acquire/release prevent. Never define it elsewhere.
#if defined(MK_EVENTS_BROKEN_RELAXED)
constexpr std::memory_order kWaitOrder = std::memory_order_relaxed;
constexpr std::memory_order kSignalOrder = std::memory_order_relaxed;
#else
constexpr std::memory_order kWaitOrder = std::memory_order_acquire;
constexpr std::memory_order kSignalOrder = std::memory_order_release;
#endif

// Non-blocking wait: the counter value if it reached `threshold` is reported through `seen`.
// Callers poll it with their own backoff and watchdog, so that one thread can play several SMs.
inline bool event_ready(const Counter& counter, int64_t threshold, uint32_t* seen) {
  if (threshold <= 0) return true;
  uint32_t value = counter.load(kWaitOrder);
  *seen = value;
  return static_cast<int64_t>(value) >= threshold;
}

inline void event_signal(Counter& counter) { counter.fetch_add(1, kSignalOrder); }

// A signal whose element has a tail task: the add that completes the element also acquires, so
// the SM that runs the tail sees what every producer wrote. Returns the value before the add.
inline uint32_t event_signal_tail(Counter& counter) {
#if defined(MK_EVENTS_BROKEN_RELAXED)
  return counter.fetch_add(1, std::memory_order_relaxed);
#else
  return counter.fetch_add(1, std::memory_order_acq_rel);
#endif
}

// Whether a signal that found `before` in its counter completed its element in iteration t.
inline bool completes_element(uint32_t before, int32_t count, int32_t iteration) {
  return static_cast<int64_t>(before) + 1 == wait_threshold(count, 0, iteration);
}

}  // namespace mk

#else  // __CUDACC__

namespace mk {

// One thread per CTA polls with acquire loads (the CTA's other threads wait at a __syncthreads()
// after it). One thread signals after a __syncthreads() and one release fence, which is
// cumulative over the CTA's writes; each signal after it is then a relaxed add (PTX's release
// pattern: fence.acq_rel, then a strong write), so a task pays one fence however many events it
// signals. GPU scope throughout.
__device__ inline bool event_ready(const uint32_t* counter, uint32_t target, uint32_t* seen) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(counter) : "memory");
  *seen = value;
  return reached(value, target);
}

// One fence before a task's signals, which are then relaxed. Each signal a release operation
// of its own (red.release / atom.release, without the fence) measured slower: qwen3-0.6b +1.6 %
// on the H200, +0.24 % on the H100 (MK_CUDA_SIGNAL=release, retired in session 88).
__device__ inline void event_release_fence() { asm volatile("fence.acq_rel.gpu;" : : : "memory"); }

// A counter's value without ordering (a strong relaxed load): several go out at once. Reading
// what the producers wrote needs event_acquire_fence() after the values are seen to suffice
// (PTX's acquire pattern: a strong read, then fence.acq_rel).
__device__ inline uint32_t event_peek(const uint32_t* counter) {
  uint32_t value;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(counter) : "memory");
  return value;
}

__device__ inline void event_acquire_fence() { asm volatile("fence.acq_rel.gpu;" : : : "memory"); }

__device__ inline void event_signal(uint32_t* counter) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" : : "l"(counter) : "memory");
}

// A signal whose element has a tail task (after event_release_fence, like event_signal): the
// add returns the value before it, and the acquire fence after an add that completed the element
// makes every producer's writes visible to the tail this CTA then runs.
__device__ inline uint32_t event_signal_tail(uint32_t* counter) {
  uint32_t before;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
  return before;
}

__device__ inline bool completes_element(uint32_t before, int32_t count, int32_t iteration,
                                         uint32_t base) {
  return before + 1 == wait_target(count, 0, iteration, base).value;
}

}  // namespace mk

#endif  // __CUDACC__
