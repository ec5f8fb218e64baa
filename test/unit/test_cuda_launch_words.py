"""MK_CUDA_LAUNCH_STEPS: steps of launch constants computed where they are read (launch_words.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import mk
from mk.inputs import random_inputs

ROOT = Path(__file__).resolve().parents[2]
DECODE = ROOT / "examples" / "decode_loop.mlir"
HAS_NVCC = shutil.which("nvcc") is not None

# The step's base is computed (an activation), or a donated argument the program writes: its
# words are not launch constants, so its readers load the step as before.
NOT_CONSTANT = {
    "computed": """
func.func @f(%l: tensor<1x4xbf16>, %x: tensor<4x8xbf16>) -> tensor<2x8xbf16> attributes {nn.steps = 3 : i64} {
  %b = nn.argmax %l {dim = -1 : i64} : (tensor<1x4xbf16>) -> tensor<1xi32>
  %p = nn.step %b : (tensor<1xi32>) -> tensor<1xi32>
  %r = nn.embedding %x, %p : (tensor<4x8xbf16>, tensor<1xi32>) -> tensor<1x8xbf16>
  %s = nn.concat %r, %r {dim = 0 : i64} : (tensor<1x8xbf16>, tensor<1x8xbf16>) -> tensor<2x8xbf16>
  func.return %s : tensor<2x8xbf16>
}""",
    "written": """
func.func @f(%pos: tensor<4xi32> {nn.donated}, %x: tensor<4x8xbf16>) -> tensor<1x8xbf16> attributes {nn.steps = 2 : i64} {
  %p = nn.step %pos : (tensor<4xi32>) -> tensor<4xi32>
  %q = nn.slice %p {offsets = array<i64: 0>, sizes = array<i64: 1>} : (tensor<4xi32>) -> tensor<1xi32>
  %w = nn.cache_write %pos, %q, %q {dim = 0 : i64} : (tensor<4xi32>, tensor<1xi32>, tensor<1xi32>) -> tensor<4xi32>
  %r = nn.embedding %x, %q : (tensor<4x8xbf16>, tensor<1xi32>) -> tensor<1x8xbf16>
  func.return %r : tensor<1x8xbf16>
}""",
}


def _source(path_or_text: Path | str, cache: Path) -> str:
    return mk.compile(path_or_text, target="cuda", cache_dir=cache).cuda_source  # type: ignore[attr-defined]


@pytest.mark.usefixtures("no_nvcc")
def test_the_decode_loops_steps_are_computed_where_they_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """%pos's word goes to shared memory at the launch's start; the attention's kv length
    (offset 1, broadcast to both rows) and new-key position (offset 0) and the cache writes'
    positions are computed from it and the iteration, not loaded; off by default."""
    off = _source(DECODE, tmp_path)
    assert "mk_launch_words" not in off and "kLaunchWords = 0;" in off
    monkeypatch.setenv("MK_CUDA_LAUNCH_STEPS", "1")
    on = _source(DECODE, tmp_path)
    assert "__shared__ int32_t mk_launch_words[1];" in on
    assert "kLaunchWords = 1;" in on
    assert re.search(r"if \(i >= 0 && i < 1\) mk_launch_words\[i\] = .*\(b\[\d+\]\)\[i - 0\];", on)
    steps = re.findall(
        r"\] = static_cast<int64_t>\(mk_launch_words\[0\]\) \+ iteration \+ (\d);", on
    )
    assert {"0", "1"} <= set(steps), steps
    # The loads they replace: i32 runs of one element, one fewer a reader.
    loads = len(re.findall(r"run_load<mk::DTYPE_I32, 1, 1>|load_runs<mk::DTYPE_I32, 1, 1>", off))
    left = len(re.findall(r"run_load<mk::DTYPE_I32, 1, 1>|load_runs<mk::DTYPE_I32, 1, 1>", on))
    assert left == loads - len(steps), (loads, left, steps)


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("name", sorted(NOT_CONSTANT))
def test_steps_of_what_is_not_a_launch_constant_are_loaded(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_LAUNCH_STEPS", "1")
    src = _source(NOT_CONSTANT[name], tmp_path)
    assert "mk_launch_words" not in src and "kLaunchWords = 0;" in src


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("scope", ["attention", "writes"])
def test_the_steps_can_be_computed_in_one_kind_of_body(
    scope: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attention`: only the attention computes its steps (the kv length at offset 1, the new
    key's position at 0); `writes`: only the other bodies (the cache writes at offset 0, the
    token history's at 1), the attention loading its own."""
    monkeypatch.setenv("MK_CUDA_LAUNCH_STEPS", scope)
    src = _source(DECODE, tmp_path)
    bodies = re.split(r"\n// task\.grid @", src)
    for body in bodies[1:]:
        attention = "stream_attention" in body
        computed = re.findall(r"mk_launch_words\[0\]\) \+ iteration \+ (\d);", body)
        assert not computed or attention == (scope == "attention"), body[:80]
    found = set(re.findall(r"mk_launch_words\[0\]\) \+ iteration \+ (\d);", src))
    assert found == {"0", "1"}, found


@pytest.mark.usefixtures("no_nvcc")
def test_a_value_outside_the_choices_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_LAUNCH_STEPS", "yes")
    with pytest.raises(mk.MkError, match="MK_CUDA_LAUNCH_STEPS must be one of 0, 1, attention"):
        _source(DECODE, tmp_path)


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_the_decode_loop_builds_without_spills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_LAUNCH_STEPS", "1")
    prog = mk.compile(DECODE, target="cuda", cache_dir=tmp_path)
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


@pytest.mark.gpu
def test_computed_steps_generate_the_loaded_ones_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the GPU, the same tokens and caches as the default build's and the reference's, over
    two calls from different positions (the words are copied at each launch's start)."""
    monkeypatch.setenv("MK_CUDA_LAUNCH_STEPS", "1")
    on = mk.compile(DECODE, target="cuda", cache_dir=tmp_path)
    monkeypatch.setenv("MK_CUDA_LAUNCH_STEPS", "0")
    off = mk.compile(DECODE, target="cuda", cache_dir=tmp_path)
    for seed in (7, 8):
        inputs = random_inputs(on.func, seed)
        copies = [[x.copy() for x in inputs] for _ in range(3)]
        want = mk.reference(DECODE, *copies[0])
        got_on, got_off = on(*copies[1]), off(*copies[2])
        np.testing.assert_array_equal(got_on[0], want[0])
        for a, b in zip(copies[1], copies[2], strict=True):  # donated state, bit for bit
            np.testing.assert_array_equal(a, b)
        for a, b in zip(got_on, got_off, strict=True):
            np.testing.assert_array_equal(a, b)
