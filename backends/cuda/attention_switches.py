"""The CUDA build switches of the decode attention bodies (MK_CUDA_ATTN_*, MK_CUDA_CAUSAL_SKIP)."""

from __future__ import annotations

from mk.backends.cuda.switch_values import choice, count, flag


def attention_merge_weights() -> bool:
    """MK_CUDA_ATTN_MERGE_WEIGHTS (default 1; 0: off): the streamed attention's merge of its
    slots' online-softmax states computes each slot's weight of a row once, a thread per row and
    slot (mk::gpu::merge_slot_weights), where every thread computed the row's peak over the
    slots and every slot's weight for each of its elements (merge_slot_states: qwen3-8b at batch
    1, 4 rows of 128 over 16 slots, 32 exponentials and 128 shared loads a thread). The same
    sums in the same order: bit-identical. One barrier more and slots · rows floats of shared
    memory. On the H100 at batch 1 (one call, session 81): qwen3-0.6b -0.28 %, qwen3-8b -0.09 %."""
    return flag("MK_CUDA_ATTN_MERGE_WEIGHTS", default=True)


def keys_ahead() -> int:
    """MK_CUDA_ATTN_KEYS_AHEAD (`1` by default: up to 2 query rows; `0`: off; `4`: up to 4): the
    most query rows of a decode attention task on CUDA cores whose first round of keys goes out
    early: such a task (aligned 16-bit caches) asks for that round before the scalars (the kv length, the new
    key's position) arrive, instead of after: their round trip to L2 then overlaps the keys' to
    HBM (mk::gpu::load_keys_ahead). The round covers the task's keys before the length cuts
    them, so a task past the length still reads one round (with a cache much longer than its
    positions, bytes nobody uses); the keys past the cut are zeroed before use, as if never
    loaded, so the outputs are bit-identical. qwen3-0.6b batch 1 on the H100: 0.9170 -> 0.9088
    ms/token (-0.90 %), with 255 registers and 4 bytes of dispatcher spills against 246 and
    none. `4` also gives it to 4-row tasks (llama-3.2-1b and qwen3-8b at batch 1), whose early
    round is otherwise off (it made ptxas spill there): untimed."""
    return {"0": 0, "1": 2, "4": 4}[choice("MK_CUDA_ATTN_KEYS_AHEAD", ("1", "0", "4"))]


def causal_skip() -> bool:
    """MK_CUDA_CAUSAL_SKIP: 1 (default) cuts a causal block attention's keys to those its rows
    can see, and a decode or non-causal block attention task's at the kv length
    (backends/cuda/causal.py); 0 walks every key of the cache, masking the rest (then cache
    rows past the length that hold NaN reach the output through a zero weight). With a cache as long as the prompt the block cut
    measured level on the H200 (qwen3-0.6b's prefill of 999 positions 26.76 -> 26.60 ms); a
    longer cache's keys past the positions written, all masked, are walked only without it.
    The decode cut: qwen3-0.6b, prompt 100, cache 2,048, 1.1846 -> 1.1294 ms/token."""
    return flag("MK_CUDA_CAUSAL_SKIP", default=True)


def attention_mma(head_dim: int, chunks: int, rows: int) -> bool:
    """MK_CUDA_ATTN_MMA: whether a decode attention whose query rows are exact in the keys'
    16-bit type runs on tensor cores (mk::gpu::stream_attention_mma: K/V chunks of 64 keys staged
    by cp.async, 8 keys a warp) rather than on CUDA cores (mk::gpu::stream_attention). `auto`
    (default) for head dims up to 64 and for tasks of 8 query rows times chunks or more (with
    few, the staging overlaps little and the m16n8k16 tiles are mostly padding, while the CUDA
    cores' loop keeps keys in flight), `1` for any it takes (head dims 32, 64 and 128), `0`
    never. On the H200 (bench/RESULTS.md, sessions 54-55, two stages) it took llama-3.2-1b (64)
    1.122 against 1.159 ms/token at batch 1, qwen3-8b (128, 4 rows, two chunks) 5.051 against
    5.164, qwen3-0.6b at batch 8 (128, 2 rows, eight chunks) 2.048 against 2.103, but
    qwen3-0.6b at batch 1 (2 rows) 1.129 against 1.107 with one chunk and 1.112 against 1.098
    with two."""
    mode = choice("MK_CUDA_ATTN_MMA", ("auto", "1", "0"))
    return mode == "1" or (mode == "auto" and (head_dim <= 64 or rows * chunks >= 8))


