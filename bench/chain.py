"""Whether a loader warp that streams weights into shared memory ahead of the dependency chain
lets a decode layer run at max(chain latency, weight bytes / bandwidth) instead of their sum.

A decode step is a chain of phases (qwen3-0.6b: norm+qkv, attention, o-proj, norm+gate/up,
down) in which every SM waits for all SMs of the phase before, loads the activation, takes a
norm, multiplies its weight slab and signals. mk streams each slab from HBM once the wait is
over, so a phase costs its round trips plus its bytes; fetching the bytes earlier (into L2, or
in one bulk copy into shared memory) measured slower, because a burst of every SM's next slab
queues in front of the latency-bound loads of the phase it overlaps (bench/RESULTS.md).

This standalone program (no mk headers; its kernel in `chain_kernel.py`: one CTA of eight
compute warps and one loader warp per SM, all SMs) runs LAYERS layers of the phases in
`--phases` (weight rows of K columns per SM; 0 = a phase of chain only) and times a whole
launch:

- `chain`: the waits, activation loads, norms and signals alone (no weights);
- `direct`: after its wait, each warp streams its rows from HBM (the way mk does today);
- `ring F`: the loader warp copies 16 KB chunks (eight rows) of the coming phases into a ring
  of SLOTS chunks with cp.async.bulk, at most F chunks in flight, as far ahead as the ring
  allows; each compute warp takes row `warp` of four chunks at a time once they land (the
  order `direct` reads its rows in) and hands their slots back. F = SLOTS is the burst
  (everything the ring can take, at once);
- `stream`: the ring at the widest F without the waits (each phase still loads and normalises
  its activation);
- `bare`: the ring at the widest F with nothing but the products: what the ring's weight
  bytes alone cost;
- `chainbg F`: `chain` with the loader thread streaming the CTA's weights through the ring
  beside it, F chunks in flight, that nobody reads: what a full HBM pipe does to the chain's
  round trips (session 82 found `ring` costing `chain` + `bare`, not their maximum); the table's
  last column is the rate that unread stream reached meanwhile;
- `chainr`, `directr`: `chain` and `direct` with acquire loads and release reductions instead
  of relaxed polls and acq_rel fences around the signal's atomic; `chainmk`, `directmk`: with
  the megakernel's own protocol (acquire polls with sleeps of 32 ns doubling to 128 between
  them, one fence then a relaxed reduction);
- with `--cluster N` every mode runs in clusters of N CTAs, and `chaincl` / `directcl` let the
  phases marked `c` in `--phases` wait for their own cluster only (each CTA's thread 0 arrives
  on every peer's shared-memory barrier, release at cluster scope, and waits for its own): what
  a phase whose consumer needs only a few producers (a head's QK-norm after its q columns) would
  cost if it were cluster-local instead of grid-wide;
- `bgll F`, `ringll F`, `ringcll F`: `chainbg`, `ring` and `ringc` with every hop by flags (as
  `chainll`): whether a chain of fewer round trips lets the ring's overlap win;
- `chaindsm`, `directdsm`, `bgdsm F`, `ringdsm F` (with `--cluster N`, where every `c` phase
  follows one with rows): as `chaincl` / `directcl` / `chainbg` / `ring`, but a local phase's
  values come through the cluster's shared memory (each CTA stores its rows into every peer's
  receive buffer, then arrives on their barriers), not through the L2, and the phase before it
  signals no counter: whether a hop that never touches the L2 keeps its speed while the HBM
  pipe is full (`directdsm` and `ringdsm` must sum what `directcl` sums);
- `directpfw`, `directpfs`, `directpfs2`: `directmk` with thread 0 asking the L2 for its CTA's
  slab of the next phase (`2`: the one after) by `cp.async.bulk.prefetch.L2`, at its wait
  (before the phase's own loads) or right after its signal (in the hop);
- `directpfp4`, `directpfp8`, `directpfp16`: `directmk` with thread 0 asking the L2 for its
  CTA's own slab of the phase while it waits, one piece of 4, 8 or 16 KB per poll that finds the
  counter short (paced, so that at most one piece is ahead of the phase's loads at the end);
- `directsp0`, `directsp`, `directsp2`: `directmk` on all CTAs but the last four, which compute
  nothing (`sp0`) or, as each phase starts, ask the L2 for the next phase's slabs of every
  computing CTA (`2`: the phase after), in 64 KB bulk prefetches: HBM idle in the hops and
  weightless phases fills the L2 without a computing CTA issuing anything;
- with phases marked `l` in `--phases` (e.g. `l32,l0,16,72`: q/k/v and the attention hand
  their values on with flags, the o-projection and the MLP, whose outputs mk accumulates, keep
  their counters), `chainmix` / `directmix` take those hops by flags and the rest by mk's
  counters: how much of `directll`'s gain a decode layer could take;
- `ringc`, `streamc`, `barec`: the same with the whole loader warp copying 16 bytes a lane (cp.async,
  through the L1's request queue) instead of one thread's bulk copies (the TMA unit's);
- `directlls`, `directllsw`: `directll` with mk's signal after each phase's flagged values (a
  fence, then a reduction nobody waits for), and with a wait too on the counter two phases back
  (long satisfied, as a megakernel's flagged reader waits for what its writer waited for): what
  the megakernel's flagged tasks keep of the counter protocol;
- `ringdyn F`: `ringll F` with each phase's chunks (of every CTA's rows) claimed from a counter
  by whichever loader asks next, so SMs that stream faster take more: whether the ring's
  coupled phases run at the slowest SM's rate. The table's last column gives the fewest and
  most chunks a CTA moved against the mean (for the `bg` modes too: how evenly the unread
  stream is served).

A phase's outputs are interleaved over the CTAs (row r of CTA c at r × CTAs + c), so the K
values the next phase reads hold rows of every CTA and each consumer waits for every producer,
as a decode layer's do (until session 84 they were in blocks, and a flagged read waited for the
first K ÷ rows CTAs only).

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

from chain_kernel import CHUNK_ROWS, SLOTS, K, kernel_source

SPARE = 4  # the spare CTAs of the directsp modes (132 SMs: 128 compute, as mk's decode grids)


def program_source(
    phases: list[int],
    layers: int,
    inflight: list[int],
    slots: int = SLOTS,
    local: list[bool] | None = None,
    cluster: int = 1,
    flagged: list[bool] | None = None,
    acc: list[bool] | None = None,
    acc_nap: int = 0,
    acc_spread: bool = False,
    acc_copies: int = 1,
) -> str:
    """The kernel and a main that times each mode (20 launches after 3, median) and prints
    `mode inflight median_us checksum_bits`, then `copy GB/s`, `bytes N` and `ctas N`. With
    `cluster` > 1 every mode runs in clusters of that many CTAs (as many as fit at once), and
    chaincl / directcl wait only for their cluster before the `local` phases. With `acc` phases
    (split-K partials added into every output) only the modes of ACC_MODES run."""
    modes = [("chain", 0, 0, 0), ("direct", 1, 0, 0)]
    modes += [("chainr", 0, 0, 0), ("directr", 1, 0, 0)]  # the same, ld.acquire / red.release
    modes += [("chainmk", 0, 0, 0), ("directmk", 1, 0, 0)]  # mk's polls (sleeps) and signal
    modes += [("chainll", 0, 0, 0), ("directll", 1, 0, 0)]  # flagged values, no counters
    # flagged values plus mk's signal; and a wait on the counter two phases back
    modes += [("directlls", 1, 0, 0), ("directllsw", 1, 0, 0)]
    # mk's protocol, each CTA asking the L2 for its next slab (or the one after) at its wait
    # (before its own loads) or at its signal (in the hop)
    modes += [("directpfw", 1, 0, 0), ("directpfs", 1, 0, 0), ("directpfs2", 1, 0, 0)]
    # mk's protocol, each CTA asking the L2 for its own slab piece by piece (4, 8, 16 KB) while
    # its wait finds the producers unfinished
    modes += [("directpfp4", 1, 0, 0), ("directpfp8", 1, 0, 0), ("directpfp16", 1, 0, 0)]
    # SPARE CTAs that compute nothing: idle (sp0), or asking the L2 for the next phase's slabs
    # (or the one after) of every computing CTA as each phase starts
    modes += [("directsp0", 1, 0, 0), ("directsp", 1, 0, 0), ("directsp2", 1, 0, 0)]
    if cluster > 1 and local and any(local):
        modes += [("chaincl", 0, 0, 0), ("directcl", 1, 0, 0)]
        if dsm_problem(phases, local, cluster) is None:  # the cluster's values in shared memory
            modes += [("chaindsm", 0, 0, 0), ("directdsm", 1, 0, 0)]
            modes += [("bgdsm", 5, f, 0) for f in inflight]
            modes += [("ringdsm", 2, f, 0) for f in inflight]
    if flagged and any(flagged):  # the flagged phases' hops by flags, the others' by counters
        modes += [("chainmix", 0, 0, 0), ("directmix", 1, 0, 0)]
    # the chain with weights streamed beside it that nobody reads (`inflight` chunks at a time)
    modes += [("chainbg", 5, f, 0) for f in inflight]
    for copier, suffix in ((0, ""), (1, "c")):
        modes += [(f"ring{suffix}", 2, f, copier) for f in inflight]
        modes.append((f"stream{suffix}", 3, slots, copier))
        modes.append((f"bare{suffix}", 4, slots, copier))
    # every hop by flags: beside an unread stream, and with the ring (by bulk copies, cp.async)
    modes += [("bgll", 5, f, 0) for f in inflight]
    modes += [("ringll", 2, f, 0) for f in inflight] + [("ringcll", 2, f, 1) for f in inflight]
    # every hop by flags, each phase's chunks claimed by whichever loader asks first
    modes += [("ringdyn", 2, f, 0) for f in inflight]
    if acc and any(acc):
        modes = [m for m in modes if m[0] in ACC_MODES]
    acc = acc or [False] * len(phases)
    # An accumulated phase's outputs start at zero (the others' at NaN: unwritten ones show).
    zero = "".join(
        f"\n    for (int l = 0; l < prm.layers; ++l) CHECK(cudaMemset(prm.act + prm.act_stride * "
        f"(1 + (long long)l * {len(phases)} + {j}), 0, {acc_copies} * K * sizeof(float)));"
        for j, a in enumerate(acc)
        if a
    )
    runs = "".join(f'\n  run("{name}", {m}, {f}, {c});' for name, m, f, c in modes)
    rows_max = max(phases)
    smem = slots * CHUNK_ROWS * K * 2 + (4 * K + max(rows_max, 1)) * 4  # ring, xs, raw, res, rx
    return f"""#include <cuda_runtime.h>
