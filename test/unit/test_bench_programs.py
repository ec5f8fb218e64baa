"""bench/attention_alone.cu and bench/slice_read.cu build without a GPU (they run on one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mk.backends.cuda import build

NVCC = build.nvcc()
ROOT = Path(__file__).resolve().parents[2]
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


def _builds_clean(name: str, out: Path, defines: list[str]) -> None:
    """bench/<name>.cu compiles for sm_90a without warnings into `out`."""
    assert NVCC is not None
    cmd = [NVCC, "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a"]
    cmd += ["--expt-relaxed-constexpr", f"-I{ROOT / 'runtime' / 'include'}"]
    cmd += [f"-D{d}" for d in defines]
    done = subprocess.run(
        [*cmd, str(ROOT / "bench" / f"{name}.cu"), "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warning" not in done.stderr, done.stderr[-2000:]
    assert out.is_file()


@needs_nvcc
@pytest.mark.parametrize("define", ["", "MK_ATTN_WARP_KEYS=16"])
def test_the_program_builds_with_its_phase_marks(define: str, tmp_path: Path) -> None:
    """It compiles for sm_90a, with the default body and with 16 keys a warp as the default; its
    own MK_ATTN_MARK stamps the body's phases in place of the megakernel's op marks."""
    _builds_clean("attention_alone", tmp_path / "attention_alone", [define] if define else [])


@needs_nvcc
def test_the_slice_read_program_builds(tmp_path: Path) -> None:
    """bench/slice_read.cu (the fused down projection's strided and contiguous weight reads
    through rows_dot_lanes) compiles for sm_90a without warnings."""
    _builds_clean("slice_read", tmp_path / "slice_read", [])
