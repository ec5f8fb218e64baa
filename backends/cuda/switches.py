"""The CUDA build switches read from the environment (MK_CUDA_*), parsed and checked alike."""

from __future__ import annotations

import os

from mk.backends.cuda.attention_switches import attention_defines
from mk.backends.cuda.switch_values import choice, count, flag

# Where a tensor-core task streams through the cp.async ring by default (MK_CUDA_MMA_RING=auto):
# its warps stream at least RING_AUTO_BYTES each, in rows of at least RING_AUTO_COLUMNS. On the
# H200 (bench/RESULTS.md, session 39), with the ring walking a raw activation's chunks as one
# stream (mk::gpu::mma_raw_ring): the gated MLP at batch 8 (tasks of 112 and 229 KB a warp, rows of
# 14,336 and 4,096) 0.1333 -> 0.1245 ms with 2 stages, 0.1211 with 3, 0.1575 with 4 (the chunks
# shrink to 1,024 columns); a 4-layer qwen3-8b step at batch 8 1343 -> 1235 us with 3 stages on
# every task (its gate/up, down and lm_head tasks: 98-1,200 KB a warp; the rest, 32-48 KB, level).
# Without the walk (session 37), the batch-8 lm_heads of qwen3-0.6b and llama-3.2-1b (rows of
# 1,024 and 2,048) lost 2.5 % of the step and the models' small linears (4-12 KB) more.
MMA_EARLY = 8  # stream_linear's Early
RING_AUTO_STAGES = 3
RING_AUTO_BYTES = 64 << 10
RING_AUTO_COLUMNS = 4096
SLICE_AUTO_STAGES = 3  # MK_CUDA_MMA_SLICE=auto's stages
# Where a normed activation takes K slices by default (MK_CUDA_MMA_SLICE_NORM=auto): at most this
# many row groups (each copies the activation) and at least this many stages a warp's slice.
SLICE_NORM_AUTO_GROUPS = 2
SLICE_NORM_AUTO_STAGES = 8


def stage_bulk() -> bool:
    """MK_CUDA_STAGE_BULK: 1 (default) stages a tensor-core task's 16-bit normed activation by
    bulk copies into shared memory, rewritten there (times the norm weight, packed) in one
    round trip (mk::gpu::stage_chunk_bulk); 0 keeps the threads' register loads, whose
    rounds of loads depend on each other and which load the norm weight once per row. On the
    H100 (session 91) RMSNorm+Linear at batch 8 took 0.0284 against 0.0292-0.0293 ms (4096x6144)
    and 0.0464-0.0466 against 0.0483-0.0484 (x12288), its staging 3.13 -> 1.74 us a task."""
    return flag("MK_CUDA_STAGE_BULK", default=True)


def mma_early() -> int:
    """MK_CUDA_MMA_EARLY=N: the steps of each warp's first round of weights that a bulk-staged
    tensor-core task (stage_bulk) without a ring loads behind its activation's bulk copies, so
    that their round trip overlaps the staging (default 8, at most 16; 0 loads none early), in a
    body of one grid; the bodies that a model's layers share take none. On the H100 (session
    91) 8 steps took RMSNorm+Linear B8 4096x6144 from 0.0283-0.0285 to 0.0277-0.0279 ms (16:
    0.0283-0.0284) and whole models at batch 8, given them in every body, 0.2-0.3 % longer."""
    return count("MK_CUDA_MMA_EARLY", MMA_EARLY, 0, 16, "steps")


