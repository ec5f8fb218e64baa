"""Weights asked for ahead of a streamed linear's turn: weights staged in shared memory, and
the L2 requests beside the staging."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from linear_programs import cuda_source, linear_program

import mk


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("n", "k", "staged"), [(512, 1024, True), (256, 776, True), (4096, 4096, False)]
)
def test_weights_are_staged_in_shared_memory_when_they_fit(
    tmp_path: Path, n: int, k: int, staged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With MK_CUDA_STAGE=1 a task whose weights fit STAGE_MAX copies them into its place in the
    staging ring ahead of its turn, and its products read them from there; the ring lies behind
    the activation chunk and holds two such tasks."""
    from mk.backends.cuda.dispatch import ring_layout
    from mk.backends.cuda.stream import STAGE_MAX, staged_ld

    monkeypatch.setenv("MK_CUDA_STAGE", "1")
    prog = mk.compile(
        linear_program(1, n, k, norm=True), target="cuda", num_sms=8, cache_dir=tmp_path
    )
    src = prog.cuda_source  # type: ignore[attr-defined]
    body = re.search(r"if \(ahead == mk::gpu::kAheadStage\) \{ (.*) return 1; \}", src)
    assert (body is not None) == staged
    assert ("stream_linear<1, " in src) and (", true>(sl)) return 2147483646;" in src) == staged
    ring = re.search(r"kRingOffset = (\d+);.*\n.*kRingBytes = (\d+);", src)
    assert ring is not None
    ring_at, ring_bytes = map(int, ring.groups())
    if body is None:
        assert (
            ring_bytes == 0 and "stage_bytes(int32_t kind) {\n    switch (body(kind)) {\n\n" in src
        )
        return
    (expect,) = re.findall(r"stage_expect\(arena, (\d+)\)", body.group(1))
    copies = re.findall(
        r"stage_rows\(arena, (\d+), .*?, (\d+), (\d+), (\d+), (\d+)\);", body.group(1)
    )
    rows = n // 8
    assert int(expect) == 2 * k * rows == sum(2 * int(r) * int(c) for _, r, _, c, _ in copies)
    assert int(expect) <= STAGE_MAX
    assert f"return {expect};" in src  # Dispatch::stage_bytes of the kind
    for offset, r, ld, cols, dst_ld in copies:
        # One row (CUDA cores): the rows stay unpadded, a contiguous slab (one bulk copy).
        assert int(ld) == int(cols) == int(dst_ld) == k == staged_ld(k, mma=False)
        assert int(offset) + 2 * int(r) * k <= int(expect)
    assert ring_at >= 4 * k and ring_at % 128 == 0  # behind the activation chunk
    assert (ring_at, ring_bytes) == ring_layout(ring_at, int(expect))
    assert f"arena.stage_base + {copies[0][0]})" in src  # the products read them there
    assert "return task_" in src and "mk::gpu::kAheadStage) != 0;" in src
    monkeypatch.delenv("MK_CUDA_STAGE")  # off by default (see the README)
    off = mk.compile(
        linear_program(1, n, k, norm=True), target="cuda", num_sms=8, cache_dir=tmp_path
    )
    assert "kAheadStage) {" not in off.cuda_source  # type: ignore[attr-defined]


