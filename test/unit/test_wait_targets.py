"""The GPU's event targets across launches (mk/events.h), checked by a C++ program built with g++."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_wait_targets_order_counters_across_the_wrap(tmp_path: Path) -> None:
    """Launches continue each other's counters, so targets pass 2^31 and 2^32: the first
    launch's loop-carried waits hold at once, a counter reaches its target exactly when the
    awaited iteration's signals are in, and neither a producer ahead nor one behind is misread."""
    exe = tmp_path / "wait_targets"
    built = subprocess.run(
        ["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'runtime/include'}",
         str(ROOT / "runtime/tests/wait_targets.cpp"), "-o", str(exe)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout
