// The persistent CUDA megakernel: one CTA per queue, all co-resident, each walking its static
// queue every iteration; waits poll event counters (acquire) under a globaltimer watchdog,
// signals release after the CTA's writes. The emitted program supplies `Dispatch::run`.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "mk/cuda_kernels.h"
#include "mk/cuda_stage.cuh"
#include "mk/events.h"
#include "mk/tables.h"

namespace mk {

// mk_cuda_launch's own refusal (beside cudaError_t codes): the grid cannot be co-resident.
constexpr int kNotCoResident = 100000;

// Everything a launch needs, all device pointers; passed by value as the kernel parameter.
struct LaunchParams {
  const WaitDesc* waits;
  const SignalDesc* signals;
  const int32_t* queue_offsets;
  const uint4* queue_entries;  // one QueueEntry<Dispatch::kSlots> per queue position
  void* const* buffers;       // base address of every buffer-table row
  uint32_t* counters;         // zeroed by the host before the launch
  RunStatus* status;          // zeroed by the host; first failure wins
  int32_t* abort_flag;        // set by a failing CTA, polled by all
  uint8_t* scratch;           // scratch_per_sm bytes per CTA
  uint64_t scratch_per_sm;
  uint64_t* timeline;         // [iterations][num_tasks][2 + marks] start, end, op marks (ns), or null
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

__device__ inline bool has_tails(const NearTask& near) {
  bool any = false;
#pragma unroll
  for (int i = 0; i < kNearSignals; ++i) any = any || near.tail_entry[i] >= 0;
  return any;
}

// Thread 0's memory of counters it has read: counters only grow during a launch, so a wait
// whose threshold a remembered value already meets needs no round trip to L2 (the lm_head's
// tasks, for one, all wait on the same counter).
struct SeenCounters {
  static constexpr int kSize = 4;
  int32_t counter[kSize] = {-1, -1, -1, -1};
  uint32_t value[kSize] = {0, 0, 0, 0};
  int32_t next = 0;
  __device__ bool meets(int32_t c, int64_t threshold) const {
#pragma unroll
    for (int i = 0; i < kSize; ++i) {
      if (counter[i] == c && static_cast<int64_t>(value[i]) >= threshold) return true;
    }
    return false;
  }
  __device__ void remember(int32_t c, uint32_t v) {
#pragma unroll
    for (int i = 0; i < kSize; ++i) {
      if (counter[i] == c) {
        value[i] = v > value[i] ? v : value[i];
        return;
      }
    }
    counter[next] = c;
    value[next] = v;
    next = (next + 1) % kSize;
  }
};

// Tail tasks a CTA owes at once (each completed element pushes one; a chain pops as it pushes),
// and the run status detail of a task whose signals owed more.
constexpr int kTailStack = 16;
constexpr uint32_t kTailOverflow = 0x7FFFFFFD;

// Thread 0, after the task's body: the release fence and every signal; a signal that completes
// an element with a tail in iteration t pushes the tail's entry (acquiring, so the tail sees
// every producer's writes) and remembers the count it made, so the tail's wait on that element
// costs no round trip to L2. False when the stack overflows (recorded as a failure).
__device__ inline bool signal_task(const NearTask& near, const SignalDesc* far, uint32_t* counters,
                                   int32_t t, int32_t* stack, int32_t& top, SeenCounters& known) {
  const TaskDesc& task = near.desc;
  event_release_fence();
  bool acquired = false, fits = true;
  for (int32_t s = task.signal_begin; s < task.signal_end; ++s) {
    const int32_t i = s - task.signal_begin;
    const bool near_row = i < kNearSignals;
    uint32_t* counter = counters + (near_row ? near.signals[i] : far[s].counter);
    if (!near_row || near.tail_entry[i] < 0) {  // the host puts every tail among the near rows
      event_signal(counter);
    } else if (const uint32_t before = event_signal_tail(counter);
               completes_element(before, near.tail_count[i], t)) {
      known.remember(near.signals[i], before + 1);
      fits = fits && top < kTailStack;
      if (top < kTailStack) stack[top++] = near.tail_entry[i];
      acquired = true;
    }
  }
  if (acquired) event_release_fence();
  return fits;
}

// Everything the dispatcher needs of the task at one queue position, laid out by the host in
// queue order (backends/cuda/host.py): its NearTask, its id, and the buffer-table rows of the
// buffers its body reads (-1 past its last). One record at an address known from the position,
// so loading the next task is one batch of independent loads, not a chain of dependent ones
// (queue entry, descriptor, waits, slot table, buffer table).
template <int Slots>
struct __align__(16) QueueEntry {
  NearTask near;
  int32_t id;
  int32_t slot[Slots];
};

// Buffer-table rows the CTA keeps in shared memory (the whole table when it has no more).
constexpr int kSharedBufferRows = 1024;

template <class Dispatch>
__device__ inline const uint4* queue_entry(const LaunchParams& p, int32_t q) {
  constexpr int kVecs = sizeof(QueueEntry<Dispatch::kSlots>) / 16;
  return p.queue_entries + static_cast<int64_t>(q) * kVecs;
}

// One thread: the entry at queue position q into `entry`, and the addresses of its buffers
// (from `table`, the buffer table) into `slots`; every load issued before the first store.
template <class Dispatch>
__device__ inline void load_entry(const LaunchParams& p, int32_t q, QueueEntry<Dispatch::kSlots>& entry,
                                  void** slots, void* const* table) {
  constexpr int kVecs = sizeof(QueueEntry<Dispatch::kSlots>) / 16;
  const uint4* src = queue_entry<Dispatch>(p, q);
  uint4 v[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) v[i] = __ldg(src + i);
  uint4* dst = reinterpret_cast<uint4*>(&entry);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) dst[i] = v[i];
  void* at[Dispatch::kSlots];
#pragma unroll
  for (int k = 0; k < Dispatch::kSlots; ++k) at[k] = entry.slot[k] >= 0 ? table[entry.slot[k]] : nullptr;
#pragma unroll
  for (int k = 0; k < Dispatch::kSlots; ++k) slots[k] = at[k];
}

// One thread: asks the L1 for the entry at queue position q, so that loading it a task later
// costs no round trip to L2 (or HBM, where a step's weight stream evicted it).
template <class Dispatch>
__device__ inline void prefetch_entry(const LaunchParams& p, int32_t q) {
  const char* at = reinterpret_cast<const char*>(queue_entry<Dispatch>(p, q));
  for (uint32_t o = 0; o < sizeof(QueueEntry<Dispatch::kSlots>); o += 128) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(at + o));
  }
}


