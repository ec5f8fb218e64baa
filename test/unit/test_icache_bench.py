"""bench/icache.py: straight-line code of a chosen size, built without a GPU; timed on one."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from bench_scripts import load

from mk.backends.cuda import build

NVCC = build.nvcc()


def _text_bytes(cubin: Path) -> int:
    sections = subprocess.run(
        ["readelf", "-SW", str(cubin)], check=True, capture_output=True, text=True
    ).stdout
    sizes = re.findall(r"\.text\.\S+\s+PROGBITS\s+\S+\s+\S+\s+([0-9a-f]+)", sections)
    return sum(int(s, 16) for s in sizes)


def test_a_function_has_one_step_per_sixty_four_bytes() -> None:
    icache = load("icache")
    text = icache.function_source("f", 8, salt=3)
    assert text.startswith("__device__ __noinline__ float f(")
    assert text.count("fmaf(") == 8 * 1024 // 16  # four FFMA of 16 bytes per step
    assert icache.function_source("f", 8, salt=3) == text  # deterministic


@pytest.mark.skipif(NVCC is None or shutil.which("readelf") is None, reason="needs nvcc, readelf")
@pytest.mark.parametrize("kb", [8, 32])
def test_the_kernel_code_is_about_the_asked_size(kb: int, tmp_path: Path) -> None:
    icache = load("icache")
    source, cubin = tmp_path / "ic.cu", tmp_path / "ic.cubin"
    source.write_text(icache.program_source(kb, funcs=4, passes=4))
    subprocess.run(
        [
            str(NVCC),
            "-O3",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-cubin",
            "-o",
            str(cubin),
            str(source),
        ],
        check=True,
    )
    size = _text_bytes(cubin)
    assert kb * 1024 <= size <= kb * 1024 * 1.25 + 4096, size


@pytest.mark.gpu
def test_one_size_is_timed(tmp_path: Path) -> None:
    icache = load("icache")
    kb, funcs, first, later, khz = icache.measure(8, 2, tmp_path, "90a").split()
    assert (int(kb), int(funcs)) == (8, 2)
    assert float(first) > 0 and float(later) > 0 and int(khz) > 0
