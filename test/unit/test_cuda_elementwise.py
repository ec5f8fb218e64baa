"""The CUDA emitter's static index arithmetic against NumPy's broadcasting and indexing."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from mk.backends.cuda.elementwise import Runs, box_runs, element_offset, flat_offset


def _eval(expr: str, e: int) -> int:
    """Evaluate an emitted C++ offset expression (unsigned 32-bit arithmetic) for element e."""
    python = re.sub(r"(\d+)u\b", r"\1", expr).replace("/", "//")
    return int(eval(python, {}, {"e": e}))


def _operand_shape(rng: np.random.Generator, out: tuple[int, ...]) -> tuple[int, ...]:
    rank = int(rng.integers(0, len(out) + 1))
    tail = out[len(out) - rank :]
    return tuple(1 if rng.random() < 0.4 else d for d in tail)


@pytest.mark.parametrize("seed", range(40))
def test_element_offset_matches_numpy_broadcasting(seed: int) -> None:
    rng = np.random.default_rng(seed)
    out = tuple(int(d) for d in rng.integers(1, 5, size=int(rng.integers(1, 5))))
    shape = _operand_shape(rng, out)
    values = np.arange(math.prod(shape)).reshape(shape)
    expected = np.broadcast_to(values, out).reshape(-1)
    expr = element_offset(out, shape)
    got = [_eval(expr, e) for e in range(math.prod(out))]
    assert got == expected.tolist(), (out, shape, expr)


def test_element_offset_simple_forms() -> None:
    assert element_offset((1, 16), (1, 16)) == "e"
    assert element_offset((1, 16), (1, 1)) == "0"
    assert element_offset((1, 16), ()) == "0"
    assert element_offset((4, 8), (8,)) == "(e) % 8u"
    assert element_offset((4, 8), (4, 1)) == "e / 8u"


@pytest.mark.parametrize("seed", range(40))
def test_box_runs_address_the_box(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    full = tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(1, 5))))
    box = tuple(int(rng.integers(1, d + 1)) for d in full)
    start = [int(rng.integers(0, f - b + 1)) for f, b in zip(full, box, strict=True)]
    index = np.arange(math.prod(full)).reshape(full)
    expected = index[tuple(slice(s, s + b) for s, b in zip(start, box, strict=True))].reshape(-1)
    runs = box_runs(full, box)
    if runs is None:
        assert sum(b > 1 for b in box) >= 2  # only boxes with several partial outer dims
        return
    first = _eval(flat_offset(full, [str(s) for s in start]), 0)
    got = [first + (e // runs.cols) * runs.ld + e % runs.cols for e in range(runs.rows * runs.cols)]
    assert got == expected.tolist(), (full, box, start, runs)


def test_box_runs_forms() -> None:
    assert box_runs((1, 2048), (1, 16)) == box_runs((2048,), (16,))
    runs = box_runs((8, 32, 128), (8, 1, 128))
    assert runs is not None and (runs.rows, runs.cols, runs.ld) == (8, 128, 32 * 128)
    assert box_runs((4, 8, 16), (2, 2, 16)) == Runs(2, 32, 128)
    assert box_runs((4, 8, 16), (2, 2, 8)) is None
    assert flat_offset((4, 8), ["0", "8 * bx"]) == "(8 * bx)"