ATTN_ROWS_FIRST = 2  # kAttnRowsFirst's default (mk/cuda_attention_mma.cuh)


def attention_rows_first() -> int:
    """MK_CUDA_ATTN_ROWS_FIRST=N (0-4, default 2): a tensor-core decode attention
    (mk::gpu::stream_attention_mma) asks for the rows it prepares before it stages its chunks of
    K and V, N stages (at most its own) between the rows' loads and their ops and the rest
    after, as the CUDA-core body does with MK_CUDA_ATTN_KV_EARLY; 0 stages every chunk first,
    and the rows' loads land behind them: a batch-8 task then has no copy in flight from the
    moment its staged chunks have landed until its rows are ready and its first chunk's math
    frees a stage. On the H100, 1 to 3 were level and 0 slower: qwen3-0.6b at batch 8 by 2 %,
    llama-3.2-1b by 0.8 % (bench/RESULTS.md, session 72)."""
    return count("MK_CUDA_ATTN_ROWS_FIRST", ATTN_ROWS_FIRST, 0, 4, "stages")


def attention_mma_stages() -> int:
    """MK_CUDA_ATTN_MMA_STAGES (1-4, default 3): the most chunks of 64 keys stream_attention_mma
    keeps staged; a task takes no more than it has chunks. Each is 2 · 64 · (head dim + 8) · 2
    bytes of the kernel's shared memory (35 KB at head dim 128), which the L1 of every body
    gives up. With shared memory starting 96 B past 128, two stages had won at batch 8
    (session 54). At the 128-byte start three won on both cards (bench/RESULTS.md, sessions 69
    and 70): at batch 8 qwen3-0.6b −1.6 % (H100) and −1.0 % (H200), llama-3.2-1b −0.3 % on
    both, qwen3-8b −0.2 % (H200), batch 1 level; four cost qwen3-0.6b B8 7.1 % on the H200."""
    return count("MK_CUDA_ATTN_MMA_STAGES", 3, 1, 4, "stages")


def attention_warp_keys() -> int:
    """MK_CUDA_ATTN_WARP_KEYS (8 default, or 16): the keys each of the 8 warps of
    stream_attention_mma takes of a staged chunk, so chunks of 64 or 128 keys. With 16 a warp's
    scores are two independent mma chains, its oᵀ += Vᵀ·pᵀ one m16n8k16 per 16 head elements
    in place of two m16n8k8, and a task walks half as many chunks (and barriers); a stage is
    twice the shared memory. Level alone and +5.4 % in qwen3-0.6b at batch 8 with two stages
    on the H100 (bench/RESULTS.md, session 98), so off."""
    return int(choice("MK_CUDA_ATTN_WARP_KEYS", ("8", "16")))


def attention_defines() -> list[str]:
    """The attention headers' switches of one build (mk/cuda_attention.cuh,
    mk/cuda_attention_mma.cuh) as #define lines."""
    lines = []
    if not attention_merge_weights():
        lines.append("#define MK_ATTN_MERGE_SLOTS 1")
    if (rows_first := attention_rows_first()) != ATTN_ROWS_FIRST:
        lines.append(f"#define MK_ATTN_ROWS_FIRST {rows_first}")
    if (warp_keys := attention_warp_keys()) != 8:
        lines.append(f"#define MK_ATTN_WARP_KEYS {warp_keys}")
    if not flag("MK_CUDA_ATTN_KV_EARLY", default=True):
        lines.append("#define MK_ATTN_KV_LATE 1")
    if (keys := count("MK_CUDA_ATTN_KEYS", 4, 1, 16, "keys")) != 4:
        lines.append(f"#define MK_ATTN_KEYS {keys}")
    return lines
