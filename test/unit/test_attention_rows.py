"""What a decode attention body reads before its key loop: the rows it prepares (q, the new K and
V rows, their norm weights and RoPE tables) and how it loads them, and its K and V rows asked
into the L2 ahead of its turn."""

from __future__ import annotations

from pathlib import Path

import pytest

import mk
from mk.models import decode_program, preset


def _tiny_decode() -> str:
    return decode_program(preset("tiny-qwen3"), 1, 256, 1)


def _attention_body(text: str, cache: Path) -> str:
    """The device function of the program's decode attention body, compiled under the
    environment's switches."""
    src = mk.compile(text, target="cuda", num_sms=8, cache_dir=cache).cuda_source or ""  # type: ignore[attr-defined]
    return next(b for b in src.split("__device__ __noinline__") if "StreamAttention sa" in b)


@pytest.mark.usefixtures("no_nvcc")
def test_the_rows_a_decode_attention_prepares_are_read_by_vector_loads(tmp_path: Path) -> None:
    """tiny-qwen3's decode attention prepares q's rows and the new K and V rows through the
    QK-norm and RoPE: every one of those rows, norm weights and tables starts a multiple of 8
    elements into its buffer, so StreamAttention::rows_aligned is set (vector loads)."""
    text = _tiny_decode()
    src = mk.compile(text, target="cuda", num_sms=8, cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    calls = src.count("mk::gpu::StreamAttention sa{};")
    assert calls > 0 and src.count("sa.q_ops.cos = ") == calls
    assert src.count("sa.rows_aligned = true;") == calls


@pytest.mark.usefixtures("no_nvcc")
def test_rows_first_is_a_build_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MK_CUDA_ATTN_ROWS_FIRST=N defines MK_ATTN_ROWS_FIRST N (mk/cuda_attention_mma.cuh: the
    rows' loads before the chunks' copies, N stages of them before the rows' ops); the header's
    default 2, or unset, leaves it out; the tensor-core call itself is the same."""
    text = decode_program(preset("qwen3-0.6b").with_(layers=1), 8, 1024, 1)
    call = "mk::gpu::stream_attention_mma<2, 128, true, 3>(sa, score);"
    for value, define in (("", None), ("2", None), ("0", 0), ("1", 1), ("4", 4)):
        monkeypatch.setenv("MK_CUDA_ATTN_ROWS_FIRST", value)
        src = mk.compile(text, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
        defines = [
            line for line in src.splitlines() if line.startswith("#define MK_ATTN_ROWS_FIRST")
        ]
        assert defines == ([] if define is None else [f"#define MK_ATTN_ROWS_FIRST {define}"])
        assert src.count(call) == 1
    for bad in ("5", "yes"):
        monkeypatch.setenv("MK_CUDA_ATTN_ROWS_FIRST", bad)
        with pytest.raises(mk.MkError, match="MK_CUDA_ATTN_ROWS_FIRST must be a number of stages"):
            mk.compile(text, target="cuda", cache_dir=tmp_path)
