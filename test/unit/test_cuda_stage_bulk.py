"""MK_CUDA_STAGE_BULK: a tensor-core linear's normed 16-bit activation staged by bulk copies
(mk::gpu::stage_chunk_bulk), checked in the source and PTX here and against the reference on
the GPU."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from linear_programs import agrees_with_the_reference, cuda_source, linear_program

import mk
from mk.backends.cuda import build as cuda_build
from mk.inputs import random_inputs

NVCC = cuda_build.nvcc()  # before any test patches it out
BULK_CALL = r"stream_linear<\d+, \d+, \d+, \d+, true, \d+, \d+, \d+, true(?:, \d+)?>"
BULK_COPY = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"


def _ptx(source: str, tmp_path: Path) -> str:
    from mk.backends.cpu.build import include_dir
    from mk.backends.cuda.build import NVCC_FLAGS

    tmp_path.mkdir(parents=True, exist_ok=True)
    cu, ptx = tmp_path / "mk.cu", tmp_path / "mk.ptx"
    cu.write_text(source)
    flags = [f for f in NVCC_FLAGS if f not in ("-shared", "-Xcompiler", "-fPIC")]
    subprocess.run(
        [str(NVCC), *flags, f"-I{include_dir()}", "-ptx", str(cu), "-o", str(ptx)], check=True
    )
    return ptx.read_text()


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("value", ["0", "1"])
def test_the_switch_defines_the_bulk_staging(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_STAGE_BULK", value)
    source = cuda_source(linear_program(8, 256, 1024, norm=True), tmp_path)
    assert re.search(r"stream_linear<8, \d+, \d+, \d+, true", source)
    assert bool(re.search(BULK_CALL, source)) == (value == "1")


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("rows", "norm"), [(1, True), (8, False)])
def test_only_a_normed_tensor_core_stream_stages_in_bulk(
    rows: int, norm: bool, tmp_path: Path
) -> None:
    """One row streams on CUDA cores; a raw activation is copied as it is (mma_raw_chunks)."""
    source = cuda_source(linear_program(rows, 256, 1024, norm=norm), tmp_path)
    assert "stream_linear<" in source and not re.search(BULK_CALL, source)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.usefixtures("no_nvcc")
def test_a_normed_batch_copies_its_rows_in_bulk_only_with_the_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A normed activation has no bulk copies by default (the raw path's are for un-normed
    ones); with the switch its eight rows are eight bulk copies on one barrier."""
    text = linear_program(8, 256, 1024, norm=True)
    monkeypatch.setenv("MK_CUDA_STAGE_BULK", "0")
    assert BULK_COPY not in _ptx(cuda_source(text, tmp_path / "off"), tmp_path / "off")
    monkeypatch.setenv("MK_CUDA_STAGE_BULK", "1")
    ptx = _ptx(cuda_source(text, tmp_path / "on"), tmp_path / "on")
    assert ptx.count(BULK_COPY) >= 8
    assert "fence.proxy.async.global" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows", "k", "bars"),
    [
        (8, 4096, "task"),
        (2, 1024, "task"),
        (16, 1024, "task"),
        (16, 6144, "task"),
        (16, 8192, "task"),
        (16, 8192, "launch"),
    ],
)
def test_bulk_staging_matches_the_reference(
    rows: int, k: int, bars: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the GPU: 2..16 rows, one chunk or several (16 rows of 6,144 columns: chunks of 3,328
    and 2,816; of 8,192: 3,584, 3,584 and 1,024 beside the weights' cp.async ring), and the
    launch-long barriers whose phases the raw chunks share."""
    monkeypatch.setenv("MK_CUDA_STAGE_BULK", "1")
    monkeypatch.setenv("MK_CUDA_RAW_BARS", bars)
    text = linear_program(rows, 4608, k, norm=True)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert re.search(BULK_CALL, prog.cuda_source)  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, (rows, k, bars))


@pytest.mark.gpu
def test_bulk_staging_gives_the_register_staging_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows land packed exactly as the register path packs them, and each thread adds the
    same groups' squares in the same order, so the outputs are bit-identical. On 8 SMs a task
    has 72 blocks of rows, so each warp takes whole rows (one column slice) and every output is
    one warp's sum: where slices split a row its warps add their parts with atomics, in any
    order."""
    text = linear_program(8, 4608, 4096, norm=True)
    outs = []
    for value in ("0", "1"):
        monkeypatch.setenv("MK_CUDA_STAGE_BULK", value)
        prog = mk.compile(text, target="cuda", num_sms=8, cache_dir=tmp_path / value)
        outs.append(prog(*random_inputs(prog.func, seed=3)))
    for a, b in zip(*outs, strict=True):
        assert np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


@pytest.mark.usefixtures("no_nvcc")
def test_the_early_steps_are_a_checked_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = linear_program(8, 256, 1024, norm=True)
    assert re.search(r"stream_linear<8, [^>]*, true, 8>", cuda_source(text, tmp_path / "default"))
    monkeypatch.setenv("MK_CUDA_MMA_EARLY", "4")
    assert re.search(r"stream_linear<8, [^>]*, true, 4>", cuda_source(text, tmp_path / "four"))
    monkeypatch.setenv("MK_CUDA_MMA_EARLY", "0")
    assert re.search(r"stream_linear<8, [^>]*, true>", cuda_source(text, tmp_path / "none"))
    monkeypatch.setenv("MK_CUDA_MMA_EARLY", "")
    monkeypatch.setenv("MK_CUDA_MMA_RING", "3")  # a lone body's ring walks from its copies
    ringed = cuda_source(text, tmp_path / "ring")
    assert re.search(r"stream_linear<8, \d+, \d+, \d+, true, 3, 0, 0, true, 8>", ringed)
    monkeypatch.setenv("MK_CUDA_MMA_EARLY", "17")
    with pytest.raises(
        mk.MkError, match="MK_CUDA_MMA_EARLY must be a number of steps from 0 to 16"
    ):
        cuda_source(text, tmp_path / "bad")


@pytest.mark.usefixtures("no_nvcc")
def test_a_models_layers_load_no_weights_early(tmp_path: Path) -> None:
    """The bodies a model's layers share take no early steps (whole models at batch 8 ran
    0.2-0.3 % longer with them), a lone body such as the lm_head does."""
    import dataclasses

    from mk.models.build import decode_program
    from mk.models.config import preset

    config = dataclasses.replace(preset("tiny"), layers=2)
    prog = mk.compile(decode_program(config, 8, 64, 1), target="cuda", cache_dir=tmp_path)
    calls, body = {}, ""
    for line in prog.cuda_source.splitlines():  # type: ignore[attr-defined]
        if name := re.match(r"__device__ __noinline__ int32_t task_\d+_k\d+_(\w+)\(", line):
            body = name.group(1)
        if call := re.search(BULK_CALL, line):
            calls[body] = call.group(0)
    assert calls["l0_q"].endswith(", true>") and calls["l0_m"].endswith(", true>"), calls
    assert calls["logits"].endswith(", true, 8>"), calls


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows", "k", "ring", "exact"),
    [
        (8, 4096, "0", True),
        (2, 1024, "0", True),
        (16, 6144, "0", False),
        (8, 4096, "3", False),
        (16, 8192, "3", False),
    ],
)
def test_early_weights_give_the_same_bits(
    rows: int, k: int, ring: str, exact: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first steps loaded behind the activation's copies feed the same mma in the same order:
    0, 8 and 16 early steps give the same outputs where one warp's sum reaches each output (on
    8 SMs, one chunk: see above; two chunks, or a ring's slices on 132 SMs, add theirs with
    atomics in any order), and they match the reference. With a ring, early steps walk every
    chunk through it (mma_bulk_ring: 16 rows of 8,192 columns are chunks of 3,584, 3,584 and
    1,024 in one buffer)."""
    monkeypatch.setenv("MK_CUDA_MMA_RING", ring)
    text = linear_program(rows, 4608, k, norm=True)
    outs = []
    for steps in ("0", "8", "16"):
        monkeypatch.setenv("MK_CUDA_MMA_EARLY", steps)
        sms = 8 if exact else 132
        prog = mk.compile(text, target="cuda", num_sms=sms, cache_dir=tmp_path / steps)
        assert f", true, {ring}, 0, 0, true" in prog.cuda_source or ring == "0"  # type: ignore[attr-defined]
        outs.append(prog(*random_inputs(prog.func, seed=4)))
        agrees_with_the_reference(prog, text, (rows, k, ring, steps))
    for other in outs[1:] if exact else []:
        for a, b in zip(outs[0], other, strict=True):
            assert np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))
