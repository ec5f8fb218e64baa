"""nn.argmax over few long lines: ties and NaNs placed across the warps' shares of a line and
across the blocks' halves, on the CPU executor and on the GPU (where a line's blocks split it
among the CTA's warps), against NumPy's first-occurrence argmax."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import mk

N = 1000  # two blocks of 500 a line; at 8 warps a line a warp's lanes stride by 256


def _program(rows: int) -> str:
    return f"""func.func @am(%x: tensor<{rows}x{N}xf32>) -> tensor<{rows}xi32> {{
  %i = nn.argmax %x {{dim = -1 : i64}} : (tensor<{rows}x{N}xf32>) -> tensor<{rows}xi32>
  func.return %i : tensor<{rows}xi32>
}}"""


def _lines(rows: int, seed: int) -> np.ndarray:
    """Random lines, the first few with a planted case: a three-way tie whose first index sits in
    a later warp's share than the second's, NaNs in two shares, a constant line."""
    x = np.random.default_rng(seed).standard_normal((rows, N)).astype(np.float32)
    cases = [
        lambda line: line.__setitem__([230, 270, 770], 9.0),  # shares 7, 0 and the second block
        lambda line: line.__setitem__([400, 260, 900], [np.nan, np.nan, 50.0]),
        lambda line: line.fill(-0.5),
    ]
    for line, case in zip(x, cases, strict=False):
        case(line)
    return x


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-argmax-cache")


def _check(target: str, rows: int, cache: Path) -> None:
    prog = mk.compile(_program(rows), target=target, cache_dir=cache)
    for seed in range(3):
        x = _lines(rows, seed)
        (got,) = prog(x.copy())
        np.testing.assert_array_equal(np.asarray(got), np.argmax(x, axis=-1).astype(np.int32))


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_the_cpu_executor_takes_the_first_maximum(rows: int, cache: Path) -> None:
    _check("cpu", rows, cache)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3, 8, 12])
def test_the_gpu_takes_the_first_maximum_across_warp_shares(rows: int, cache: Path) -> None:
    _check("cuda", rows, cache)
