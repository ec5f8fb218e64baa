// Waiting for a task's turn: the launch parameters, the task's near copy of its descriptor and
// waits, and thread 0's poll of the event counters under the globaltimer watchdog. The
// dispatcher waits before a body, or a body that loads its weights first waits itself (Turn).
#pragma once

#include <stdint.h>

#include "mk/cuda_kernels.h"
#include "mk/events.h"
#include "mk/tables.h"

namespace mk {

// Everything a launch needs, all device pointers; passed by value as the kernel parameter.
struct LaunchParams {
  const WaitDesc* waits;
  const SignalDesc* signals;
  const int32_t* queue_offsets;
  const uint4* queue_entries;  // one QueueEntry<Dispatch::kSlots> per queue position
  void* const* buffers;       // base address of every buffer-table row
  uint32_t* counters;         // zeroed by the host when it resets the program (events.h)
  RunStatus* status;          // zeroed likewise; first failure wins, and a launch that finds one
                              // runs nothing
  int32_t* abort_flag;        // set by a failing CTA, polled by all
  uint8_t* scratch;           // scratch_per_sm bytes per CTA
  uint64_t scratch_per_sm;
  uint64_t* timeline;         // [iterations][num_tasks][2 + marks] start, end, op marks (ns), then
                              // [num_sms] the CTA's entry and exit (ns); or null
  uint32_t* epoch;            // per CTA: the iterations of the launches since the reset
  const uint4* heads;         // per CTA: its LaunchHead<Dispatch::kSlots> (mk/cuda_megakernel.cuh)
  int32_t num_sms;
  int32_t num_tasks;
  int32_t iterations;
  int32_t marks;              // op-mark slots per task in the timeline (MK_OP_MARKS builds)
  int64_t timeout_ns;
};

__device__ inline uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ inline bool aborted(const LaunchParams& p) {
  return *static_cast<volatile int32_t*>(p.abort_flag) != 0;
}

// Records the first failure of the launch and tells every CTA to stop.
__device__ inline void record_failure(const LaunchParams& p, RunStatus s) {
  if (atomicCAS(&p.status->error, RUN_OK, s.error) == RUN_OK) {
    p.status->sm = s.sm;
    p.status->task = s.task;
    p.status->counter = s.counter;
    p.status->iteration = s.iteration;
    p.status->value = s.value;
    p.status->threshold = s.threshold;
    p.status->wait_ms = s.wait_ms;
    __threadfence_system();
  }
  atomicExch(p.abort_flag, 1);
}

// What the dispatcher reads of a task, copied into shared memory before its turn: the
// descriptor and its first waits and signals (a task with more reads the rest from the tables).
constexpr int kNearWaits = 8, kNearSignals = 8;
struct NearTask {
  TaskDesc desc;
  WaitDesc waits[kNearWaits];
  int32_t signals[kNearSignals];     // counters
  int32_t tail_entry[kNearSignals];  // the entry of the signal's tail task, or -1
  int32_t tail_count[kNearSignals];  // its event's signals per element per iteration
};

// Thread 0's memory of counters it has read: counters only grow, so a wait whose target a
// remembered value already reaches needs no round trip to L2 (the lm_head's tasks, for one,
// all wait on the same counter).
struct SeenCounters {
  static constexpr int kSize = 4;
  int32_t counter[kSize];
  uint32_t value[kSize];
  int32_t next;
  // No initializers: the dispatcher keeps it in shared memory, where a body waiting for its own
  // turn reaches it too.
  __device__ void clear() {
#pragma unroll
    for (int i = 0; i < kSize; ++i) {
      counter[i] = -1;
      value[i] = 0;
    }
    next = 0;
  }
  __device__ bool meets(int32_t c, uint32_t target) const {
#pragma unroll
    for (int i = 0; i < kSize; ++i) {
      if (counter[i] == c && reached(value[i], target)) return true;
    }
    return false;
  }
  __device__ void remember(int32_t c, uint32_t v) {
#pragma unroll
    for (int i = 0; i < kSize; ++i) {
      if (counter[i] == c) {
        value[i] = reached(v, value[i]) ? v : value[i];
        return;
      }
    }
    counter[next] = c;
    value[next] = v;
    next = (next + 1) % kSize;
  }
};

// One look at every near wait of a task with n <= kNearWaits of them (waits_hold_at_first_look).
__device__ inline bool all_waits_hold(const LaunchParams& p, const NearTask& near, int32_t t,
                                      uint32_t base) {
  const int32_t n = near.desc.wait_end - near.desc.wait_begin;
  uint32_t value[kNearWaits];
#pragma unroll
  for (int i = 0; i < kNearWaits; ++i) {
    if (i < n) value[i] = event_peek(p.counters + near.waits[i].counter);
  }
  bool all = true;
#pragma unroll
  for (int i = 0; i < kNearWaits; ++i) {
    if (i < n) {
      const WaitDesc& wd = near.waits[i];
      const WaitTarget target = wait_target(wd.count, wd.distance, t, base);
      all = all && (target.now || reached(value[i], target.value));
    }
  }
  if (all) event_acquire_fence();
  return all;
}

// Thread 0, with Dispatch::kBatchWaits (on unless MK_CUDA_WAIT_BATCH=0): every near wait's
// counter read at once, one round trip to L2 for all of them, then one acquire fence when they
// all hold; false (look one by one) when one does not, or the task has more waits than are near.
// (Skipping the counters this CTA already saw hold, and remembering those read, cost 2.4 % on
// the H100: session 87.)
__device__ inline bool waits_hold_at_first_look(const LaunchParams& p, const NearTask& near,
                                                int32_t t, uint32_t base) {
  const int32_t n = near.desc.wait_end - near.desc.wait_begin;
  if (n > kNearWaits) return false;
  return all_waits_hold(p, near, t, base);
}

// The longest sleep between two polls of one counter (MK_CUDA_POLL_SLEEP): the sleep doubles
// from 32 ns up to it; 0 polls without sleeping.
#if defined(MK_POLL_SLEEP_NS)
constexpr unsigned kPollSleepNs = MK_POLL_SLEEP_NS;
#else
constexpr unsigned kPollSleepNs = 128;
#endif

// Thread 0: waits until every wait of `task` holds in iteration t of a launch that `base`
// iterations preceded since the reset; false if the launch stops.
// (Keeping several reads of a counter in flight instead of one poll at a time made every
// dispatch 0.1-0.55 us longer on the H200.)
template <bool Batch>
__device__ inline bool wait_task(const LaunchParams& p, const NearTask& near, int32_t id, int32_t sm,
                                 int32_t t, uint32_t base, SeenCounters& known) {
  const TaskDesc& task = near.desc;
  if constexpr (Batch) {
    if (task.wait_end - task.wait_begin > 1 && waits_hold_at_first_look(p, near, t, base)) return true;
  }
  bool slept = false;
  for (int32_t w = task.wait_begin; w < task.wait_end; ++w) {
    const int32_t i = w - task.wait_begin;
    const WaitDesc wd = i < kNearWaits ? near.waits[i] : p.waits[w];
    const WaitTarget target = wait_target(wd.count, wd.distance, t, base);
    if (target.now || known.meets(wd.counter, target.value)) continue;
    uint32_t seen = 0;
    const uint64_t start = globaltimer();
    unsigned sleep_ns = kPollSleepNs < 32 ? kPollSleepNs : 32, polls = 0;
    const auto timed_out = [&] {
      const uint64_t waited = globaltimer() - start;
      if (static_cast<int64_t>(waited) <= p.timeout_ns) return false;
      record_failure(p, RunStatus{RUN_TIMEOUT, sm, id, wd.counter, t, seen, target.value,
                                  static_cast<int32_t>(waited / 1000000)});
      return true;
    };
    while (!event_ready(p.counters + wd.counter, target.value, &seen)) {
      // Every poll is a round trip to L2: look at the abort flag only now and then.
      if ((++polls & 15) == 0 && aborted(p)) return false;
      if (timed_out()) return false;
      // A short cap: the sleep is latency on the critical path once the event fires.
      if (kPollSleepNs > 0) {
        __nanosleep(sleep_ns);
        sleep_ns = sleep_ns * 2 < kPollSleepNs ? sleep_ns * 2 : kPollSleepNs;
      }
    }
    known.remember(wd.counter, seen);
    slept = slept || polls > 1;
  }
  // Another CTA's failure: checked while polling, and once more after a wait that had to sleep
  // (a task whose events were all ready at the first look does not pay the round trip).
  return !slept || !aborted(p);
}

}  // namespace mk
