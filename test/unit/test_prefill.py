"""mk's prefill program (mk.models.prefill_program): the prompt's K/V caches in one call, against
the NumPy reference's step-by-step prefill, in chunks, from mk-generate, and on the GPU."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import mk
from mk.backends.cuda import build as cuda_build
from mk.models import (
    prefill_inputs,
    prefill_program,
    prefill_rows,
    preset,
    program_inputs,
    random_prompt,
    random_weights,
)
from mk.models.build import arguments, prefill_arguments
from mk.source import entry_function, load_module

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
NVCC = cuda_build.nvcc()
BATCH, PROMPT, CONTEXT = 2, 9, 24


def _caches(name: str, values: list[np.ndarray], context: int = CONTEXT) -> list[np.ndarray]:
    """The K/V caches among a decode program's inputs, as float64."""
    config = preset(name)
    roles = [a.role for a in arguments(config, BATCH, context)]
    return [
        np.asarray(v, np.float64)
        for r, v in zip(roles, values, strict=True)
        if r in ("k_cache", "v_cache")
    ]


def _assert_close(got: list[np.ndarray], want: list[np.ndarray], filled: int) -> None:
    """The first `filled` positions within bf16 rounding of the reference, the rest untouched."""
    for g, w in zip(got, want, strict=True):
        scale = np.abs(w[:, :, :filled]).max()
        assert scale > 0 and np.abs(g - w).max() <= 2e-2 * scale, np.abs(g - w).max() / scale
        assert np.abs(g[:, :, filled:]).max() == 0


def test_the_prefill_program_text_and_arguments() -> None:
    config = preset("tiny-qwen3")
    text = prefill_program(config, BATCH, PROMPT - 1, CONTEXT)
    assert text == prefill_program(config, BATCH, PROMPT - 1, CONTEXT)  # deterministic
    assert "func.func @prefill(%prompt: tensor<2x8xi32>, %positions: tensor<8xi32>" in text
    assert text.count("causal = true") == config.layers
    assert text.count("{nn.donated}") == 2 * config.layers
    names = [a.name for a in prefill_arguments(config, BATCH, PROMPT - 1, CONTEXT)]
    assert names[:2] == ["prompt", "positions"] and "tokens" not in names and "pos" not in names
    with pytest.raises(ValueError, match="below the context"):
        prefill_program(config, BATCH, CONTEXT, CONTEXT)
    entry_function(load_module(text))  # a well-formed nn program


@needs_gxx
@pytest.mark.parametrize(
    ("name", "length", "context"),
    [
        ("tiny", PROMPT, CONTEXT),
        ("tiny-qwen3", PROMPT, CONTEXT),
        ("tiny-qwen3", 151, 160),
    ],  # fmt: skip
)
def test_prefill_caches_match_the_reference(
    name: str, length: int, context: int, tmp_path: Path
) -> None:
    """On the CPU executor: the caches the NumPy reference fills step by step (positions
    0..P-2), and nothing past them; 150 positions take the attention's query blocks."""
    config = preset(name)
    weights = random_weights(config, seed=3)
    prompt = random_prompt(config, BATCH, length, seed=4)
    want = program_inputs(config, weights, BATCH, context, prompt)
    got = program_inputs(config, weights, BATCH, context, prompt, prefill=False)
    prog = mk.compile(prefill_program(config, BATCH, length - 1, context), cache_dir=tmp_path)
    (hidden,) = prog(*prefill_inputs(config, got, prompt, context))
    assert hidden.shape == (BATCH, config.hidden) and np.isfinite(hidden.astype(np.float32)).all()
    _assert_close(_caches(name, got, context), _caches(name, want, context), length - 1)


def test_prefill_rows_pad_a_count_no_divisor_cuts() -> None:
    """997 positions (a prime) run as 999 = 9 x 111; counts cut well as they are; the padding
    stays below the context, else the count stays."""
    config = preset("qwen3-0.6b")

    def rows(n: int, context: int) -> int:
        return prefill_rows(config, 1, n, context)

    assert rows(997, 1024) == 999 and rows(998, 1024) == 999
    assert [rows(n, 1024) for n in (1, 64, 999, 1000, 1023)] == [1, 64, 999, 1000, 1023]
    assert rows(67, 80) == 68  # 67 one block of 67 rows; 68 = 2 x 34
    assert rows(997, 999) == 997  # 999 would reach the context: none fits


def test_prefill_rows_on_the_gpu_fill_waves() -> None:
    """Modelled for the CUDA target: 999 positions of qwen3-0.6b as 1,008 (q/k/v in 256 gemm
    tiles rather than 288, two waves of 132 SMs rather than three; the attention in 128 blocks
    rather than 216), when the context leaves room; the CPU's count as it was; a count that the
    model finds no better than any more rows stays."""
    config = preset("qwen3-0.6b")
    assert prefill_rows(config, 1, 999, 1100, "cuda") == 1008
    assert prefill_rows(config, 1, 999, 1006, "cuda") == 1000  # 1,008 would pass the context
    assert prefill_rows(config, 1, 999, 1100) == 999
    assert prefill_rows(config, 1, 1024, 1200, "cuda") == 1024
    assert prefill_rows(config, 1, 999, 1100, "cuda", num_sms=144) != 1008  # other waves


def test_the_prefill_rows_model_ranks_by_the_cost_model() -> None:
    """mk.compiler.mugraph_estimate: the lowering mk.compile makes for the target, costed."""
    from mk.compiler import mugraph_estimate

    one = preset("qwen3-0.6b").with_(layers=1)
    at = {r: mugraph_estimate(prefill_program(one, 1, r, 1100), "cuda") for r in (999, 1008)}
    assert at[1008] < at[999]
    with pytest.raises(TypeError, match="unknown pass option"):
        mugraph_estimate(prefill_program(one, 1, 999, 1100), "cuda", tile_x=3)
    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        mugraph_estimate(prefill_program(one, 1, 999, 1100), "tpu")
    config = preset("tiny-qwen3")
    prompt = random_prompt(config, 1, 10, seed=1)
    inputs = program_inputs(config, random_weights(config, seed=1), 1, 16, prompt, prefill=False)
    values = prefill_inputs(config, inputs, prompt, 16, rows=12)
    assert values[0].tolist() == [[*prompt[0, :9].tolist(), *[int(prompt[0, 9])] * 3]]
    assert values[1].tolist() == list(range(12))
    for bad in (8, 16):
        with pytest.raises(ValueError, match="rows must be at least the prompt's 9 positions"):
            prefill_inputs(config, inputs, prompt, 16, rows=bad)


@needs_gxx
def test_a_padded_prefill_fills_the_prompts_positions(tmp_path: Path) -> None:
    """67 positions run as 68 (prefill_rows): the first 67 as the reference fills them, the 68th
    the prompt's next token at its own position (as the first decode step writes it), and
    nothing past it."""
    name, length, context = "tiny-qwen3", 68, 80
    config = preset(name)
    weights = random_weights(config, seed=7)
    prompt = random_prompt(config, BATCH, length, seed=8)
    want = program_inputs(config, weights, BATCH, context, prompt)
    got = program_inputs(config, weights, BATCH, context, prompt, prefill=False)
    rows = prefill_rows(config, BATCH, length - 1, context)
    assert rows == length
    prog = mk.compile(prefill_program(config, BATCH, rows, context), cache_dir=tmp_path)
    prog(*prefill_inputs(config, got, prompt, context, rows))
    for g, w in zip(_caches(name, got, context), _caches(name, want, context), strict=True):
        scale = np.abs(w[:, :, : length - 1]).max()
        assert np.abs(g[:, :, : length - 1] - w[:, :, : length - 1]).max() <= 2e-2 * scale
        assert np.abs(g[:, :, length - 1]).max() > 0 and np.abs(g[:, :, rows:]).max() == 0


@needs_gxx
def test_prefill_in_two_chunks_matches_one_call(tmp_path: Path) -> None:
    """Positions 0..3, then 4..7 against the caches the first chunk left: the same caches as
    one call for 0..7 (the second chunk's attention is causal at an offset)."""
    name, config = "tiny-qwen3", preset("tiny-qwen3")
    weights = random_weights(config, seed=5)
    prompt = random_prompt(config, BATCH, PROMPT, seed=6)
    whole = program_inputs(config, weights, BATCH, CONTEXT, prompt, prefill=False)
    prog = mk.compile(prefill_program(config, BATCH, PROMPT - 1, CONTEXT), cache_dir=tmp_path)
    prog(*prefill_inputs(config, whole, prompt, CONTEXT))
    chunks = program_inputs(config, weights, BATCH, CONTEXT, prompt, prefill=False)
    half = (PROMPT - 1) // 2
    chunk = mk.compile(prefill_program(config, BATCH, half, CONTEXT), cache_dir=tmp_path)
    for start in (0, half):
        values = prefill_inputs(config, chunks, prompt[:, start : start + half + 1], CONTEXT)
        values[1] = values[1] + np.int32(start)  # the chunk's positions
        chunk(*values)
    _assert_close(_caches(name, chunks), _caches(name, whole), PROMPT - 1)


