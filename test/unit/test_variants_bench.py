"""bench/variants.py: its variants' switches and environments (the timing needs a GPU)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from bench_scripts import load


@pytest.fixture
def variants() -> Any:
    return load("variants")


def test_a_variant_is_its_switches(variants: Any) -> None:
    assert variants.parse_variant("") == {}
    assert variants.parse_variant("MK_CUDA_LAYER_LOADS=8,MK_CUDA_ATTN_KEYS=2") == {
        "MK_CUDA_LAYER_LOADS": "8",
        "MK_CUDA_ATTN_KEYS": "2",
    }
    assert variants.parse_variant("MK_PASS_OPTIONS=accumulate_columns=128+task_us=2") == {
        "MK_PASS_OPTIONS": "accumulate_columns=128+task_us=2"
    }


@pytest.mark.parametrize("text", ["LOADS=8", "MK_CUDA_LOADS", "MK_CUDA_LOADS=8,X=1"])
def test_a_malformed_variant_is_refused(variants: Any, text: str) -> None:
    with pytest.raises(ValueError, match="is not MK_CUDA_NAME=VALUE"):
        variants.parse_variant(text)


def test_each_variant_starts_from_no_switches(variants: Any) -> None:
    base = {"PATH": "/bin", "MK_CUDA_LOADS": "12", "MK_CACHE_DIR": "c", "MK_PASS_OPTIONS": "k=1"}
    env = variants.environment(base, {"MK_CUDA_LAYER_LOADS": "0"})
    assert env == {"PATH": "/bin", "MK_CACHE_DIR": "c", "MK_CUDA_LAYER_LOADS": "0"}


def test_the_command_refuses_a_malformed_variant(
    variants: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["variants.py", "--model", "tiny", "", "LOADS=8"])
    assert variants.main() == 2
    assert "'LOADS=8' is not MK_CUDA_NAME=VALUE" in capsys.readouterr().err
