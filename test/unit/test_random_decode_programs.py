"""Random decode-shaped nn programs end to end: on the CPU executor, through nvcc, and on the GPU.

The examples and models exercise the shapes they were tuned for; these draw rows, widths, head
counts and cache lengths around them (odd widths, a few rows, GQA groups, short and unaligned
caches), so each target's choice of paths is checked against the reference, not just built.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from nn_programs import decode_programs
from xdsl.dialects.builtin import ModuleOp

import mk
from mk import compiler
from mk.backends.cuda import build
from mk.inputs import random_inputs

CACHE = Path(tempfile.mkdtemp(prefix="mk-random-decode-"))
atexit.register(shutil.rmtree, CACHE, True)

SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
# Each example is an nvcc build: a failure is reported as drawn, not shrunk build by build.
BUILDS = {**SETTINGS, "phases": [Phase.explicit, Phase.reuse, Phase.generate]}


def check_matches_the_reference(
    text: str, outputs: tuple[np.ndarray, ...], inputs: list[np.ndarray]
) -> None:
    want = mk.reference(text, *inputs)
    assert len(outputs) == len(want)
    for i, (got, ref) in enumerate(zip(outputs, want, strict=True)):
        error, bound = compiler.output_error(np.asarray(got), np.asarray(ref))
        assert error <= bound, f"output #{i}: error {error:.3e} > {bound:.0e}\n{text}"


def test_decode_programs_draw_the_paths_they_are_for() -> None:
    """The strategy reaches what it exists for: attention over unaligned caches, gated linears,
    residual adds and all three dtypes (so a narrowed strategy cannot pass unnoticed)."""
    seen: set[str] = set()

    @settings(max_examples=60, **SETTINGS)
    @given(decode_programs())
    def collect(module: ModuleOp) -> None:
        text = str(module)
        seen.update(
            op
            for op in ("nn.attention", "nn.silu", "nn.add", "bf16", "xf16>", "xf32>")
            if op in text
        )
        seen.update(f"s={s}" for s in (100, 257, 600) if f"x{s}x" in text)

    collect()
    assert seen >= {"nn.attention", "nn.silu", "nn.add", "bf16", "xf16>", "xf32>", "s=257"}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@settings(max_examples=5, **SETTINGS)
@given(decode_programs(), st.integers(1, 8), st.integers(0, 3))
def test_random_decode_programs_on_the_cpu(module: ModuleOp, num_sms: int, seed: int) -> None:
    text = str(module)
    try:
        prog = mk.compile(text, num_sms=num_sms, num_threads=min(num_sms, 4), cache_dir=CACHE)
    except mk.MkError as e:  # no C++ compiler for the executor's kernels
        pytest.skip(str(e))
    inputs = random_inputs(prog.func, seed=seed)
    check_matches_the_reference(text, prog(*inputs, max_delay_us=20, seed=seed), inputs)


@pytest.mark.skipif(build.nvcc() is None, reason="needs nvcc")
@settings(max_examples=3, **BUILDS)
@given(decode_programs())
def test_random_decode_programs_build_with_nvcc(module: ModuleOp) -> None:
    prog = mk.compile(str(module), target="cuda", cache_dir=CACHE)
    assert "megakernel" in prog.cuda_source  # type: ignore[attr-defined]
    assert prog.cuda_resources  # type: ignore[attr-defined]  # ptxas reported on the build


@pytest.mark.gpu
@settings(max_examples=12, **BUILDS)
@given(decode_programs(), st.integers(0, 3))
def test_random_decode_programs_on_the_gpu(module: ModuleOp, seed: int) -> None:
    """Outputs start NaN (the host fills them), so an element no task wrote fails the check."""
    text = str(module)
    prog = mk.compile(text, target="cuda", cache_dir=CACHE)
    inputs = random_inputs(prog.func, seed=seed)
    check_matches_the_reference(text, prog(*inputs), inputs)
