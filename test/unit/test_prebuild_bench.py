"""bench/prebuild.py: the programs its specs stand for, and their builds into the cache."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from bench_scripts import load

import mk
from mk.backends.cuda import nvcc
from mk.models import decode_program, preset


@pytest.fixture
def prebuild(monkeypatch: pytest.MonkeyPatch) -> Any:
    """bench/prebuild.py; bench.py and timeline.py import torch at the top, which these specs
    and builds never use."""
    for name in ("torch", "torch.nn", "torch.nn.functional"):
        monkeypatch.setitem(sys.modules, name, mock.MagicMock())
    return load("prebuild")


def test_gen_spec_is_mk_generates_program(prebuild: Any) -> None:
    [(name, text)] = prebuild.texts_of("gen:tiny:2:3")
    assert name == "tiny B2 steps 3"
    assert text == decode_program(preset("tiny"), 2, 1024, 3)
    [(_, eight)] = prebuild.texts_of("gen:tiny:1")
    assert eight == decode_program(preset("tiny"), 1, 1024, 8)


@pytest.mark.parametrize("spec", ["gen:tiny", "step:tiny:1", "nope:x", "gen:tiny:1:2:3"])
def test_malformed_specs_say_what_is_expected(prebuild: Any, spec: str) -> None:
    with pytest.raises(ValueError, match="bench:F, step:P:L:B or gen:P:B"):
        prebuild.texts_of(spec)


@pytest.mark.skipif(nvcc() is None, reason="needs nvcc")
def test_build_fills_the_cache_that_compile_then_hits(
    prebuild: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MK_PASS_OPTIONS", raising=False)
    [(name, text)] = prebuild.texts_of("gen:tiny:1:1")
    assert prebuild.build(name, text).startswith("tiny B1 steps 1: built")
    assert mk.compile(text, target="cuda").cache_hit  # type: ignore[attr-defined]