// Thread 0, with Dispatch::kBatchWaits (MK_CUDA_WAIT_BATCH=1): every near wait's counter read
// at once, one round trip to L2 for all of them, then one acquire fence when they all hold;
// false (look one by one) when one does not, or the task has more waits than are near.
__device__ inline bool waits_hold_at_first_look(const LaunchParams& p, const NearTask& near,
                                                int32_t t) {
  const int32_t n = near.desc.wait_end - near.desc.wait_begin;
  if (n > kNearWaits) return false;
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
      all = all && static_cast<int64_t>(value[i]) >= wait_threshold(wd.count, wd.distance, t);
    }
  }
  if (all) event_acquire_fence();
  return all;
}

// Thread 0, with Dispatch::kPipePolls (MK_CUDA_POLL_PIPE=1), once a counter was found below
// `threshold`: keeps kPollDepth relaxed reads of it in flight, a new one every kPollGapNs, and
// takes one acquire fence when a read meets the threshold. A plain poll waits out a whole L2
// round trip before the next one goes out, so an update that lands just after a read reached L2
// is seen up to one and a half round trips later; here about half of one plus the gap. RUN_OK,
// RUN_TIMEOUT or -1 (the launch stops).
constexpr int kPollDepth = 4;
constexpr unsigned kPollGapNs = 96;
__device__ inline int32_t poll_pipelined(const LaunchParams& p, const uint32_t* counter,
                                         int64_t threshold, uint64_t start, uint32_t* seen) {
  uint32_t v[kPollDepth];
#pragma unroll
  for (int i = 0; i < kPollDepth; ++i) {
    v[i] = event_peek(counter);
    __nanosleep(kPollGapNs);
  }
  for (uint32_t round = 1;; ++round) {
#pragma unroll
    for (int i = 0; i < kPollDepth; ++i) {
      *seen = v[i];
      if (static_cast<int64_t>(v[i]) >= threshold) {
        event_acquire_fence();
        return RUN_OK;
      }
      v[i] = event_peek(counter);
      __nanosleep(kPollGapNs);
    }
    if ((round & 3) == 0 && aborted(p)) return -1;
    if (static_cast<int64_t>(globaltimer() - start) > p.timeout_ns) return RUN_TIMEOUT;
  }
}