#include <stdint.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>
{kernel_source(phases, slots, local, flagged, acc, acc_nap, acc_spread, acc_copies)}
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
static std::vector<float> reference, spare_reference, cluster_reference;
constexpr int SPARE = {SPARE};

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
  const bool pf = strstr(name, "directpf") == name, sp = strstr(name, "directsp") == name;
  prm.extra = ends_with(name, "lls") ? 1 : ends_with(name, "llsw") ? 3 : 0;
  const bool mk_sync = ends_with(name, "mk") || ends_with(name, "mix") || pf || sp || prm.extra;
  prm.sync = mode < 2 ? (ends_with(name, "r") ? 1 : mk_sync ? 2 : 0) : 0;
  const bool paced = strstr(name, "directpfp") == name;
  prm.pf = paced ? 4 : pf ? (strstr(name, "pfw") ? 1 : 2) : sp && !ends_with(name, "sp0") ? 3 : 0;
  prm.piece = paced ? 1024 * atoi(name + strlen("directpfp")) : 0;
  prm.pf_ahead = ends_with(name, "2") ? 2 : 1;
  prm.spare = sp ? SPARE : 0;
  prm.dsm = strstr(name, "dsm") != nullptr;
  prm.local = ends_with(name, "cl") || prm.dsm;
  prm.dyn = ends_with(name, "dyn");
  prm.ll = ends_with(name, "ll") || ends_with(name, "mix") || prm.dyn || prm.extra;
  prm.ll_all = ends_with(name, "ll") || prm.dyn || prm.extra;
  prm.mode = mode;
  prm.copier = copier;
  prm.inflight = inflight;
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> times;
  double streamed_bytes = 0, streamed_us = 0;  // the bg modes' unread stream, timed launches
  double low = 0, high = 0;  // the bg and dyn modes: the fewest and most chunks a CTA moved ÷ the mean
  for (int r = 0; r < 23; ++r) {{
    CHECK(cudaMemset(prm.streamed, 0, sms * sizeof(unsigned long long)));
    CHECK(cudaMemset(prm.counters, 0, {len(phases)} * prm.layers * sizeof(unsigned)));
    CHECK(cudaMemset(prm.claims, 0, {len(phases)} * prm.layers * sizeof(unsigned)));
    CHECK(cudaMemset(prm.act + prm.act_stride, 0xff, (act_floats - prm.act_stride) * sizeof(float)));  // NaN
    CHECK(cudaMemset(prm.lls, 0, act_floats * sizeof(unsigned long long)));  // no flags{zero}
    cudaEventRecord(a);
    CHECK(launch());
    cudaEventRecord(b);
    CHECK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    if (r >= 3) times.push_back(ms * 1e3f);
    if (r >= 3 && (mode == 5 || prm.dyn)) {{
      std::vector<unsigned long long> chunks(sms);
      CHECK(cudaMemcpy(chunks.data(), prm.streamed, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      double sum = 0;
      for (unsigned long long c : chunks) sum += (double)c;
      const auto [lo, hi] = std::minmax_element(chunks.begin(), chunks.end());
      low += *lo * (double)sms / sum / 20;
      high += *hi * (double)sms / sum / 20;
      if (mode == 5) {{
        streamed_bytes += sum * kChunk;
        streamed_us += ms * 1e3;
      }}
    }}
  }}
  std::sort(times.begin(), times.end());
  const size_t last = act_floats - prm.act_stride;
  std::vector<float> h(prm.act_stride);
  CHECK(cudaMemcpy(h.data(), prm.act + last, prm.act_stride * sizeof(float), cudaMemcpyDeviceToHost));
  if (prm.ll && (prm.ll_all || kLastFlagged)) {{  // the values of the last phase's flagged words
    std::vector<unsigned long long> l(prm.act_stride);
    CHECK(cudaMemcpy(l.data(), prm.lls + last, l.size() * 8, cudaMemcpyDeviceToHost));
    for (size_t e = 0; e < l.size(); ++e) {{
      const uint32_t bits = (l[e] >> 32) ? static_cast<uint32_t>(l[e]) : 0xffffffffu;  // unwritten: NaN
      memcpy(&h[e], &bits, 4);
      if (kLastAcc) h[e] = e >= K || acc_count(l[e]) != (unsigned)sms ? NAN : acc_value(l[e]);
    }}
  }}
  if (kLastAcc && !prm.ll)  // the copies' sums (counter modes)
    for (int e = 0; e < K; ++e)
      for (int c = 1; c < kAccCopies; ++c) h[e] += h[c * K + e];
  int same = -1;  // -1: not checked
  if (mode == 1 && reference.empty()) {{
    reference = h;
  }} else if (mode == 1 && prm.local && !prm.dsm) {{  // directcl: the sums of the cluster-local reads
    cluster_reference = h;
  }} else if (prm.dsm && (mode == 1 || mode == 2)) {{  // the same values through shared memory
    same = memcmp(h.data(), cluster_reference.data(), h.size() * sizeof(float)) == 0;
  }} else if (prm.spare && ends_with(name, "sp0")) {{  // fewer computing CTAs: other sums
    spare_reference = h;
  }} else if (prm.spare) {{
    same = memcmp(h.data(), spare_reference.data(), h.size() * sizeof(float)) == 0;
  }} else if ({int(any(acc))} && (mode == 1 || mode == 2)) {{  // f32 reductions: sums in any order
    same = 2;
    for (int e = 0; e < K; ++e)
      if (!(fabsf(h[e] - reference[e]) <= 1e-3f * (1.f + fabsf(reference[e])))) same = 0;
  }} else if ((mode == 1 && !prm.local) || mode == 2) {{  // the same sums, however they wait
    same = memcmp(h.data(), reference.data(), h.size() * sizeof(float)) == 0;
  }}
  const double stream_gbs = streamed_us > 0 ? streamed_bytes / (streamed_us * 1e3) : 0;
  printf("%s %d %.2f %d %.0f %.2f %.2f\\n", name, inflight, times[times.size() / 2], same, stream_gbs, low, high);
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
  prm.act_stride = std::max((long long)sms * {max(rows_max, 1)}, (long long){acc_copies} * K);
  act_floats = (size_t)prm.act_stride * ({len(phases)} * {layers} + 1);
  CHECK(cudaMalloc(&prm.act, act_floats * sizeof(float)));
  CHECK(cudaMalloc(&prm.lls, act_floats * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&prm.streamed, sms * sizeof(unsigned long long)));
  std::vector<float> in(prm.act_stride);
  for (size_t e = 0; e < in.size(); ++e) in[e] = 0.5f + static_cast<float>((e * 7919) % 1000) / 1000.f;
  CHECK(cudaMemcpy(prm.act, in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&prm.counters, {len(phases)} * {layers} * sizeof(unsigned)));
  CHECK(cudaMalloc(&prm.claims, {len(phases)} * {layers} * sizeof(unsigned)));
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
MODE_NAMES += (
    "chainll",
    "directll",
    "directlls",
    "directllsw",
    "directpfw",
    "directpfs",
    "directpfs2",
)
MODE_NAMES += ("directpfp4", "directpfp8", "directpfp16")
MODE_NAMES += ("directsp0", "directsp", "directsp2", "chainmix", "directmix")


def flag_problem(phases: list[int], flagged: list[bool]) -> str | None:
    """Why the mix modes cannot run these phases, or None: a phase that waits on a counter reads
    the plain values of the last phase with rows before it, so that one must not be flagged."""
    n = len(phases)
    for j in range(n):
        if flagged[j - 1]:
            continue  # read by flags
        last = next((k % n for k in range(j - 1, j - 1 - n, -1) if phases[k % n] > 0), None)
        if last is not None and flagged[last]:
            return (
                f"phase {j} waits on a counter but the values it reads (phase {last}'s) are "
                "flagged: flag the phases in between too"
            )
    return None


def dsm_problem(phases: list[int], local: list[bool], cluster: int) -> str | None:
    """Why the dsm modes cannot run these phases, or None: every local phase after the first
    reads the rows of the phase before it from the cluster's shared memory, so that phase needs
    rows, and a receive buffer of K floats holds a cluster's rows."""
    n = len(phases)
    for j in range(n):
        if local[j] and phases[j - 1] == 0:
            return f"local phase {j} follows a phase without rows"
        if local[j] and cluster * phases[j - 1] > K:
            return f"a cluster of {cluster} CTAs has more than {K} values of phase {(j - 1) % n}"
    return None


MODE_NAMES += ("chaindsm", "directdsm", "bgdsm", "ringdsm")
MODE_NAMES += ("chainbg", "ring", "stream", "bare", "ringc", "streamc", "barec")
MODE_NAMES += ("bgll", "ringll", "ringcll", "ringdyn")
# With accumulated phases: mk's counters against counted words, with and without weights and the
# ring, and the ring's bytes alone.
ACC_MODES = ("chainmk", "directmk", "chainll", "directll", "directlls", "bare", "ringll", "bgll")


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
        "| mode | in flight (16 KB chunks) | µs | µs a layer | × floor | same sums as direct "
        "| unread stream GB/s | chunks a CTA moved ÷ the mean, fewest–most |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        if r[0] in MODE_NAMES:
            us = float(r[2])
            same = {"-1": "", "1": "yes", "2": "within 1e-3", "0": "**no**"}[r[3]]
            f = (
                r[1]
                if r[0].startswith(("ring", "stream", "bare", "chainbg", "bgdsm", "bgll"))
                else ""
            )
            gbs = r[4] if len(r) > 4 and r[4] != "0" else ""
            share = f"{r[5]}–{r[6]}" if len(r) > 6 and r[6] != "0.00" else ""
            lines.append(
                f"| {r[0]} | {f} | {us:.1f} | {us / layers:.2f} | {us / floor:.2f} | {same} "
                f"| {gbs} | {share} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--phases",
        default="32,0,0,16,48,24",
        help="rows per SM of each phase; a leading c marks a phase that needs only its "
        "cluster, a leading l one that hands its values on with flags (the mix modes), a leading "
        "a one whose CTAs add their values into every output (a split-K projection)",
    )
    ap.add_argument("--cluster", type=int, default=1, help="CTAs per cluster (1-16)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--inflight", default="1,2,4,12", help="chunks in flight for the ring")
    ap.add_argument("--acc-nap", type=int, default=0, help="ns between polls of counted sums")
    ap.add_argument(
        "--acc-spread", action="store_true", help="each CTA adds its terms from its own quarter"
    )
    ap.add_argument(
        "--acc-copies",
        type=int,
        default=1,
        help="copies of an accumulated phase's outputs (counter modes: CTA b adds into copy "
        "b %% copies, the next phase sums them)",
    )
    args = ap.parse_args()
    items = args.phases.split(",")
    phases = [int(x.lstrip("cla")) for x in items]
    acc = [x.startswith("a") for x in items]
    if any(a and r == 0 for a, r in zip(acc, phases, strict=True)):
        raise SystemExit("an accumulated phase needs rows")
    local = [x.startswith("c") for x in items]
    flagged = [x.startswith("l") for x in items]
    if any(acc) and (any(flagged) or any(local)):
        raise SystemExit("accumulated phases run with neither c nor l phases")
    if any(flagged) and (problem := flag_problem(phases, flagged)):
        raise SystemExit(problem)
    if not 1 <= args.cluster <= 16:
        raise SystemExit("a cluster is 1 to 16 CTAs")
    if any(r % CHUNK_ROWS for r in phases):
        raise SystemExit(f"rows per phase must be multiples of {CHUNK_ROWS}")
    inflight = [int(x) for x in args.inflight.split(",")]
    if any(not 1 <= f <= SLOTS for f in inflight):
        raise SystemExit(f"chunks in flight must be 1..{SLOTS}")
    src = program_source(
        phases,
        args.layers,
        inflight,
        local=local,
        cluster=args.cluster,
        flagged=flagged,
        acc=acc,
        acc_nap=args.acc_nap,
        acc_spread=args.acc_spread,
        acc_copies=args.acc_copies,
    )
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(src, Path(tmp))
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    print(table(out, args.layers))


if __name__ == "__main__":
    main()
