"""The device side of bench/chain.py: the megakernel-shaped chain of phases (compute warps 0-7,
loader warp 8), as CUDA source. bench/chain.py wraps it in a host program that times each mode."""

from __future__ import annotations

from chain_ll import LL_SOURCE

K = 1024  # columns of every weight row (bf16): a 2 KB row, a 16 KB chunk of eight rows
CHUNK_ROWS = 8
SLOTS = 12  # 192 KB of ring
GROUP = 4  # chunks a warp takes at once: four rows' loads in flight per lane


def kernel_source(
    phases: list[int],
    slots: int,
    local: list[bool] | None = None,
    flagged: list[bool] | None = None,
    acc: list[bool] | None = None,
    acc_nap: int = 0,
    acc_spread: bool = False,
    acc_copies: int = 1,
) -> str:
    """The megakernel-shaped chain: compute warps 0-7, loader warp 8. A `local` phase (with the
    cl modes) waits for its cluster's CTAs only, through shared-memory barriers, not the grid; a
    `flagged` one (with the mix modes) hands its values on with their flags, not a counter; an
    `acc` one adds its rows' values into every output (a split-K projection's partials), with the
    counter modes into one of `acc_copies` copies of the outputs (CTA b into copy b % copies),
    which the next phase sums as it reads them."""
    n = len(phases)
    local = local or [False] * n
    flagged = flagged or [False] * n
    acc = acc or [False] * n
    prefix = [sum(phases[:i]) for i in range(n)]
    push = [int(phases[j] > 0 and local[(j + 1) % n]) for j in range(n)]
    return f"""
constexpr int K = {K}, kRows = {CHUNK_ROWS}, kSlots = {slots}, kPhases = {n}, kGroup = {GROUP};
constexpr int kChunk = kRows * K * 2;
constexpr unsigned kAccNap = {acc_nap};  // ns between the polls of counted words (0: spin)
constexpr bool kAccSpread = {"true" if acc_spread else "false"};
constexpr int kAccCopies = {acc_copies};  // copies of an accumulated phase's outputs (counter modes)
__constant__ int c_rows[kPhases] = {{{", ".join(map(str, phases))}}};
__constant__ int c_prefix[kPhases] = {{{", ".join(map(str, prefix))}}};
__constant__ int c_local[kPhases] = {{{", ".join(str(int(x)) for x in local)}}};
__constant__ int c_flagged[kPhases] = {{{", ".join(str(int(x)) for x in flagged)}}};
__constant__ int c_push[kPhases] = {{{", ".join(map(str, push))}}};
__constant__ int c_acc[kPhases] = {{{", ".join(str(int(x)) for x in acc)}}};
constexpr bool kLastAcc = {"true" if acc[-1] else "false"};
constexpr bool kLastFlagged = {"true" if flagged[-1] else "false"};
constexpr int kLayerRows = {sum(phases)};
constexpr int kRowsMax = {max(max(phases), 1)};
enum Mode {{ CHAIN = 0, DIRECT = 1, RING = 2, STREAM = 3, BARE = 4, BACKGROUND = 5 }};

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
// Thread r < n: one arrival (release, cluster scope) on the barrier at `bar` in CTA r of the
// cluster, all n at once (one thread arriving on every peer in turn took ~0.3 µs a peer);
// thread 0 then waits for this CTA's own barrier to complete phase `parity` (acquire).
__device__ __forceinline__ void cluster_meet(uint64_t* bar, uint32_t n, uint32_t parity) {{
  if (threadIdx.x < n) {{
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(sa(bar)), "r"(threadIdx.x));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
  }}
  uint32_t ok = threadIdx.x != 0;
  while (!ok) {{
    asm volatile(
        "{{\\n .reg .pred p;\\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\\n"
        " selp.u32 %0, 1, 0, p;\\n}}"
        : "=r"(ok) : "r"(sa(bar)), "r"(parity) : "memory");
  }}
}}

// The dsm modes: this CTA's `rows` values (in res) stored at crank * rows of every peer's
// receive buffer `rx` (its own included), through the cluster's shared memory.
__device__ __forceinline__ void push_rows(const float* res, float* rx, int rows, uint32_t crank, uint32_t n) {{
  for (int t = threadIdx.x; t < rows * static_cast<int>(n); t += 256) {{
    const int r = t % rows;
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(sa(rx + crank * rows + r)), "r"(t / rows));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(res[r]) : "memory");
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

// Where row r of CTA `cta`'s share of a phase's outputs goes: rows interleaved over the CTAs, so
// the K values a phase reads hold the first rows of every CTA and its every consumer waits for
// every producer, as a decode layer's do (a flagged read of a block of K values would wait for
// a few CTAs only).
__device__ __forceinline__ long long row_at(int cta, int r, int ctas) {{ return (long long)r * ctas + cta; }}

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
  int dsm;    // with local: a local phase's values come through the peers' shared memory (each
              // producer stores its rows into every peer's receive buffer), not the L2
  int ll;     // 1: no counters; each value travels with its flag (one 8-byte store), polled
  int ll_all; // with ll: every phase so (the ll modes), else the c_flagged ones (the mix modes)
  unsigned long long* lls;  // per phase: the flagged values
  unsigned long long* streamed;  // the bg and dyn modes: chunks each CTA's loader moved
  int dyn;            // the dyn modes: a loader claims a phase's chunks from `claims`, as many
  unsigned* claims;   // as it can take, so faster SMs stream more (one counter a phase)
  int extra;  // with ll: what a megakernel task adds to a flagged hop; 1 mk's signal (a fence and a
              // reduction), 2 also a wait on the counter two phases back (the lls, llsw modes)
  long long act_stride;
  int pf;        // the next slab into L2 (one bulk prefetch): 0 never, 1 at the wait, 2 at the signal;
                 // 4: the phase's own slab, one piece of `piece` bytes per poll that finds it short
  int piece;
  int pf_ahead;  // phases with rows ahead (1: the next)
  int spare;     // the last `spare` CTAs compute nothing: with pf 3 they ask the L2 for the
                 // slabs of every computing CTA, pf_ahead phases with rows ahead, as each phase starts
}};

// The CTAs that compute (and signal); the spare ones after them only prefetch.
__device__ __forceinline__ int ctas(const Params& p) {{ return static_cast<int>(gridDim.x) - p.spare; }}

__device__ __forceinline__ const uint16_t* slab(const Params& p, int layer, int j) {{
  const long long g = ctas(p);
  return p.w + ((long long)layer * kLayerRows * g + c_prefix[j] * g + (long long)blockIdx.x * c_rows[j]) * K;
}}

// The pf_ahead-th phase with rows after (layer, j), as (l, k); false past the last layer.
__device__ __forceinline__ bool phase_ahead(const Params& p, int layer, int j, int& l, int& k) {{
  int found = 0;
  for (l = layer, k = j + 1; l < p.layers; ++l, k = 0)
    for (; k < kPhases; ++k)
      if (c_rows[k] > 0 && ++found == p.pf_ahead) return true;
  return false;
}}

// Asks the L2 for [at, at + bytes) in 64 KB bulk prefetches, the pieces i with i % n == rank.
__device__ __forceinline__ void prefetch_pieces(const char* at, long long bytes, int rank, int n) {{
  long long piece = 0;
  for (long long o = 0; o < bytes; o += 65536, ++piece) {{
    if (piece % n != rank) continue;
    const uint32_t m = static_cast<uint32_t>(bytes - o < 65536 ? bytes - o : 65536);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at + o), "r"(m) : "memory");
  }}
}}

// Thread 0: asks the L2 for this CTA's slab of the pf_ahead-th phase with rows after (layer, j).
__device__ __forceinline__ void prefetch_next(const Params& p, int layer, int j) {{
  int l, k;
  if (!phase_ahead(p, layer, j, l, k)) return;
  prefetch_pieces(reinterpret_cast<const char*>(slab(p, l, k)), (long long)c_rows[k] * K * 2, 0, 1);
}}

// A spare CTA's thread 0: as each phase starts (the phase before it signalled by every
// computing CTA), its share of the pieces of the pf_ahead-th phase with rows after it, for all
// computing CTAs at once (their slabs of a phase are one contiguous block).
__device__ __noinline__ void prefetch_spare(const Params& p, int rank) {{
  const long long n = ctas(p);
  int phase = 0;
  for (int layer = 0; layer < p.layers; ++layer)
    for (int j = 0; j < kPhases; ++j, ++phase) {{
      if (phase > 0) {{
        unsigned seen, nap = 32;
        do {{
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(p.counters + phase - 1) : "memory");
          if (seen < n) {{ __nanosleep(nap); nap = nap < 128 ? 2 * nap : 128; }}
        }} while (seen < n);
      }}
      int l, k;
      if (!phase_ahead(p, layer, j, l, k)) continue;
      const uint16_t* block = p.w + ((long long)l * kLayerRows * n + c_prefix[k] * n) * K;
      prefetch_pieces(reinterpret_cast<const char*>(block), n * c_rows[k] * K * 2, rank, p.spare);
    }}
}}

{_loader_source()}{_compute_source()}{_entry_source()}"""


def _loader_source() -> str:
    """The loader warp's walk over every chunk of every phase, into the ring."""
    return (
        """
// The ring's i-th use: its slot once the compute warps handed it back and fewer than `inflight`
// copies are still landing.
__device__ __forceinline__ int ring_slot(const Params& p, uint64_t* full, uint64_t* empty, long long i) {
  const int slot = static_cast<int>(i % kSlots);
  const long long use = i / kSlots;
  if (use > 0) mb_wait(&empty[slot], static_cast<uint32_t>((use - 1) & 1));
  if (i >= p.inflight) {
    const long long d = i - p.inflight;
    mb_wait(&full[d % kSlots], static_cast<uint32_t>((d / kSlots) & 1));
  }
  return slot;
}

__device__ __noinline__ void load_ahead(const Params& p, uint16_t* ring, uint64_t* full, uint64_t* empty,
                                        int lane) {
    long long i = 0;
    for (int layer = 0; layer < p.layers; ++layer)
      for (int j = 0; j < kPhases; ++j)
        for (int c = 0; c < c_rows[j] / kRows; ++c, ++i) {
          const int slot = ring_slot(p, full, empty, i);
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
        + CLAIM_LOADER_SOURCE
    )


CLAIM_LOADER_SOURCE = """
// The dyn modes: the loader claims chunks of each phase (of every CTA's rows) one at a time from
// the phase's counter until none is left, so an SM that streams faster takes more of them, and
// ends the phase's run in the ring with a slot that names no chunk (chunk_of -1). Its next
// claim is asked for as soon as a copy is out, its round trip hidden behind the ring's waits.
__device__ __noinline__ void load_claimed(const Params& p, uint16_t* ring, uint64_t* full, uint64_t* empty,
                                          int* chunk_of) {
  const int n = ctas(p);
  long long i = 0, moved = 0;
  for (int layer = 0; layer < p.layers; ++layer)
    for (int j = 0; j < kPhases; ++j) {
      if (c_rows[j] == 0) continue;
      unsigned* claim = p.claims + layer * kPhases + j;
      const int total = n * c_rows[j] / kRows;
      const uint16_t* block = p.w + ((long long)layer * kLayerRows + c_prefix[j]) * n * K;
      int c = static_cast<int>(atomicAdd(claim, 1u));
      for (;;) {
        const int slot = ring_slot(p, full, empty, i++);
        if (c >= total) {
          chunk_of[slot] = -1;
          mb_arrive(&full[slot]);
          break;
        }
        chunk_of[slot] = c;
        bulk(ring + (size_t)slot * (kChunk / 2), block + (long long)c * (kChunk / 2), kChunk, &full[slot]);
        ++moved;
        c = static_cast<int>(atomicAdd(claim, 1u));
      }
    }
  p.streamed[blockIdx.x] = static_cast<unsigned long long>(moved);  // chunks this CTA claimed
}
"""

BACKGROUND_SOURCE = """
// The chainbg modes: the loader thread streams this CTA's share of the weights through the ring,
// `inflight` 16 KB chunks at a time, for as long as the chain runs, and nobody reads them: what
// a full HBM pipe does to the chain's round trips.
__device__ __noinline__ void load_background(const Params& p, uint16_t* ring, uint64_t* full,
                                             const volatile int* done) {
  const long long share = (long long)p.layers * kLayerRows * K;  // elements a CTA has
  const uint16_t* base = p.w + (long long)blockIdx.x * share;
  const long long chunks = share / (kChunk / 2);
  if (chunks == 0) return;  // less than a chunk of weights: nothing to stream
  long long i = 0;
  for (; !*done; ++i) {
    if (i >= p.inflight) {
      const long long d = i - p.inflight;
      mb_wait(&full[d % kSlots], static_cast<uint32_t>((d / kSlots) & 1));
    }
    bulk(ring + (size_t)(i % kSlots) * (kChunk / 2), base + (i % chunks) * (kChunk / 2), kChunk,
         &full[i % kSlots]);
  }
  // Every copy lands before the CTA may exit.
  for (long long d = i > p.inflight ? i - p.inflight : 0; d < i; ++d)
    mb_wait(&full[d % kSlots], static_cast<uint32_t>((d / kSlots) & 1));
  p.streamed[blockIdx.x] = static_cast<unsigned long long>(i);  // chunks this CTA moved
}
"""


def _compute_source() -> str:
    """The compute warps' phases: wait, activation and norm, product, signal."""
    return (
        BACKGROUND_SOURCE
        + LL_SOURCE
        + """
// A phase's `rows` from the ring (chunks i on), row `warp` of kGroup chunks at a time once they
// land, their slots handed back; the chunks taken so far.
__device__ __forceinline__ long long take_chunks(uint16_t* ring, const float* xs, uint64_t* full, uint64_t* empty,
                                                 long long i, int rows, float* out, int ostep) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int c = 0; c < rows / kRows; c += kGroup) {
    const int n = rows / kRows - c < kGroup ? rows / kRows - c : kGroup;
    const uint16_t* row[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const long long at = i + g;
      row[g] = ring + (size_t)(at % kSlots) * (kChunk / 2) + warp * K;
      if (g < n) mb_wait(&full[at % kSlots], static_cast<uint32_t>((at / kSlots) & 1));
    }
    dot_rows<false, kGroup>(row, n, xs, out + (long long)(c * kRows + warp) * ostep, kRows * ostep);
    __syncwarp();
    if (lane == 0)
      for (int g = 0; g < n; ++g) mb_arrive(&empty[(i + g) % kSlots]);
    i += n;
  }
  return i;
}

// The dyn modes: the chunks the loader claimed for a phase, up to its end slot; row `warp` of
// each goes out flagged where its owner in the static modes stores it (chunk c holds rows
// c * kRows.. of the phase's block, whose row g is row g % rows of CTA g / rows): the same sums.
__device__ __forceinline__ long long take_claimed(uint16_t* ring, const float* xs, uint64_t* full, uint64_t* empty,
                                                  const int* chunk_of, long long i, int rows, int ctas,
                                                  unsigned long long* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (;; ++i) {
    const int slot = static_cast<int>(i % kSlots);
    mb_wait(&full[slot], static_cast<uint32_t>((i / kSlots) & 1));
    const int c = chunk_of[slot];
    if (c >= 0) {
      const uint16_t* row[1] = {ring + (size_t)slot * (kChunk / 2) + warp * K};
      float v;
      dot_rows<false, 1>(row, 1, xs, &v, 1);
      const int g = c * kRows + warp;
      if (lane == 0) ll_put(out + row_at(g / rows, g % rows, ctas), v);
    }
    __syncwarp();
    if (lane == 0) mb_arrive(&empty[slot]);
    if (c < 0) return i + 1;
  }
}

__device__ __noinline__ void compute(const Params& p, uint16_t* ring, float* xs, float* raw, float* res,
                                     float* rx, uint64_t* full,
                                     uint64_t* empty, uint64_t* cbar, float* part, const int* chunk_of,
                                     uint32_t crank, uint32_t csize) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool ringed = p.mode == RING || p.mode == STREAM || p.mode == BARE;
  long long i = 0;  // chunks taken
  if (p.mode == BARE) {  // the ring's bytes alone: chunks dotted with act_in as they land
    for (int e = threadIdx.x; e < K; e += 256) xs[e] = p.act[e];
    compute_sync();
    float* out = p.act + p.act_stride + (long long)blockIdx.x * kLayerRows;
    for (int layer = 0; layer < p.layers; ++layer)
      for (int j = 0; j < kPhases; ++j) i = take_chunks(ring, xs, full, empty, i, c_rows[j], out + c_prefix[j], 1);
    return;
  }
  const float* src = p.act;  // act_in
  int src_rows = 0, prev_rows = 0;  // rows a CTA wrote of src; of the phase before
  uint32_t locals = 0;  // local phases met
  int pushed = 0;  // the dsm modes: rows stored into the peers' receive buffers (two, in turn)
  int phase = 0;
  for (int layer = 0; layer < p.layers; ++layer)
    for (int j = 0; j < kPhases; ++j, ++phase) {
      const int rows = c_rows[j];
      const bool local = p.local && c_local[j] && phase > 0;
      // Flagged phases hand their values on with flags; the others store and signal a counter.
      const bool in_ll = p.ll && phase > 0 && (p.ll_all || c_flagged[j == 0 ? kPhases - 1 : j - 1]);
      const bool out_ll = p.ll && (p.ll_all || c_flagged[j]);
      if (local) cluster_meet(cbar, csize, locals & 1);
      locals += local;
      // The llsw modes: a flagged reader that also waits on the counter two phases back, as a
      // megakernel's flagged reader waits for what its writer waited for.
      const bool inherited = in_ll && (p.extra & 2) && phase > 1;
      if (!local && (!in_ll || inherited) && phase > 0 && p.mode != STREAM && threadIdx.x == 0) {
        const unsigned* ctr = p.counters + phase - (inherited ? 2 : 1);
        unsigned seen, nap = 32;
        const char* own = reinterpret_cast<const char*>(slab(p, layer, j));
        const long long own_bytes = p.pf == 4 ? (long long)rows * K * 2 : 0;
        long long asked = 0;
        do {
          if (p.sync == 0) {
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ctr) : "memory");
          } else {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ctr) : "memory");
          }
          // Paced: the HBM idle in the wait takes a piece per poll, so at most one piece is
          // still ahead of the phase's own loads when the wait ends.
          if (asked < own_bytes && seen < ctas(p)) {
            const uint32_t m = static_cast<uint32_t>(own_bytes - asked < p.piece ? own_bytes - asked : p.piece);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(own + asked), "r"(m) : "memory");
            asked += m;
          }
          if (p.sync == 2 && seen < ctas(p)) {  // mk's poll: a sleep of 32 ns doubling to 128
            __nanosleep(nap);
            nap = nap < 128 ? 2 * nap : 128;
          }
        } while (seen < ctas(p));
        if (p.sync == 0) asm volatile("fence.acq_rel.gpu;" ::: "memory");
      }
      if (p.pf == 1 && threadIdx.x == 0) prefetch_next(p, layer, j);
      compute_sync();
      // The activation and its norm (every phase: the chain's latency-bound part).
      float ss = 0.f;
      // A local phase reads only what its cluster wrote of the phase before.
      const bool near = local && prev_rows > 0;
      const int first = static_cast<int>(blockIdx.x - crank);  // the cluster's first CTA
      const int span = near ? static_cast<int>(csize) * src_rows : K;
      const bool in_acc = phase > 0 && c_acc[j == 0 ? kPhases - 1 : j - 1];
      if (in_ll && in_acc) {
        ss = acc_take(p.lls + (long long)phase * p.act_stride, xs, raw, static_cast<unsigned>(ctas(p)));
      } else if (in_ll) {
        ss = ll_take(p.lls + (long long)phase * p.act_stride, xs, raw);
      } else {
        // Every load of the activation in flight before its first store (as mk's
        // load_runs_together): stores into xs first would keep the next load behind them. The
        // dsm modes' near phases read the same values where the cluster stored them here.
        const float* got = near && p.dsm ? rx + ((pushed - 1) & 1) * K : nullptr;
        float v[K / 256];
#pragma unroll
        for (int s = 0; s < K / 256; ++s) {
          const int e = (threadIdx.x + s * 256) % span;
          // near: the cluster's CTA e / src_rows, its row e % src_rows
          const long long at = near ? row_at(first + e / src_rows, e % src_rows, ctas(p)) : e;
          v[s] = got ? got[e] : __ldcg(src + at);
          if (in_acc) {  // the other copies' terms (counter modes)
#pragma unroll
            for (int c = 1; c < kAccCopies; ++c) v[s] += __ldcg(src + c * K + at);
          }
        }
#pragma unroll
        for (int s = 0; s < K / 256; ++s) {
          xs[threadIdx.x + s * 256] = v[s];
          raw[threadIdx.x + s * 256] = v[s];
          ss += v[s] * v[s];
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
      const bool push = p.dsm && c_push[j];
      float* const act_out = p.act + (long long)(phase + 1) * p.act_stride + blockIdx.x;  // row r at r * ctas
      const bool acc = c_acc[j] && rows > 0;
      float* out = out_ll || push || acc ? res : act_out;
      const int ostep = out == act_out ? ctas(p) : 1;
      if (p.mode == DIRECT) {
        const uint16_t* w = slab(p, layer, j);
        // Row `warp` of chunks c..c+3 (rows warp + 8c...), as the ring takes them below.
        for (int c = 0; c < rows / kRows; c += kGroup) {
          const int n = rows / kRows - c < kGroup ? rows / kRows - c : kGroup;
          const uint16_t* row[kGroup];
#pragma unroll
          for (int g = 0; g < kGroup; ++g) row[g] = w + (long long)((c + g) * kRows + warp) * K;
          dot_rows<true, kGroup>(row, n, xs, out + (long long)(c * kRows + warp) * ostep, kRows * ostep);
        }
      } else if (ringed && p.dyn) {
        if (rows > 0)
          i = take_claimed(ring, xs, full, empty, chunk_of, i, rows, ctas(p), p.lls + (long long)(phase + 1) * p.act_stride);
      } else if (ringed) {
        i = take_chunks(ring, xs, full, empty, i, rows, out, ostep);
      } else {
        for (int r = threadIdx.x; r < rows; r += 256) out[r * ostep] = xs[(blockIdx.x * rows + r) % K];
      }
      compute_sync();
      if (push) {  // the peers' copy, and the plain one for the phases that read all CTAs' values
        for (int r = threadIdx.x; r < rows; r += 256) act_out[(long long)r * ctas(p)] = res[r];
        push_rows(res, rx + (pushed & 1) * K, rows, crank, csize);
        ++pushed;
        compute_sync();
      }
      if (acc) {  // every output's term, then (with a counter) a barrier before the signal
        acc_give(out_ll ? p.lls + (long long)(phase + 1) * p.act_stride : nullptr,
                 out_ll ? nullptr : act_out - blockIdx.x, rows, res);
        compute_sync();
      } else if (out_ll && !(p.dyn && rows > 0))  // a dyn phase's rows went out as they were computed
        ll_give(p.lls + (long long)(phase + 1) * p.act_stride, rows, res, raw, ctas(p));
      if (rows > 0 && p.mode != STREAM && !out_ll) {
        src = p.act + (long long)(phase + 1) * p.act_stride;
        src_rows = rows;
      }
      prev_rows = rows;
      // The dsm modes: a local phase next waits for its cluster, not this counter.
      // The lls modes signal a counter beside their flagged values (mk's signal, which nobody
      // reads but the llsw modes' inherited waits).
      const bool signals = !out_ll || (p.extra & 1);
      if (threadIdx.x == 0 && signals && !(p.dsm && c_local[(j + 1) % kPhases])) {
        if (p.sync == 0) {
          asm volatile("fence.acq_rel.gpu;" ::: "memory");
          atomicAdd(p.counters + phase, 1u);
        } else if (p.sync == 2) {  // mk's signal: one fence, then a relaxed reduction
          asm volatile("fence.acq_rel.gpu;" ::: "memory");
          asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(p.counters + phase) : "memory");
        } else {
          asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.counters + phase) : "memory");
        }
        if (p.pf == 2) prefetch_next(p, layer, j);
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
  __shared__ int chunk_of[kSlots];  // the dyn modes: the chunk in each slot (-1: the phase's end)
  __shared__ volatile int done;  // the chainbg modes: the chain is over
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t crank = cluster_rank(), csize = cluster_size();
  if (threadIdx.x == 0) {
    done = 0;
    for (int s = 0; s < kSlots; ++s) { mb_init(&full[s], p.copier ? 32 : 1); mb_init(&empty[s], 8); }
    mb_init(&cbar, static_cast<int>(csize));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  cluster_sync_all();  // every peer's barrier is initialised before the first remote arrival
  const bool ringed = p.mode == RING || p.mode == STREAM || p.mode == BARE;
  if (static_cast<int>(blockIdx.x) >= ctas(p)) {  // a spare CTA
    if (p.pf == 3 && threadIdx.x == 0) prefetch_spare(p, static_cast<int>(blockIdx.x) - ctas(p));
  } else if (warp == 8) {
    if (ringed && p.dyn && lane == 0) load_claimed(p, ring, full, empty, chunk_of);
    if (ringed && !p.dyn && (p.copier == 1 || lane == 0)) load_ahead(p, ring, full, empty, lane);
    if (p.mode == BACKGROUND && lane == 0) load_background(p, ring, full, &done);
  } else {
    compute(p, ring, xs, xs + K, xs + 2 * K, xs + 2 * K + kRowsMax, full, empty, &cbar, part, chunk_of, crank,
            csize);
    if (p.mode == BACKGROUND) {
      compute_sync();
      if (threadIdx.x == 0) done = 1;
    }
  }
  cluster_sync_all();
}
"""