// Thread 0: waits until every wait of `task` holds in iteration t; false if the launch stops.
// `on_miss` runs once, at the first event found not ready: work worth doing only while the
// task would otherwise sleep (Dispatch::kPrefetchAtWait).
template <bool Batch, bool Pipe, class OnMiss>
__device__ inline bool wait_task(const LaunchParams& p, const NearTask& near, int32_t id, int32_t sm,
                                 int32_t t, SeenCounters& known, OnMiss&& on_miss) {
  const TaskDesc& task = near.desc;
  if constexpr (Batch) {
    if (task.wait_end - task.wait_begin > 1 && waits_hold_at_first_look(p, near, t)) return true;
  }
  bool slept = false, missed = false;
  const auto first_miss = [&] {
    if (!missed) {
      missed = true;
      on_miss();
    }
  };
  for (int32_t w = task.wait_begin; w < task.wait_end; ++w) {
    const int32_t i = w - task.wait_begin;
    const WaitDesc wd = i < kNearWaits ? near.waits[i] : p.waits[w];
    const int64_t threshold = wait_threshold(wd.count, wd.distance, t);
    if (known.meets(wd.counter, threshold)) continue;
    uint32_t seen = 0;
    const uint64_t start = globaltimer();
    unsigned sleep_ns = 32, polls = 0;
    const auto timed_out = [&] {
      const uint64_t waited = globaltimer() - start;
      if (static_cast<int64_t>(waited) <= p.timeout_ns) return false;
      record_failure(p, RunStatus{RUN_TIMEOUT, sm, id, wd.counter, t, seen,
                                  static_cast<uint32_t>(threshold),
                                  static_cast<int32_t>(waited / 1000000)});
      return true;
    };
    if constexpr (Pipe) {
      if (!event_ready(p.counters + wd.counter, threshold, &seen)) {
        first_miss();
        const int32_t got = poll_pipelined(p, p.counters + wd.counter, threshold, start, &seen);
        if (got < 0 || (got == RUN_TIMEOUT && timed_out())) return false;
        slept = true;  // look at the abort flag once it holds, as after a plain poll's sleep
      }
    }
    while (!Pipe && !event_ready(p.counters + wd.counter, threshold, &seen)) {
      first_miss();
      // Every poll is a round trip to L2: look at the abort flag only now and then.
      if ((++polls & 15) == 0 && aborted(p)) return false;
      if (timed_out()) return false;
      // A short cap: the sleep is latency on the critical path once the event fires.
      __nanosleep(sleep_ns);
      if (sleep_ns < 128) sleep_ns *= 2;
    }
    if (threshold > 0) known.remember(wd.counter, seen);
    slept = slept || sleep_ns > 32;
  }
  // Another CTA's failure: checked while polling, and once more after a wait that had to sleep
  // (a task whose events were all ready at the first look does not pay the round trip).
  return !slept || !aborted(p);
}

