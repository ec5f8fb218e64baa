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


def test_every_round_times_each_instance_once_in_a_seeded_order(variants: Any) -> None:
    order = variants.schedule(["", "A=1", "B=2"], 2, 3)
    pairs = sorted((v, i) for v in ["", "A=1", "B=2"] for i in range(2))
    assert len(order) == 3 and all(sorted(r) == pairs for r in order)
    assert order == variants.schedule(["", "A=1", "B=2"], 2, 3)  # the same on every call
    assert len({tuple(r) for r in order}) > 1  # rounds are shuffled differently
    plain = variants.schedule(["", "A=1"], 2, 2, shuffled=False)
    assert plain == [[("", 0), ("", 1), ("A=1", 0), ("A=1", 1)]] * 2


def test_a_variant_is_the_median_of_its_instances_with_their_spread(variants: Any) -> None:
    median, spread = variants.summary([[1.0, 1.2, 1.1], [1.3, 1.3, 1.4]])
    assert median == pytest.approx(1.25)
    assert spread == pytest.approx((1.3 - 1.1) / 1.25)
    assert variants.summary([[2.0, 2.0]]) == (2.0, 0.0)


def test_the_command_refuses_no_instances(
    variants: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["variants.py", "--model", "tiny", "--instances", "0", ""])
    assert variants.main() == 2
    assert "--instances and --rounds must be at least 1" in capsys.readouterr().err


def test_each_variant_is_compared_with_the_first(variants: Any) -> None:
    """The report gives each variant's change against the first variant's median and flags a
    build whose generated ids differ, in words a `grep -v tokens` keeps."""
    assert variants.verdict(1.0, 1.0, True) == "+0.00 % against the first"
    assert variants.verdict(0.98, 1.0, True) == "-2.00 % against the first"
    flagged = variants.verdict(0.5, 1.0, False)
    assert flagged.startswith("-50.00 % against the first") and "MISMATCH" in flagged
    assert "tokens" not in flagged


def test_kind_runs_average_each_kinds_tasks_over_the_iterations(variants: Any) -> None:
    """Per kind, the mean µs its tasks ran over every recorded iteration; a task that never
    started is left out; the table gives each variant's change against the first."""
    import numpy as np

    us = 1000.0
    kinds = ["q", "q", "att"]
    first = np.array([[1, 11], [1, 13], [0, 0]]) * us
    second = np.array([[2, 12], [2, 16], [5, 9]]) * us
    runs = variants.kind_runs(kinds, [first, second])
    assert runs == {"q": (10 + 12 + 10 + 14) / 4, "att": 4.0}
    table = variants.kind_table({"": runs, "X=1": {"q": 10.0, "att": 5.0}}, "")
    assert table[1].split()[:2] == ["q", "11.50"] and table[1].endswith("10.00 (-1.50)")
    assert table[2].split()[:2] == ["att", "4.00"] and table[2].endswith("5.00 (+1.00)")
