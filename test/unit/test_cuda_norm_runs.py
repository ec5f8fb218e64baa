"""Graph_defs that only normalise rows (backends/cuda/norm_runs.py): which ones, the emitted
call, its build, and on the GPU its rows against the reference."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import mk
from mk import compiler
from mk.backends.cuda.norm_runs import plan_norm
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


def _plans(text: str) -> list[bool]:
    module = load_module(text)
    NnToMugraphPass().apply(make_context(), module)
    return [plan_norm(op) is not None for op in module.walk() if isinstance(op, GraphDefOp)]


def test_which_graph_defs_are_norms() -> None:
    assert _plans(norms(999, (1024,), "bf16")) == [True]
    assert _plans(norms(40, (96,), "f16")) == [True]
    assert _plans(norms(40, (96,), "f32")) == [False]  # f32 rows keep the tile path
    assert _plans(norms(40, (100,), "bf16")) == [False]  # not a multiple of 32 lanes


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
    assert "rms_norm_rows<32, true>" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_norms_build(tmp_path: Path) -> None:
    """The vector form (1,024: 16-byte units in registers) and the walk (96) in one build."""
    prog = mk.compile(norms(40, (1024, 96), "bf16"), target="cuda", cache_dir=tmp_path)
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert "rms_norm_runs<1024, true>" in src and "rms_norm_runs<96, true>" in src
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