def mma_slice() -> tuple[int, bool]:
    """MK_CUDA_MMA_SLICE: the stages of the K-slice rings and whether they go only where they
    take no more shared memory than the chunks they replace. A tensor-core task with a raw
    activation (no norm, 16-bit of the weights' type, aligned) and at most 32 weight rows then
    has each warp stream one slice of K for all of its rows, the activation's columns copied
    beside the weights in the same ring (mk::gpu::mma_slices_raw), instead of the activation in
    chunks every warp must finish. `auto` (default): SLICE_AUTO_STAGES stages, only where the
    rings fit in the task's chunked shared memory; 0 or 1: never; 2..4: those stages on every
    such task. On the H100 (session 94), batch 8, 3 stages on every such task: qwen3-0.6b
    1.4990 -> 1.4836 and 1.5185 -> 1.5021 ms/token (its o-projection and down tasks -0.47 and
    -0.43 us), qwen3-8b 7.0372 -> 6.9639, the gated MLP level (0.1341 / 0.1347 ms); llama-3.2-1b
    1.5996 -> 1.6222 and 1.6181 -> 1.6417, its sliced o-projection level and the kernel's shared
    memory 112 -> 120 KB with every other kind slower (its lm_head +2.8 us), which `auto` leaves
    as it was (session 95: the same 120 KB given to the arena runs level, and the sliced
    layer is less code, so the cause is open; `auto` against 0 on qwen3-0.6b at batch 8: 1.4777
    against 1.4972)."""
    text = os.environ.get("MK_CUDA_MMA_SLICE", "") or "auto"
    if text == "auto":
        return SLICE_AUTO_STAGES, True
    stages = count("MK_CUDA_MMA_SLICE", 0, 0, 4, "stages")
    return (0 if stages == 1 else stages), False


def mma_slice_norm() -> str:
    """MK_CUDA_MMA_SLICE_NORM: which tensor-core tasks whose 16-bit activation is normed on the
    way in take K slices (mma_slice's stages, where they fit in the stream's room): each warp's
    ring then also carries the norm weight's columns, the fragment is x·g and each warp takes
    its slice's Σx² (mk::gpu::mma_slices<..., Norm>), in place of the bulk staging's copies,
    rewrite and barrier; a task of more than 6 blocks of 8 rows splits its warps into row
    groups, each of which copies the activation. `auto` (default): only where the warps form at
    most SLICE_NORM_AUTO_GROUPS row groups and a warp's slice has at least
    SLICE_NORM_AUTO_STAGES stages; `1`: every such task; `0`: none. On the H100 (session 95),
    batch 8, on every such task: qwen3-8b 6.9832 -> 6.9096 ms/token (its q/k/v, 2 groups of 16
    stages, 24.80 -> 22.55 us a task; its gate/up, 8 groups, 68.97 -> 70.93), qwen3-0.6b
    1.4845 -> 1.5313 (q/k/v and gate/up with 2 stages a slice: +1.20 and +0.60 us),
    llama-3.2-1b 1.5988 -> 1.6891 (its fused MLP's gate/up in 4 groups +4.84 us), RMSNorm+Linear
    at batch 8 level (0.0276 and 0.0459-0.0460 ms)."""
    return choice("MK_CUDA_MMA_SLICE_NORM", ("auto", "0", "1"))


def smem_align() -> int:
    """MK_CUDA_SMEM_ALIGN: the alignment in bytes of the dynamic shared memory's start (128, the
    default; 16, its start then following the static shared memory; 1024). The bodies lay their
    buffers out on 128-byte offsets from that start. At 16 a change of the static shared memory
    moved it: 1,248 -> 1,168 B (50c5560) made the gated MLP at batch 8 0.1423 -> 0.1520 ms on the
    H100, and 128 took it to 0.1385 (session 68)."""
    return int(choice("MK_CUDA_SMEM_ALIGN", ("128", "16", "1024")))


def raw_bars_kept() -> bool:
    """MK_CUDA_RAW_BARS: `task` (default) initialises and invalidates the two mbarriers a raw
    activation's bulk copies complete on in each task; `launch` keeps them for the whole launch
    and counts their phases. Racecheck reports `task`'s copies into bytes a previous task's
    copy filled as a race (each task waits for its copies and the CTA passes a barrier before
    the next is issued) and is clean with `launch`, so `launch` is the build it checks. On the
    H200 `launch` took qwen3-8b at batch 8 from 6.29 to 7.48 ms/token (+19 %; the gated MLP and
    RMSNorm+Linear at batch 8 level), on the H100 the other presets level (session 66), so
    `task` is the default."""
    return choice("MK_CUDA_RAW_BARS", ("task", "launch")) == "launch"


