"""Graph_defs that only copy a tile (backends/cuda/copy_runs.py): which ones, the emitted call,
and on the GPU the copies of head transposes against the reference."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import mk
from mk import compiler
from mk.backends.cuda.copy_runs import plan_copy
from mk.dialects import make_context
from mk.dialects.mugraph import GraphDefOp
from mk.inputs import random_inputs
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import load_module


def transposes(batch: int, d: int, dtype: str, between: str = "") -> str:
    """Heads out of rows and back ([B·S, H·D] <-> [B, H, S, D]), as a prefill moves q into
    attention and its result out; `between` an elementwise op on the heads."""
    b, s, h = batch, 150, 4
    rows = f"tensor<{b * s}x{h * d}x{dtype}>"
    four, heads = f"tensor<{b}x{s}x{h}x{d}x{dtype}>", f"tensor<{b}x{h}x{s}x{d}x{dtype}>"
    mid = f"%m = nn.{between} %t : ({heads}) -> {heads}" if between else ""
    return f"""
    func.func @f(%x: {rows}) -> {rows} {{
      %x4 = nn.reshape %x : ({rows}) -> {four}
      %t = nn.transpose %x4 {{perm = array<i64: 0, 2, 1, 3>}} : ({four}) -> {heads}
      {mid}
      %u = nn.transpose {"%m" if between else "%t"} {{perm = array<i64: 0, 2, 1, 3>}} : ({heads}) -> {four}
      %y = nn.reshape %u : ({four}) -> {rows}
      func.return %y : {rows}
    }}"""


def _copies(text: str) -> list[bool]:
    module = load_module(text)
    NnToMugraphPass().apply(make_context(), module)
    return [plan_copy(op) is not None for op in module.walk() if isinstance(op, GraphDefOp)]


def test_head_transposes_are_copies() -> None:
    assert _copies(transposes(1, 8, "bf16")) == [True, True]
    assert _copies(transposes(1, 8, "bf16", between="exp")) == [True, True]  # exp: a kernel
    silu = """
    func.func @f(%x: tensor<4x64xbf16>) -> tensor<4x64xbf16> {
      %s = nn.silu %x : (tensor<4x64xbf16>) -> tensor<4x64xbf16>
      %y = nn.mul %s, %x : (tensor<4x64xbf16>, tensor<4x64xbf16>) -> tensor<4x64xbf16>
      func.return %y : tensor<4x64xbf16>
    }"""
    assert _copies(silu) == [False]  # a thread_map between


@pytest.mark.usefixtures("no_nvcc")
def test_a_copy_is_one_call(tmp_path: Path) -> None:
    src = mk.compile(transposes(1, 8, "bf16"), target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::copy_runs<2>(") == 2 and "store_run_elem" not in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_copies_build(tmp_path: Path) -> None:
    prog = mk.compile(transposes(2, 8, "f32"), target="cuda", cache_dir=tmp_path)
    assert "mk::gpu::copy_runs<4>(" in prog.cuda_source  # type: ignore[attr-defined]
    assert prog.library_path is not None  # type: ignore[attr-defined]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("batch", "d", "dtype"),
    [(1, 8, "bf16"), (2, 8, "bf16"), (1, 6, "bf16"), (1, 8, "f32"), (2, 3, "f32")],
)
def test_copies_match_the_reference(batch: int, d: int, dtype: str, tmp_path: Path) -> None:
    """16-byte units where the runs keep them whole (D of 8 bf16 or f32), element by element
    where they do not (D of 6 bf16, 3 f32): exactly the reference's values."""
    text = transposes(batch, d, dtype)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert "mk::gpu::copy_runs<" in prog.cuda_source  # type: ignore[attr-defined]
    inputs = random_inputs(prog.func, seed=batch + d)
    (out,) = prog(*inputs)
    (ref,) = mk.reference(text, *inputs)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


@pytest.mark.usefixtures("no_nvcc")
def test_a_prefills_head_transposes_are_copies(tmp_path: Path) -> None:
    """q's and k's heads out of the linears' rows, the attention's back, and V's heads into the
    cache at the position (an in-place output): copy calls."""
    from mk.models import prefill_program, preset

    text = prefill_program(preset("tiny-qwen3"), 1, 150, 160)
    src = mk.compile(text, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert src.count("// a copy") >= 4
    assert "const int64_t at_pos" in src


# V's heads appended to a cache at a run-time position (a prefill's V rows).
V_APPEND = """
func.func @f(%cache: tensor<1x2x256x64xbf16> {nn.donated}, %v: tensor<200x128xbf16>, %p: tensor<1xi32>) -> tensor<1x2x256x64xbf16> {
  %v4 = nn.reshape %v : (tensor<200x128xbf16>) -> tensor<1x200x2x64xbf16>
  %vt = nn.transpose %v4 {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x200x2x64xbf16>) -> tensor<1x2x200x64xbf16>
  %w = nn.cache_write %cache, %vt, %p {dim = 2 : i64} : (tensor<1x2x256x64xbf16>, tensor<1x2x200x64xbf16>, tensor<1xi32>) -> tensor<1x2x256x64xbf16>
  %y = nn.exp %w : (tensor<1x2x256x64xbf16>) -> tensor<1x2x256x64xbf16>
  func.return %y : tensor<1x2x256x64xbf16>
}
"""


@pytest.mark.usefixtures("no_nvcc")
def test_an_appending_copy_checks_its_position(tmp_path: Path) -> None:
    src = mk.compile(V_APPEND, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert "const int64_t at_pos = mk::gpu::load_elem_i(" in src
    assert "if (at_pos + 50 * by < 0 || at_pos + 50 * by + 50 > 256) return 1;" in src
    (call,) = [line for line in src.splitlines() if "// a copy" in line]
    assert "(at_pos + 50 * by) * 64" in call


@pytest.mark.gpu
def test_an_appending_copy_matches_the_reference_and_fails_outside(tmp_path: Path) -> None:
    """Rows 17..216 of the cache from the copy, the rest as they were; at 100 the rows would pass
    the cache's 256: the task fails."""
    prog = mk.compile(V_APPEND, target="cuda", cache_dir=tmp_path)
    assert "// a copy" in prog.cuda_source  # type: ignore[attr-defined]
    inputs = random_inputs(prog.func, seed=4)
    inputs[2][...] = 17
    ref_inputs = [np.array(v, copy=True) for v in inputs]
    (out,) = prog(*inputs)
    (ref,) = mk.reference(V_APPEND, *ref_inputs)
    error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))  # exp of the cache
    assert error <= bound, error
    inputs[2][...] = 100
    with pytest.raises(RuntimeError):
        prog(*inputs)
