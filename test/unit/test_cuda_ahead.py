"""A streamed linear's weights asked for early: its first round behind the activation's loads,
and the weights' L2 policy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from linear_programs import cuda_source, linear_program

import mk


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
    first = re.compile(r"mk::gpu::stream_linear<1, \d+, \d+, \d+, false, 0, 2>\(sl\);")
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
    first = re.compile(r"mk::gpu::stream_linear<1, (\d+), \d+, (\d+), false, 0, 2>\(sl\);")
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
    part = re.compile(r"mk::gpu::stream_linear<1, 8, \d+, 2, false, 0, 2, 4>\(sl\);")
    whole = re.compile(r"mk::gpu::stream_linear<1, 4, \d+, 1, false, 0, 2>\(sl\);")
    few, many = linear_program(1, 256, 1024, True), linear_program(1, 512, 4096, True)
    assert "false, 0, 2" not in cuda_source(many, tmp_path)
    monkeypatch.setenv("MK_CUDA_STAGE_FIRST_HELD", "4")
    assert part.search(cuda_source(many, tmp_path))
    assert whole.search(cuda_source(few, tmp_path))
    monkeypatch.setenv("MK_CUDA_STAGE_FIRST", "1")
    src = cuda_source(many, tmp_path)
    assert not part.search(src) and "false, 0, 2>(sl);" in src
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
