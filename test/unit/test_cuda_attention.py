"""Decode attention on the GPU: which graph_defs stream, the emitted call, odd shapes on a GPU."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from attention_programs import attention, matches_the_reference

import mk
from mk import compiler
from mk.backends.cuda.stream_attention import AttentionPlan, plan_attention
from mk.dialects import make_context
from mk.dialects.mugraph import GraphDefOp, InputOp
from mk.inputs import random_inputs
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import load_module

ROOT = Path(__file__).resolve().parents[2]


def _lowered_plans(text: str, **options: int) -> dict[str, AttentionPlan | None]:
    """Each graph_def's attention plan, by its first result's name."""
    module = load_module(text)
    NnToMugraphPass(**options).apply(make_context(), module)
    return {
        op.results[0].name_hint or "": plan_attention(op)
        for op in module.walk()
        if isinstance(op, GraphDefOp)
    }


def _plans(text: str, **options: int) -> dict[str, bool]:
    return {name: p is not None for name, p in _lowered_plans(text, **options).items()}


# --------------------------------------------------------------------------- no GPU needed


# What attention-fold=1 puts in each example's split kernel: the new K row, the new V row, q's
# per-head ops (decoder_block concatenates its cache instead of writing it).
FOLDED = {
    "attention_decode": (False, False, False),
    "llama3_8b_block": (True, True, True),
    "decode_loop": (True, True, True),
    "decoder_block": (False, False, True),
}


@pytest.mark.parametrize(
    ("example", "kernel", "rows", "head_dim", "args"),
    [("attention_decode", "o_o", 4, 64, ("s", "key", "scalar")),
     ("llama3_8b_block", "att2_o", 4, 128, ("s", "key", "scalar")),
     ("decode_loop", "att2", 2, 16, ("s", "key", "scalar")),
     ("decoder_block", "att2_o", 2, 64, ("s",))],  # 128 keys: two splits
)  # fmt: skip
@pytest.mark.parametrize("fold", [0, 1])
def test_split_kernels_of_the_examples_stream(
    example: str, kernel: str, rows: int, head_dim: int, args: tuple[str, ...], fold: int
) -> None:
    module = load_module((ROOT / "examples" / f"{example}.mlir").read_text())
    NnToMugraphPass(attention_fold=fold).apply(make_context(), module)
    kernels = {op.results[0].name_hint: op for op in module.walk() if isinstance(op, GraphDefOp)}
    plans = {name: plan_attention(op) for name, op in kernels.items()}
    assert {name for name, p in plans.items() if p is not None} == {kernel}
    plan = plans[kernel]
    assert plan is not None and (plan.rows, plan.head_dim) == (rows, head_dim)
    assert tuple(a if isinstance(a, str) else "scalar" for a in plan.args) == args
    # Nothing the loop computes is left as a tile but the accumulator's state.
    streamed = plan.streamed()
    assert not {plan.acc.o, plan.acc.m, plan.acc.l} & streamed
    assert plan.k.tile in streamed and plan.v.tile in streamed
    # q is read in place, or (its norm and RoPE folded in) computed by the call as it loads it.
    assert (plan.q.tile if isinstance(plan.q, InputOp) else plan.q) in streamed
    assert plan.prologue == ()
    folded = (plan.k_new is not None, plan.v_new is not None, not isinstance(plan.q, InputOp))
    assert folded == (FOLDED[example] if fold else (False, False, False))


@pytest.mark.parametrize(
    ("shape", "why"),
    [((1, 4, 1, 64, 64, {"causal": True, "sq": 2}), "query positions in the mask"),
     ((1, 16, 1, 64, 40, {}), "16 query rows of head dim 40"),
     ((1, 16, 1, 64, 64, {"dtype": "f32"}), "16 query rows of f32"),
     ((1, 2, 1, 64, 96, {}), "head dim 96"),
     ((1, 2, 1, 64, 64, {"dtype": "f32"}), "f32 keys")],
)  # fmt: skip
def test_other_attention_forms_keep_the_tile_loop(
    shape: tuple[int, int, int, int, int, dict[str, object]], why: str
) -> None:
    *dims, extra = shape
    plans = _plans(attention(*dims, **extra))  # type: ignore[arg-type]
    assert plans and not any(plans.values()), why


@pytest.mark.usefixtures("no_nvcc")
def test_emitted_call_and_score_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-3-8B's block (4 query rows a task, head dim 128): 16 splits of one 64-key chunk on
    CUDA cores by default; 8 splits (two chunks a task) on tensor cores, on CUDA cores with
    MK_CUDA_ATTN_MMA=0."""
    path = ROOT / "examples/llama3_8b_block.mlir"
    src = mk.compile(path, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::stream_attention<4, 128>(sa, score);") == 1
    src = mk.compile(path, target="cuda", cache_dir=tmp_path, kv_splits=8).cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::stream_attention_mma<4, 128, true, 2>(sa, score);") == 1
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "0")
    src = mk.compile(path, target="cuda", cache_dir=tmp_path, kv_splits=8).cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::stream_attention<4, 128>(sa, score);") == 1
    assert "const auto score = [&](float s, int64_t key) -> float {" in src
    assert "mk::gpu::accum_softmax_update" not in src  # the split loop no longer runs on tiles
    # Shared memory covers the groups' states: 16 groups of 16 lanes, 4 rows of 128 + m, l.
    smem = int(src.split("kSmemBytes = ")[1].split(";")[0])
    assert smem >= 4 * 16 * 4 * 130


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("shape", "options"), [((1, 16, 8, 1024, 128), {}), ((3, 2, 2, 96, 16), {"dtype": "f16"})]
)
def test_a_streamed_attention_knows_its_caches_are_aligned(
    shape: tuple[int, int, int, int, int], options: dict[str, Any], tmp_path: Path
) -> None:
    """Every K/V tile of a streamed attention starts a multiple of the head dim (8 elements or
    more) into its cache, so StreamAttention::aligned is set and the body holds no path for
    unaligned caches (qwen3-0.6b's batch-8 body 44.8 -> 37.0 KB of SASS)."""
    text = attention(*shape, **options)
    src = mk.compile(text, target="cuda", num_sms=8, cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::StreamAttention sa{};") == src.count("sa.aligned = true;") > 0


@pytest.mark.usefixtures("no_nvcc")
def test_the_streamed_attention_state_is_not_initialised_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stream_attention writes o, m and l whole: the body only sizes them (three element loops
    and barriers fewer), unless MK_CUDA_LEAN=0."""
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "0")

    def attention_body() -> str:
        path = ROOT / "examples/llama3_8b_block.mlir"
        src = mk.compile(path, target="cuda", cache_dir=tmp_path).cuda_source or ""
        return next(b for b in src.split("__device__ __noinline__") if "stream_attention<" in b)

    lean = attention_body()
    sa = lean.split("mk::gpu::StreamAttention sa{};", 1)[1]
    state = [line.split(" = ")[1].removesuffix(".data();") for line in sa.splitlines()
             if line.strip().startswith(("sa.o = ", "sa.m = ", "sa.l = "))]  # fmt: skip
    assert len(state) == 3
    for tile in state:
        assert f"{tile}.resize(" in lean and f"{tile}.assign(" not in lean
    monkeypatch.setenv("MK_CUDA_LEAN", "0")
    assert all(f"{tile}.assign(" in attention_body() for tile in state)


# --------------------------------------------------------------------------- many query rows

BLOCK_SHAPES = [
    ((1, 4, 2, 320, 64), {"causal": True, "sq": 300}),  # 2 heads x 60 queries a block
    ((2, 2, 2, 72, 128), {"causal": True, "sq": 72, "kv_len": False}),
    ((1, 8, 2, 200, 128), {"dtype": "f16", "sq": 150}),
    ((1, 16, 1, 100, 64), {}),  # 16 heads of one query against one KV head
    ((1, 4, 4, 100, 32), {"causal": True, "sq": 100}),
    ((1, 16, 8, 520, 128), {"causal": True, "sq": 500}),  # qwen3's heads
]


@pytest.mark.parametrize(("dims", "extra"), BLOCK_SHAPES[:4])
def test_many_query_rows_plan_the_block_call(
    dims: tuple[int, ...], extra: dict[str, object]
) -> None:
    plans = _plans(attention(*dims, **extra))  # type: ignore[arg-type]
    assert plans and all(plans.values())


def _block_plans(text: str) -> list[AttentionPlan]:
    return [p for p in _lowered_plans(text).values() if p is not None and p.block]


def test_a_causal_block_knows_its_mask() -> None:
    """The causal prefill's mask gives the key bound's operands (kv_len, the queries' span);
    a mask of kv_len alone gives none."""
    (plan,) = _block_plans(attention(1, 4, 2, 320, 64, causal=True, sq=300))
    assert plan.causal is not None and plan.causal.span == 300
    assert plan.causal.length.source_index() == 3  # %kv_len
    (plan,) = _block_plans(attention(1, 8, 2, 200, 128, dtype="f16", sq=150))
    assert plan.causal is None


def test_a_decode_attention_knows_its_length() -> None:
    """A decode step's mask `key < kv_len` gives the keys' bound; without kv_len there is
    none, and a block plan keeps its causal bound instead."""
    plans = [p for p in _lowered_plans(attention(2, 8, 2, 256, 64)).values() if p is not None]
    assert plans and all(p.length is not None and p.length.source_index() == 3 for p in plans)
    plans = [p for p in _lowered_plans(attention(2, 4, 4, 64, 32, kv_len=False)).values() if p]
    assert plans and all(p.length is None for p in plans)
    (block,) = _block_plans(attention(1, 4, 2, 320, 64, causal=True, sq=300))
    assert block.length is None and block.causal is not None


@pytest.mark.usefixtures("no_nvcc")
def test_emitted_block_call_and_score_function(tmp_path: Path) -> None:
    """A causal prefill's attention: one call over all keys, the score given each row's query
    position, and room for two stages of 64 K and V rows of 64 + 8 elements."""
    text = attention(1, 4, 2, 320, 64, causal=True, sq=300)
    src = mk.compile(text, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::block_attention<120, 64, true>(ba, score);") == 1
    assert "const auto score = [&](float s, float key, float query) -> float {" in src
    assert "ba.q_run_rows = 60;" in src and "ba.q_run_ld = 19200;" in src
    assert "accum_softmax_update" not in src and "mma_tile<" not in src
    assert int(src.split("kSmemBytes = ")[1].split(";")[0]) >= 3 * 2 * 64 * 72 * 2


# --------------------------------------------------------------------------- on the GPU


SHAPES = [
    ((2, 8, 2, 256, 64), {}),
    ((1, 32, 8, 1024, 128), {}),
    ((1, 16, 8, 200, 128), {}),  # keys not a multiple of the groups
    ((3, 2, 2, 96, 16), {"dtype": "f16"}),
    ((1, 8, 1, 520, 256), {}),
    ((2, 4, 4, 64, 32), {"kv_len": False}),
]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize(("keys", "early"), [("", "0"), ("8", "0"), ("", "1")])
def test_key_loop_switches_are_build_options(
    keys: str, early: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_ATTN_KEYS=8 defines MK_ATTN_KEYS and MK_CUDA_ATTN_KV_EARLY=0 MK_ATTN_KV_LATE; a
    batch-8 decode attention of 512 keys a task (qwen3-0.6b's heads) on CUDA cores, its first
    round of keys ahead of its scalars (2 rows), builds without spills each way."""
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "0")
    monkeypatch.setenv("MK_CUDA_ATTN_KEYS", keys)
    monkeypatch.setenv("MK_CUDA_ATTN_KV_EARLY", early)
    text = attention(8, 16, 8, 1024, 128)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=2)
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert ("#define MK_ATTN_KEYS 8" in src) == (keys == "8")
    assert ("#define MK_ATTN_KV_LATE 1" in src) == (early == "0")
    assert "mk::gpu::stream_attention_ahead<2, 128>(" in src
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_merge_weights_are_a_build_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slots' weights are computed once by default (mk::gpu::merge_slot_weights), which
    reserves a float per slot and row more; MK_CUDA_ATTN_MERGE_WEIGHTS=0 defines
    MK_ATTN_MERGE_SLOTS (every thread weighs the slots for each of its elements) and gives the
    floats back. qwen3-8b's heads at batch 1 (4 rows of 128, 16 slots), built without spills
    either way; 0 and 1 only."""
    text = attention(1, 32, 8, 1024, 128)
    (plan,) = [p for p in _lowered_plans(text).values() if p is not None]
    floats = plan.smem_floats()
    monkeypatch.setenv("MK_CUDA_ATTN_MERGE_WEIGHTS", "0")
    assert floats - plan.smem_floats() == 16 * 4
    for value, slots in (("", False), ("0", True)):
        monkeypatch.setenv("MK_CUDA_ATTN_MERGE_WEIGHTS", value)
        prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
        src = prog.cuda_source  # type: ignore[attr-defined]
        assert ("#define MK_ATTN_MERGE_SLOTS 1" in src) == slots
        assert "mk::gpu::stream_attention<4, 128>(" in src
        used = prog.cuda_resources  # type: ignore[attr-defined]
        assert used is not None and (used.spill_stores, used.spilling) == (0, 0), (value, used)
    monkeypatch.setenv("MK_CUDA_ATTN_MERGE_WEIGHTS", "2")
    with pytest.raises(mk.MkError, match="MK_CUDA_ATTN_MERGE_WEIGHTS"):
        mk.compile(text, target="cuda", cache_dir=tmp_path)


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("dims", "extra", "mode", "call"),
    [
        ((8, 16, 8, 1024, 128), {}, "1", "stream_attention_mma<2, 128, true, 3>"),
        ((8, 16, 8, 1024, 128), {}, "auto", "stream_attention_mma<2, 128, true, 3>"),  # 8 chunks
        ((2, 8, 2, 256, 128), {}, "auto", "stream_attention<4, 128>"),  # one chunk of 64 keys
        ((1, 16, 8, 1024, 128), {}, "auto", "stream_attention_ahead<2, 128>"),  # 2 x 2 chunks
        ((1, 32, 8, 1024, 128), {}, "auto", "stream_attention<4, 128>"),  # 4 x 1 (16 splits)
        ((1, 32, 8, 1024, 128), {"kv_splits": 8}, "auto", "stream_attention_mma<4, 128, true, 2>"),
        ((2, 8, 2, 256, 64), {"dtype": "f16"}, "auto", "stream_attention_mma<4, 64, false, 1>"),
        ((2, 8, 2, 256, 64), {}, "0", "stream_attention<4, 64>"),
        ((2, 4, 4, 64, 32), {}, "", "stream_attention_mma<1, 32, true, 1>"),
        ((3, 2, 2, 96, 16), {}, "1", "stream_attention_ahead<1, 16>"),  # head dim not 32/64/128
        ((1, 8, 1, 520, 256), {}, "1", "stream_attention<8, 256>"),  # o would not fit registers
    ],
)
def test_tensor_core_decode_attention_is_a_build_option(
    dims: tuple[int, ...],
    extra: dict[str, object],
    mode: str,
    call: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MK_CUDA_ATTN_MMA=1 calls stream_attention_mma where the head dim and dtypes allow, with
    a stage for each chunk of 64 keys a task has, up to 2, and their room; `auto` (or unset) up
    to head dim 64 and for tasks of 8 query rows times chunks or more (qwen3-8b's heads at batch
    1 with 1,024 keys in 8 splits; its default 16 give one chunk a task); 0 never."""
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", mode)
    extra = dict(extra)
    options = {"kv_splits": extra.pop("kv_splits")} if "kv_splits" in extra else {}
    text = attention(*dims, **extra)  # type: ignore[arg-type]
    src = mk.compile(text, target="cuda", cache_dir=tmp_path, **options).cuda_source  # type: ignore[attr-defined]
    ahead = ", keys_ahead" if "ahead" in call else ""  # up to 2 rows: keys before the scalars
    assert f"mk::gpu::{call}(sa, score{ahead});" in src
    if "mma" in call:  # a stage a chunk of the task's keys (up to 2) of K and V rows of d + 8
        stages = int(call.split(", ")[-1].rstrip(">"))
        front = int(src.split("kArenaOffset = ")[1].split(";")[0])
        assert front >= stages * 2 * 64 * (dims[4] + 8) * 2


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("most", "stages"), [("", 3), ("4", 4), ("3", 3), ("2", 2), ("1", 1)])
def test_tensor_core_stages_are_a_build_option(
    most: str, stages: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_ATTN_MMA_STAGES bounds the stages of a task of 8 chunks (512 keys)."""
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "1")
    monkeypatch.setenv("MK_CUDA_ATTN_MMA_STAGES", most)
    text = attention(8, 16, 8, 1024, 128)
    src = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=2).cuda_source  # type: ignore[attr-defined]
    assert f"mk::gpu::stream_attention_mma<2, 128, true, {stages}>(sa, score);" in src


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("warp", "stages"), [("", 3), ("8", 3), ("16", 3)])
def test_tensor_core_warp_keys_are_a_build_option(
    warp: str, stages: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_ATTN_WARP_KEYS=16 stages chunks of 128 keys (a task of 512 keys: 4, of which 3
    in flight) with room for them in front of the arena; 8 (the default) chunks of 64."""
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "1")
    monkeypatch.setenv("MK_CUDA_ATTN_WARP_KEYS", warp)
    text = attention(8, 16, 8, 1024, 128)
    src = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=2).cuda_source  # type: ignore[attr-defined]
    assert f"mk::gpu::stream_attention_mma<2, 128, true, {stages}>(sa, score);" in src
    assert ("#define MK_ATTN_WARP_KEYS 16" in src) == (warp == "16")
    chunk_keys = 128 if warp == "16" else 64
    front = int(src.split("kArenaOffset = ")[1].split(";")[0])
    assert front >= stages * 2 * chunk_keys * (128 + 8) * 2


