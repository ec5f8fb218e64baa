"""Decode-shaped linears on tensor cores (batches of 2..16 rows): the plan, the register and
cp.async-ring loads, and the products on the GPU."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from pathlib import Path

import pytest
from linear_programs import agrees_with_the_reference, cuda_source, graph_defs, linear_program

import mk
from mk.backends.cuda import build as cuda_build
from mk.backends.cuda.dispatch import DYNAMIC_SMEM
from mk.backends.cuda.stream import MMA_LOADS, SMEM_BYTES, WIDE_ROOM, plan_stream, ring_bytes
from mk.diagnostics import MkError

NVCC = cuda_build.nvcc()  # before any test patches it out


# A tensor-core weight fragment's load, past the L1 (the default) or through it; a lane shuffle.
NO_ALLOCATE = "ld.global.nc.L1::no_allocate.L2::256B.v4.u32"
THROUGH_L1 = "ld.global.nc.L2::256B.v4.u32"
SHUFFLE = r"shfl\.sync\.idx\.b32"
# stream_linear's trailing Bulk (a normed activation staged by bulk copies), the defaults between.
BULK_TAIL = r"(?:(?:, 0)*, true(?:, \d+)?)?"


def _mma_chains(ptx: str) -> tuple[int, int]:
    """(mma instructions, those whose accumulator input is the previous mma's output)."""
    mma = re.findall(
        r"mma\.sync\.aligned\.m16n8k16\S* \{(%f\d+),[^;]*\{(%f\d+), %f\d+, %f\d+, %f\d+\};", ptx
    )
    return len(mma), sum(c == d for (d, _), (_, c) in itertools.pairwise(mma))


def _ptx_of(text: str, tmp_path: Path) -> str:
    """The PTX nvcc makes of an emitted megakernel (no GPU needed)."""
    import subprocess

    from mk.backends.cpu.build import include_dir
    from mk.backends.cuda.build import NVCC_FLAGS

    source, ptx = tmp_path / "mk.cu", tmp_path / "mk.ptx"
    source.write_text(text)
    flags = [f for f in NVCC_FLAGS if f not in ("-shared", "-Xcompiler", "-fPIC")]
    subprocess.run(
        [str(NVCC), *flags, f"-I{include_dir()}", "-ptx", str(source), "-o", str(ptx)],
        check=True,
    )
    return ptx.read_text()


def _switch_ptx(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str, value: str, define: str
) -> str:
    """The PTX of `text` built with `switch`=`value`, whose #define shows exactly when it is 1."""
    monkeypatch.setenv(switch, value)
    source = cuda_source(text, tmp_path / value)
    assert (f"#define {define} 1" in source) == (value == "1")
    return _ptx_of(source, tmp_path / value)


@pytest.mark.parametrize(
    ("rows", "k", "cores"), [(1, 1024, False), (2, 1024, True), (16, 512, True), (5, 776, False)]
)
def test_tensor_cores_for_batches_of_two_to_sixteen(rows: int, k: int, cores: bool) -> None:
    kernels = graph_defs(linear_program(rows, 64, k, norm=True), tile_n=0)
    plans = [p for p in map(plan_stream, kernels.values()) if p is not None]
    assert len(plans) == 1 and plans[0].tensor_cores(k) is cores
    assert plans[0].mma_steps() == MMA_LOADS  # U steps in flight


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("n", [64, 4608])
def test_one_row_stays_on_cuda_cores(tmp_path: Path, n: int) -> None:
    """A single activation row streams on CUDA cores, a batch of two on tensor cores (one row on
    tensor cores, MK_CUDA_MMA_ONE_ROW=1, ran whole models 13 % slower and was retired)."""
    for rows, mma in ((1, False), (2, True)):
        src = cuda_source(linear_program(rows, n, 1024, norm=True), tmp_path / str(rows), 132)
        calls = re.findall(rf"stream_linear<{rows}, \d+, \d+, \d+, (true|false)[,>]", src)
        assert calls and all(c == str(mma).lower() for c in calls), calls


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("pipe", ["0", "1"])
def test_tensor_core_products_build_with_and_without_the_pipeline(
    tmp_path: Path, pipe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch-8 linear on tensor cores compiles to PTX with U steps of loads in flight, both as
    one batch and with MK_CUDA_MMA_PIPE=1's two alternating halves; four accumulators per group
    keep the mma from being one dependent chain."""
    monkeypatch.setenv("MK_CUDA_MMA_PIPE", pipe)
    monkeypatch.setenv("MK_CUDA_MMA_RING", "0")  # the fragments loaded straight into registers
    text = cuda_source(linear_program(8, 256, 1024, norm=True), tmp_path)
    assert ("#define MK_MMA_PIPE 1" in text) == (pipe == "1")
    assert re.search(rf"stream_linear<8, \d+, {MMA_LOADS}, \d+, true{BULK_TAIL}>", text)
    ptx = _ptx_of(text, tmp_path)
    count, chained = _mma_chains(ptx)
    assert count >= 2 * MMA_LOADS  # every step of a batch unrolled
    assert chained <= count // 10, (chained, count)  # no mma waits for the one before
    # The load kinds that MK_CUDA_MMA_L1 changes (below), and no shuffles.
    assert ptx.count(NO_ALLOCATE) >= MMA_LOADS and ptx.count(THROUGH_L1) == 0
    assert not re.search(SHUFFLE, ptx)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_tensor_core_weights_through_the_l1_are_opt_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_MMA_L1=1 loads a tensor-core warp's weight fragments through the L1 (no
    L1::no_allocate), so the two halves of a 128-byte line may share one line request. (The
    build without it is the pipeline test's, which checks its loads.)"""
    monkeypatch.setenv("MK_CUDA_MMA_RING", "0")
    text = linear_program(8, 256, 1024, norm=True)
    ptx = _switch_ptx(text, tmp_path, monkeypatch, "MK_CUDA_MMA_L1", "1", "MK_MMA_L1")
    # The program's only weight stream is the tensor-core one: all of its loads change kind.
    assert ptx.count(NO_ALLOCATE) == 0 and ptx.count(THROUGH_L1) >= MMA_LOADS


@pytest.mark.parametrize(
    ("rows", "n", "k", "norm", "env", "stages", "chunk"),
    [
        (8, 64, 4096, True, "3", 3, 4096),  # the packed chunk (64 KB) and the ring (96 KB)
        (16, 64, 14336, True, "3", 3, 2048),
        (8, 64, 4096, True, "4", 4, 2048),
        # auto (the default): a ring of 3 from 64 KB a warp in rows of 4,096 or more
        (8, 32, 4096, True, "", 0, 4096),
        (8, 64, 4096, True, "", 3, 4096),
        (8, 128, 4096, True, "auto", 3, 4096),
        (8, 512, 1024, True, "", 0, 1024),  # 128 KB a warp, but rows of 1,024 columns
        (8, 64, 4096, True, "0", 0, 4096),
        (1, 64, 1024, True, "3", 0, 1024),  # CUDA cores: no ring
        # a raw activation may take two packed buffers (mma_raw_chunks): half the chunk each
        (8, 128, 14336, False, "3", 3, 2048),
        (8, 128, 4096, False, "3", 3, 4096),  # unless one holds all of K beside the ring
        (8, 128, 4096, False, "4", 4, 1024),
        (8, 128, 14336, False, "", 3, 2048),
        (8, 128, 14336, False, "2", 2, 3072),
    ],
)
def test_tensor_cores_stream_through_the_ring(
    rows: int,
    n: int,
    k: int,
    norm: bool,
    env: str,
    stages: int,
    chunk: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MK_CUDA_MMA_RING", env)
    kernels = graph_defs(linear_program(rows, n, k, norm=norm), tile_n=n)
    (plan,) = [p for p in map(plan_stream, kernels.values()) if p is not None]
    assert plan.ring_stages(k) == stages and plan.chunk(k) == chunk
    ring = ring_bytes(stages) if stages else 0
    buffers = 1 if norm or chunk == k else 2
    assert plan.smem_bytes(k) == (buffers * 2 * rows * chunk + ring if stages else 4 * rows * chunk)
    assert plan.smem_bytes(k) <= SMEM_BYTES


def test_the_stream_room_is_a_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """MK_CUDA_STREAM_KB sizes the activation chunk and ring's room: with 192 KiB a raw batch-8
    activation of 4,096 columns fits whole beside a ring of four stages (64 + 128 KiB)."""
    monkeypatch.setenv("MK_CUDA_MMA_RING", "4")
    monkeypatch.setenv("MK_CUDA_STREAM_KB", "192")
    kernels = graph_defs(linear_program(8, 128, 4096, norm=False), tile_n=128)
    (plan,) = [p for p in map(plan_stream, kernels.values()) if p is not None]
    assert plan.chunk(4096) == 4096 and plan.smem_bytes(4096) == (64 + 128) << 10
    monkeypatch.setenv("MK_CUDA_STREAM_KB", "300")
    with pytest.raises(MkError, match="MK_CUDA_STREAM_KB must be a number of KiB from 32 to 208"):
        [plan_stream(k) for k in kernels.values()]


def test_the_auto_ring_threshold_is_a_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """MK_CUDA_MMA_RING_KB moves auto's threshold; it is checked like the other counts."""
    kernels = graph_defs(linear_program(8, 128, 4096, norm=True), tile_n=128)
    (plan,) = [p for p in map(plan_stream, kernels.values()) if p is not None]
    monkeypatch.setenv("MK_CUDA_MMA_RING_KB", "129")  # the task's warps stream 128 KB each
    assert plan.ring_stages(4096) == 0
    monkeypatch.setenv("MK_CUDA_MMA_RING_KB", "128")
    assert plan.ring_stages(4096) == 3
    monkeypatch.setenv("MK_CUDA_MMA_RING_KB", "lots")
    with pytest.raises(MkError, match="MK_CUDA_MMA_RING_KB must be a number of KiB"):
        plan.ring_stages(4096)


def test_a_ring_too_deep_for_the_room_is_made_shallower(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four stages take 128 KiB: the 160 KiB room takes them beside a chunk, 128 KiB three, 96
    KiB two, and 64 KiB none (a ring of one stage is no ring)."""
    monkeypatch.setenv("MK_CUDA_MMA_RING", "4")
    kernels = graph_defs(linear_program(8, 128, 4096, norm=False), tile_n=128)
    (plan,) = [p for p in map(plan_stream, kernels.values()) if p is not None]
    for kib, stages in ((160, 4), (128, 3), (96, 2), (64, 0)):
        room = dataclasses.replace(plan, x_bytes=kib << 10)
        assert room.ring_stages(4096) == stages, kib
        assert room.smem_bytes(4096) <= room.x_bytes


def test_the_ring_depth_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_MMA_RING", "9")
    kernels = graph_defs(linear_program(8, 64, 1024, norm=True), tile_n=0)
    (plan,) = [p for p in map(plan_stream, kernels.values()) if p is not None]
    with pytest.raises(MkError, match="MK_CUDA_MMA_RING must be a number of stages from 0 to 4"):
        plan.ring_stages(1024)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_tensor_core_products_build_through_the_ring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With MK_CUDA_MMA_RING=3 a batch-8 linear on tensor cores copies its weights with cp.async
    (one warp-wide copy per 512-byte row segment) and still issues every mma of a stage on
    independent accumulators."""
    monkeypatch.setenv("MK_CUDA_MMA_RING", "3")
    text = cuda_source(linear_program(8, 256, 1024, norm=True), tmp_path)
    assert re.search(rf"stream_linear<8, \d+, \d+, \d+, true, 3{BULK_TAIL}>", text)
    code = _ptx_of(text, tmp_path)
    assert code.count("cp.async.cg.shared.global.L2::256B") >= 8  # a stage: eight rows
    assert "cp.async.wait_group" in code
    count, chained = _mma_chains(code)
    assert count >= 16  # a stage's eight steps, two mma each
    assert chained <= count // 10, (chained, count)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows", "ring", "norm", "k"),
    [
        (2, "3", True, 1024),
        (8, "3", True, 1024),
        (8, "4", True, 1024),
        (16, "2", True, 1024),
        (8, "2", False, 6144),
        (4, "3", False, 6144),
        (8, "4", False, 5440),
        (16, "3", False, 6144),
        (8, "3", False, 4096),  # one chunk, one buffer
        (4, "4", False, 2048),
    ],
)
def test_the_ring_matches_the_reference(
    rows: int, ring: str, norm: bool, k: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the GPU, MK_CUDA_MMA_RING: ragged last units (4608 columns over the warps) included,
    and a raw activation's bulk-copied chunks (no norm: mma_raw_chunks) beside the ring, which
    walks them all as one stream (two to six chunks, each buffer reused up to three times, the
    last one ragged at 5,440 = 5 · 1,024 + 320)."""
    monkeypatch.setenv("MK_CUDA_MMA_RING", ring)
    text = linear_program(rows, 4608, k, norm)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert re.search(
        rf"stream_linear<{rows}, \d+, \d+, \d+, true, {ring}{BULK_TAIL}>",
        prog.cuda_source,
    )  # type: ignore[attr-defined]
    one_buffer = not norm and 2 * rows * k + ring_bytes(int(ring)) <= SMEM_BYTES
    assert (f"sl.kc = {k};" in prog.cuda_source) == (norm or one_buffer)  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, (rows, ring, norm, k))


def _rounds(blocks: int, warps: int, steps: int, u: int, slices: int) -> int:
    """The busiest warp's rounds of loads: its units times a unit's rounds of u steps."""
    per_warp = math.ceil(blocks * slices / warps)
    return per_warp * math.ceil(math.ceil(steps / slices) / u)


def _busy(blocks: int, warps: int, slices: int) -> int:
    return min(blocks * slices, warps)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_mma_slices_keep_the_most_warps_busy_in_the_fewest_rounds(tmp_path: Path) -> None:
    """mk::gpu::mma_slices, run on the host: the most warps busy, then the fewest rounds of loads
    for the busiest warp, then the fewest slices."""
    import subprocess

    from mk.backends.cpu.build import include_dir

    cases = [(149, 32, 16), (4, 32, 16), (6, 32, 16), (1, 64, 16), (1, 96, 16), (28, 128, 16),
             (12, 128, 8), (3, 2, 16), (1, 1, 16), (125, 32, 8), (126, 32, 16), (3, 448, 16)]  # fmt: skip
    calls = "\n".join(
        f'  printf("%d\\n", mk::gpu::mma_slices({b}, 8, {s}, {u}));' for b, s, u in cases
    )
    source, exe = tmp_path / "slices.cu", tmp_path / "slices"
    source.write_text(
        f'#include <cstdio>\n#include "mk/cuda_stream.cuh"\nint main() {{\n{calls}\n  return 0;\n}}\n'
    )
    subprocess.run(
        [str(NVCC), "-std=c++17", "--expt-relaxed-constexpr", f"-I{include_dir()}",
         "-o", str(exe), str(source)],
        check=True,
    )  # fmt: skip
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert len(out) == len(cases)
    for (blocks, steps, u), got in zip(cases, out, strict=True):
        options = range(1, min(8, steps) + 1)
        busiest = max(_busy(blocks, 8, s) for s in options)
        full = [s for s in options if _busy(blocks, 8, s) == busiest]
        fewest = min(_rounds(blocks, 8, steps, u, s) for s in full)
        assert int(got) == min(s for s in full if _rounds(blocks, 8, steps, u, s) == fewest)
    # The batch-8 lm_head task of qwen3-0.6b: 149 blocks of 32 steps, one slice of 38 rounds
    # (eight slices, which give every warp the same share, take 149).
    assert out[0] == "1"
    assert _rounds(149, 8, 32, 16, 8) == 149 and _rounds(149, 8, 32, 16, 1) == 38
    # A one-block o-projection: eight slices keep every warp busy.
    assert out[3] == "8"


@pytest.mark.gpu
@pytest.mark.parametrize("ring", ["0", "3"])
def test_slices_of_an_lm_head_task_match_the_reference(
    ring: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the GPU, an lm_head-like task of 149 blocks (one slice) and one of 72 (whole-K units
    where the ring allows)."""
    monkeypatch.setenv("MK_CUDA_MMA_RING", ring)
    text = linear_program(8, 9536 if ring == "0" else 4608, 1024, True)
    prog = mk.compile(text, target="cuda", num_sms=8, cache_dir=tmp_path)
    agrees_with_the_reference(prog, text, ("fill", ring))


def _wide_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wide: str, k: int = 14336) -> str:
    """A batch-8 raw linear streaming through the ring (a down projection's shape), with
    MK_CUDA_WIDE_ROOM=`wide`."""
    monkeypatch.setenv("MK_CUDA_MMA_RING", "3")
    monkeypatch.setenv("MK_CUDA_WIDE_ROOM", wide)
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", "0")  # K slices would take no chunks at all
    return cuda_source(linear_program(8, 256, k, False), tmp_path / f"{wide}_{k}", num_sms=8)


@pytest.mark.usefixtures("no_nvcc")
def test_a_stream_with_tiny_tiles_takes_the_wide_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where WIDE_ROOM walks the activation in fewer chunks (14,336 columns: 7 of 2,048 -> 4 of
    3,584), the body takes it, reaching into the arena's shared-memory part, and clears its tiles
    of it; the arena's part then takes what is left of the shared memory."""
    wide = _wide_source(tmp_path, monkeypatch, "1")
    assert f"arena.clear_front({WIDE_ROOM});" in wide and "sl.kc = 3584;" in wide
    assert re.findall(r"kSmemBytes = (\d+)", wide) == [str(DYNAMIC_SMEM)]
    usual = _wide_source(tmp_path, monkeypatch, "0")
    assert "clear_front" not in usual and "sl.kc = 2048;" in usual
    assert re.findall(r"kSmemBytes = (\d+)", usual) == [str(SMEM_BYTES + (48 << 10))]
    # One chunk either way (4,096 columns fit one buffer): the usual room.
    assert "clear_front" not in _wide_source(tmp_path, monkeypatch, "1", k=4096)


@pytest.mark.usefixtures("no_nvcc")
def test_a_norm_body_keeps_the_usual_room(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A normed activation of 1,024 columns is one chunk in the usual room: nothing to gain."""
    monkeypatch.setenv("MK_CUDA_MMA_RING", "3")
    text = linear_program(8, 256, 1024, True)
    assert "clear_front" not in cuda_source(text, tmp_path, num_sms=8)


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_the_wide_room_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_MMA_RING", "3")
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", "0")  # K slices would take no chunks at all
    prog = mk.compile(linear_program(8, 256, 14336, False), target="cuda", cache_dir=tmp_path)
    assert "arena.clear_front(" in prog.cuda_source  # type: ignore[attr-defined]
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and used.spilling == 0, used


@pytest.mark.gpu
@pytest.mark.parametrize(("k", "wide"), [(14336, "1"), (14336, "0"), (8992, "1")])
def test_the_wide_room_matches_the_reference(
    k: int, wide: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the GPU, a raw batch-8 activation walked in chunks of the wide room (the last ragged
    at 8,992 = 2 · 3,584 + 1,824) and of the usual one; the body's tiles behind its room."""
    monkeypatch.setenv("MK_CUDA_MMA_RING", "3")
    monkeypatch.setenv("MK_CUDA_WIDE_ROOM", wide)
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", "0")  # the chunks, not K slices
    text = linear_program(8, 256, k, False)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert ("arena.clear_front(" in prog.cuda_source) == (wide == "1")  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, (k, wide))


@pytest.mark.usefixtures("no_nvcc")
def test_raw_bars_per_task_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw chunks' two mbarriers live for a task (faster); `launch` (racecheck-clean) is the
    opt-in."""
    text = linear_program(8, 256, 1024, norm=True)
    assert "#define MK_RAW_BARS_LAUNCH" not in cuda_source(text, tmp_path)
    monkeypatch.setenv("MK_CUDA_RAW_BARS", "launch")
    assert "#define MK_RAW_BARS_LAUNCH 1" in cuda_source(text, tmp_path)