template <class Dispatch>
__global__ void __launch_bounds__(kCudaThreads, 1) megakernel(const LaunchParams p) {
  using Entry = QueueEntry<Dispatch::kSlots>;
  constexpr bool kTableShared = Dispatch::kBuffers <= kSharedBufferRows;
  __shared__ int32_t go;
  // The current task's entry and buffer addresses and the next one's: thread 32 loads the
  // next task's (and asks the L2 for its weights) while thread 0 waits for the current one, so
  // a body reads its coordinates and buffers from shared memory and thread 0's wait and signals
  // start without a table load. Three sets: while thread 32 fills the one after next, thread 0
  // may still be signalling from the one before.
  __shared__ Entry entry[3];
  __shared__ void* slots[3][Dispatch::kSlots];
  // The buffer table, so resolving a task's buffers costs no round trip to L2.
  __shared__ void* table_rows[kTableShared && Dispatch::kBuffers > 0 ? Dispatch::kBuffers : 1];
  // Weights staged ahead (cuda_stage.cuh): a barrier and a place in the ring per task set.
  __shared__ uint64_t stage_bars[3];
  __shared__ gpu::StagePlace staged[3];
  __shared__ uint32_t stage_phases[3];  // barrier phases begun per set (thread 0 or 32 issues)
  // Tail tasks this CTA owes (queue-entry indices), run before its next queued task.
  __shared__ int32_t tail_stack[kTailStack];
  __shared__ int32_t tail_top;
  const int32_t sm = blockIdx.x;
  uint8_t* const ring = gpu::mk_dynamic_smem + Dispatch::kRingOffset;
  gpu::Arena arena{p.scratch + static_cast<uint64_t>(sm) * p.scratch_per_sm, 0, p.scratch_per_sm,
                   gpu::mk_dynamic_smem + Dispatch::kArenaOffset, 0, Dispatch::kArenaBytes,
                   nullptr, p.marks, 0, ring, &stage_bars[0], 0};
  void* const* table = p.buffers;
  if constexpr (kTableShared) {
    for (int i = threadIdx.x; i < Dispatch::kBuffers; i += kCudaThreads) table_rows[i] = p.buffers[i];
    table = table_rows;
  }
  // One thread: task set `set`'s weights into the ring at the place chosen for them.
  auto stage_set = [&](uint32_t set, const TaskDesc* task, int32_t t_task) {
    gpu::Arena at = arena;
    at.stage_base = ring + staged[set].at;
    at.stage_bar = &stage_bars[set];
    Dispatch::stage(task->kind, task, slots[set], at, t_task);
    staged[set].parity = stage_phases[set]++ & 1;
  };
  const int32_t begin = p.queue_offsets[sm], end = p.queue_offsets[sm + 1];
  if (threadIdx.x == 0) {
    tail_top = 0;
    for (int i = 0; i < 3; ++i) {
      gpu::stage_barrier_init(&stage_bars[i]);
      staged[i] = gpu::StagePlace{0, 0, 0, 0};
      stage_phases[i] = 0;
    }
    if (begin < end && p.iterations > 0) {  // the launch's first task: nobody loaded it ahead
      // From the global table: the other threads are still filling the shared one.
      load_entry<Dispatch>(p, begin, entry[0], slots[0], p.buffers);
      const TaskDesc* first = &entry[0].near.desc;
      if constexpr (!Dispatch::kPrefetchAtWait) Dispatch::prefetch(first->kind, first, slots[0], arena, 0);
      staged[0].bytes = Dispatch::stage_bytes(first->kind);
      if (staged[0].bytes) stage_set(0, first, 0);
    }
  }
  __syncthreads();
  uint32_t n = 0;       // tasks begun; entry/slots/staged[n % 3] hold task n's
  SeenCounters known;   // thread 0's
  const uint64_t slot_width = 2 + static_cast<uint64_t>(p.marks);
  // All threads: one task's body in iteration t, then thread 0's signals (and timeline); false
  // if the launch must stop.
  int32_t t = 0;
  auto run_task = [&](const Entry& e, void* const* task_slots) {
    const TaskDesc* task = &e.near.desc;
#if defined(MK_OP_MARKS_WARM)
    // A diagnostic profile build: the body once untimed, so that the timed run below finds its
    // code in the instruction cache and its reads in L2.
    arena.reset(gpu::ArenaMark{0, 0});
    arena.marks = nullptr;
    Dispatch::run(task->kind, task, task_slots, arena, t);
    __syncthreads();
#endif
    const uint64_t started = p.timeline && threadIdx.x == 0 ? globaltimer() : 0;
    arena.reset(gpu::ArenaMark{0, 0});
    uint64_t* slot =
        p.timeline ? p.timeline + (static_cast<uint64_t>(t) * p.num_tasks + e.id) * slot_width : nullptr;
    arena.marks = slot && p.marks > 0 ? slot + 2 : nullptr;
    arena.mark_n = 0;
    const int32_t rc = Dispatch::run(task->kind, task, task_slots, arena, t);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (rc != 0) {
        record_failure(p, RunStatus{RUN_KERNEL_FAILED, sm, e.id, -1, t, static_cast<uint32_t>(rc - 1), 0, 0});
      } else if (!signal_task(e.near, p.signals, p.counters, t, tail_stack, tail_top, known)) {
        record_failure(p, RunStatus{RUN_KERNEL_FAILED, sm, e.id, -1, t, kTailOverflow, 0, 0});
      }
      if (slot) {
        slot[0] = started;
        slot[1] = globaltimer();
      }
    }
    return rc == 0;
  };
  // The queue position after q (wrapping into the next iteration), or -1 past the last.
  auto after_q = [&](int32_t q, int32_t t) { return q + 1 < end ? q + 1 : t + 1 < p.iterations ? begin : -1; };
  for (; t < p.iterations; ++t) {
    for (int32_t q = begin; q < end; ++q) {
      const uint32_t cur = n++ % 3, after = (cur + 1) % 3;
      if (threadIdx.x == 0) {
        const TaskDesc* task = &entry[cur].near.desc;
        // Weights that found no room ahead: into the front of the ring, free now.
        if (staged[cur].deferred) {
          stage_set(cur, task, t);
          staged[cur].deferred = 0;
        }
        // With kPrefetchAtWait the L2 prefetch of this task's weights is issued only once a
        // wait finds its producers unfinished: a ready task starts without paying for it.
        go = wait_task<Dispatch::kBatchWaits, Dispatch::kPipePolls>(p, entry[cur].near, entry[cur].id, sm, t, known, [&] {
          if constexpr (Dispatch::kPrefetchAtWait) Dispatch::prefetch(task->kind, task, slots[cur], arena, t);
        });
      } else if (threadIdx.x == 32) {
        // The next task: its entry and buffers, its weights into the ring behind this task's
        // (and, prefetching ahead, into L2), so HBM streams them while this task waits and
        // runs; and the entry after it into L1.
        const int32_t next = after_q(q, t);
        if (next >= 0) {
          const int32_t t_next = next > q ? t : t + 1;
          load_entry<Dispatch>(p, next, entry[after], slots[after], table);
          const TaskDesc& ahead = entry[after].near.desc;
          if constexpr (!Dispatch::kPrefetchAtWait) {
            Dispatch::prefetch(ahead.kind, &ahead, slots[after], arena, t_next);
          }
          const uint32_t bytes = Dispatch::stage_bytes(ahead.kind);
          staged[after] = gpu::StagePlace{0, bytes, 0, 0};
          if (bytes) {
            const int32_t at = gpu::ring_place(staged[cur].at, staged[cur].bytes, bytes, Dispatch::kRingBytes);
            if (at < 0) {
              staged[after].deferred = 1;
            } else {
              staged[after].at = static_cast<uint32_t>(at);
              stage_set(after, &ahead, t_next);
            }
          }
          const int32_t later = after_q(next, t_next);
          if (later >= 0) prefetch_entry<Dispatch>(p, later);
          // Its tails' entries too: a tail is loaded right after the signal that completes it.
#pragma unroll
          for (int i = 0; i < kNearSignals; ++i) {
            const int32_t tail = entry[after].near.tail_entry[i];
            if (tail >= 0) prefetch_entry<Dispatch>(p, tail);
          }
        }
      }
      __syncthreads();
      if (!go) return;
      arena.stage_base = ring + staged[cur].at;
      arena.stage_bar = &stage_bars[cur];
      arena.stage_parity = staged[cur].parity;
      if (!run_task(entry[cur], slots[cur])) return;
      if (!has_tails(entry[cur].near)) continue;
      // Tails: the tasks whose element this task's signals completed, run here and now (their
      // own signals may complete more). Set (cur + 2) % 3 is free until thread 32 fills it at
      // the next queued task.
      __syncthreads();
      const uint32_t ts = (cur + 2) % 3;
      for (int32_t owed = tail_top; owed > 0; owed = tail_top) {
        __syncthreads();  // every thread has read tail_top
        if (threadIdx.x == 0) {
          load_entry<Dispatch>(p, tail_stack[--tail_top], entry[ts], slots[ts], table);
          go = wait_task<Dispatch::kBatchWaits, Dispatch::kPipePolls>(p, entry[ts].near, entry[ts].id, sm, t, known, [] {});
        }
        __syncthreads();
        if (!go || !run_task(entry[ts], slots[ts])) return;
        __syncthreads();  // thread 0's pushes
      }
    }
  }
}

