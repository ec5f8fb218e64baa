"""A tiny preset's decode loop, compiled with given options, run on random weights and checked
against the NumPy reference: the helper of tests that change how a decode step is lowered."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import mk
from mk.models import (
    decode_program,
    generated_tokens,
    preset,
    program_inputs,
    random_prompt,
    random_weights,
    reference_generate,
)
from mk.models.reference import compare

BATCH, CONTEXT, STEPS = 2, 5, 4


def decode(name: str, cache: Path, target: str, **options: object) -> mk.Program:
    """The preset's decode loop (batch 2, context 5, 4 steps)."""
    program = decode_program(preset(name), BATCH, CONTEXT, STEPS)
    return mk.compile(program, target=target, cache_dir=cache, **options)


def inputs(name: str) -> list[np.ndarray]:
    """Random weights and prompt, as the decode loop's arguments."""
    config = preset(name)
    weights = random_weights(config)
    return program_inputs(config, weights, BATCH, CONTEXT, random_prompt(config, BATCH))


def assert_generates_the_reference(name: str, prog: mk.Program) -> None:
    """The program's tokens and last logits against the reference, teacher-forced on its tokens
    (a divergence only after a near-tie passes)."""
    config = preset(name)
    weights = random_weights(config)
    prompt = random_prompt(config, BATCH)
    tokens, logits = prog(*program_inputs(config, weights, BATCH, CONTEXT, prompt))
    got = generated_tokens(tokens, 0, STEPS)
    ref = reference_generate(config, weights, prompt, STEPS, context=CONTEXT, forced=got)
    result = compare(got, ref.logits, {STEPS - 1: np.asarray(logits).astype(np.float32)})
    assert result.ok, result.problems