def mma_ring(warp_bytes: int, columns: int) -> int:
    """MK_CUDA_MMA_RING: stages of each warp's cp.async ring for a tensor-core task whose warps
    stream `warp_bytes` of weights each in rows of `columns`; 0 for none. `auto` (default):
    RING_AUTO_STAGES where a warp streams at least MK_CUDA_MMA_RING_KB KiB (RING_AUTO_BYTES
    unless set) in rows of at least RING_AUTO_COLUMNS, else none; 0 or 1: never; 2..4: those
    stages for every such task."""
    text = os.environ.get("MK_CUDA_MMA_RING", "") or "auto"
    if text == "auto":
        least = count("MK_CUDA_MMA_RING_KB", RING_AUTO_BYTES >> 10, 0, 1 << 20, "KiB") << 10
        long_rows = columns >= RING_AUTO_COLUMNS
        return RING_AUTO_STAGES if warp_bytes >= least and long_rows else 0
    stages = count("MK_CUDA_MMA_RING", 0, 0, 4, "stages")
    return 0 if stages == 1 else stages


def rows_dot() -> str:
    """MK_CUDA_ROWS_DOT: how an accumulating output's product streams its weight columns
    (mk/cuda_rows_add.cuh). `mma` (default): 2..16 activation rows of up to 128 columns on
    tensor cores, an 8-row tile of the weight a load (rows_dot_mma), one row too from 64
    columns (llama-3.2-1b batch 1 −0.79 % on the H100), else as `lanes`; on the H200 at batch
    8 qwen3-0.6b 2.22 -> 2.02 and llama-3.2-1b 2.04 -> 1.76 ms/token. `lanes` share a row on
    CUDA cores, a power of two of them (won at 24, 64 and 96 columns a row at batch 1);
    `packed` share it in groups that keep more lanes busy (3 a row for 24 columns, 4 taking 3
    pieces each for 96; qwen3-0.6b batch 1 +0.9 % on the H100); `threads` take whole rows
    (bench/RESULTS.md); `mma-all` puts one row on tensor cores at any width (qwen3-0.6b's 24
    columns at batch 1 +2.3 % on the H100, llama-3.2-1b −2.4 % on the H200 in session 37)."""
    return choice("MK_CUDA_ROWS_DOT", ("mma", "lanes", "packed", "threads", "mma-all"))


def load_groups() -> bool:
    """On unless MK_CUDA_LOAD_GROUPS=0: consecutive run loads of a task body go out together, all
    loads before any store (load_groups.py; qwen3-0.6b 1.189 -> 1.171 ms/token on the H200)."""
    return flag("MK_CUDA_LOAD_GROUPS", default=True)


def lean_linears() -> bool:
    """On unless MK_CUDA_LEAN=0: a streamed linear on CUDA cores writes its sums and Σx² instead of adding
    to them (StreamLinear::assign), so its body does not zero them first (one element loop per
    accumulator and a barrier less before the weights stream), and Σx² is summed at the staging
    barrier instead of behind a barrier of its own after the products (qwen3-0.6b 1.311 ->
    1.275 ms/token with FUSE_LOOPS on the H200). Likewise a streamed attention's o, m and l,
    which stream_attention writes whole, are not initialised first."""
    return flag("MK_CUDA_LEAN", default=True)


def fuse_loops() -> bool:
    """On unless MK_CUDA_FUSE_LOOPS=0: element loops that need no barrier between them run as one loop
    (fuse_loops.py): a decode epilogue's scale, activation and stores in one statement."""
    return flag("MK_CUDA_FUSE_LOOPS", default=True)


POLL_SLEEP_NS = 128  # the default cap of a poll's sleep (mk/cuda_wait.cuh)


def poll_sleep_ns() -> int:
    """MK_CUDA_POLL_SLEEP: the longest sleep between two polls of a counter, in ns (the sleep
    doubles from 32 ns up to it; 0 spins). bench/chain.py's standalone chain polls without
    sleeping; the megakernel's cap has not been measured against spinning."""
    return count("MK_CUDA_POLL_SLEEP", POLL_SLEEP_NS, 0, 4096, "ns")


