"""mk.models: presets, the NumPy reference, the decode program and mk-generate (safetensors:
test_model_weights.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from test_model_weights import write_safetensors

import mk
from mk.models import (
    PRESETS,
    ModelConfig,
    decode_program,
    generated_tokens,
    preset,
    program_inputs,
    random_prompt,
    random_weights,
    reference_generate,
)
from mk.models.build import arguments
from mk.models.reference import compare
from mk.models.weights import inverse_frequencies

BF16 = np.dtype(ml_dtypes.bfloat16)


def _has_decode_ops() -> bool:
    from mk.dialects import nn

    return hasattr(nn, "CacheWriteOp") and hasattr(nn, "StepOp")


needs_decode_ops = pytest.mark.skipif(
    not _has_decode_ops(), reason="nn.cache_write / nn.step have not landed in the compiler"
)
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


# --------------------------------------------------------------------------- presets


def _count_by_hand(h: int, hq: int, hkv: int, d: int, layers: int, i: int, v: int, tied: bool,
                   qk_norm: bool) -> int:  # fmt: skip
    attn = h * hq * d * 2 + h * hkv * d * 2 + (2 * d if qk_norm else 0)
    per_layer = attn + 3 * h * i + 2 * h
    return v * h * (1 if tied else 2) + layers * per_layer + h


@pytest.mark.parametrize(
    ("name", "expected", "approx"),
    [
        ("llama-3.2-1b", _count_by_hand(2048, 32, 8, 64, 16, 8192, 128256, True, False), 1.24e9),
        ("qwen3-0.6b", _count_by_hand(1024, 16, 8, 128, 28, 3072, 151936, True, True), 0.60e9),
        ("qwen3-8b", _count_by_hand(4096, 32, 8, 128, 36, 12288, 151936, False, True), 8.19e9),
    ],
)
def test_preset_parameter_counts(name: str, expected: int, approx: float) -> None:
    config = preset(name)
    assert config.parameter_count() == expected
    assert config.parameter_count() == pytest.approx(approx, rel=0.01)


def test_step_weight_bytes_reads_only_the_batch_rows_of_an_untied_embedding() -> None:
    big, small = preset("qwen3-8b"), preset("qwen3-0.6b")
    table = 2 * big.vocab * big.hidden
    assert big.step_weight_bytes(1) == 2 * big.parameter_count() - table + 2 * big.hidden
    assert big.step_weight_bytes(8) - big.step_weight_bytes(1) == 2 * 7 * big.hidden
    # Issue-scale check: qwen3-8b's weights a step reads are ~15.2 GB, not the 16.4 GB stored.
    assert big.step_weight_bytes(1) == pytest.approx(15.15e9, rel=0.01)
    # Tied: the table is the lm_head's and is read whole.
    assert small.step_weight_bytes(1) == 2 * small.parameter_count()


def test_preset_shapes() -> None:
    q = preset("qwen3-8b")
    shapes = q.weight_shapes()
    assert shapes["model.layers.35.self_attn.q_proj.weight"] == (4096, 4096)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (1024, 4096)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (128,)
    assert shapes["lm_head.weight"] == (151936, 4096)
    small = preset("qwen3-0.6b")
    # Qwen3-0.6B's attention is wider than its hidden size: 16 heads of 128 on 1024.
    assert small.weight_shapes()["model.layers.0.self_attn.o_proj.weight"] == (1024, 2048)
    assert "lm_head.weight" not in small.weight_shapes()
    llama = preset("llama-3.2-1b")
    assert "model.layers.0.self_attn.q_norm.weight" not in llama.weight_shapes()
    assert llama.rope_scaling is not None and not llama.qk_norm
    assert {PRESETS["tiny"].family, PRESETS["tiny-qwen3"].family} == {"llama", "qwen3"}
    # KV cache bytes: 2 (K, V) x 28 layers x 8 heads x 1024 positions x 128 x 2 bytes.
    assert small.kv_cache_bytes(1, 1024) == 2 * 28 * 8 * 1024 * 128 * 2


def test_bad_presets_and_configs() -> None:
    with pytest.raises(ValueError, match="unknown model preset 'llama-9'; presets: tiny"):
        preset("llama-9")
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        PRESETS["tiny"].with_(kv_heads=3)
    with pytest.raises(ValueError, match="family"):
        ModelConfig("x", "gpt", 8, 1, 1, 8, 1, 8, 8, True, 1e4, 1e-6, False)


def test_llama3_rope_scaling() -> None:
    config = preset("llama-3.2-1b")
    plain = 1.0 / 500000.0 ** (np.arange(0, 64, 2) / 64)
    scaled = inverse_frequencies(config)
    wavelength = 2 * np.pi / plain
    high = wavelength < 8192 / 4  # short wavelengths are kept
    low = wavelength > 8192 / 1  # long ones are divided by the factor 32
    assert high.any() and low.any()
    np.testing.assert_allclose(scaled[high], plain[high])
    np.testing.assert_allclose(scaled[low], plain[low] / 32)
    mid = ~high & ~low
    assert np.all(scaled[mid] < plain[mid]) and np.all(scaled[mid] > plain[mid] / 32)
    assert np.all(np.diff(scaled) < 0)


# The fields of the public config.json files that the presets stand for.
_HF_LLAMA32_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 16,
    "head_dim": 64,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
}
_HF_QWEN3_06B = {
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "num_hidden_layers": 28,
    "head_dim": 128,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "tie_word_embeddings": True,
}


def test_presets_match_hugging_face_configs(tmp_path: Path) -> None:
    from mk.models.config import check_hf_config, config_from_hf

    assert config_from_hf(_HF_LLAMA32_1B, "llama-3.2-1b") == preset("llama-3.2-1b")
    assert config_from_hf(_HF_QWEN3_06B, "qwen3-0.6b") == preset("qwen3-0.6b")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_HF_QWEN3_06B, "num_hidden_layers": 36}))
    with pytest.raises(ValueError, match="does not describe qwen3-0.6b: layers 28 vs 36"):
        check_hf_config(preset("qwen3-0.6b"), path)
    with pytest.raises(ValueError, match="model_type 'mistral'"):
        config_from_hf({**_HF_QWEN3_06B, "model_type": "mistral"})
    with pytest.raises(ValueError, match="missing field 'hidden_size'"):
        config_from_hf({k: v for k, v in _HF_QWEN3_06B.items() if k != "hidden_size"})


# --------------------------------------------------------------------------- the NumPy reference


def _full_forward(
    config: ModelConfig, weights: dict[str, np.ndarray], seq: np.ndarray
) -> np.ndarray:
    """Logits [B, S, V] of the whole sequence at once with a causal mask, in float64, without a
    cache: a different algorithm from the step-by-step decoder, written from the model's
    definition (rotate_half form of RoPE, per-head attention loops)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    b, s = seq.shape
    d, hq, hkv = config.head_dim, config.heads, config.kv_heads

    def norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + config.rms_eps) * g

    inv = inverse_frequencies(config)
    angles = np.arange(s)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(angles)] * 2, -1)  # [S, D]
    sin = np.concatenate([np.sin(angles)] * 2, -1)

    def rotate(x: np.ndarray) -> np.ndarray:  # x [B, heads, S, D]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    x = w["model.embed_tokens.weight"][seq]  # [B, S, H]
    causal = np.tril(np.ones((s, s), bool))
    for layer in range(config.layers):
        p = f"model.layers.{layer}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(b, s, hq, d).transpose(0, 2, 1, 3)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(b, s, hkv, d).transpose(0, 2, 1, 3)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(b, s, hkv, d).transpose(0, 2, 1, 3)
        if config.qk_norm:
            q = norm(q, w[p + "self_attn.q_norm.weight"])
            k = norm(k, w[p + "self_attn.k_norm.weight"])
        q, k = rotate(q), rotate(k)
        out = np.zeros_like(q)
        for head in range(hq):
            kv = head * hkv // hq
            scores = q[:, head] @ k[:, kv].transpose(0, 2, 1) / math.sqrt(d)  # [B, S, S]
            scores = np.where(causal, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, kv]
        att = out.transpose(0, 2, 1, 3).reshape(b, s, hq * d)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        h2 = norm(x, w[p + "post_attention_layernorm.weight"])
        g = h2 @ w[p + "mlp.gate_proj.weight"].T
        u = h2 @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    head_w = w["model.embed_tokens.weight" if config.tied_embeddings else "lm_head.weight"]
    return norm(x, w["model.norm.weight"]) @ head_w.T


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_numpy_reference_matches_full_recompute(name: str) -> None:
    config = preset(name)
    weights = random_weights(config, seed=5)
    prompt = random_prompt(config, batch=2, length=3, seed=5)
    steps = 5
    gen = reference_generate(config, weights, prompt, steps, dtype=np.float64, round_bf16=False)
    seq = np.concatenate([prompt, gen.tokens], axis=1)
    for t in range(steps):
        # Step t's logits are those of the last position of the sequence so far.
        full = _full_forward(config, weights, seq[:, : prompt.shape[1] + t])[:, -1]
        np.testing.assert_allclose(gen.logits[t], full, rtol=1e-9, atol=1e-9)
        np.testing.assert_array_equal(gen.tokens[:, t], np.argmax(full, -1))
    assert len(set(gen.tokens.ravel().tolist())) > 1  # the test sees several different tokens


def test_bf16_reference_stays_close_to_exact() -> None:
    config = preset("tiny")
    weights = random_weights(config, seed=2)
    prompt = random_prompt(config, 2, 1, seed=2)
    exact = reference_generate(config, weights, prompt, 4, dtype=np.float64, round_bf16=False)
    bf16 = reference_generate(config, weights, prompt, 4, forced=exact.tokens)
    rel = np.linalg.norm(bf16.logits - exact.logits) / np.linalg.norm(exact.logits)
    assert 0 < rel < 2e-2
    assert bf16.logits.std() > 1.0  # random weights give logits a spread of a few units


def test_compare_allows_only_near_ties() -> None:
    ref = np.array([[[0.0, 5.0, 4.99, 1.0]], [[3.0, 0.0, 0.0, 0.0]]])  # [steps, batch, V]
    ok = compare(np.array([[2, 0]]), ref, {1: ref[1]})
    assert ok.ok and ok.divergence == (0, 0) and ok.logit_error == 0
    assert ok.divergence_gap == pytest.approx(0.01)
    bad = compare(np.array([[3, 0]]), ref, {})
    assert not bad.ok and "step 0 sequence 0: token 3, reference 1" in bad.problems[0]
    off = compare(np.array([[1, 0]]), ref, {1: ref[1] * 1.1})
    assert not off.ok and "step 1: logits differ" in off.problems[0]


