"""MK_CUDA_MMA_SLICE (and MK_CUDA_MMA_SLICE_NORM): a 16-bit activation's tensor-core product with
each warp on one slice of K, the activation (and a norm weight) beside the weights in its ring
(mk::gpu::mma_slices), checked in the source here and against the reference on the GPU."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from linear_programs import agrees_with_the_reference, cuda_source, linear_program

import mk
from mk.backends.cuda import build as cuda_build

NVCC = cuda_build.nvcc()  # before any test patches it out

SLICE_CALL = r"stream_linear<(\d+), \d+, \d+, \d+, true, (\d+), 0, 0, false, 0, (\d+)>"
NORM_CALL = r"stream_linear<(\d+), \d+, \d+, \d+, true, (\d+), 0, 0, false, 0, (\d+), true>"


def _slices(source: str, call: str = SLICE_CALL) -> list[tuple[int, int, int]]:
    """(activation rows, stages, blocks) of each K-slice call (NORM_CALL: normed ones)."""
    return [tuple(map(int, m)) for m in re.findall(call, source)]  # type: ignore[misc]


@pytest.mark.usefixtures("no_nvcc")
def test_auto_slices_only_where_the_rings_take_no_more_shared_memory(tmp_path: Path) -> None:
    """By default a raw batch of 8 whose tasks hold 32 weight rows (4,096 rows over 128 tasks)
    takes 4 blocks and 3 stages (120 KB) where its chunks and ring take more (14,336 columns),
    not where its one chunk takes less (2,048 columns: 32 KB); its activation is then one
    chunk."""
    down = cuda_source(linear_program(8, 4096, 14336, norm=False), tmp_path / "down", num_sms=132)
    assert _slices(down) == [(8, 3, 4)]
    assert "sl.kc = 14336;" in down
    short = cuda_source(linear_program(8, 4096, 2048, norm=False), tmp_path / "short", num_sms=132)
    assert "stream_linear<8," in short and not _slices(short)


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("value", "want"), [("4", [(8, 4, 4)]), ("2", [(8, 2, 4)]), ("0", []), ("1", [])]
)
def test_a_stage_count_slices_every_such_task(
    value: str, want: list[tuple[int, int, int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A count gives the rings wherever a task may take them, whatever they take; 0 and 1 (no
    ring) none."""
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", value)
    text = linear_program(8, 4096, 2048, norm=False)
    assert _slices(cuda_source(text, tmp_path, num_sms=132)) == want


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("rows", "n", "norm", "sms"),
    [(8, 4096, True, 132), (1, 4096, False, 132), (8, 4096, False, 8)],
)
def test_only_a_raw_tensor_core_task_of_few_rows_takes_slices(
    rows: int, n: int, norm: bool, sms: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A normed activation is staged (its norm is applied on the way in), one row streams on CUDA
    cores, and a task of more than 32 weight rows (4,096 over 8 SMs) keeps the chunks."""
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", "3")
    source = cuda_source(linear_program(rows, n, 2048, norm=norm), tmp_path, num_sms=sms)
    assert "stream_linear<" in source and not _slices(source)


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("rows", "n", "k", "want"),
    [
        (8, 4096, 4096, [(8, 3, 4)]),  # 32 rows a task: one row group
        (8, 6144, 4096, [(8, 3, 3)]),  # 48 rows: 6 blocks take 175 KB, so two groups of 3
        (8, 12288, 4096, [(8, 3, 3)]),  # 96 rows: four groups of 3 blocks
        (8, 4096, 1024, [(8, 2, 4)]),  # 2 stages a warp's slice: no deeper ring
        (16, 4096, 4096, [(16, 3, 4)]),  # 16 activation rows: 150 KB of rings
    ],
)
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_normed_slices_take_row_groups_and_rings_that_fit(
    rows: int,
    n: int,
    k: int,
    want: list[tuple[int, int, int]],
    dtype: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MK_CUDA_MMA_SLICE_NORM=1: a normed activation's task takes slices in the fewest row
    groups whose blocks (at most 6) and rings (at most the stream's 160 KB) fit, its rings no
    deeper than a warp's slice has stages; its chunk is all of K, and nothing is bulk-staged.
    Half-precision activations and weights alike."""
    monkeypatch.setenv("MK_CUDA_MMA_SLICE_NORM", "1")
    text = linear_program(rows, n, k, norm=True, dtype=dtype)
    source = cuda_source(text, tmp_path, num_sms=128)
    assert _slices(source, NORM_CALL) == want
    assert f"sl.kc = {k};" in source


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("n", "k", "sliced"),
    [
        (4096, 4096, True),  # one row group, 8 stages a slice
        (6144, 4096, True),  # two row groups, 16 stages a slice
        (12288, 4096, False),  # four row groups
        (4096, 1024, False),  # 2 stages a slice
    ],
)
def test_auto_slices_a_normed_activation_in_few_groups_of_long_slices(
    n: int, k: int, sliced: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a normed activation takes slices only in at most 2 row groups whose warps'
    slices have at least 8 stages; elsewhere (and everywhere with MK_CUDA_MMA_SLICE_NORM=0) it
    keeps its bulk staging."""
    text = linear_program(8, n, k, norm=True)
    source = cuda_source(text, tmp_path / "auto", num_sms=128)
    assert bool(_slices(source, NORM_CALL)) == sliced
    staged = r"stream_linear<8, \d+, \d+, \d+, true, \d+, 0, 0, true"
    assert bool(re.search(staged, source)) != sliced
    monkeypatch.setenv("MK_CUDA_MMA_SLICE_NORM", "0")
    off = cuda_source(text, tmp_path / "off", num_sms=128)
    assert not _slices(off, NORM_CALL) and re.search(staged, off)


@pytest.mark.usefixtures("no_nvcc")
def test_a_bad_stage_count_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", "5")
    with pytest.raises(
        mk.MkError, match="MK_CUDA_MMA_SLICE must be a number of stages from 0 to 4"
    ):
        cuda_source(linear_program(8, 4096, 2048, norm=False), tmp_path, num_sms=132)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_the_warps_slices_tile_k_in_whole_stages(tmp_path: Path) -> None:
    """mk::gpu::slice_columns, run on the host: the eight warps' slices follow one another from
    0 to K, each starts on a 64-column stage, and their stage counts differ by at most one (K
    of 64 to 14,336 columns, a last half stage included). mk::gpu::slice_groups: the fewest
    row groups (1, 2, 4, 8) whose blocks cover the rows, 0 past 8."""
    from mk.backends.cpu.build import include_dir

    ks = [64, 96, 1056, 2048, 3072, 12288, 14336, 480]
    groups = [(48, 6, 1), (49, 6, 2), (96, 6, 2), (96, 3, 4), (192, 3, 8), (200, 3, 0), (8, 1, 1)]
    calls = "\n".join(
        f'  for (int w = 0; w < 8; ++w) {{ mk::gpu::slice_columns({k}, w, 8, a, b); printf("%d %d\\n", a, b); }}'
        for k in ks
    )
    source, exe = tmp_path / "slices.cu", tmp_path / "slices"
    calls += "\n" + "\n".join(
        f'  printf("%d\\n", mk::gpu::slice_groups({r}, {b}, 8));' for r, b, _ in groups
    )
    source.write_text(
        '#include <cstdio>\n#include "mk/cuda_mma_slice.cuh"\n'
        f"int main() {{\n  int a, b;\n{calls}\n  return 0;\n}}\n"
    )
    subprocess.run(
        [str(NVCC), "-std=c++17", f"-I{include_dir()}", "-o", str(exe), str(source)], check=True
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert [int(v) for v in out[len(out) - len(groups) :]] == [g for _, _, g in groups]
    out = out[: len(out) - len(groups)]
    pairs = [(int(a), int(b)) for a, b in zip(out[::2], out[1::2], strict=True)]
    assert len(pairs) == 8 * len(ks)
    for i, k in enumerate(ks):
        runs = pairs[8 * i : 8 * i + 8]
        assert runs[0][0] == 0 and runs[-1][1] == k, (k, runs)
        assert all(a[1] == b[0] for a, b in zip(runs[:-1], runs[1:], strict=True)), (k, runs)
        assert all(a % 64 == 0 and a <= b for a, b in runs), (k, runs)
        stages = [-(-(b - a) // 64) for a, b in runs]
        assert max(stages) - min(stages) <= 1, (k, runs)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows", "n", "k", "heads", "stages"),
    [
        (8, 4096, 14336, 1, 3),  # the gated MLP's down projection at batch 8
        (8, 4096, 14336, 1, 2),
        (16, 4096, 4096, 1, 4),  # both halves of the A operand
        (2, 1024, 1056, 1, 3),  # K not a whole number of 64-column stages; 8-row tasks
        (5, 1024, 2048, 3, 3),  # rows past M in the last quad; three weights in one task
    ],
)
def test_slices_match_the_reference(
    rows: int,
    n: int,
    k: int,
    heads: int,
    stages: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", str(stages))
    text = linear_program(rows, n, k, norm=False, heads=heads)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert _slices(prog.cuda_source), prog.cuda_source  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, (rows, n, k, heads, stages))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows", "n", "k", "stages", "dtype"),
    [
        (8, 4096, 4096, 3, "bf16"),  # one row group of 4 blocks
        (8, 6144, 4096, 3, "bf16"),  # RMSNorm+Linear at batch 8: two row groups
        (8, 12288, 4096, 2, "bf16"),  # four row groups
        (8, 4096, 1024, 3, "bf16"),  # a model's q/k/v at batch 8: 2 stages a slice
        (16, 4096, 4096, 3, "bf16"),  # both halves of the A operand, normed
        (3, 1024, 1056, 4, "bf16"),  # K not a whole number of 64-column stages; few rows
        (8, 4096, 4096, 3, "f16"),  # half precision: the fragment's product and mma in f16
    ],
)
def test_normed_slices_match_the_reference(
    rows: int,
    n: int,
    k: int,
    stages: int,
    dtype: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", str(stages))
    monkeypatch.setenv("MK_CUDA_MMA_SLICE_NORM", "1")
    text = linear_program(rows, n, k, norm=True, dtype=dtype)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert _slices(prog.cuda_source, NORM_CALL), prog.cuda_source  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, (rows, n, k, stages, dtype))
