"""Whether a loader warp that streams weights into shared memory ahead of the dependency chain
lets a decode layer run at max(chain latency, weight bytes / bandwidth) instead of their sum.

A decode step is a chain of phases (qwen3-0.6b: norm+qkv, attention, o-proj, norm+gate/up,
down) in which every SM waits for all SMs of the phase before, loads the activation, takes a
norm, multiplies its weight slab and signals. mk streams each slab from HBM once the wait is
over, so a phase costs its round trips plus its bytes; fetching the bytes earlier (into L2, or
in one bulk copy into shared memory) measured slower, because a burst of every SM's next slab
queues in front of the latency-bound loads of the phase it overlaps (bench/RESULTS.md).

This standalone program (no mk headers; one CTA of eight compute warps and one loader warp
per SM, all SMs) runs LAYERS layers of the phases in `--phases` (weight rows of K columns per
SM; 0 = a phase of chain only) and times a whole launch:

- `chain`: the waits, activation loads, norms and signals alone (no weights);
- `direct`: after its wait, each warp streams its rows from HBM (the way mk does today);
- `ring F`: the loader warp copies 16 KB chunks (eight rows) of the coming phases into a ring
  of SLOTS chunks with cp.async.bulk, at most F chunks in flight, as far ahead as the ring
  allows; each compute warp takes row `warp` of four chunks at a time once they land (the
  order `direct` reads its rows in) and hands their slots back. F = SLOTS is the burst
  (everything the ring can take, at once);
- `stream`: the ring at the widest F without the waits: what the weight bytes alone cost;
- `chainr`, `directr`: `chain` and `direct` with acquire loads and release reductions instead
  of relaxed polls and acq_rel fences around the signal's atomic; `chainmk`, `directmk`: with
  the megakernel's own protocol (acquire polls with sleeps of 32 ns doubling to 128 between
  them, one fence then a relaxed reduction);
- with `--cluster N` every mode runs in clusters of N CTAs, and `chaincl` / `directcl` let the
  phases marked `c` in `--phases` wait for their own cluster only (each CTA's thread 0 arrives
  on every peer's shared-memory barrier, release at cluster scope, and waits for its own): what
  a phase whose consumer needs only a few producers (a head's QK-norm after its q columns) would
  cost if it were cluster-local instead of grid-wide;
- `ringc`, `streamc`: the same with the whole loader warp copying 16 bytes a lane (cp.async,
  through the L1's request queue) instead of one thread's bulk copies (the TMA unit's).

Every mode but `chain`/`stream` computes the same sums in the same order, so the final
activations must be bit-identical (checked). The floor is the weight bytes at the copy
bandwidth measured in the same run (device-to-device cudaMemcpy).

    python bench/chain.py [--phases 32,0,0,16,48,24] [--layers 28] [--inflight 1,2,4,12]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

K = 1024  # columns of every weight row (bf16): a 2 KB row, a 16 KB chunk of eight rows
CHUNK_ROWS = 8
SLOTS = 12  # 192 KB of ring
GROUP = 4  # chunks a warp takes at once: four rows' loads in flight per lane


def kernel_source(phases: list[int], slots: int, local: list[bool] | None = None) -> str:
    """The megakernel-shaped chain: compute warps 0-7, loader warp 8. A `local` phase (with the
    cl modes) waits for its cluster's CTAs only, through shared-memory barriers, not the grid."""
    n = len(phases)
    local = local or [False] * n
    prefix = [sum(phases[:i]) for i in range(n)]
    return f"""
constexpr int K = {K}, kRows = {CHUNK_ROWS}, kSlots = {slots}, kPhases = {n}, kGroup = {GROUP};
constexpr int kChunk = kRows * K * 2;
__constant__ int c_rows[kPhases] = {{{", ".join(map(str, phases))}}};
__constant__ int c_prefix[kPhases] = {{{", ".join(map(str, prefix))}}};
__constant__ int c_local[kPhases] = {{{", ".join(str(int(x)) for x in local)}}};
constexpr int kLayerRows = {sum(phases)};
enum Mode {{ CHAIN = 0, DIRECT = 1, RING = 2, STREAM = 3 }};

__device__ __forceinline__ uint32_t sa(const void* p) {{
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}}
__device__ __forceinline__ void mb_init(uint64_t* b, int n) {{
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n) : "memory");
}}
__device__ __forceinline__ bool mb_done(uint64_t* b, uint32_t parity) {{
  uint32_t ok;
  asm volatile(
      "{{\\n .reg .pred p;\\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n"
      " selp.u32 %0, 1, 0, p;\\n}}"
      : "=r"(ok) : "r"(sa(b)), "r"(parity) : "memory");
  return ok != 0;
}}
__device__ __forceinline__ void mb_wait(uint64_t* b, uint32_t parity) {{
  while (!mb_done(b, parity)) {{}}
}}
__device__ __forceinline__ void mb_arrive(uint64_t* b) {{
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory");
}}
__device__ __forceinline__ void bulk(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {{
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(bar)), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(bar)) : "memory");
}}
__device__ __forceinline__ void compute_sync() {{ asm volatile("bar.sync 1, 256;" ::: "memory"); }}
// Every thread of every CTA of the cluster (a CTA's shared memory must outlive its peers' use).
__device__ __forceinline__ void cluster_sync_all() {{
  asm volatile("barrier.cluster.arrive.release.aligned;\\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
}}
__device__ __forceinline__ uint32_t cluster_rank() {{
  uint32_t r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}}
__device__ __forceinline__ uint32_t cluster_size() {{
  uint32_t n; asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n)); return n;
}}
// Thread 0: one arrival (release, cluster scope) on the barrier at `bar` in every CTA of the
// cluster, then the wait for this CTA's own barrier to complete phase `parity` (acquire).
__device__ __forceinline__ void cluster_meet(uint64_t* bar, uint32_t n, uint32_t parity) {{
  for (uint32_t r = 0; r < n; ++r) {{
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(sa(bar)), "r"(r));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
  }}
  uint32_t ok = 0;
  while (!ok) {{
    asm volatile(
        "{{\\n .reg .pred p;\\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\\n"
        " selp.u32 %0, 1, 0, p;\\n}}"
        : "=r"(ok) : "r"(sa(bar)), "r"(parity) : "memory");
  }}
}}

template <bool Global>
__device__ __forceinline__ uint4 ld16(const uint16_t* p) {{
  uint4 v;
  if (Global) {{
    asm("ld.global.nc.L1::no_allocate.v4.u32 {{%0, %1, %2, %3}}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }} else {{
    v = *reinterpret_cast<const uint4*>(p);
  }}
  return v;
}}

__device__ __forceinline__ float warp_sum(float v) {{
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}}

// Up to G rows (row[j]), each dotted with xs by the warp: every load issued first.
template <bool Global, int G>
__device__ __forceinline__ void dot_rows(const uint16_t* const* row, int n, const float* xs, float* out,
                                         int out_step) {{
  const int lane = threadIdx.x & 31;
  uint4 v[G][K / 256];
#pragma unroll
  for (int j = 0; j < G; ++j)
    if (j < n)
#pragma unroll
      for (int s = 0; s < K / 256; ++s) v[j][s] = ld16<Global>(row[j] + s * 256 + lane * 8);
#pragma unroll
  for (int j = 0; j < G; ++j) {{
    if (j >= n) break;
    float acc = 0.f;
#pragma unroll
    for (int s = 0; s < K / 256; ++s) {{
      const float4 a = *reinterpret_cast<const float4*>(xs + s * 256 + lane * 8);
      const float4 b = *reinterpret_cast<const float4*>(xs + s * 256 + lane * 8 + 4);
      const uint32_t u[4] = {{v[j][s].x, v[j][s].y, v[j][s].z, v[j][s].w}};
      const float x[8] = {{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
#pragma unroll
      for (int q = 0; q < 4; ++q) {{
        acc = fmaf(__uint_as_float(u[q] << 16), x[2 * q], acc);
        acc = fmaf(__uint_as_float(u[q] & 0xffff0000u), x[2 * q + 1], acc);
      }}
    }}
    acc = warp_sum(acc);
    if (lane == 0) out[j * out_step] = acc;
  }}
}}

struct Params {{
  const uint16_t* w;  // layer-major, then phase, then SM, then rows of K
  float* act;         // per phase: gridDim.x * max rows floats; act_in first
  unsigned* counters; // per phase: SMs done
  int layers, mode, inflight, copier;  // copier: 0 one thread's cp.async.bulk, 1 a warp's cp.async
  int sync;  // 0: relaxed polls + acq_rel fences around an atomic; 1: ld.acquire, red.release;
             // 2: as 1, with mk's sleeps between polls
  int local;  // 1: the phases marked local wait for their cluster only
  int ll;     // 1: no counters; each value travels with its flag (one 8-byte store), polled
  unsigned long long* lls;  // per phase: the flagged values
  long long act_stride;
}};

__device__ __forceinline__ const uint16_t* slab(const Params& p, int layer, int j) {{
  const long long g = gridDim.x;
  return p.w + ((long long)layer * kLayerRows * g + c_prefix[j] * g + (long long)blockIdx.x * c_rows[j]) * K;
}}

{_loader_source()}{_compute_source()}{_entry_source()}"""