# --------------------------------------------------------------------------- the decode program


def test_decode_program_text_and_inputs() -> None:
    from mk.source import entry_function, load_module

    config = preset("tiny-qwen3")
    text = decode_program(config, batch=2, context=16, steps=4)
    assert text == decode_program(config, batch=2, context=16, steps=4)  # deterministic
    assert "attributes {nn.steps = 4 : i64}" in text
    assert "%tokens: tensor<16x2xi32> {nn.donated}" in text
    assert "%l1_v_cache: tensor<2x2x16x32xbf16> {nn.donated}" in text
    assert "%l0_qn = nn.rms_norm %l0_q4, %l0_q_norm" in text
    assert "%logits = nn.linear %xn, %embed" in text  # tied embeddings
    single = decode_program(config, batch=2, context=16)
    assert "nn.steps" not in single
    llama = decode_program(preset("tiny"), 1, 8)
    assert "%logits = nn.linear %xn, %lm_head" in llama and "q_norm" not in llama
    with pytest.raises(ValueError, match="do not fit"):
        decode_program(config, 1, 4, steps=4)
    if not _has_decode_ops():
        return
    func = entry_function(load_module(text))  # parses and verifies
    args = func.body.block.args
    specs = arguments(config, 2, 16)
    assert len(args) == len(specs)
    inputs = program_inputs(config, random_weights(config), 2, 16, random_prompt(config, 2, 3))
    from mk.inputs import check_inputs

    check_inputs(func, inputs)  # dtypes and shapes match the signature
    assert inputs[1].tolist() == [2]  # pos: the prompt's last token