@pytest.mark.usefixtures("no_nvcc")
def test_stage_is_0_or_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MK_CUDA_STAGE takes 0 or 1 (`head`, heads staged at the task's wait, measured slower and
    was removed)."""
    monkeypatch.setenv("MK_CUDA_STAGE", "head")
    with pytest.raises(mk.MkError, match="MK_CUDA_STAGE must be 0 or 1, got 'head'"):
        cuda_source(linear_program(1, 512, 4096, norm=True), tmp_path, num_sms=8)


@pytest.mark.parametrize("k", [64, 256, 776, 1024, 2048, 3072, 4096, 14336])
def test_staged_rows_of_a_tensor_core_step_use_distinct_banks(k: int) -> None:
    """Lane (g, t) of a tensor-core step reads row g at 16-byte unit t: the eight rows must start
    in distinct 16-byte units modulo the eight of a 128-byte bank line."""
    from mk.backends.cuda.stream import STAGE_MAX, stage_offsets, staged_ld

    units = 2 * staged_ld(k, mma=True) // 16
    assert 2 * staged_ld(k, mma=True) % 16 == 0
    assert len({g * units % 8 for g in range(8)}) == 8
    offsets = stage_offsets([16, 8], k, [k, k], mma=True)
    assert (offsets is None) == (2 * 24 * staged_ld(k, mma=True) > STAGE_MAX)
    if offsets is not None:
        assert offsets == [0, 2 * 16 * staged_ld(k, mma=True)]
    # rows not 16-byte aligned in global memory
    assert stage_offsets([8], k, [k + 4], mma=True) is None


def test_the_staging_ring_holds_two_tasks_where_it_can() -> None:
    """The ring takes two of the largest staged task where the arena keeps ARENA_KEEP, one when
    only that fits, and refuses a task the shared memory cannot hold."""
    from mk.backends.cuda.dispatch import ARENA_KEEP, DYNAMIC_SMEM, ring_layout

    assert ring_layout(4000, 0) == (4096, 0)
    at, ring = ring_layout(4000, 64 << 10) or (0, 0)
    assert at == 4096 and ring == 128 << 10 and at + ring + ARENA_KEEP <= DYNAMIC_SMEM
    at, ring = ring_layout(16 << 10, 96 << 10) or (0, 0)
    assert 96 << 10 <= ring < 192 << 10 and at + ring + ARENA_KEEP == DYNAMIC_SMEM
    at, ring = ring_layout(100 << 10, 100 << 10) or (0, 0)
    assert ring >= 100 << 10 and at + ring <= DYNAMIC_SMEM
    assert ring_layout(133 << 10, 128 << 10) is None


@pytest.mark.usefixtures("no_nvcc")
def test_staging_splits_a_long_row_into_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With MK_CUDA_STAGE=1 the activation chunk leaves the ring its room: a single row of
    8,704 columns is staged in two chunks (what the GPU test of lean linears needs)."""
    monkeypatch.setenv("MK_CUDA_STAGE", "1")
    src = cuda_source(linear_program(1, 64, 8704, norm=True), tmp_path)
    assert "sl.k = 8704;" in src and "sl.kc = 8192;" in src


