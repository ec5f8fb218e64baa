// Per-CTA memory of the CUDA task bodies: the dynamic shared memory, the bump arena the tiles
// live in (a shared-memory part, then global scratch), the tiles themselves, and the op marks
// of a profile build.
#pragma once

#include <stdint.h>
#include <stdio.h>

namespace mk {
constexpr int kCudaThreads = 256;  // every CTA of the megakernel
}  // namespace mk

// A CTA's threads as the code sees them: in the megakernel (MK_MEGAKERNEL, which the emitted
// source defines) the constant kCudaThreads, so that loops over a CTA's threads fold (an element
// loop of at most that many elements is one guarded step); elsewhere (bench programs) the
// launch's.
#if defined(MK_MEGAKERNEL)
#define MK_CTA_THREADS (static_cast<unsigned>(::mk::kCudaThreads))
#else
#define MK_CTA_THREADS blockDim.x
#endif

// A CTA-cooperative loop: thread i takes elements i, i + MK_CTA_THREADS, ...
#define MK_FOR_EACH(e, n) _Pragma("unroll 1") for (int64_t e = threadIdx.x; e < (n); e += MK_CTA_THREADS)
#define MK_FOR_EACH_U32(e, n) _Pragma("unroll 1") for (uint32_t e = threadIdx.x; e < (n); e += MK_CTA_THREADS)

namespace mk {
namespace gpu {

// The dynamic shared memory of a CTA: the streamed bodies' activation chunk or attention slots
// at the front, then the arena's fast part (Dispatch::kArenaOffset). It starts after the static
// shared memory, on MK_DYNAMIC_SMEM_ALIGN bytes (MK_CUDA_SMEM_ALIGN): the bodies' buffers sit on
// 128-byte offsets from it; a start off 128 B measured slower (the gated MLP at batch 8: +10 %
// on the H100).
#ifndef MK_DYNAMIC_SMEM_ALIGN
#define MK_DYNAMIC_SMEM_ALIGN 128
#endif
extern __shared__ __align__(MK_DYNAMIC_SMEM_ALIGN) unsigned char mk_dynamic_smem[];

struct ArenaMark {
  uint64_t top;
  uint64_t fast_top;
};

// Out of line: every body allocates, and the report's printf inlined was ~250 bytes of code in
// each of them.
__device__ __noinline__ inline void scratch_overflow(uint64_t need, uint64_t cap) {
#if !defined(MK_NO_DEVICE_PRINTF)
  if (threadIdx.x == 0) printf("mk: CTA %d scratch overflow (%llu > %llu bytes)\n", blockIdx.x,
                               (unsigned long long)need, (unsigned long long)cap);
#endif
  __trap();
}

// Per-CTA bump allocator: tiles go to a shared-memory part while it has room, then to this SM's
// slice of the global scratch area. Most task bodies' tiles are small, and in shared memory each
// of their cooperative steps costs a few dozen cycles instead of an L2 round trip. All threads
// allocate in the same order, so they agree on every address without talking to each other.
struct Arena {
  uint8_t* base;
  uint64_t top;
  uint64_t cap;
  uint8_t* fast;
  uint64_t fast_top;
  uint64_t fast_cap;
  uint64_t* marks;  // this task's op-mark timestamps (MK_OP_MARKS builds with a timeline), or null
  int32_t mark_cap;
  int32_t mark_n;
  // Flagged buffers (cuda_flags.cuh): the flag this task's iteration writes and waits for, and
  // what a stuck wait reports (the launch's parameters, the task, the iteration).
  uint32_t flag;
  const void* params;
  int32_t task;
  int32_t t;
  // Out of line: ~150 bytes of code inline at each of a body's allocations.
  __device__ __noinline__ void* alloc(uint64_t bytes) {
    const uint64_t near = (fast_top + 15) & ~uint64_t{15};
    if (near + bytes <= fast_cap) {
      fast_top = near + bytes;
      return fast + near;
    }
    const uint64_t at = (top + 15) & ~uint64_t{15};
    if (at + bytes > cap) scratch_overflow(at + bytes, cap);
    top = at + bytes;
    return base + at;
  }
  // A body whose shared memory at the front takes `front` bytes, reaching into the fast part,
  // keeps its tiles behind them (in global scratch where the fast part has no room left).
  __device__ void clear_front(uint64_t front) {
    const uint64_t at = static_cast<uint64_t>(fast - mk_dynamic_smem);
    if (front > at + fast_top) fast_top = front - at;
  }
  __device__ ArenaMark mark() const { return ArenaMark{top, fast_top}; }
  __device__ void reset(ArenaMark m) {
    top = m.top;
    fast_top = m.fast_top;
  }
};

// Op marks: a build with MK_OP_MARKS defined stamps the time after each statement of a task body
// (and between the phases of the streamed bodies) into the timeline, so a profile can say which
// statement a task's time goes to. Thread 0 stamps; the statements end with __syncthreads().
__device__ inline uint64_t mark_clock() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ inline void op_mark(Arena& a) {
  if (threadIdx.x == 0 && a.marks && a.mark_n < a.mark_cap) a.marks[a.mark_n] = mark_clock();
  ++a.mark_n;
}

#if defined(MK_OP_MARKS)
#define MK_MARK(arena) ::mk::gpu::op_mark(arena)
#else
#define MK_MARK(arena) ((void)0)
#endif

// A dense tile in scratch memory with a fixed capacity (its static size): a handle, so copies
// share storage; `resize` only changes the logical size.
template <class T>
struct Tile {
  T* p = nullptr;
  int64_t n = 0;
  int64_t cap = 0;
  __device__ Tile() {}
  __device__ Tile(Arena& a, int64_t capacity)
      : p(static_cast<T*>(a.alloc(sizeof(T) * (capacity > 0 ? capacity : 1)))), n(0), cap(capacity) {}
  // A tile in storage the caller allocated (a body's tiles as one arena block).
  __device__ Tile(T* storage, int64_t capacity) : p(storage), n(0), cap(capacity) {}
  __device__ void resize(int64_t m) {
    if (m > cap) {
#if !defined(MK_NO_DEVICE_PRINTF)
      if (threadIdx.x == 0) printf("mk: tile of %lld elements resized to %lld\n", (long long)cap, (long long)m);
#endif
      __trap();
    }
    n = m;
  }
  __device__ int64_t size() const { return n; }
  __device__ T* data() const { return p; }
  __device__ T& operator[](int64_t i) const { return p[i]; }
  // This tile becomes a view of x (a reshape: the same elements in the same order).
  __device__ void alias(const Tile& x) {
    p = x.p;
    n = x.n;
    cap = x.cap;
  }
  __device__ void assign(int64_t m, T value) {
    resize(m);
    MK_FOR_EACH(e, m) p[e] = value;
    __syncthreads();
  }
};

}  // namespace gpu
}  // namespace mk