@needs_decode_ops
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_nn_interpreter_matches_numpy_reference(name: str) -> None:
    config = preset(name)
    weights = random_weights(config, seed=1)
    prompt = random_prompt(config, 2, 3, seed=1)
    steps, context = 4, 8
    inputs = program_inputs(config, weights, 2, context, prompt)
    tokens, logits = mk.reference(decode_program(config, 2, context, steps), *inputs)
    ref = reference_generate(config, weights, prompt, steps, context=context)
    np.testing.assert_array_equal(generated_tokens(tokens, 2, steps), ref.tokens)
    np.testing.assert_array_equal(inputs[0], tokens)  # the donated history was updated
    assert np.abs(inputs[-1][:, :, : 2 + steps]).max() > 0  # and the last V cache
    got = logits.astype(np.float64)
    assert np.linalg.norm(got - ref.logits[-1]) / np.linalg.norm(ref.logits[-1]) < 1e-2


# --------------------------------------------------------------------------- end to end on the CPU


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-cache")


@needs_decode_ops
@needs_gxx
def test_tiny_generates_on_cpu_executor(cache_dir: Path) -> None:
    config = preset("tiny")
    weights = random_weights(config)
    batch, steps, context = 2, 4, 5  # the shape mk-generate's test below compiles too
    prompt = random_prompt(config, batch)
    prog = mk.compile(decode_program(config, batch, context, steps), cache_dir=cache_dir)
    inputs = program_inputs(config, weights, batch, context, prompt)
    tokens, logits = prog(*inputs)
    got = generated_tokens(tokens, 0, steps)
    np.testing.assert_array_equal(inputs[0], tokens)  # donated: written back
    ref = reference_generate(config, weights, prompt, steps, context=context, forced=got)
    result = compare(got, ref.logits, {steps - 1: logits.astype(np.float32)})
    assert result.ok, result.problems
    assert result.divergence is None  # tiny's random weights have no near-ties here
    np.testing.assert_array_equal(got, reference_generate(config, weights, prompt, steps).tokens)


@needs_decode_ops
@pytest.mark.usefixtures("no_nvcc")
def test_a_batch_v_rows_go_to_the_cache_from_copy_blocks(cache_dir: Path) -> None:
    """At batch 2 (by default, cache_rows=1) each KV head's V rows are copied into the cache by
    a block of their own, which waits only for its head's attention; with cache_rows=0 one
    library task writes every head's, as at batch 1 either way."""
    config = preset("tiny-qwen3")
    text = decode_program(config, 2, 5, 2)
    by_blocks = mk.compile(text, target="cuda", cache_dir=cache_dir)
    src = by_blocks.cuda_source  # type: ignore[attr-defined]
    assert "mk::gpu::cache_write_bytes(" not in src
    assert src.count("mk::gpu::copy_runs<2>(") == 1  # one body, which every layer's grid runs
    grids = by_blocks.graph.index().grids_by_name  # type: ignore[attr-defined]
    v_writes = [g for name, g in grids.items() if name.endswith("_v_cache")]
    assert len(v_writes) == config.layers
    assert all(g.shape_tuple == (config.kv_heads,) for g in v_writes)
    one_task = mk.compile(text, target="cuda", cache_dir=cache_dir, cache_rows=0)
    assert "mk::gpu::cache_write_bytes(" in one_task.cuda_source  # type: ignore[attr-defined]
    single = mk.compile(decode_program(config, 1, 5, 2), target="cuda", cache_dir=cache_dir)
    assert "mk::gpu::cache_write_bytes(" in single.cuda_source  # type: ignore[attr-defined]


@pytest.mark.parametrize("flag", [-1, 2])
def test_cache_rows_takes_0_or_1(flag: int, cache_dir: Path) -> None:
    text = decode_program(preset("tiny"), 2, 5, 2)
    with pytest.raises(mk.MkError, match="nn-to-mugraph: cache-rows must be 0 or 1"):
        mk.compile(text, cache_dir=cache_dir, cache_rows=flag)