def launch_steps() -> str:
    """MK_CUDA_LAUNCH_STEPS (default 0): `1` has a task body that reads a decode-loop step of a
    launch constant (`nn.step %pos`: the kv length, the new key's position) compute it from the
    constant's words, copied into shared memory at the launch's start, and its iteration,
    instead of loading the step task's result with an L2 round trip (launch_words.py). On the
    H100: qwen3-0.6b batch 1 -0.90 %, llama-3.2-1b batch 1 -0.12 % / -0.38 %, qwen3-0.6b batch 8
    +0.28 % / +0.33 %. `attention` computes them in the decode attention bodies only, `writes`
    in the others only (the cache and token writes): which part costs batch 8, untimed."""
    return choice("MK_CUDA_LAUNCH_STEPS", ("0", "1", "attention", "writes"))


def batch_waits() -> bool:
    """On unless MK_CUDA_WAIT_BATCH=0: the dispatcher reads the counters of all of a task's near
    waits at once and takes one acquire fence when they all hold, instead of one L2 round trip
    per wait. On the H100 (session 79, variants.py at batch 1): qwen3-0.6b −1.05 % and −1.24 %
    in two calls, llama-3.2-1b −0.56 %, qwen3-8b −0.22 %; qwen3-0.6b at batch 8 −0.03 %. The one
    H200 timing (session 66, before builds were timed side by side) had it 1.1 % slower."""
    return flag("MK_CUDA_WAIT_BATCH", default=True)


def plain_launch() -> bool:
    """MK_CUDA_LAUNCH: `cooperative` (default) launches the megakernel with
    cudaLaunchCooperativeKernel, which guarantees that every CTA is resident; `plain` with
    cudaLaunchKernel behind the same occupancy check, which a kernel running beside it on
    another stream could defeat (the waits then time out: an error, never a hang). On the H200
    it launched no faster (bench/launch.py: 5.82 against 5.70 us queued for a tiny program)."""
    return choice("MK_CUDA_LAUNCH", ("cooperative", "plain")) == "plain"


def merge_tiles() -> bool:
    """MK_CUDA_MERGE_TILES=1: the split-KV merge as tile steps, as before its device call."""
    return flag("MK_CUDA_MERGE_TILES")


def weights_evict_first() -> bool:
    """Whether streamed weights are loaded with the L2's evict-first priority
    (MK_CUDA_WEIGHT_L2=evict_first): a decode step reads each weight byte once and far more of
    them than the L2 holds, so keeping them only pushes out what is read again (activations,
    the KV cache, event counters, the kernel's code)."""
    return choice("MK_CUDA_WEIGHT_L2", ("normal", "evict_first")) == "evict_first"


def flag_poll_all() -> bool:
    """MK_CUDA_FLAG_POLL: `watch` (default) waits between two rounds of a flagged read on one
    missing word alone; `all` sleeps and loads every missing word again each round (bench/
    chain.py's `ll` modes spin that way): one L2 round trip less after the last word lands, at
    the price of more polling traffic through the L2 the producers stream their weights from."""
    return choice("MK_CUDA_FLAG_POLL", ("watch", "all")) == "all"


FLAG_SLEEP_NS = 96  # kFlagSleepNs's default (mk/cuda_flags.cuh)


def flag_sleep_ns() -> int:
    """MK_CUDA_FLAG_SLEEP: the sleep between two looks at a missing flagged word, in ns (default
    96; 0 spins, as bench/chain.py's `ll` modes do, which gained there what the megakernel's
    flagged head rows did not)."""
    return count("MK_CUDA_FLAG_SLEEP", FLAG_SLEEP_NS, 0, 4096, "ns")


def gemm() -> str:
    """MK_CUDA_GEMM: the tensor-core instruction of a many-row linear's gemm tile, `wgmma`
    (default; through CuTe, mk/cuda_wgmma_tile.cuh) or `mma` (mma.sync, mk/cuda_mma_tile.cuh)."""
    return choice("MK_CUDA_GEMM", ("wgmma", "mma"))


def gemm_stages() -> int:
    """MK_CUDA_GEMM_STAGES: the wgmma gemm tile's most stages (2 to 8, default 4), fewer where
    the shared memory does not take them."""
    return count("MK_CUDA_GEMM_STAGES", 4, 2, 8, "stages")


