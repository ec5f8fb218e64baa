"""bench/mma_product.py: the tensor-core product timed alone, built without a GPU; run on one."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import load, run_main, stack_frames

from mk.backends.cuda import build

NVCC = build.nvcc()


def test_the_program_times_the_registers_beside_each_ring() -> None:
    bench = load("mma_product")
    src = bench.program_source(8, 32, 1024, [2, 3])
    assert src == bench.program_source(8, 32, 1024, [2, 3])  # deterministic
    assert '#include "mk/cuda_stream.cuh"' in src
    # Wall time from the global timer: cycles at the loaded SM clock would read as faster.
    assert (
        "mk::gpu::mark_clock()" in src
        and "clock64()" not in src
        and "cudaDevAttrClockRate" not in src
    )
    for name, ring in (("regs", 0), ("ring2", 2), ("ring3", 3)):
        assert f"run_{name}(" in src
        assert f"mk::gpu::mma_chunk<8, {bench.LOADS}, {ring}>" in src
    # The packed rows (16 KB), then three stages of eight warps' eight 512-byte rows.
    assert bench.smem_bytes(8, 1024, [2, 3]) == (16 << 10) + 3 * 8 * 8 * 512


def test_a_ring_past_the_shared_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load("mma_product")
    monkeypatch.setattr("sys.argv", ["mma_product.py", "--k", "8192", "--rings", "4"])
    with pytest.raises(SystemExit, match="more than 227 KB"):
        bench.main()


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_the_program_builds_without_local_memory(tmp_path: Path) -> None:
    bench = load("mma_product")
    frames = stack_frames(str(NVCC), bench.program_source(8, 32, 1024, [3]), tmp_path)
    assert len(frames) == 2 and all(f == "0" for f in frames), frames


@pytest.mark.gpu
def test_the_ring_sums_what_the_registers_sum(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = run_main(
        "mma_product", ["--rows", "32", "--k", "1024", "--rings", "3"], monkeypatch, capsys
    )
    rows = [line for line in out if line.startswith("| r")]
    assert [r.split("|")[1].strip() for r in rows] == ["regs", "ring3"]
    for row in rows:
        us, diff = row.split("|")[2].strip(), row.split("|")[4].split("/")[0].strip()
        assert float(us) > 0 and float(diff) == 0.0  # the same products in the same order