@pytest.mark.usefixtures("no_nvcc")
def test_tensor_core_warp_keys_name_their_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "1")
    monkeypatch.setenv("MK_CUDA_ATTN_WARP_KEYS", "32")
    with pytest.raises(mk.MkError, match="MK_CUDA_ATTN_WARP_KEYS must be one of 8, 16, got '32'"):
        mk.compile(attention(8, 16, 8, 1024, 128), target="cuda", cache_dir=tmp_path)


@pytest.mark.usefixtures("no_nvcc")
def test_tensor_core_switch_names_its_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "yes")
    with pytest.raises(mk.MkError, match="MK_CUDA_ATTN_MMA must be one of auto, 1, 0, got 'yes'"):
        mk.compile(attention(2, 4, 4, 64, 32), target="cuda", cache_dir=tmp_path)


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("most", ["0", "5", "two"])
def test_tensor_core_stages_name_their_range(
    most: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "1")
    monkeypatch.setenv("MK_CUDA_ATTN_MMA_STAGES", most)
    message = f"MK_CUDA_ATTN_MMA_STAGES must be a number of stages from 1 to 4, got '{most}'"
    with pytest.raises(mk.MkError, match=message):
        mk.compile(attention(8, 16, 8, 1024, 128), target="cuda", cache_dir=tmp_path)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize(
    ("stages", "rows_first", "warp"),
    [(3, "2", ""), (4, "2", ""), (3, "0", ""), (3, "1", ""), (2, "2", "16"), (3, "0", "16")],
)
def test_tensor_core_decode_attention_builds_without_spills(
    stages: int, rows_first: str, warp: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the rows' loads first (the default, 2 stages of copies before the rows' ops; 1), their
    registers live across the first chunks' copies; and with every copy first (0); with 8 or 16
    keys a warp."""
    monkeypatch.setenv("MK_CUDA_ATTN_WARP_KEYS", warp)
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "1")
    monkeypatch.setenv("MK_CUDA_ATTN_MMA_STAGES", str(stages))
    monkeypatch.setenv("MK_CUDA_ATTN_ROWS_FIRST", rows_first)
    text = attention(8, 16, 8, 1024, 128)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=2)
    call = f"mk::gpu::stream_attention_mma<2, 128, true, {stages}>("
    assert call in prog.cuda_source  # type: ignore[attr-defined]
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dims", "extra"), SHAPES, ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else ""
)
@pytest.mark.parametrize(
    ("keys", "mma", "early", "stages", "warp"),
    [
        ("", "0", "1", "", ""),
        ("8", "0", "1", "", ""),
        ("", "1", "1", "", ""),
        ("", "1", "1", "2", ""),
        ("", "1", "1", "4", ""),
        ("", "1", "1", "", "16"),
        ("", "1", "1", "1", "16"),
        ("", "0", "0", "", ""),
    ],
    ids=[
        "rounds",
        "8-keys",
        "tensor-cores",
        "tensor-cores-2-stages",
        "tensor-cores-4-stages",
        "tensor-cores-16-keys-a-warp",
        "tensor-cores-16-keys-a-warp-1-stage",
        "kv-late",
    ],
)
def test_streamed_attention_matches_the_reference(
    dims: tuple[int, ...],
    extra: dict[str, object],
    keys: str,
    mma: str,
    early: str,
    stages: str,
    warp: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The key loops: a round's loads then its keys, with 4 or 8 keys a round,
    (MK_CUDA_ATTN_MMA=1) staged chunks on tensor cores where the head dim allows (up to 3, or
    MK_CUDA_ATTN_MMA_STAGES=1, 2 or 4, in flight; 8 or, MK_CUDA_ATTN_WARP_KEYS=16, 16 keys of
    each a warp), and
    the first round's loads issued behind the prepared rows' loads (MK_CUDA_ATTN_KV_EARLY=0: after);
    kv_splits=3 gives tasks of several rounds or chunks."""
    monkeypatch.setenv("MK_CUDA_ATTN_KEYS", keys)
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", mma)
    monkeypatch.setenv("MK_CUDA_ATTN_KV_EARLY", early)
    monkeypatch.setenv("MK_CUDA_ATTN_MMA_STAGES", stages)
    monkeypatch.setenv("MK_CUDA_ATTN_WARP_KEYS", warp)
    text = attention(*dims, **extra)  # type: ignore[arg-type]
    assert any(_plans(text).values())
    for splits in (0, 3):
        prog = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=splits)
        for seed in (0, 1):
            inputs = random_inputs(prog.func, seed=seed)
            (out,) = prog(*inputs)
            (ref,) = mk.reference(text, *inputs)
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound, (dims, splits, seed, error)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dims", "mma"),
    [((1, 32, 8, 1024, 128), ""), ((1, 16, 8, 1024, 128), ""), ((3, 2, 2, 96, 16), "1"),
     ((1, 8, 1, 520, 256), "1")],
    ids=["4x128", "2x128", "1x16", "8x256"],
)  # fmt: skip
def test_merge_weights_merge_as_the_slots_did(
    dims: tuple[int, ...], mma: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default merge (the slots' weights computed once) gives outputs bit-identical to
    MK_CUDA_ATTN_MERGE_WEIGHTS=0's (the same weights and sums in the same order) and agrees with
    the reference: 4 and 2 rows of 128 over 16 slots, one row of 16 over 128 slots, 8 rows of
    256 over 8 slots."""
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", mma)
    monkeypatch.setenv("MK_CUDA_ATTN_MERGE_WEIGHTS", "0")
    text = attention(*dims)
    plain = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert re.search(r"mk::gpu::stream_attention(_ahead)?<", plain.cuda_source)  # type: ignore[attr-defined]
    inputs = random_inputs(plain.func, seed=5)
    (want,) = plain(*inputs)
    monkeypatch.delenv("MK_CUDA_ATTN_MERGE_WEIGHTS")
    weights = mk.compile(text, target="cuda", cache_dir=tmp_path)
    (got,) = weights(*inputs)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    matches_the_reference(weights, text, dims)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [0, 3])
@pytest.mark.parametrize("kv_len", [True, False])
def test_keys_that_are_the_values_on_the_gpu(tmp_path: Path, kv_len: bool, splits: int) -> None:
    """One argument as both K and V (the kernel reads it once, as both)."""
    text = attention(2, 8, 2, 300, 64, kv_len=kv_len, shared_kv=True)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=splits)
    matches_the_reference(prog, text, (kv_len, splits))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dims", "extra"),
    BLOCK_SHAPES,
    ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else "",
)
@pytest.mark.parametrize("skip", ["0", "1"], ids=["all-keys", "causal-skip"])
def test_block_attention_matches_the_reference(
    dims: tuple[int, ...],
    extra: dict[str, object],
    skip: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many query rows on tensor cores: causal or not, ragged last chunks of keys, f16, rows
    that are not a multiple of 16, fully masked rows (kv_len at random); with
    MK_CUDA_CAUSAL_SKIP=1 (the default) a causal block walks only the keys its rows can see."""
    monkeypatch.setenv("MK_CUDA_CAUSAL_SKIP", skip)
    text = attention(*dims, **extra)  # type: ignore[arg-type]
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert "block_attention<" in prog.cuda_source  # type: ignore[attr-defined]
    matches_the_reference(prog, text, dims)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_block_attention_builds_without_spills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qwen3's heads (128 rows of 128 elements a task): Q, o and the scores in registers; the
    causal cut of the keys builds too."""
    monkeypatch.setenv("MK_CUDA_CAUSAL_SKIP", "1")
    prog = mk.compile(
        attention(1, 16, 8, 520, 128, causal=True, sq=500), target="cuda", cache_dir=tmp_path
    )
    assert "mk::gpu::block_attention<" in prog.cuda_source  # type: ignore[attr-defined]
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and used.spill_stores == 0, used