def gemm_in_flight() -> bool:
    """MK_CUDA_GEMM_IN_FLIGHT: 1 (default) lets one chunk's wgmma products of the gemm tile run
    on past the next chunk's barrier (with three stages or more; one chunk less of copies ahead);
    0 drains the tensor cores before each barrier. On the H200 (bench/RESULTS.md, session 50)
    bench/gemm.py 999x4096x1024 0.0661 -> 0.0581 ms, 1024x4096x4096 0.1039 -> 0.0877; five
    stages did not help the prefill (15.28 against 15.11 ms with four)."""
    return flag("MK_CUDA_GEMM_IN_FLIGHT", default=True)


def gemm_staged_sums() -> bool:
    """MK_CUDA_GEMM_STAGED_SUMS: 1 (default) lets the wgmma gemm tile hand its sums to the
    body's accumulators through the stages' shared memory (each thread's registers at addresses
    known at compile time, then a rolled loop of 4-column runs); 0 unrolls one slot pick and two
    bounds checks per register, which took ~30 % of a prefill's `q` body in ncu's samples
    (session 50). On the H200 (bench/RESULTS.md, session 51) qwen3-0.6b's prefill of 1,008 rows
    13.077 -> 11.615 ms."""
    return flag("MK_CUDA_GEMM_STAGED_SUMS", default=True)


def local_tiles() -> bool:
    """MK_CUDA_LOCAL_TILES: 1 (default) makes a tile that one element loop writes and reads
    back at its own element a local of that loop (backends/cuda/local_tiles.py); 0 keeps it in
    the arena. On the H200 qwen3-0.6b's prefill of 1,008 rows 11.372 -> 11.072 ms (session 51)."""
    return flag("MK_CUDA_LOCAL_TILES", default=True)


# The fewest elements of a loop that pair_stores pairs by default: a prefill's epilogues (4,032
# elements and more), not a decode step's (8 to 128, whose timing was not run with pairs).
PAIR_MIN = 1024


def pair_stores() -> int:
    """MK_CUDA_PAIR_STORES: an element loop of at least the returned count of elements that
    only computes values and stores 16-bit runs of even length takes two elements a thread, one
    4-byte store for each pair (backends/cuda/pair_loops.py). `auto` (default): PAIR_MIN; `all`:
    any loop; `0`: none. On the H200 (session 51) qwen3-0.6b's prefill 11.061 -> 10.913 ms in one
    call (every loop of its CUDA has 4,032 elements or more: `auto` and `all` emit the same)."""
    mode = choice("MK_CUDA_PAIR_STORES", ("auto", "all", "0"))
    return {"auto": PAIR_MIN, "all": 2}.get(mode, 0)


def wide_room() -> bool:
    """MK_CUDA_WIDE_ROOM: 1 (default) lets a streamed linear whose tiles are tiny take
    stream.WIDE_ROOM of shared memory for its activation chunks and ring, reaching into the
    arena's part, where it then walks the activation in fewer chunks (a batch-8 down projection:
    on the H200 in session 40, 36.3 against 39.5 us a task of the gated MLP's with every body
    given that room; the others lost their arena then); 0 keeps every body in its usual room."""
    return flag("MK_CUDA_WIDE_ROOM", default=True)


def merge_early() -> str:
    """MK_CUDA_MERGE_EARLY: where a linear on CUDA cores whose activation is an attention merge
    it makes itself (the split o-projection at batch 1) asks for its weights, so that their
    round trip to HBM overlaps the partials' round trip and the merge instead of following them.
    `auto` (default): `beside` where the merge takes at most a quarter of the CTA's threads
    (qwen3-0.6b and llama-3.2-1b at batch 1: 64 of 256; on the H100, session 87, −1.34 % and
    −0.36 %), else `0` (qwen3-8b's 512 columns a block: 128 threads, +1.17 % with `beside`);
    `0`: after the merge; `beside`: the warps that do not merge ask the L2 for the weights
    while the others load the partials (mk::gpu::merge_rows_beside, where the merge leaves a
    warp idle; no registers held), and the stream then finds them there. Each warp's first
    round loaded into registers before the merge's loads (`1`, retired) cost 1.3 % at
    qwen3-0.6b batch 1 on the H200 (session 62): the partials, needed first, then queued
    behind 32 KB of weights."""
    return choice("MK_CUDA_MERGE_EARLY", ("auto", "0", "beside"))


STAGE_FIRST_AUTO = -1  # stage_first unset: one step where the registers allow (emit_stream)