// Enqueues the grid cooperatively on `stream` (all CTAs co-resident, or a refusal) without
// waiting for it. Dispatch::kSmemBytes of dynamic shared memory go to each CTA (the task bodies'
// staging area, then the arena's fast part); the attribute and the occupancy are settled once per
// process.
template <class Dispatch>
int launch(const LaunchParams* params, cudaStream_t stream) {
  static int capacity = -1;  // co-resident CTAs the device takes, once known
  const size_t smem = Dispatch::kSmemBytes;
  if (capacity < 0) {
    int device = 0, sms = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) {
      e = cudaFuncSetAttribute(megakernel<Dispatch>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem));
    }
    if (e == cudaSuccess) {
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, megakernel<Dispatch>,
                                                        kCudaThreads, smem);
    }
    if (e != cudaSuccess) return static_cast<int>(e);
    capacity = sms * per_sm;
  }
  if (params->num_sms > capacity) return kNotCoResident;
  void* args[] = {const_cast<LaunchParams*>(params)};
  return static_cast<int>(cudaLaunchCooperativeKernel(
      reinterpret_cast<const void*>(megakernel<Dispatch>), dim3(params->num_sms),
      dim3(kCudaThreads), args, smem, stream));
}

}  // namespace mk

#define MK_CUDA_ENTRY_POINTS(Dispatch)                                                        \
  extern "C" int mk_abi_version(void) { return MK_RUNTIME_ABI; }                            \
  extern "C" int mk_cuda_launch(const mk::LaunchParams* p, void* stream) {                  \
    return mk::launch<Dispatch>(p, static_cast<cudaStream_t>(stream));                      \
  }                                                                                         \
  extern "C" const char* mk_cuda_error_string(int e) {                                      \
    return e == mk::kNotCoResident ? "the grid cannot be co-resident"                       \
                                   : cudaGetErrorString(static_cast<cudaError_t>(e));       \
  }                                                                                         \
  extern "C" int mk_cuda_device_sms(void) {                                                 \
    int d = 0, n = 0;                                                                       \
    cudaGetDevice(&d);                                                                      \
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d);                          \
    return n;                                                                               \
  }                                                                                         \
  extern "C" int mk_cuda_sizeof_params(void) { return sizeof(mk::LaunchParams); }