@pytest.mark.usefixtures("no_nvcc")
def test_weight_l2_priority_is_a_build_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_WEIGHT_L2=evict_first defines MK_STREAM_EVICT_FIRST in the source (the weight
    loads take the L2's evict-first policy); by default the source does not."""
    text = linear_program(1, 512, 1024, norm=True)
    assert "MK_STREAM_EVICT_FIRST" not in cuda_source(text, tmp_path)
    monkeypatch.setenv("MK_CUDA_WEIGHT_L2", "evict_first")
    assert "#define MK_STREAM_EVICT_FIRST 1\n" in cuda_source(text, tmp_path)
    monkeypatch.setenv("MK_CUDA_WEIGHT_L2", "last")
    with pytest.raises(mk.MkError, match="MK_CUDA_WEIGHT_L2 must be one of normal, evict_first"):
        cuda_source(text, tmp_path)


@pytest.mark.usefixtures("no_nvcc")
def test_stage_first_loads_the_first_round_behind_the_activation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_STAGE_FIRST=1 has a CUDA-core linear that stages its activation load its first
    round of weights itself (stream_linear's First = 2): batch 1 with or without the norm, one
    weight or two; not batch 2 or 8 (tensor cores); 0 turns it off."""
    first = re.compile(r"mk::gpu::stream_linear<1, \d+, \d+, \d+, false, false, 1, 0, 2>\(sl\);")
    monkeypatch.setenv("MK_CUDA_STAGE_FIRST", "0")
    assert not first.search(cuda_source(linear_program(1, 256, 1024, True), tmp_path))
    monkeypatch.setenv("MK_CUDA_STAGE_FIRST", "1")
    for shape, expected in (
        ((1, 256, 1024, True), True),
        ((1, 256, 1024, False, 2), True),
        ((2, 256, 1024, True), False),
        ((8, 256, 1024, True), False),
    ):
        src = cuda_source(linear_program(*shape), tmp_path)
        assert "mk::gpu::stream_linear<" in src, shape
        assert bool(first.search(src)) == expected, shape
        if not expected:
            assert ", 2>(sl)" not in src, shape


@pytest.mark.usefixtures("no_nvcc")
def test_stage_first_by_default_where_a_thread_holds_few_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unset, MK_CUDA_STAGE_FIRST has a body take one step early where a thread holds at most
    STAGE_FIRST_HELD 16-byte loads through the staging (the step's rows and its own activation
    loads): 4 rows a round and one activation load do, 8 rows and two do not (unless set)."""
    first = re.compile(
        r"mk::gpu::stream_linear<1, (\d+), \d+, (\d+), false, false, 1, 0, 2>\(sl\);"
    )
    few, many = linear_program(1, 256, 1024, True), linear_program(1, 512, 4096, True)
    assert first.findall(cuda_source(few, tmp_path)) == [("4", "1")]
    assert not first.search(cuda_source(many, tmp_path))
    assert "mk::gpu::stream_linear<1, 8, " in cuda_source(many, tmp_path)
    monkeypatch.setenv("MK_CUDA_STAGE_FIRST", "1")
    assert first.findall(cuda_source(many, tmp_path)) == [("8", "2")]


@pytest.mark.usefixtures("no_nvcc")
def test_stage_first_held_takes_every_body_with_part_of_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_STAGE_FIRST_HELD=H: the bodies past the default's rule load their first step
    early too, H - XB rows of it (stream_linear's Held = H), where by default a body of 8 rows
    and two activation loads takes none; a body within the rule still takes its whole step;
    not with MK_CUDA_STAGE_FIRST set; past 16 is an error."""
    part = re.compile(r"mk::gpu::stream_linear<1, 8, \d+, 2, false, false, 1, 0, 2, 4>\(sl\);")
    whole = re.compile(r"mk::gpu::stream_linear<1, 4, \d+, 1, false, false, 1, 0, 2>\(sl\);")
    few, many = linear_program(1, 256, 1024, True), linear_program(1, 512, 4096, True)
    assert "false, 1, 0, 2" not in cuda_source(many, tmp_path)
    monkeypatch.setenv("MK_CUDA_STAGE_FIRST_HELD", "4")
    assert part.search(cuda_source(many, tmp_path))
    assert whole.search(cuda_source(few, tmp_path))
    monkeypatch.setenv("MK_CUDA_STAGE_FIRST", "1")
    src = cuda_source(many, tmp_path)
    assert not part.search(src) and "false, 1, 0, 2>(sl);" in src
    monkeypatch.delenv("MK_CUDA_STAGE_FIRST")
    for bad in ("17", "four"):
        monkeypatch.setenv("MK_CUDA_STAGE_FIRST_HELD", bad)
        with pytest.raises(mk.MkError, match="MK_CUDA_STAGE_FIRST_HELD"):
            cuda_source(many, tmp_path)


@pytest.mark.usefixtures("no_nvcc")
def test_stage_first_takes_a_number_of_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_STAGE_FIRST=N: the header loads one step of the round unless MK_STAGE_FIRST_STEPS
    says more; 0 is off; anything but 0-4 is an error naming the switch."""
    text = linear_program(1, 256, 1024, True)
    for value, define in (("1", None), ("2", 2), ("4", 4), ("0", None)):
        monkeypatch.setenv("MK_CUDA_STAGE_FIRST", value)
        src = cuda_source(text, tmp_path)
        defines = [line for line in src.splitlines() if line.startswith("#define MK_STAGE_FIRST")]
        assert defines == ([] if define is None else [f"#define MK_STAGE_FIRST_STEPS {define}"])
        assert (", 0, 2>(sl);" in src) == (value != "0")
    for bad in ("5", "yes"):
        monkeypatch.setenv("MK_CUDA_STAGE_FIRST", bad)
        with pytest.raises(mk.MkError, match="MK_CUDA_STAGE_FIRST must be a number of steps"):
            cuda_source(text, tmp_path)