def stage_first() -> int:
    """MK_CUDA_STAGE_FIRST=N (1-4; 0: off; unset: STAGE_FIRST_AUTO): a linear on CUDA cores
    whose activation it stages (not flagged, aligned weights in global memory) loads the first N
    steps of each warp's first round of weights into registers right behind the activation's
    first loads and before their staging (stream_linear<..., First = 2>), so that their round
    trip to HBM overlaps the activation's and the staging barrier instead of following them.
    The order follows the tensor-core attention's rows first (MK_CUDA_ATTN_ROWS_FIRST): a load
    asked first lands first, so the activation, needed first, goes out first;
    asking for the weights before the partials a merge loads (MK_CUDA_MERGE_EARLY=1, retired)
    cost 1.3 %, and asking the L2 instead of registers (MK_CUDA_STAGE_BESIDE, retired) 5.2 %.
    Held through the staging, a
    whole round (4 steps at batch 1) made ptxas spill 144-172 B (2-layer presets) and one step
    of every eligible body 72-160 B on llama-3.2-1b and qwen3-8b; by default a body takes one
    step where it holds few loads through the staging (emit_stream.STAGE_FIRST_HELD):
    qwen3-0.6b −1.45 % and −0.90 % at batch 1 on the H100 (docs/cuda-backend.md)."""
    return count("MK_CUDA_STAGE_FIRST", STAGE_FIRST_AUTO, 0, 4, "steps")


def stage_first_held() -> int:
    """MK_CUDA_STAGE_FIRST_HELD=H (1-16; opt-in; 0, the default: off): with MK_CUDA_STAGE_FIRST
    unset, the bodies past the default's rule (more than emit_stream.STAGE_FIRST_HELD loads held)
    load their first weight step early too, but only the step's first H - XB rows of their row
    group (at least one; XB: the thread's own activation loads), so that a thread holds at most
    H 16-byte loads through the staging; the rest of the step loads at its turn
    (stream_linear<..., Held = H>, mk::gpu::stage_first_rows). On the H100 at batch 1 (session
    81): llama-3.2-1b -0.60 % with 2 and -0.56 % with 3, qwen3-8b -0.05 % with 4 and +0.12 %
    with 3, qwen3-0.6b +0.05 % with 3 and +0.96 % with 5: no value gains on every preset."""
    return count("MK_CUDA_STAGE_FIRST_HELD", 0, 0, 16, "loads")


# Most task bodies `auto` inlines into one dispatcher: ptxas took minutes over one function
# holding many bodies (qwen3-0.6b's prefill of 999 positions with the generic attention loop:
# not done in 15 minutes, against 32 s with the bodies called; with block_attention, 2 layers
# built in 25 s here).
INLINE_MOST_BODIES = 4


def inline_bodies(wgmma: bool, functions: int = 1) -> bool:
    """MK_CUDA_INLINE_BODIES: whether the task bodies are inlined into the dispatcher, which then
    makes no calls. ptxas serializes every wgmma of a function that makes any call (C7510), so
    `auto` (default) inlines where a body runs a wgmma tile and there are at most
    INLINE_MOST_BODIES of them (`functions`): on the H200 (bench/RESULTS.md, session 45) 4096^3
    0.480 -> 0.403 ms, 1024x4096^2 0.124 -> 0.106. 0 or 1 force it; `walk` (inline_walk) too.
    Forced on a model's decode (qwen3-0.6b: 19 bodies) the build did not end in 400 s on the
    GPU machine (bench/RESULTS.md, session 56)."""
    text = os.environ.get("MK_CUDA_INLINE_BODIES", "") or "auto"
    if text == "auto":
        return wgmma and functions <= INLINE_MOST_BODIES
    if text == "gemm":
        return False  # the wgmma bodies only (inline_gemm)
    return text == "walk" or flag("MK_CUDA_INLINE_BODIES")