def _loader_source() -> str:
    """The loader warp's walk over every chunk of every phase, into the ring."""
    return """
__device__ __noinline__ void load_ahead(const Params& p, uint16_t* ring, uint64_t* full, uint64_t* empty,
                                        int lane) {
    long long i = 0;
    for (int layer = 0; layer < p.layers; ++layer)
      for (int j = 0; j < kPhases; ++j)
        for (int c = 0; c < c_rows[j] / kRows; ++c, ++i) {
          const int slot = static_cast<int>(i % kSlots);
          const long long use = i / kSlots;
          if (use > 0) mb_wait(&empty[slot], static_cast<uint32_t>((use - 1) & 1));
          if (i >= p.inflight) {
            const long long d = i - p.inflight;
            mb_wait(&full[d % kSlots], static_cast<uint32_t>((d / kSlots) & 1));
          }
          uint16_t* dst = ring + (size_t)slot * (kChunk / 2);
          const uint16_t* from = slab(p, layer, j) + (size_t)c * kRows * K;
          if (p.copier == 0) {
            bulk(dst, from, kChunk, &full[slot]);
          } else {  // every lane: 16-byte cp.async, then an arrival once its copies land
            for (int e = lane * 8; e < kChunk / 2; e += 256) {
              asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(dst + e)), "l"(from + e) : "memory");
            }
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(sa(&full[slot])) : "memory");
          }
        }
}
"""


