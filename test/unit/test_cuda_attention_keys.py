"""Which keys a decode or block attention reads on CUDA: cut at the kv length or the causal
bound, the first round asked for ahead of the scalars, and cache rows past the length (NaN in
a cache never written there) kept out of the output."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from attention_programs import attention, matches_the_reference

import mk
from mk import compiler
from mk.inputs import random_inputs


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("skip", ["0", "1", ""])
def test_decode_keys_stop_at_the_length_unless_turned_off(
    skip: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task of keys at or past kv_len loads none (a cache longer than the positions written);
    MK_CUDA_CAUSAL_SKIP=0 walks them all."""
    monkeypatch.setenv("MK_CUDA_CAUSAL_SKIP", skip)
    src = mk.compile(attention(2, 8, 2, 256, 64), target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    cut = "mk::gpu::imin(static_cast<int64_t>(sa.keys), len - sa.key0)"
    assert (cut in src) == (skip != "0")


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("skip", ["0", "1", ""])
def test_causal_keys_are_cut_unless_turned_off(
    skip: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_CAUSAL_SKIP: on by default (unset or empty), 0 walks every key."""
    monkeypatch.setenv("MK_CUDA_CAUSAL_SKIP", skip)
    text = attention(1, 4, 2, 320, 64, causal=True, sq=300)
    src = mk.compile(text, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert ("const int64_t first = len - 300 + ba.query0, last = first + 59;" in src) == (
        skip != "0"
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("value", ["", "0", "1"])
def test_keys_ahead_are_a_build_option(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_ATTN_KEYS_AHEAD (on by default): qwen3-0.6b's heads at batch 1 (2 rows of 128
    on CUDA cores) ask for the first round's K rows before the kv length's load, and the call
    takes them; 0 leaves them after. Built without spills either way."""
    monkeypatch.setenv("MK_CUDA_ATTN_KEYS_AHEAD", value)
    prog = mk.compile(attention(1, 16, 8, 1024, 128), target="cuda", cache_dir=tmp_path)
    src = prog.cuda_source  # type: ignore[attr-defined]
    on = value != "0"
    assert ("mk::gpu::load_keys_ahead<2, 128>(" in src) == on
    assert ("128, 64, keys_ahead);" in src) == on  # ld 128, the task's 64 keys (16 splits)
    assert ("mk::gpu::stream_attention_ahead<2, 128>(sa, score, keys_ahead);" in src) == on
    assert ("mk::gpu::stream_attention<2, 128>(sa, score);" in src) != on
    if on:  # the keys' loads go out before the scalar's
        assert src.index("load_keys_ahead<") < src.index("mk::gpu::load_runs<mk::DTYPE_I32")
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("dims", "extra"),
    [((1, 32, 8, 1024, 128), {}), ((1, 16, 8, 1024, 128), {"kv_len": False}),
     ((1, 16, 8, 1024, 128), {"dtype": "f32"})],
    ids=["4-rows", "no-scalars", "f32-cache"],
)  # fmt: skip
def test_keys_ahead_only_where_they_fit(
    dims: tuple[int, ...], extra: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not for 4 query rows unless asked for (`4`: the early round's register bound), nor
    without a scalar to load (nothing to overlap), nor from f32 caches; a value other than 0, 1
    or 4 is an error."""
    monkeypatch.setenv("MK_CUDA_ATTN_KEYS_AHEAD", "1")
    prog = mk.compile(attention(*dims, **extra), target="cuda", cache_dir=tmp_path)
    assert "keys_ahead" not in prog.cuda_source  # type: ignore[attr-defined]
    monkeypatch.setenv("MK_CUDA_ATTN_KEYS_AHEAD", "4")
    four = mk.compile(attention(*dims, **extra), target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert ("mk::gpu::load_keys_ahead<4, 128>(" in four) == (dims[1] == 32 and not extra)
    monkeypatch.setenv("MK_CUDA_ATTN_KEYS_AHEAD", "yes")
    with pytest.raises(mk.MkError, match="MK_CUDA_ATTN_KEYS_AHEAD must be one of 1, 0, 4"):
        mk.compile(attention(1, 16, 8, 1024, 128), target="cuda", cache_dir=tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [0, 3])
@pytest.mark.parametrize(("heads", "value"), [(16, "1"), (32, "4")])
def test_keys_ahead_give_the_same_outputs_on_the_gpu(
    heads: int, value: str, splits: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_ATTN_KEYS_AHEAD=1 (2 rows a task) and =4 (4 rows) give outputs bit-identical to
    =0's where the caches' rows at and past each sequence's kv length are NaN (tasks past the
    length read a round of them and must drop it), and agree with the reference on random
    caches. CUDA cores pinned: three splits' longer chunks would go to the tensor cores."""
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", "0")
    monkeypatch.setenv("MK_CUDA_ATTN_KEYS_AHEAD", "0")
    text = attention(2, heads, 8, 512, 128)
    plain = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=splits)
    q, k, v, lens = random_inputs(plain.func, seed=3)
    lens = np.array([200, 457], dtype=np.int32)
    k, v = np.array(k), np.array(v)
    for b, n in enumerate(lens):
        k[b, :, n:] = np.nan
        v[b, :, n:] = np.nan
    (want,) = plain(q, k, v, lens)
    assert not np.isnan(np.asarray(want, dtype=np.float32)).any()
    monkeypatch.setenv("MK_CUDA_ATTN_KEYS_AHEAD", value)
    ahead = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=splits)
    assert f"stream_attention_ahead<{heads // 8}, 128>" in ahead.cuda_source  # type: ignore[attr-defined]
    (got,) = ahead(q, k, v, lens)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    matches_the_reference(ahead, text, splits)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dims", "options", "splits", "mma"),
    [
        ((2, 16, 8, 512, 128), {}, 0, "0"),
        ((2, 16, 8, 512, 128), {}, 0, "1"),
        ((2, 8, 2, 300, 64), {}, 3, "auto"),
        ((2, 4, 2, 40, 16), {"dtype": "f32", "causal": True, "sq": 3}, 0, "auto"),
        ((2, 4, 2, 256, 64), {"sq": 64}, 0, "auto"),  # block attention, cut at the length
        ((2, 4, 2, 256, 64), {"sq": 64, "causal": True}, 0, "auto"),  # cut at the last query
    ],
)
def test_nan_cache_rows_past_kv_len_stay_out_of_the_output(
    dims: tuple[int, int, int, int, int],
    options: dict[str, Any],
    splits: int,
    mma: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cache never written past kv_len (torch.empty) may hold NaN there: every attention body
    (CUDA cores, tensor cores, the generic tile loops, a prefill's block attention) agrees with
    the reference, which skips those rows, instead of returning 0·NaN."""
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", mma)
    text = attention(*dims, **options)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=splits)
    q, k, v, lens = random_inputs(prog.func, seed=7)
    lens = np.array([dims[3] * 2 // 5, dims[3] - 3], dtype=np.int32)
    k, v = np.array(k), np.array(v)
    for b, n in enumerate(lens):
        k[b, :, n:] = np.nan
        v[b, :, n:] = np.nan
    (out,) = prog(q, k, v, lens)
    (ref,) = mk.reference(text, q, k, v, lens)
    assert not np.isnan(np.asarray(ref, dtype=np.float32)).any()
    error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
    assert error <= bound, error


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("causal", "skip"), [(False, ""), (True, ""), (False, "0")])
def test_a_block_attention_cuts_its_keys_at_the_kv_length(
    causal: bool, skip: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-causal block attention (64 queries a head) walks no key at or past the kv length,
    as a decode task does; a causal one is cut at its last query instead (which lies before
    the length); MK_CUDA_CAUSAL_SKIP=0 walks every key."""
    monkeypatch.setenv("MK_CUDA_CAUSAL_SKIP", skip)
    text = attention(2, 4, 2, 256, 64, sq=64, causal=causal)
    src = mk.compile(text, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert "mk::gpu::block_attention<" in src
    cut = "ba.keys = static_cast<int32_t>(mk::gpu::imax(int64_t{0}, mk::gpu::imin(static_cast<int64_t>(ba.keys), len - ba.key0)));"
    assert (cut in src) == (not causal and skip != "0")
    assert ("a causal mask:" in src) == causal
