"""Graph_defs that only normalise (and rotate) rows (backends/cuda/norm_runs.py): which ones,
the emitted calls, their build, and on the GPU their rows against the reference."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import mk
from mk import compiler
from mk.backends.cuda.norm_runs import plan_norm
from mk.diagnostics import MkError
from mk.dialects import make_context
from mk.dialects.mugraph import GraphDefOp
from mk.inputs import random_inputs
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import load_module


def norms(rows: int, widths: tuple[int, ...], dtype: str) -> str:
    """A standalone RMSNorm of `rows` rows per width, each returned."""
    args, lines, outs = [], [], []
    for i, h in enumerate(widths):
        x = f"tensor<{rows}x{h}x{dtype}>"
        args += [f"%x{i}: {x}", f"%g{i}: tensor<{h}x{dtype}>"]
        lines.append(
            f"%y{i} = nn.rms_norm %x{i}, %g{i} {{epsilon = 1.0e-05 : f32}} "
            f": ({x}, tensor<{h}x{dtype}>) -> {x}"
        )
        outs.append((f"%y{i}", x))
    ret = f"func.return {', '.join(n for n, _ in outs)} : {', '.join(t for _, t in outs)}"
    sig = ", ".join(t for _, t in outs)
    body = "\n      ".join([*lines, ret])
    return f"func.func @f({', '.join(args)}) -> ({sig}) {{\n      {body}\n    }}"


def qk_rope(heads: int, positions: int, d: int, dtype: str, shared: bool = False) -> str:
    """A QK-norm + RoPE of `heads` heads over `positions` rows; the tables a row per position,
    or one row for all (`shared`)."""
    x, g = f"tensor<1x{heads}x{positions}x{d}x{dtype}>", f"tensor<{d}x{dtype}>"
    t = f"tensor<{d // 2}x{dtype}>" if shared else f"tensor<{positions}x{d // 2}x{dtype}>"
    return f"""
    func.func @f(%x: {x}, %g: {g}, %c: {t}, %s: {t}) -> {x} {{
      %n = nn.rms_norm %x, %g {{epsilon = 1.0e-06 : f32}} : ({x}, {g}) -> {x}
      %r = nn.rope %n, %c, %s : ({x}, {t}, {t}) -> {x}
      func.return %r : {x}
    }}"""


# K rows normalised, rotated and appended to a cache at a run-time position (a prefill's K):
# one in-place output whose blocks land side by side from the position.
APPEND = """
func.func @f(%cache: tensor<1x2x256x64xbf16> {nn.donated}, %k: tensor<1x2x200x64xbf16>, %g: tensor<64xbf16>, %c: tensor<200x32xbf16>, %s: tensor<200x32xbf16>, %p: tensor<1xi32>) -> tensor<1x2x256x64xbf16> {
  %n = nn.rms_norm %k, %g {epsilon = 1.0e-06 : f32} : (tensor<1x2x200x64xbf16>, tensor<64xbf16>) -> tensor<1x2x200x64xbf16>
  %r = nn.rope %n, %c, %s : (tensor<1x2x200x64xbf16>, tensor<200x32xbf16>, tensor<200x32xbf16>) -> tensor<1x2x200x64xbf16>
  %w = nn.cache_write %cache, %r, %p {dim = 2 : i64} : (tensor<1x2x256x64xbf16>, tensor<1x2x200x64xbf16>, tensor<1xi32>) -> tensor<1x2x256x64xbf16>
  %y = nn.exp %w : (tensor<1x2x256x64xbf16>) -> tensor<1x2x256x64xbf16>
  func.return %y : tensor<1x2x256x64xbf16>
}
"""


def _plans(text: str) -> list[bool]:
    module = load_module(text)
    NnToMugraphPass().apply(make_context(), module)
    return [plan_norm(op) is not None for op in module.walk() if isinstance(op, GraphDefOp)]


def test_which_graph_defs_are_norms() -> None:
    assert _plans(norms(999, (1024,), "bf16")) == [True]
    assert _plans(norms(40, (96,), "f16")) == [True]
    assert _plans(norms(40, (96,), "f32")) == [False]  # f32 rows keep the tile path
    assert _plans(norms(40, (100,), "bf16")) == [False]  # not a multiple of 32 lanes
    assert _plans(qk_rope(4, 200, 128, "bf16")) == [True]  # blocks of 50 rows
    assert _plans(qk_rope(4, 200, 32, "bf16")) == [False]  # halves of 16: not the call's lanes


def test_decode_sized_bodies_keep_the_tile_path_unless_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MK_CUDA_ROW_RUNS: `auto` (default) except a RoPE with one table row for all (a decode
    step's QK-norm), `all` always, `0` never."""
    decode = qk_rope(2, 6, 64, "bf16", shared=True)
    assert _plans(decode) == [False]
    monkeypatch.setenv("MK_CUDA_ROW_RUNS", "all")
    assert _plans(decode) == [True]
    monkeypatch.setenv("MK_CUDA_ROW_RUNS", "0")
    assert _plans(norms(999, (1024,), "bf16")) == [False]
    monkeypatch.setenv("MK_CUDA_ROW_RUNS", "some")
    with pytest.raises(MkError, match="MK_CUDA_ROW_RUNS must be one of auto, all, 0"):
        _plans(decode)