LL_SOURCE = """
// The ll modes: a value and its flag in one 8-byte store, so a consumer's poll of the values is
// the wait (no fence, no counter, one round trip fewer), as NCCL's LL protocol does.
__device__ __forceinline__ float ll_take(const unsigned long long* in, float* xs, float* raw) {
  unsigned long long v[K / 256];
  unsigned pending = (1u << (K / 256)) - 1;
  while (pending) {  // every load of a round in flight at once
#pragma unroll
    for (int s = 0; s < K / 256; ++s)
      if (pending & (1u << s))
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v[s]) : "l"(in + threadIdx.x + s * 256) : "memory");
#pragma unroll
    for (int s = 0; s < K / 256; ++s)
      if ((pending & (1u << s)) && (v[s] >> 32) == 1u) pending &= ~(1u << s);
  }
  float ss = 0.f;  // in the plain path's order: the same sums
#pragma unroll
  for (int s = 0; s < K / 256; ++s) {
    const float x = __uint_as_float(static_cast<uint32_t>(v[s]));
    xs[threadIdx.x + s * 256] = x;
    raw[threadIdx.x + s * 256] = x;
    ss += x * x;
  }
  return ss;
}
// A phase of rows writes them; a weightless one forwards its share of the values it read.
__device__ __forceinline__ void ll_give(unsigned long long* out, int rows, const float* res, const float* raw) {
  const int n = rows > 0 ? rows : (K + gridDim.x - 1) / gridDim.x;
  const long long at = (long long)blockIdx.x * n;
  for (int r = threadIdx.x; r < n && (rows > 0 || at + r < K); r += 256) {
    const float v = rows > 0 ? res[r] : raw[at + r];
    const unsigned long long w = (1ull << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(out + at + r), "l"(w) : "memory");
  }
}
"""


