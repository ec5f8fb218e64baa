"""Launches of one CUDA program continue each other's event counters; a failure resets them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mk
from mk import compiler
from mk.backends.cuda.host import CudaRunError
from mk.inputs import random_inputs

ROOT = Path(__file__).resolve().parents[2]
LM_HEAD = ROOT / "examples" / "lm_head_argmax.mlir"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-relaunch-cache")


def _assert_close(outs: tuple[object, ...], refs: tuple[np.ndarray, ...]) -> None:
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound, f"output {i} {ref.dtype}{list(ref.shape)}: error {error:.3g}"


def _epochs(prog: object) -> np.ndarray:
    return prog._state.epoch.cpu().numpy()  # type: ignore[attr-defined]


@pytest.mark.gpu
@pytest.mark.parametrize("example", ["decoder_block", "decode_loop"])
def test_launches_continue_the_counters(example: str, cache: Path) -> None:
    """Four runs, fresh inputs each, with no reset between them: every CTA's epoch counts the
    iterations of all four, and every run matches the reference."""
    path = ROOT / "examples" / f"{example}.mlir"
    prog = mk.compile(path, target="cuda", num_sms=16, cache_dir=cache)
    for seed in range(4):
        inputs = random_inputs(prog.func, seed=10 + seed)
        refs = mk.reference(path, *[x.copy() for x in inputs])  # donated inputs change in place
        _assert_close(prog(*inputs), refs)
    assert (_epochs(prog) == 4 * prog.tables.iterations).all()


def _ids_out_of_range(prog: object, seed: int) -> list[np.ndarray]:
    inputs = random_inputs(prog.func, seed=seed)  # type: ignore[attr-defined]
    inputs[0][2] = 1000  # past the table's 1,000 rows
    return inputs


@pytest.mark.gpu
def test_a_failed_run_is_reset_before_the_next(cache: Path) -> None:
    prog = mk.compile(LM_HEAD, target="cuda", num_sms=8, cache_dir=cache)
    with pytest.raises(CudaRunError, match="failed on SM"):
        prog(*_ids_out_of_range(prog, 1))
    for seed in (2, 3):
        inputs = random_inputs(prog.func, seed=seed)
        _assert_close(prog(*inputs), mk.reference(LM_HEAD, *inputs))
    assert (_epochs(prog) == 2 * prog.tables.iterations).all()


@pytest.mark.gpu
def test_a_launch_after_an_unchecked_failure_runs_nothing(cache: Path) -> None:
    import torch

    prog = mk.compile(LM_HEAD, target="cuda", num_sms=8, cache_dir=cache)
    bad = [compiler._to_torch(a).cuda() for a in _ids_out_of_range(prog, 4)]
    prog.launch(*bad)  # type: ignore[attr-defined]
    good = random_inputs(prog.func, seed=5)
    (out,) = prog.launch(*[compiler._to_torch(a).cuda() for a in good])  # type: ignore[attr-defined]
    with pytest.raises(CudaRunError, match="failed on SM"):
        prog.check()  # type: ignore[attr-defined]
    assert (out.cpu().numpy() == np.iinfo(np.int32).min).all()  # the second run ran nothing
    torch.cuda.synchronize()
    _assert_close(prog(*good), mk.reference(LM_HEAD, *good))