@needs_decode_ops
@needs_gxx
def test_v_rows_by_blocks_generate_as_one_task_does(cache_dir: Path) -> None:
    """The CPU executor runs both forms of the V rows' cache write to the same bits."""
    config = preset("tiny-qwen3")
    weights = random_weights(config)
    batch, steps, context = 2, 3, 6
    prompt = random_prompt(config, batch, seed=4)
    text = decode_program(config, batch, context, steps)
    runs = []
    for rows in (1, 0):
        prog = mk.compile(text, cache_dir=cache_dir, cache_rows=rows)
        runs.append(prog(*program_inputs(config, weights, batch, context, prompt)))
    for got, want in zip(*runs, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    tokens = generated_tokens(np.asarray(runs[0][0]), 0, steps)
    np.testing.assert_array_equal(tokens, reference_generate(config, weights, prompt, steps).tokens)


@needs_decode_ops
@needs_gxx
@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--option", "kv_splits=2", "--option", "tile_n=32"],
        ["--option", "kv_splits=2", "--option", "merge_rows=2"],  # the merge folded at batch 2
    ],
)
def test_mk_generate_check(
    cache_dir: Path, capsys: pytest.CaptureFixture[str], options: list[str]
) -> None:
    """The tokens match the reference, with the default tiling and with pass options."""
    from mk.tools.mk_generate import main

    argv = ["--model", "tiny", "--batch", "2", "--steps", "4", "--target", "cpu", "--check"]
    assert main([*argv, *options, "--cache-dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out
    assert "tokens: 8 of 8 are the reference's argmax" in out and "check: ok" in out
    assert "ms/token" in out


@needs_decode_ops
@needs_gxx
def test_mk_generate_says_it_ignores_the_benchmarks_pass_options(
    cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_PASS_OPTIONS is bench/'s variable: mk-generate builds without it and says so, so that
    a run meant to check a pass option does not pass silently on the default build."""
    from mk.tools.mk_generate import main

    monkeypatch.setenv("MK_PASS_OPTIONS", "kv_splits=2")
    argv = ["--model", "tiny", "--batch", "2", "--steps", "4", "--target", "cpu", "--check"]
    assert main([*argv, "--cache-dir", str(cache_dir)]) == 0
    captured = capsys.readouterr()
    assert "MK_PASS_OPTIONS (the benchmarks' variable) is not read here" in captured.err
    assert "--option NAME=VALUE" in captured.err and "check: ok" in captured.out


@needs_decode_ops
@needs_gxx
def test_mk_generate_accuracy(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Logits past --logit-tol pass when mk is about as close to the unrounded model as the
    bf16 reference is (measured only then, unless --accuracy); --no-accuracy keeps the plain
    tolerance; the tokens still count."""
    from mk.tools.mk_generate import main

    argv = ["--model", "tiny", "--batch", "2", "--steps", "4", "--target", "cpu", "--check"]
    argv += ["--cache-dir", str(cache_dir)]
    assert main([*argv, "--logit-tol", "0", "--no-accuracy"]) == 1  # a zero tolerance fails
    out = capsys.readouterr().out
    assert "MISMATCH: step" in out and "unrounded" not in out
    assert main([*argv, "--logit-tol", "0"]) == 0
    out = capsys.readouterr().out
    assert "against the unrounded reference: mk " in out and "check: ok" in out
    assert "(within the accuracy bound) step" in out and "MISMATCH" not in out
    assert main(argv) == 0  # within the tolerance: the unrounded run only with --accuracy
    assert "unrounded" not in capsys.readouterr().out
    assert main([*argv, "--accuracy"]) == 0
    assert "against the unrounded reference: mk " in capsys.readouterr().out


@needs_decode_ops
@needs_gxx
def test_mk_generate_check_fails_logits_off_the_model(
    cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logits 5 % off (a wrong build) fail --check: past the tolerance and the accuracy bound."""
    import mk.tools.mk_generate as gen

    run_in_kernel = gen._run_in_kernel

    def skewed(*args: Any) -> Any:
        run = run_in_kernel(*args)
        run.logits = {t: v * 1.05 for t, v in run.logits.items()}
        return run

    monkeypatch.setattr(gen, "_run_in_kernel", skewed)
    argv = ["--model", "tiny", "--steps", "3", "--target", "cpu", "--check"]
    assert gen.main([*argv, "--cache-dir", str(cache_dir)]) == 1
    out = capsys.readouterr().out
    assert "(MISMATCH: at most 1.25x)" in out and "MISMATCH: step 2: logits differ" in out
    assert "check: FAILED" in out


def test_accuracy_bound_rejects_logits_far_from_the_model() -> None:
    import argparse

    from mk.tools.mk_generate import Run, _as_accurate

    config = preset("tiny")
    weights = random_weights(config)
    prompt = random_prompt(config, 2)
    ref = reference_generate(config, weights, prompt, 3, context=5)
    args = argparse.Namespace(target="cpu", steps=3, context=5)
    last = {2: ref.logits[2]}
    assert _as_accurate(args, config, weights, prompt, Run(ref.tokens, last), ref.logits)
    skewed = Run(ref.tokens, {2: ref.logits[2] * 1.1})  # 10 % off: far past bf16 rounding
    assert not _as_accurate(args, config, weights, prompt, skewed, ref.logits)


def test_compare_separates_tokens_and_logits() -> None:
    from mk.models.reference import compare, logit_error

    ref = np.zeros((1, 1, 4))
    ref[0, 0] = [0.0, 3.0, 1.0, 0.5]
    off = {0: ref[0] + 0.3}
    result = compare(np.array([[1]]), ref, off, logit_tol=0.01)
    assert result.tokens_ok and not result.logits_ok and not result.ok
    result = compare(np.array([[2]]), ref, {0: ref[0]}, logit_tol=0.01)
    assert not result.tokens_ok and result.logits_ok
    exact = ref.copy()
    assert logit_error(off, exact) == pytest.approx(0.6 / np.linalg.norm(ref[0]))


def test_mk_generate_user_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from mk.tools.mk_generate import main

    assert main(["--model", "gpt-5"]) == 1
    assert "mk-generate: error: unknown model preset 'gpt-5'" in capsys.readouterr().err
    assert main(["--model", "tiny", "--steps", "8", "--context", "4"]) == 1
    assert "--context 4 is too small" in capsys.readouterr().err
    assert main(["--model", "tiny", "--weights", str(tmp_path / "none.safetensors")]) == 1
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["--model", "tiny", "--layers", "3"]) == 1
    assert "--layers must be in 1..2 for tiny" in capsys.readouterr().err
    assert main(["--model", "tiny", "--option", "kv_splits"]) == 1
    assert "pass option 'kv_splits': expected NAME=VALUE" in capsys.readouterr().err
    assert main(["--model", "tiny", "--option", "warp_speed=9"]) == 1
    assert "unknown pass option(s) warp_speed" in capsys.readouterr().err
    assert main(["--model", "tiny", "--vocab", "64", "--weights", str(tmp_path)]) == 1
    assert "--vocab takes a size >= 2 and works with random weights only" in capsys.readouterr().err
    write_safetensors(tmp_path / "w.safetensors", {"model.norm.weight": np.ones(64, np.float32)})
    assert main(["--model", "tiny", "--weights", str(tmp_path / "w.safetensors")]) == 1
    err = capsys.readouterr().err
    assert "missing weight(s) model.embed_tokens.weight" in err and "Traceback" not in err


@needs_decode_ops
@needs_gxx
def test_qwen3_single_steps_on_cpu_executor(cache_dir: Path) -> None:
    """One step per call (no nn.steps), the host advancing pos; Qwen3's QK-norm and tied head."""
    config = preset("tiny-qwen3").with_(layers=1)
    weights = random_weights(config, seed=4)
    batch, steps, context = 2, 3, 6
    prompt = random_prompt(config, batch, 2, seed=4)
    prog = mk.compile(decode_program(config, batch, context), cache_dir=cache_dir)
    inputs = program_inputs(config, weights, batch, context, prompt)
    logits = {}
    for t in range(steps):
        inputs[1] = np.array([1 + t], np.int32)
        _, out = prog(*inputs)
        logits[t] = out.astype(np.float32)
    got = generated_tokens(inputs[0], 1, steps)
    ref = reference_generate(config, weights, prompt, steps, context=context, forced=got)
    result = compare(got, ref.logits, logits)
    assert result.ok, result.problems
    assert result.compared_steps == [0, 1, 2] and result.logit_error < 2e-2


@pytest.mark.gpu
def test_tiny_generates_on_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """The in-kernel loop on the megakernel against the PyTorch decoder (one near-tie allowed)."""
    from mk.tools.mk_generate import main

    argv = ["--model", "tiny-qwen3", "--batch", "2", "--steps", "8", "--context", "32"]
    assert main([*argv, "--target", "cuda", "--check"]) == 0
    out = capsys.readouterr().out
    assert "check: ok" in out
    assert re.search(r"megakernel: \d+ registers, \d+ B of stack, no spills", out), out


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "batch"), [("tiny", 1), ("tiny-qwen3", 2)])
def test_torch_prefill_in_one_pass_matches_the_step_loop(name: str, batch: int) -> None:
    """TorchDecoder.reset runs the prompt as one causal pass: the caches, position and next
    token the step-by-step loop leaves (bf16, so within rounding)."""
    from mk.models.torch_reference import TorchDecoder

    config = preset(name)
    weights = random_weights(config, seed=1)
    prompt = random_prompt(config, batch, 20, seed=2)
    models = [TorchDecoder(config, weights, batch, 32) for _ in range(2)]
    models[0].reset(prompt)
    models[1].reset(prompt, stepwise=True)
    one, steps = models
    assert int(one.pos.item()) == int(steps.pos.item()) == 19
    assert one.token.tolist() == steps.token.tolist() == prompt[:, -1].tolist()
    for a, b in ((one.k_cache, steps.k_cache), (one.v_cache, steps.v_cache)):
        a, b = a.float().cpu().numpy(), b.float().cpu().numpy()
        assert np.abs(b[:, :, :, 19:]).max() == 0 and np.abs(a[:, :, :, 19:]).max() == 0
        scale = np.abs(b[:, :, :, :19]).max()
        assert scale > 0 and np.abs(a - b).max() <= 3e-2 * scale, np.abs(a - b).max() / scale


@needs_decode_ops
@needs_gxx
def test_mk_generate_host_loop(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One launch per token through mk-generate (the program of the test above: a cache hit)."""
    from mk.tools.mk_generate import main

    argv = ["--model", "tiny-qwen3", "--layers", "1", "--batch", "2", "--context", "6"]
    argv += [
        "--steps",
        "3",
        "--prompt-len",
        "2",
        "--host-loop",
        "--check",
        "--bench",
        "--runs",
        "2",
    ]
    assert main([*argv, "--cache-dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out
    assert "logits (step 0, 1, 2)" in out and "check: ok" in out and "bench: " in out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize(
    ("name", "batch"), [("qwen3-0.6b", 1), ("qwen3-0.6b", 8), ("llama-3.2-1b", 8), ("qwen3-8b", 1)]
)
def test_model_decode_megakernel_builds_without_spills(
    name: str, batch: int, cache_dir: Path
) -> None:
    """Every body shares the megakernel's registers: a helper that needs many of them (the
    embedding gather with eight 16-byte loads in flight) spilled q, r, y_acc and the lm_head of
    every layer, and qwen3-0.6b's decode ran 11 % slower at batch 8 (bench/RESULTS.md, session
    57). Two layers of a preset's shapes and a small vocabulary show the same registers; the
    presets cover both attention bodies (CUDA and tensor cores) and head dims 64 and 128."""
    config = dataclasses.replace(preset(name), layers=2, vocab=2048)
    prog = mk.compile(
        decode_program(config, batch, 1024, steps=2), target="cuda", cache_dir=cache_dir
    )
    used = prog.cuda_resources
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used
