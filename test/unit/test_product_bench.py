"""bench/product.py: the decode product timed alone, built without a GPU; run on one."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import load, stack_frames

from mk.backends.cpu.build import include_dir
from mk.backends.cuda import build

NVCC = build.nvcc()


def test_the_program_calls_the_real_product_per_mode() -> None:
    product = load("product")
    src = product.program_source(48, 1024, 6, 4)
    assert src == product.program_source(48, 1024, 6, 4)  # deterministic
    assert '#include "mk/cuda_stream.cuh"' in src
    assert (
        "mk::gpu::mark_clock()" in src
        and "clock64()" not in src
        and "cudaDevAttrClockRate" not in src
    )
    for mode in ("hbm", "l2"):
        assert f"run_{mode}(" in src
    assert src.count("mk::gpu::stream_rows<1, 6, 4, true>(") == 2
    assert product.shapes("6x4,3x2") == [(6, 4), (3, 2)]


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_the_program_builds_without_local_memory(tmp_path: Path) -> None:
    """The two kernels compile for sm_90a, keeping the loads in registers (no stack frame:
    a spilled stream would time local memory, not the product)."""
    product = load("product")
    frames = stack_frames(str(NVCC), product.program_source(48, 1024, 6, 4), tmp_path)
    assert len(frames) == 2 and all(f == "0" for f in frames), frames


@pytest.mark.gpu
def test_one_shape_is_timed(tmp_path: Path) -> None:
    product = load("product")
    out = product.measure(48, 1024, 6, 4, 0, tmp_path, include_dir())
    modes = [line.split() for line in out.split("\n") if line.strip()]
    assert [m[0] for m in modes] == list(product.MODES)
    assert all(len(m) == 2 and int(m[1]) > 0 for m in modes), out  # mode median_ns
