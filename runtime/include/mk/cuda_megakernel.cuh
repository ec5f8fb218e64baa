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
  const TaskDesc* tasks;
  const WaitDesc* waits;
  const SignalDesc* signals;
  const int32_t* queue_offsets;
  const int32_t* queue_tasks;
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
  int32_t signals[kNearSignals];  // counters
};

// One thread: task `id`'s NearTask and the addresses of its buffers, every load issued before
// the first store.
template <class Dispatch>
__device__ inline void load_task(const LaunchParams& p, int32_t id, NearTask& near, void** slots) {
  const TaskDesc desc = p.tasks[id];
  WaitDesc waits[kNearWaits];
  int32_t signals[kNearSignals];
#pragma unroll
  for (int i = 0; i < kNearWaits; ++i) {
    if (desc.wait_begin + i < desc.wait_end) waits[i] = p.waits[desc.wait_begin + i];
  }
#pragma unroll
  for (int i = 0; i < kNearSignals; ++i) {
    if (desc.signal_begin + i < desc.signal_end) signals[i] = p.signals[desc.signal_begin + i].counter;
  }
  Dispatch::resolve(desc.kind, p.buffers, slots);
  near.desc = desc;
#pragma unroll
  for (int i = 0; i < kNearWaits; ++i) {
    if (desc.wait_begin + i < desc.wait_end) near.waits[i] = waits[i];
  }
#pragma unroll
  for (int i = 0; i < kNearSignals; ++i) {
    if (desc.signal_begin + i < desc.signal_end) near.signals[i] = signals[i];
  }
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

// Thread 0: waits until every wait of `task` holds in iteration t; false if the launch stops.
__device__ inline bool wait_task(const LaunchParams& p, const NearTask& near, int32_t id, int32_t sm,
                                 int32_t t, SeenCounters& known) {
  const TaskDesc& task = near.desc;
  bool slept = false;
  for (int32_t w = task.wait_begin; w < task.wait_end; ++w) {
    const int32_t i = w - task.wait_begin;
    const WaitDesc wd = i < kNearWaits ? near.waits[i] : p.waits[w];
    const int64_t threshold = wait_threshold(wd.count, wd.distance, t);
    if (known.meets(wd.counter, threshold)) continue;
    uint32_t seen = 0;
    const uint64_t start = globaltimer();
    unsigned sleep_ns = 32, polls = 0;
    while (!event_ready(p.counters + wd.counter, threshold, &seen)) {
      // Every poll is a round trip to L2: look at the abort flag only now and then.
      if ((++polls & 15) == 0 && aborted(p)) return false;
      const uint64_t waited = globaltimer() - start;
      if (static_cast<int64_t>(waited) > p.timeout_ns) {
        record_failure(p, RunStatus{RUN_TIMEOUT, sm, id, wd.counter, t, seen,
                                    static_cast<uint32_t>(threshold),
                                    static_cast<int32_t>(waited / 1000000)});
        return false;
      }
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
  __shared__ int32_t go;
  // Descriptors, waits, signals and buffer addresses (Dispatch::resolve) of the current task
  // and the next one: thread 32 loads the next task's (and asks the L2 for its weights) while
  // thread 0 waits for the current one, so a body reads its coordinates and buffers from shared
  // memory, thread 0's wait and signals start without a table load, and tasks that follow each
  // other on an SM pay the longer of the two chains of L2 round trips (queue, task table, index
  // and buffer tables; counter) instead of their sum.
  // Three sets: while thread 32 fills the one after next, thread 0 may still be signalling from
  // the one before.
  __shared__ NearTask near[3];
  __shared__ void* slots[3][Dispatch::kSlots];
  __shared__ uint64_t stage_bar;
  __shared__ uint32_t stage_parity;
  const int32_t sm = blockIdx.x;
  gpu::Arena arena{p.scratch + static_cast<uint64_t>(sm) * p.scratch_per_sm, 0, p.scratch_per_sm,
                   gpu::mk_dynamic_smem + Dispatch::kArenaOffset, 0, Dispatch::kArenaBytes,
                   nullptr, p.marks, 0, &stage_bar, 0};
  if (threadIdx.x == 0) gpu::stage_barrier_init(&stage_bar);
  __syncthreads();
  uint32_t stages = 0;  // thread 0: barrier phases begun
  uint32_t n = 0;       // tasks begun; near/slots[n % 3] hold task n's
  SeenCounters known;   // thread 0's
  const uint64_t slot_width = 2 + static_cast<uint64_t>(p.marks);
  const int32_t begin = p.queue_offsets[sm], end = p.queue_offsets[sm + 1];
  for (int32_t t = 0; t < p.iterations; ++t) {
    for (int32_t q = begin; q < end; ++q) {
      const int32_t id = p.queue_tasks[q];
      const uint32_t cur = n++ % 3, after = (cur + 1) % 3;
      if (threadIdx.x == 0) {
        if (n == 1) {  // the launch's first task: nobody loaded it ahead
          load_task<Dispatch>(p, id, near[0], slots[0]);
          Dispatch::prefetch(near[0].desc.kind, &near[0].desc, slots[0], arena, t);
        }
        const TaskDesc* task = &near[cur].desc;
        // This task's weights into shared memory while it waits (the kinds that stage them).
        if (Dispatch::stage(task->kind, task, slots[cur], arena, t)) stage_parity = stages++ & 1;
        go = wait_task(p, near[cur], id, sm, t, known);
      } else if (threadIdx.x == 32) {
        // The next task: its descriptor and buffers, and its weights into L2, so HBM streams
        // them while this task waits and runs.
        const int32_t next = q + 1 < end ? q + 1 : t + 1 < p.iterations ? begin : -1;
        if (next >= 0) {
          const TaskDesc& ahead = near[after].desc;
          load_task<Dispatch>(p, p.queue_tasks[next], near[after], slots[after]);
          Dispatch::prefetch(ahead.kind, &ahead, slots[after], arena, next > q ? t : t + 1);
        }
      }
      __syncthreads();
      if (!go) return;
      const TaskDesc* task = &near[cur].desc;
      arena.stage_parity = stage_parity;
      const uint64_t started = p.timeline && threadIdx.x == 0 ? globaltimer() : 0;
      arena.reset(gpu::ArenaMark{0, 0});
      uint64_t* slot =
          p.timeline ? p.timeline + (static_cast<uint64_t>(t) * p.num_tasks + id) * slot_width : nullptr;
      arena.marks = slot && p.marks > 0 ? slot + 2 : nullptr;
      arena.mark_n = 0;
      const int32_t rc = Dispatch::run(task->kind, task, slots[cur], arena, t);
      __syncthreads();
      if (threadIdx.x == 0) {
        if (rc != 0) {
          record_failure(p, RunStatus{RUN_KERNEL_FAILED, sm, id, -1, t,
                                      static_cast<uint32_t>(rc - 1), 0, 0});
        } else {
          event_release_fence();
          for (int32_t s = task->signal_begin; s < task->signal_end; ++s) {
            const int32_t i = s - task->signal_begin;
            event_signal(p.counters + (i < kNearSignals ? near[cur].signals[i] : p.signals[s].counter));
          }
        }
        if (slot) {
          slot[0] = started;
          slot[1] = globaltimer();
        }
      }
      if (rc != 0) return;
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