@needs_gxx
def test_mk_generate_prefills_with_mk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--prefill mk: the caches from mk's prefill, then the same tokens the reference makes."""
    from mk.tools.mk_generate import main

    argv = ["--model", "tiny-qwen3", "--batch", "2", "--prompt-len", "12", "--steps", "4"]
    assert main([*argv, "--prefill", "mk", "--check", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "prefill of the prompt (mk)" in out and "check: ok" in out
    assert "tokens: 8 of 8 are the reference's argmax" in out
    padded = ["--model", "tiny-qwen3", "--prompt-len", "68", "--steps", "3", "--context", "80"]
    assert main([*padded, "--prefill", "mk", "--check", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "prefill of the prompt (mk): 67 positions as 68 (mk.models.prefill_rows)" in out
    assert "check: ok" in out


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_the_prefill_program_builds_for_cuda(tmp_path: Path) -> None:
    text = prefill_program(preset("tiny-qwen3"), BATCH, 40, 64)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert re.search(r"mk::gpu::\w*(mma|gemm)_tile", prog.cuda_source)  # type: ignore[attr-defined]


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_the_prefill_megakernels_bodies_spill_nothing(tmp_path: Path) -> None:
    """Every body shares the megakernel's registers: four loads in flight a thread in the head
    transposes' copy spilled the gemm and attention bodies of a prefill of qwen3-0.6b's shapes
    (4 functions, 116 B), 9 % of its time on the H200 (bench/RESULTS.md, session 57). Only the
    entry's queue walk may keep words on the stack."""
    config = dataclasses.replace(preset("qwen3-0.6b"), layers=2, vocab=2048)
    prog = mk.compile(prefill_program(config, 1, 999, 1024), target="cuda", cache_dir=tmp_path)
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and used.spilling <= 1, used


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "prompt_len"), [("tiny", 9), ("tiny-qwen3", 40)])
def test_mk_generate_prefills_on_the_gpu(
    name: str, prompt_len: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the megakernel: mk's prefill, then decoding, against the PyTorch decoder."""
    from mk.tools.mk_generate import main

    argv = ["--model", name, "--batch", "2", "--prompt-len", str(prompt_len), "--steps", "6"]
    assert main([*argv, "--target", "cuda", "--prefill", "mk", "--check"]) == 0
    assert "check: ok" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize(
    "switches",
    ["MK_CUDA_GEMM_STAGED_SUMS=0", "MK_CUDA_INLINE_BODIES=gemm", "MK_CUDA_PAIR_STORES=0"],
)
def test_the_gemm_tiles_switches_prefill_on_the_gpu(
    switches: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The per-register form of the wgmma tile's epilogue, the opt-in inlining of the wgmma
    bodies alone and the stores one element a thread, on tiny-qwen3's prefill."""
    from mk.tools.mk_generate import main

    for item in switches.split(","):
        monkeypatch.setenv(*item.split("=", 1))
    argv = ["--model", "tiny-qwen3", "--batch", "2", "--prompt-len", "40", "--steps", "6"]
    assert main([*argv, "--target", "cuda", "--prefill", "mk", "--check"]) == 0
    assert "check: ok" in capsys.readouterr().out


def test_the_prefill_bench_counts_the_linears_flops() -> None:
    from bench_scripts import load

    config = preset("tiny")
    per_layer = config.hidden * (config.q_dim + 2 * config.kv_dim) + config.q_dim * config.hidden
    per_layer += 3 * config.hidden * config.intermediate
    assert load("prefill").linear_flops(config, 10) == 2.0 * 10 * config.layers * per_layer


def test_the_prefill_bench_bounds_mk_by_pytorchs_own_drift() -> None:
    """Both against the model in f32: mk may drift at most twice as far as PyTorch bf16."""
    from bench_scripts import load

    within = load("prefill").within_rounding
    assert within(0.035, 0.03) and within(0.0005, 0.0)
    assert not within(0.1, 0.03) and not within(0.01, 0.0)


@pytest.mark.parametrize(
    ("rows", "message"),
    [("5", "counts from the prompt's 999 positions below the context 1008"),
     ("999,x", "comma-separated counts"), ("1008", "below the context 1008")],
)  # fmt: skip
def test_the_prefill_bench_refuses_rows_outside_the_prompt_and_context(
    rows: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench_scripts import load

    monkeypatch.setattr("sys.argv", ["prefill.py", "--model", "tiny", "--rows", rows])
    with pytest.raises(SystemExit) as exit_info:
        load("prefill").main()
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["", "MK_CUDA_INLINE_BODIES=walk"])
def test_the_prefill_bench_runs(
    variant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench/prefill.py on tiny-qwen3: mk's caches as close to the f32 model as PyTorch's, with
    the bodies called and with the whole walk inlined (MK_CUDA_INLINE_BODIES=walk)."""
    from bench_scripts import load

    argv = ["prefill.py", "--model", "tiny-qwen3", "--prompt-len", "150", "--runs", "50", variant]
    monkeypatch.setattr("sys.argv", argv)
    assert load("prefill").main() == 0
    out = capsys.readouterr().out
    assert "prefill of 149 positions: PyTorch one causal pass" in out
    assert f"  mk {variant or '(defaults)'}, " in out