def inline_gemm() -> bool:
    """MK_CUDA_INLINE_BODIES=gemm (opt-in; on the H200 qwen3-0.6b's whole prefill did not
    build within 4 minutes, session 51): only the bodies that run a
    wgmma tile are inlined, with the walk's task runner, `run` and the tiles as for `walk`, the
    other bodies staying calls. ptxas then keeps the wgmma pipelined: no call crosses it. In a
    local build of a 2-layer qwen3-0.6b prefill with MK_CUDA_GEMM_STAGED_SUMS=1: 24 s, no C7510
    (the called bodies' wgmma waited after every instruction: ~15 % of their ncu samples,
    session 50), the entry spilling 812 B; with the per-element sums the same build took 7.5
    minutes and spilled 2.1 KB."""
    return os.environ.get("MK_CUDA_INLINE_BODIES", "") == "gemm"


def inline_walk() -> bool:
    """MK_CUDA_INLINE_BODIES=walk (opt-in): besides the bodies, the dispatcher's
    `run`, the queue walk's task runner and the wgmma tiles are forced inline, so that the
    megakernel makes no call at all. With many bodies the compiler keeps those as functions of
    their own (a tile that two bodies share, the runner that the walk calls from two places),
    and ptxas then serializes the wgmma anyway (C7510): a prefill's linears. On the H200
    (session 47) a 2-layer qwen3-0.6b prefill's step took 2,000 against 2,132 us, its linears'
    tiles no faster, and the whole model's build passed 2 minutes. inline_gemm does the same
    around the wgmma bodies alone."""
    return os.environ.get("MK_CUDA_INLINE_BODIES", "") in ("walk", "gemm")


def row_runs(decode_shaped: bool) -> bool:
    """MK_CUDA_ROW_RUNS: whether a body that only normalises (and rotates) rows is one
    mk::gpu::rms_norm_runs / rms_norm_rope_runs call (backends/cuda/norm_runs.py): `auto` (the
    default) unless it is `decode_shaped` (a RoPE whose tables are one row for all: a decode
    step's QK-norm, whose tile form was timed and tuned; the call there is not timed yet),
    `all` always, `0` never."""
    mode = choice("MK_CUDA_ROW_RUNS", ("auto", "all", "0"))
    return mode == "all" or (mode == "auto" and not decode_shaped)


def defines(profile: bool, warm: bool, inline: bool = False) -> str:
    """The header switches of one build (mk/cuda_arena.h, mk/cuda_stream.cuh) as #define lines;
    `profile` for op marks, `warm` to run each body once untimed before its timed run, `inline`
    where the bodies are inlined (the arena's overflow messages, calls, are left out)."""
    lines = ["#define MK_OP_MARKS 1"] if profile else []
    if profile and warm:
        lines.append("#define MK_OP_MARKS_WARM 1")
    if weights_evict_first():
        lines.append("#define MK_STREAM_EVICT_FIRST 1")
    if flag("MK_CUDA_MMA_PIPE"):
        lines.append("#define MK_MMA_PIPE 1")
    if (sleep := poll_sleep_ns()) != POLL_SLEEP_NS:
        lines.append(f"#define MK_POLL_SLEEP_NS {sleep}")
    if flag_poll_all():
        lines.append("#define MK_FLAG_POLL_ALL 1")
    if (flag_sleep := flag_sleep_ns()) != FLAG_SLEEP_NS:
        lines.append(f"#define MK_FLAG_SLEEP_NS {flag_sleep}")
    if flag("MK_CUDA_MMA_L1"):
        lines.append("#define MK_MMA_L1 1")
    if (first_steps := stage_first()) > 1:
        lines.append(f"#define MK_STAGE_FIRST_STEPS {first_steps}")
    lines += attention_defines()
    if plain_launch():
        lines.append("#define MK_PLAIN_LAUNCH 1")
    if raw_bars_kept():
        lines.append("#define MK_RAW_BARS_LAUNCH 1")
    if (align := smem_align()) != 128:
        lines.append(f"#define MK_DYNAMIC_SMEM_ALIGN {align}")
    if not gemm_in_flight():
        lines.append("#define MK_WGMMA_DRAIN 1")
    if not gemm_staged_sums():
        lines.append("#define MK_WGMMA_SLOT_SUMS 1")
    # With the bodies inlined, the arena's overflow messages (printf) are the calls left; the
    # overflow still traps.
    if inline:
        lines.append("#define MK_NO_DEVICE_PRINTF 1")
    if inline_walk():
        lines.append("#define MK_INLINE_WALK 1")
    return "".join(line + "\n" for line in lines)
