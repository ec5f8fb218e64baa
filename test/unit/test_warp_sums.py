"""The transposed warp sums of the CUDA-core linears (mk/warp_sums.h), run on the CPU by a C++
program built with g++: 32 threads as a warp's lanes, exchanging as __shfl_xor_sync does."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_every_row_groups_sums_are_written_once_and_right(tmp_path: Path) -> None:
    """Row groups of 1..8 weight rows by 1..16 activation rows: each sum written by one lane,
    equal to the lanes' values summed in double, for counts that are powers of two, padded to
    one (12 -> 16, 6 -> 8) and past 32 (five exchanges a value); each of N transposed indices
    held by 32 / N lanes."""
    exe = tmp_path / "warp_sums"
    built = subprocess.run(
        ["g++", "-std=c++20", "-Wall", "-Wextra", "-Werror", "-pthread",
         f"-I{ROOT / 'runtime/include'}", str(ROOT / "runtime/tests/warp_sums.cpp"), "-o", str(exe)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout
