"""The superoptimizer benchmark's programs (bench/search_bench.py): they parse and verify at the
benchmark's shapes, and at a small scale the search lowers each to one kernel and agrees with the
reference on the CPU."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from bench_scripts import load

import mk
from mk import compiler
from mk.diagnostics import verify_located
from mk.inputs import random_inputs
from mk.source import load_module

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    return load("search_bench")


def test_benchmark_programs_verify() -> None:
    programs = _bench().workloads()
    assert len(programs) == 6
    for name, text in programs.items():
        verify_located(load_module(text))  # raises with a location on any error
        assert "func.func" in text, name


@pytest.mark.parametrize("kind", ["rms_unfused", "gated", "lora"])
def test_search_fuses_each_benchmark_program_at_small_scale(kind: str, tmp_path: Path) -> None:
    text = getattr(_bench(), kind)(2, 64, 128)
    rules = mk.compile(text, cache_dir=tmp_path)
    found = mk.compile(text, search=True, budget_s=20, cache_dir=tmp_path)
    count = _bench().kernels
    assert count(found) == 1 <= count(rules)  # the whole program in one kernel
    inputs = _bench().with_positive_eps(text, random_inputs(found.func, seed=1))
    for out, ref in zip(found(*inputs), mk.reference(text, *inputs), strict=True):
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound, (kind, error)


def test_too_few_runs_is_a_usage_error() -> None:
    """The method's 50 timed runs at least: an argparse error (exit 2), not a traceback."""
    import subprocess
    import sys

    from bench_scripts import ROOT

    run = subprocess.run(
        [sys.executable, str(ROOT / "bench/search_bench.py"), "--runs", "10"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and "at least 50 timed runs" in run.stderr
    assert "Traceback" not in run.stderr
