// The persistent CUDA megakernel: one CTA per queue, all co-resident, each walking its static
// queue every iteration; waits poll event counters (acquire) under a globaltimer watchdog,
// signals release after the CTA's writes. The emitted program supplies `Dispatch::run`.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "mk/cuda_kernels.h"
#include "mk/cuda_flags.cuh"
#include "mk/cuda_stage.cuh"
#include "mk/cuda_wait.cuh"
#include "mk/events.h"
#include "mk/tables.h"

namespace mk {

// mk_cuda_launch's own refusal (beside cudaError_t codes): the grid cannot be co-resident.
constexpr int kNotCoResident = 100000;

__device__ inline bool has_tails(const NearTask& near) {
  bool any = false;
#pragma unroll
  for (int i = 0; i < kNearSignals; ++i) any = any || near.tail_entry[i] >= 0;
  return any;
}

// Tail tasks a CTA owes at once (each completed element pushes one; a chain pops as it pushes),
// and the run status detail of a task whose signals owed more.
constexpr int kTailStack = 16;
constexpr uint32_t kTailOverflow = 0x7FFFFFFD;

// Thread 0, after the task's body: the release fence and every signal; a signal that completes
// an element with a tail in iteration t (`base` iterations before this launch) pushes the
// tail's entry (acquiring, so the tail sees every producer's writes) and remembers the count it
// made, so the tail's wait on that element costs no round trip to L2. False when the stack
// overflows (recorded as a failure).
// Without Tails (no task of the program is a tail) every signal is a plain one.
template <bool Tails>
__device__ inline bool signal_task(const NearTask& near, const SignalDesc* far, uint32_t* counters,
                                   int32_t t, uint32_t base, int32_t* stack, int32_t& top,
                                   SeenCounters& known) {
  const TaskDesc& task = near.desc;
  if (task.signal_begin == task.signal_end) return true;  // nobody to publish to
  event_release_fence();
  bool acquired = false, fits = true;
  for (int32_t s = task.signal_begin; s < task.signal_end; ++s) {
    const int32_t i = s - task.signal_begin;
    const bool near_row = i < kNearSignals;
    uint32_t* counter = counters + (near_row ? near.signals[i] : far[s].counter);
    if (!Tails || !near_row || near.tail_entry[i] < 0) {  // the host puts every tail among the near rows
      event_signal(counter);
    } else if (const uint32_t before = event_signal_tail(counter);
               completes_element(before, near.tail_count[i], t, base)) {
      known.remember(near.signals[i], before + 1);
      fits = fits && top < kTailStack;
      if (top < kTailStack) stack[top++] = near.tail_entry[i];
      acquired = true;
    }
  }
  if (acquired) event_acquire_fence();  // the tail reads what every producer wrote
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

// Where a CTA's launch starts, built by the host per CTA whenever the buffers move
// (backends/cuda/entries.py): its first queue entry, its queue's bounds and that entry's buffer
// addresses, so the first task waits for one round trip to memory, not three dependent ones
// (bounds, entry, buffer table).
template <int Slots>
struct __align__(16) LaunchHead {
  QueueEntry<Slots> entry;
  int32_t begin, end, unused[2];
  void* slot[(Slots + 1) / 2 * 2];
};

// Buffer-table rows the CTA keeps in shared memory (the whole table when it has no more).
constexpr int kSharedBufferRows = 1024;

template <class Dispatch>
__device__ inline const uint4* queue_entry(const LaunchParams& p, int32_t q) {
  constexpr int kVecs = sizeof(QueueEntry<Dispatch::kSlots>) / 16;
  return p.queue_entries + static_cast<int64_t>(q) * kVecs;
}

// One thread: N 16-byte words from `src` into registers, every load issued before any is used;
// the first sizeof(Entry) bytes of them then into `entry` (shared memory).
template <int N>
__device__ inline void load_vecs(const uint4* src, uint4 (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = __ldg(src + i);
}

template <class Entry, int N>
__device__ inline void store_entry(const uint4 (&v)[N], Entry& entry) {
  static_assert(sizeof(Entry) % 16 == 0 && sizeof(Entry) / 16 <= N, "an entry is whole 16-byte words");
  uint4* dst = reinterpret_cast<uint4*>(&entry);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(Entry) / 16); ++i) dst[i] = v[i];
}

// One thread: the entry at queue position q into `entry`, and the addresses of its buffers
// (from `table`, the buffer table) into `slots`; every load issued before the first store.
template <class Dispatch>
__device__ inline void load_entry(const LaunchParams& p, int32_t q, QueueEntry<Dispatch::kSlots>& entry,
                                  void** slots, void* const* table) {
  uint4 v[sizeof(QueueEntry<Dispatch::kSlots>) / 16];
  load_vecs(queue_entry<Dispatch>(p, q), v);
  store_entry(v, entry);
  void* at[Dispatch::kSlots];
#pragma unroll
  for (int k = 0; k < Dispatch::kSlots; ++k) at[k] = entry.slot[k] >= 0 ? table[entry.slot[k]] : nullptr;
#pragma unroll
  for (int k = 0; k < Dispatch::kSlots; ++k) slots[k] = at[k];
}

// One thread: the CTA's head (every load issued before the first store): its first entry and
// buffer addresses into `entry` and `slots`, its queue's bounds into `bounds`.
template <class Dispatch>
__device__ inline void load_head(const LaunchParams& p, int32_t sm, QueueEntry<Dispatch::kSlots>& entry,
                                 void** slots, int32_t* bounds) {
  using Head = LaunchHead<Dispatch::kSlots>;
  constexpr int kVecs = sizeof(Head) / 16, kEntryVecs = sizeof(QueueEntry<Dispatch::kSlots>) / 16;
  uint4 v[kVecs];
  load_vecs(p.heads + static_cast<int64_t>(sm) * kVecs, v);
  store_entry(v, entry);
  bounds[0] = static_cast<int32_t>(v[kEntryVecs].x);
  bounds[1] = static_cast<int32_t>(v[kEntryVecs].y);
#pragma unroll
  for (int k = 0; k < Dispatch::kSlots; ++k) {
    const uint4& w = v[kEntryVecs + 1 + k / 2];
    const uint64_t lo = k % 2 == 0 ? w.x : w.z, hi = k % 2 == 0 ? w.y : w.w;
    slots[k] = reinterpret_cast<void*>(lo | hi << 32);
  }
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

// With a timeline, where the CTA's entry and exit go (after every task's slots), so a profile
// shows what the launch's start and end cost beside the tasks.
__device__ inline uint64_t* cta_span(const LaunchParams& p, int32_t sm) {
  return p.timeline + static_cast<uint64_t>(p.iterations) * p.num_tasks * (2 + static_cast<uint64_t>(p.marks)) +
         2 * static_cast<uint64_t>(sm);
}

// MK_INLINE_WALK (MK_CUDA_INLINE_BODIES=walk): the walk runs a task inline at both of its places,
// so that with the bodies inlined the megakernel makes no call that a body's wgmma pipeline
// would cross (ptxas C7510).
#if defined(MK_INLINE_WALK)
#define MK_INLINED_TASK __attribute__((always_inline))
#else
#define MK_INLINED_TASK
#endif

// The CTA's walk of its queue in every iteration; false if the launch stopped (a failure here
// or elsewhere, or one an earlier launch left unreset).
template <class Dispatch>
__device__ __forceinline__ bool run_queues(const LaunchParams& p) {
  using Entry = QueueEntry<Dispatch::kSlots>;
  constexpr bool kTableShared = Dispatch::kBuffers <= kSharedBufferRows;
  __shared__ int32_t go;
  // The current task's entry and buffer addresses and the next one's: thread 32 loads the
  // next task's while thread 0 waits for the current one, so a body reads its coordinates and
  // buffers from shared memory and thread 0's wait and signals start without a table load. Three sets: while thread 32 fills the one after next, thread 0
  // may still be signalling from the one before.
  __shared__ Entry entry[3];
  __shared__ void* slots[3][Dispatch::kSlots];
  // The buffer table, so resolving a task's buffers costs no round trip to L2.
  __shared__ void* table_rows[kTableShared && Dispatch::kBuffers > 0 ? Dispatch::kBuffers : 1];
  // Tail tasks this CTA owes (queue-entry indices), run before its next queued task.
  __shared__ int32_t tail_stack[kTailStack];
  __shared__ int32_t tail_top;
  // Thread 0's memory of counters.
  __shared__ SeenCounters known;
  // Iterations of the launches since the host's reset: this launch's iteration t continues them
  // (the counters' targets, events.h), and a flagged buffer's flag for it is base + t + 1.
  __shared__ uint32_t base;
  __shared__ bool stopped;  // by a failed launch before this one
  __shared__ int32_t bounds[2];  // the CTA's queue positions [begin, end)
  const int32_t sm = blockIdx.x;
  if (p.timeline && threadIdx.x == 0) cta_span(p, sm)[0] = globaltimer();
  gpu::Arena arena{p.scratch + static_cast<uint64_t>(sm) * p.scratch_per_sm, 0, p.scratch_per_sm,
                   gpu::mk_dynamic_smem + Dispatch::kArenaOffset, 0, Dispatch::kArenaBytes,
                   nullptr, p.marks, 0, 0, &p, -1, 0};
  void* const* table = p.buffers;
  if constexpr (kTableShared) {
    // Warps 2 and up: thread 0 starts on the head and thread 32 on the second entry at once,
    // not after a row's round trip (0.1-0.2 µs off the first task's start on an H100).
    constexpr int kCopiers = kCudaThreads - 64;
    for (int i = static_cast<int>(threadIdx.x) - 64; i < Dispatch::kBuffers; i += kCopiers) {
      if (i >= 0) table_rows[i] = p.buffers[i];
    }
    table = table_rows;
  }
  if constexpr (Dispatch::kLaunchWords > 0) {
    // The launch constants whose steps the bodies compute (launch_words.py): one a thread of
    // warps 2 and up, read before the first task's barrier.
    static_assert(Dispatch::kLaunchWords <= kCudaThreads - 64, "a launch word a thread");
    if (threadIdx.x >= 64) Dispatch::load_launch_words(p.buffers, static_cast<int>(threadIdx.x) - 64);
  }
  if (threadIdx.x == 0) {
    // Used only once the first task's loads are out, so the launch's start waits for one round
    // trip to memory, not two.
    const uint32_t epoch = p.epoch[sm];
    const int32_t error = static_cast<volatile RunStatus*>(p.status)->error;
    tail_top = 0;
    known.clear();
    gpu::raw_bars_init();
    // The launch's first task: nobody loaded it ahead.
    load_head<Dispatch>(p, sm, entry[0], slots[0], bounds);
    base = epoch;
    // A failure of an earlier launch leaves its counters short: nothing runs until the reset.
    stopped = error != RUN_OK;
  } else if (threadIdx.x == 32) {
    // Thread 32 loads the second task's entry at the first task's turn, and the first task
    // waits for it: into the L1 now, beside thread 0's loads of the head.
    if (const int32_t second = p.queue_offsets[sm] + 1; second < p.queue_offsets[sm + 1]) {
      prefetch_entry<Dispatch>(p, second);
    }
  }
  __syncthreads();
  if (stopped) return false;
  const int32_t begin = bounds[0], end = bounds[1];
  uint32_t n = 0;  // tasks begun; entry/slots[n % 3] hold task n's
  const uint64_t slot_width = 2 + static_cast<uint64_t>(p.marks);
  // All threads: one task's body in iteration t, then thread 0's signals (and timeline); false
  // if the launch must stop.
  int32_t t = 0;
  auto run_task = [&](const Entry& e, void* const* task_slots) MK_INLINED_TASK {
    const TaskDesc* task = &e.near.desc;
    arena.flag = base + static_cast<uint32_t>(t) + 1;
    arena.task = e.id;
    arena.t = t;
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
      } else if (!signal_task<Dispatch::kTails>(e.near, p.signals, p.counters, t, base, tail_stack, tail_top, known)) {
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
        go = wait_task<Dispatch::kBatchWaits>(p, entry[cur].near, entry[cur].id, sm, t, base, known);
      } else if (threadIdx.x == 32) {
        // The next task: its entry and buffers; and the entry after it into L1.
        const int32_t next = after_q(q, t);
        if (next >= 0) {
          const int32_t t_next = next > q ? t : t + 1;
          load_entry<Dispatch>(p, next, entry[after], slots[after], table);
          const int32_t later = after_q(next, t_next);
          if (later >= 0) prefetch_entry<Dispatch>(p, later);
          // Its tails' entries too: a tail is loaded right after the signal that completes it.
          if constexpr (Dispatch::kTails) {
#pragma unroll
            for (int i = 0; i < kNearSignals; ++i) {
              const int32_t tail = entry[after].near.tail_entry[i];
              if (tail >= 0) prefetch_entry<Dispatch>(p, tail);
            }
          }
        }
      }
      __syncthreads();
      if (!go || !run_task(entry[cur], slots[cur])) return false;
      // A program without tails leaves this code out: the dispatcher runs at every task, and
      // what it holds beside its executed path still takes instruction-cache room.
      if (!Dispatch::kTails || !has_tails(entry[cur].near)) continue;
      // Tails: the tasks whose element this task's signals completed, run here and now (their
      // own signals may complete more). Set (cur + 2) % 3 is free until thread 32 fills it at
      // the next queued task.
      __syncthreads();
      const uint32_t ts = (cur + 2) % 3;
      for (int32_t owed = tail_top; owed > 0; owed = tail_top) {
        __syncthreads();  // every thread has read tail_top
        if (threadIdx.x == 0) {
          load_entry<Dispatch>(p, tail_stack[--tail_top], entry[ts], slots[ts], table);
          go = wait_task<Dispatch::kBatchWaits>(p, entry[ts].near, entry[ts].id, sm, t, base, known);
        }
        __syncthreads();
        if (!go || !run_task(entry[ts], slots[ts])) return false;
        __syncthreads();  // thread 0's pushes
      }
    }
  }
  // The next launch continues from here; only this CTA reads its word, at its next start.
  if (threadIdx.x == 0) {
    p.epoch[sm] = base + static_cast<uint32_t>(p.iterations);
    if (p.timeline) cta_span(p, sm)[1] = globaltimer();
  }
  return true;
}

template <class Dispatch>
__global__ void __launch_bounds__(kCudaThreads, 1) megakernel(const __grid_constant__ LaunchParams p) {
  run_queues<Dispatch>(p);
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
#if defined(MK_PLAIN_LAUNCH)
  // MK_CUDA_LAUNCH=plain: the occupancy check above is the only guarantee of co-residency.
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(megakernel<Dispatch>),
                                           dim3(params->num_sms), dim3(kCudaThreads), args, smem,
                                           stream));
#else
  return static_cast<int>(cudaLaunchCooperativeKernel(
      reinterpret_cast<const void*>(megakernel<Dispatch>), dim3(params->num_sms),
      dim3(kCudaThreads), args, smem, stream));
#endif
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