def _compute_source() -> str:
    """The compute warps' phases: wait, activation and norm, product, signal."""
    return (
        LL_SOURCE
        + """
__device__ __noinline__ void compute(const Params& p, uint16_t* ring, float* xs, float* raw, float* res,
                                     uint64_t* full,
                                     uint64_t* empty, uint64_t* cbar, float* part, uint32_t crank,
                                     uint32_t csize) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool ringed = p.mode == RING || p.mode == STREAM;
  long long i = 0;  // chunks taken
  const float* src = p.act;  // act_in
  int src_rows = 0, prev_rows = 0;  // rows a CTA wrote of src; of the phase before
  uint32_t locals = 0;  // local phases met
  int phase = 0;
  for (int layer = 0; layer < p.layers; ++layer)
    for (int j = 0; j < kPhases; ++j, ++phase) {
      const int rows = c_rows[j];
      const bool local = p.local && c_local[j] && phase > 0;
      if (local && threadIdx.x == 0) cluster_meet(cbar, csize, locals & 1);
      locals += local;
      if (!local && !p.ll && phase > 0 && p.mode != STREAM && threadIdx.x == 0) {
        const unsigned* ctr = p.counters + phase - 1;
        unsigned seen, nap = 32;
        do {
          if (p.sync == 0) {
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ctr) : "memory");
          } else {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ctr) : "memory");
          }
          if (p.sync == 2 && seen < gridDim.x) {  // mk's poll: a sleep of 32 ns doubling to 128
            __nanosleep(nap);
            nap = nap < 128 ? 2 * nap : 128;
          }
        } while (seen < gridDim.x);
        if (p.sync == 0) asm volatile("fence.acq_rel.gpu;" ::: "memory");
      }
      compute_sync();
      // The activation and its norm (every phase: the chain's latency-bound part).
      float ss = 0.f;
      // A local phase reads only what its cluster wrote of the phase before.
      const bool near = local && prev_rows > 0;
      const long long base = near ? (long long)(blockIdx.x - crank) * src_rows : 0;
      const int span = near ? static_cast<int>(csize) * src_rows : K;
      if (p.ll && phase > 0) {
        ss = ll_take(p.lls + (long long)phase * p.act_stride, xs, raw);
      } else {
        for (int e = threadIdx.x; e < K; e += 256) {
          const float v = __ldcg(src + base + e % span);
          xs[e] = v;
          raw[e] = v;
          ss += v * v;
        }
      }
      ss = warp_sum(ss);
      if (lane == 0) part[warp] = ss;
      compute_sync();
      float total = 0.f;
#pragma unroll
      for (int q = 0; q < 8; ++q) total += part[q];
      const float scale = rsqrtf(total / K + 1e-6f);
      for (int e = threadIdx.x; e < K; e += 256) xs[e] *= scale;
      compute_sync();
      float* out = p.ll ? res : p.act + (long long)(phase + 1) * p.act_stride + (long long)blockIdx.x * rows;
      if (p.mode == DIRECT) {
        const uint16_t* w = slab(p, layer, j);
        // Row `warp` of chunks c..c+3 (rows warp + 8c...), as the ring takes them below.
        for (int c = 0; c < rows / kRows; c += kGroup) {
          const int n = rows / kRows - c < kGroup ? rows / kRows - c : kGroup;
          const uint16_t* row[kGroup];
#pragma unroll
          for (int g = 0; g < kGroup; ++g) row[g] = w + (long long)((c + g) * kRows + warp) * K;
          dot_rows<true, kGroup>(row, n, xs, out + c * kRows + warp, kRows);
        }
      } else if (ringed) {
        for (int c = 0; c < rows / kRows; c += kGroup) {
          const int n = rows / kRows - c < kGroup ? rows / kRows - c : kGroup;
          const uint16_t* row[kGroup];
#pragma unroll
          for (int g = 0; g < kGroup; ++g) {
            const long long at = i + g;
            row[g] = ring + (size_t)(at % kSlots) * (kChunk / 2) + warp * K;
            if (g < n) mb_wait(&full[at % kSlots], static_cast<uint32_t>((at / kSlots) & 1));
          }
          dot_rows<false, kGroup>(row, n, xs, out + c * kRows + warp, kRows);
          __syncwarp();
          if (lane == 0)
            for (int g = 0; g < n; ++g) mb_arrive(&empty[(i + g) % kSlots]);
          i += n;
        }
      } else {
        for (int r = threadIdx.x; r < rows; r += 256) out[r] = xs[(blockIdx.x * rows + r) % K];
      }
      compute_sync();
      if (p.ll) ll_give(p.lls + (long long)(phase + 1) * p.act_stride, rows, res, raw);
      if (rows > 0 && p.mode != STREAM) {
        src = p.act + (long long)(phase + 1) * p.act_stride;
        src_rows = rows;
      }
      prev_rows = rows;
      if (threadIdx.x == 0 && !p.ll) {
        if (p.sync == 0) {
          asm volatile("fence.acq_rel.gpu;" ::: "memory");
          atomicAdd(p.counters + phase, 1u);
        } else if (p.sync == 2) {  // mk's signal: one fence, then a relaxed reduction
          asm volatile("fence.acq_rel.gpu;" ::: "memory");
          asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(p.counters + phase) : "memory");
        } else {
          asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.counters + phase) : "memory");
        }
      }
    }
}
"""
    )


def _entry_source() -> str:
    """The kernel: barriers set up, then the loader warp and the compute warps apart."""
    return """
__global__ void __launch_bounds__(288, 1) chain(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* ring = reinterpret_cast<uint16_t*>(smem);
  float* xs = reinterpret_cast<float*>(smem + kSlots * kChunk);
  __shared__ uint64_t full[kSlots], empty[kSlots];
  __shared__ uint64_t cbar;  // a local phase: one arrival from each CTA of the cluster
  __shared__ float part[8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t crank = cluster_rank(), csize = cluster_size();
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) { mb_init(&full[s], p.copier ? 32 : 1); mb_init(&empty[s], 8); }
    mb_init(&cbar, static_cast<int>(csize));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  cluster_sync_all();  // every peer's barrier is initialised before the first remote arrival
  const bool ringed = p.mode == RING || p.mode == STREAM;
  if (warp == 8) {
    if (ringed && (p.copier == 1 || lane == 0)) load_ahead(p, ring, full, empty, lane);
  } else {
    compute(p, ring, xs, xs + K, xs + 2 * K, full, empty, &cbar, part, crank, csize);
  }
  cluster_sync_all();
}
"""


def program_source(
    phases: list[int],
    layers: int,
    inflight: list[int],
    slots: int = SLOTS,
    local: list[bool] | None = None,
    cluster: int = 1,
) -> str:
    """The kernel and a main that times each mode (20 launches after 3, median) and prints
    `mode inflight median_us checksum_bits`, then `copy GB/s`, `bytes N` and `ctas N`. With
    `cluster` > 1 every mode runs in clusters of that many CTAs (as many as fit at once), and
    chaincl / directcl wait only for their cluster before the `local` phases."""
    modes = [("chain", 0, 0, 0), ("direct", 1, 0, 0)]
    modes += [("chainr", 0, 0, 0), ("directr", 1, 0, 0)]  # the same, ld.acquire / red.release
    modes += [("chainmk", 0, 0, 0), ("directmk", 1, 0, 0)]  # mk's polls (sleeps) and signal
    modes += [("chainll", 0, 0, 0), ("directll", 1, 0, 0)]  # flagged values, no counters
    if cluster > 1 and local and any(local):
        modes += [("chaincl", 0, 0, 0), ("directcl", 1, 0, 0)]
    for copier, suffix in ((0, ""), (1, "c")):
        modes += [(f"ring{suffix}", 2, f, copier) for f in inflight]
        modes.append((f"stream{suffix}", 3, slots, copier))
    runs = "".join(f'\n  run("{name}", {m}, {f}, {c});' for name, m, f, c in modes)
    rows_max = max(phases)
    smem = slots * CHUNK_ROWS * K * 2 + (2 * K + rows_max) * 4  # ring, xs, raw, res
    return f"""#include <cuda_runtime.h>
#include <stdint.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
{kernel_source(phases, slots, local)}
__global__ void fill(uint16_t* w, size_t n) {{
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {{
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32) * 40503u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    const float v = (static_cast<float>(h & 0xffffu) / 65536.f - 0.5f) * 0.1f;  // never all zero
    uint32_t bits; memcpy(&bits, &v, 4);
    w[i] = static_cast<uint16_t>(bits >> 16);
  }}
}}

#define CHECK(x) do {{ cudaError_t e_ = (x); if (e_ != cudaSuccess) {{ \\
  printf("error %s at %d\\n", cudaGetErrorString(e_), __LINE__); exit(1); }} }} while (0)

static int sms;
static Params prm;
static size_t act_floats;
static std::vector<float> reference;

static cudaLaunchConfig_t config;
static cudaLaunchAttribute attrs[1];

static cudaError_t launch() {{
  if ({cluster} == 1) {{
    void* args[] = {{&prm}};
    return cudaLaunchCooperativeKernel((const void*)chain, sms, 288, args, {smem}, 0);
  }}
  return cudaLaunchKernelEx(&config, chain, prm);
}}

static bool ends_with(const char* s, const char* tail) {{
  const size_t n = strlen(s), m = strlen(tail);
  return n >= m && strcmp(s + n - m, tail) == 0;
}}

static void run(const char* name, int mode, int inflight, int copier) {{
  prm.sync = mode < 2 ? (ends_with(name, "r") ? 1 : ends_with(name, "mk") ? 2 : 0) : 0;
  prm.local = ends_with(name, "cl");
  prm.ll = ends_with(name, "ll");
  prm.mode = mode;
  prm.copier = copier;
  prm.inflight = inflight;
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> times;
  for (int r = 0; r < 23; ++r) {{
    CHECK(cudaMemset(prm.counters, 0, {len(phases)} * prm.layers * sizeof(unsigned)));
    CHECK(cudaMemset(prm.act + prm.act_stride, 0xff, (act_floats - prm.act_stride) * sizeof(float)));  // NaN
    CHECK(cudaMemset(prm.lls, 0, act_floats * sizeof(unsigned long long)));  // no flags
    cudaEventRecord(a);
    CHECK(launch());
    cudaEventRecord(b);
    CHECK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    if (r >= 3) times.push_back(ms * 1e3f);
  }}
  std::sort(times.begin(), times.end());
  const size_t last = act_floats - prm.act_stride;
  std::vector<float> h(prm.act_stride);
  CHECK(cudaMemcpy(h.data(), prm.act + last, prm.act_stride * sizeof(float), cudaMemcpyDeviceToHost));
  if (prm.ll) {{  // the values of the last phase's flagged words
    std::vector<unsigned long long> l(prm.act_stride);
    CHECK(cudaMemcpy(l.data(), prm.lls + last, l.size() * 8, cudaMemcpyDeviceToHost));
    for (size_t e = 0; e < l.size(); ++e) {{
      const uint32_t bits = (l[e] >> 32) ? static_cast<uint32_t>(l[e]) : 0xffffffffu;  // unwritten: NaN
      memcpy(&h[e], &bits, 4);
    }}
  }}
  int same = -1;  // -1: not checked
  if (mode == 1 && reference.empty()) {{
    reference = h;
  }} else if ((mode == 1 && !prm.local) || mode == 2) {{  // the same sums, however they wait
    same = memcmp(h.data(), reference.data(), h.size() * sizeof(float)) == 0;
  }}
  printf("%s %d %.2f %d\\n", name, inflight, times[times.size() / 2], same);
}}

int main() {{
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  CHECK(cudaFuncSetAttribute(chain, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem}));
  if ({cluster} > 1) {{  // as many whole clusters as are co-resident (GPCs hold whole clusters)
    CHECK(cudaFuncSetAttribute(chain, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = {cluster};
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = 1;
    config.gridDim = dim3(sms / {cluster} * {cluster});
    config.blockDim = dim3(288);
    config.dynamicSmemBytes = {smem};
    config.attrs = attrs;
    config.numAttrs = 1;
    int clusters = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&clusters, chain, &config));
    sms = std::min(clusters, sms / {cluster}) * {cluster};
    config.gridDim = dim3(sms);
  }}
  printf("ctas %d\\n", sms);
  prm.layers = {layers};
  const size_t wn = (size_t){layers} * {sum(phases)} * sms * K;
  uint16_t* w; CHECK(cudaMalloc(&w, wn * 2));
  fill<<<1024, 256>>>(w, wn);
  prm.w = w;
  prm.act_stride = (long long)sms * {max(rows_max, 1)} > K ? (long long)sms * {max(rows_max, 1)} : K;
  act_floats = (size_t)prm.act_stride * ({len(phases)} * {layers} + 1);
  CHECK(cudaMalloc(&prm.act, act_floats * sizeof(float)));
  CHECK(cudaMalloc(&prm.lls, act_floats * sizeof(unsigned long long)));
  std::vector<float> in(prm.act_stride);
  for (size_t e = 0; e < in.size(); ++e) in[e] = 0.5f + static_cast<float>((e * 7919) % 1000) / 1000.f;
  CHECK(cudaMemcpy(prm.act, in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&prm.counters, {len(phases)} * {layers} * sizeof(unsigned)));
{runs}
  // The copy bandwidth: read + write of a buffer far larger than the L2.
  const size_t cb = size_t{{1}} << 30;
  void *x, *y; CHECK(cudaMalloc(&x, cb)); CHECK(cudaMalloc(&y, cb));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> t;
  for (int r = 0; r < 13; ++r) {{
    cudaEventRecord(a); cudaMemcpyAsync(y, x, cb, cudaMemcpyDeviceToDevice); cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    if (r >= 3) t.push_back(ms);
  }}
  std::sort(t.begin(), t.end());
  printf("copy %.1f\\n", 2.0 * cb / (t[t.size() / 2] * 1e-3) / 1e9);
  printf("bytes %zu\\n", wn * 2);
  return 0;
}}
"""


def build(src: str, work: Path, nvcc: str = "nvcc") -> Path:
    """The program compiled for the H200 into `work`."""
    cu, exe = work / "chain.cu", work / "chain"
    cu.write_text(src)
    subprocess.run(
        [nvcc, "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-o", str(exe), str(cu)],
        check=True,
    )  # fmt: skip
    return exe


MODE_NAMES = ("chain", "direct", "chainr", "directr", "chainmk", "directmk", "chaincl", "directcl")
MODE_NAMES += ("chainll", "directll")
MODE_NAMES += ("ring", "stream", "ringc", "streamc")


def table(out: str, layers: int) -> str:
    """The program's lines as a Markdown table: µs per launch and per layer, × the floor."""
    rows = [line.split() for line in out.splitlines() if line.strip()]
    copy = next(float(r[1]) for r in rows if r[0] == "copy")
    nbytes = next(int(r[1]) for r in rows if r[0] == "bytes")
    ctas = next((int(r[1]) for r in rows if r[0] == "ctas"), 0)
    floor = nbytes / (copy * 1e9) * 1e6
    lines = [
        f"weights {nbytes / 1e6:.0f} MB, copy {copy:.0f} GB/s, floor {floor:.1f} µs "
        f"({floor / layers:.2f} µs a layer), {ctas} CTAs",
        "| mode | in flight (16 KB chunks) | µs | µs a layer | × floor | same sums as direct |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r[0] in MODE_NAMES:
            us = float(r[2])
            same = {"-1": "", "1": "yes", "0": "**no**"}[r[3]]
            f = r[1] if r[0].startswith(("ring", "stream")) else ""
            lines.append(
                f"| {r[0]} | {f} | {us:.1f} | {us / layers:.2f} | {us / floor:.2f} | {same} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--phases",
        default="32,0,0,16,48,24",
        help="rows per SM of each phase; a leading c marks a phase that needs only its cluster",
    )
    ap.add_argument("--cluster", type=int, default=1, help="CTAs per cluster (1-16)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--inflight", default="1,2,4,12", help="chunks in flight for the ring")
    args = ap.parse_args()
    items = args.phases.split(",")
    phases = [int(x.removeprefix("c")) for x in items]
    local = [x.startswith("c") for x in items]
    if not 1 <= args.cluster <= 16:
        raise SystemExit("a cluster is 1 to 16 CTAs")
    if any(r % CHUNK_ROWS for r in phases):
        raise SystemExit(f"rows per phase must be multiples of {CHUNK_ROWS}")
    inflight = [int(x) for x in args.inflight.split(",")]
    if any(not 1 <= f <= SLOTS for f in inflight):
        raise SystemExit(f"chunks in flight must be 1..{SLOTS}")
    src = program_source(phases, args.layers, inflight, local=local, cluster=args.cluster)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(src, Path(tmp))
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    print(table(out, args.layers))


if __name__ == "__main__":
    main()
