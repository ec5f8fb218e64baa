"""The rows a decode attention prepares before its keys (q, the new K and V rows, their norm
weights and RoPE tables): how the emitted body loads them."""

from __future__ import annotations

from pathlib import Path

import pytest

import mk
from mk.models import decode_program, preset


def _tiny_decode() -> str:
    return decode_program(preset("tiny-qwen3"), 1, 256, 1)


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
def test_rows_l1_asks_for_the_prepared_rows_before_the_scalars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_ATTN_ROWS_L1=1: the decode attention body asks the L1 for each row it will
    prepare (q, the new K and V rows, two norm weights, the shared RoPE tables: 7) before it
    loads the kv length and the new key's position; off by default."""
    text = _tiny_decode()

    def attention_body() -> str:
        src = mk.compile(text, target="cuda", num_sms=8, cache_dir=tmp_path).cuda_source or ""  # type: ignore[attr-defined]
        return next(b for b in src.split("__device__ __noinline__") if "StreamAttention sa" in b)

    assert "prefetch_l1" not in attention_body()
    monkeypatch.setenv("MK_CUDA_ATTN_ROWS_L1", "1")
    body = attention_body()
    asks = [line for line in body.splitlines() if "mk::gpu::prefetch_l1(" in line]
    assert len(asks) == len(set(asks)) == 7
    assert body.index("prefetch_l1") < body.index("load_runs_together") < body.index("sa.q =")
    monkeypatch.setenv("MK_CUDA_ATTN_ROWS_L1", "yes")
    with pytest.raises(mk.MkError, match="MK_CUDA_ATTN_ROWS_L1 must be 0 or 1"):
        attention_body()