@pytest.mark.usefixtures("no_nvcc")
def test_a_norm_is_one_call(tmp_path: Path) -> None:
    src = mk.compile(norms(999, (1024,), "bf16"), target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::rms_norm_runs<1024, true>(") == 1, src
    assert "rms_norm_rows" not in src and "store_run_elem" not in src
    f16 = mk.compile(norms(40, (96,), "f16"), target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert "mk::gpu::rms_norm_runs<96, false>(" in f16


@pytest.mark.usefixtures("no_nvcc")
def test_a_prefills_hidden_norms_are_norm_calls(tmp_path: Path) -> None:
    """The norms before q/k/v and before the MLP (their own kernels at 150 rows, norm-rows=16);
    the QK-norm's blocks go on with RoPE and keep the tile path."""
    from mk.models import prefill_program, preset

    text = prefill_program(preset("tiny-qwen3"), 1, 150, 160)
    src = mk.compile(text, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert src.count("// a norm") == 1  # one body the layers' two norms share
    assert "rms_norm_rows<32, true>" in src  # head_dim 32: halves of 16, the tile path


@pytest.mark.usefixtures("no_nvcc")
def test_a_qwen3_prefills_qk_norms_are_norm_rope_calls(tmp_path: Path) -> None:
    """qwen3-0.6b's q rows and its K rows, the latter appended in place at the position the
    body loads and checks first."""
    from mk.models import prefill_program, preset

    text = prefill_program(preset("qwen3-0.6b").with_(layers=1), 1, 999, 1024)
    src = mk.compile(text, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::rms_norm_rope_runs<128, true, true>(") == 2
    assert "rms_norm_rows" not in src and "rope_rows" not in src
    assert "if (at_pos + 37 * by < 0 || at_pos + 37 * by + 37 > 1024) return 1;" in src


@pytest.mark.usefixtures("no_nvcc")
def test_an_appended_norm_rope_checks_its_position(tmp_path: Path) -> None:
    src = mk.compile(APPEND, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert "const int64_t at_pos = mk::gpu::load_elem_i(" in src
    assert "if (at_pos + 50 * by < 0 || at_pos + 50 * by + 50 > 256) return 1;" in src
    assert "(at_pos + 50 * by) * 64" in src.split("rms_norm_rope_runs<64, true, true>(", 1)[1]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize(
    ("text", "call"),
    [(norms(40, (1024, 96), "bf16"), "rms_norm_runs<96, true>"),
     (APPEND, "rms_norm_rope_runs<64, true, true>")],
    ids=["norms", "append"],
)  # fmt: skip
def test_norms_build(text: str, call: str, tmp_path: Path) -> None:
    """The norm's vector form (1,024: 16-byte units in registers) and its walk (96); the norm +
    RoPE appended in place: without spills."""
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert call in prog.cuda_source  # type: ignore[attr-defined]
    assert prog.library_path is not None  # type: ignore[attr-defined]
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is None or used.spill_stores == 0, used


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows", "widths", "dtype"),
    [
        (999, (1024,), "bf16"),
        (40, (1024, 96), "bf16"),
        (40, (4096, 288), "f16"),
        (7, (256,), "bf16"),
    ],
)
def test_norms_match_the_reference(
    rows: int, widths: tuple[int, ...], dtype: str, tmp_path: Path
) -> None:
    text = norms(rows, widths, dtype)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert "mk::gpu::rms_norm_runs<" in prog.cuda_source  # type: ignore[attr-defined]
    for seed in (0, 1):
        inputs = random_inputs(prog.func, seed=seed)
        for out, ref in zip(prog(*inputs), mk.reference(text, *inputs), strict=True):
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound, (rows, widths, dtype, seed, error)
