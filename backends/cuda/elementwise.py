"""Index arithmetic resolved when the CUDA source is emitted: element offsets and box runs.

A task body's tiles have static shapes, so how an operand is read from an output element's
index, and where a box lies in its buffer, are known before nvcc runs. Emitting them as
constant expressions keeps the device from building shape arrays in local memory and running
division chains per element: in a decode step, each of those cost a task microseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def broadcast_strides(shape: Sequence[int], out: Sequence[int]) -> list[int]:
    """Strides of a row-major `shape` broadcast (right-aligned) against `out`: 0 where it is 1."""
    strides = [0] * len(out)
    stride, lead = 1, len(out) - len(shape)
    for d in range(len(out) - 1, -1, -1):
        di = d - lead
        if di < 0:
            continue
        strides[d] = 0 if shape[di] == 1 else stride
        stride *= shape[di]
    return strides


def element_offset(out: Sequence[int], shape: Sequence[int], e: str = "e") -> str:
    """A C++ expression of the 32-bit element index `e` of `out`: the offset of the element of
    an operand of `shape` (broadcast against `out`) that it reads."""
    strides = broadcast_strides(shape, out)
    live = [d for d in range(len(out)) if out[d] > 1 and strides[d] != 0]
    if not live:
        return "0"
    dense = [math.prod(out[d + 1 :]) for d in range(len(out))]
    if all(strides[d] == dense[d] for d in live) and math.prod(shape) == math.prod(out):
        return e
    terms = []
    for d in live:
        index = e if dense[d] == 1 else f"{e} / {dense[d]}u"
        if math.prod(out[:d]) > 1:
            index = f"({index}) % {out[d]}u"
        terms.append(index if strides[d] == 1 else f"({index}) * {strides[d]}u")
    return " + ".join(terms)


@dataclass(frozen=True)
class Runs:
    """A box of a row-major buffer as `rows` runs of `cols` contiguous elements, `ld` apart."""

    rows: int
    cols: int
    ld: int


def box_runs(full: Sequence[int], box: Sequence[int]) -> Runs | None:
    """The box as runs, or None when its elements need more than two levels (several partial
    dimensions outside the innermost run)."""
    strides = [math.prod(full[d + 1 :]) for d in range(len(full))]
    cols, d = 1, len(full) - 1
    while d >= 0 and box[d] == full[d]:
        cols *= box[d]
        d -= 1
    if d >= 0:
        cols *= box[d]
        d -= 1
    outer = [k for k in range(d + 1) if box[k] > 1]
    if len(outer) > 1:
        return None
    if not outer:
        return Runs(1, cols, cols)
    return Runs(box[outer[0]], cols, strides[outer[0]])


def flat_offset(full: Sequence[int], starts: Sequence[str]) -> str:
    """The element offset of a box's first element from its per-dimension start expressions."""
    strides = [math.prod(full[d + 1 :]) for d in range(len(full))]
    terms = [
        f"({s}) * {n}" if n != 1 else f"({s})"
        for s, n in zip(starts, strides, strict=True)
        if s != "0"
    ]
    return " + ".join(terms) if terms else "0"
