"""Sized per-row norm and RoPE device calls (backends/cuda/row_ops.py): when the CUDA emitter
uses them instead of the generic library calls."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from xdsl.dialects.builtin import TensorType, f32
from xdsl.ir import Block, SSAValue

import mk
from mk.backends.cuda.row_ops import rms_norm_rows, rope_rows
from mk.dialects.mugraph_tiles import RMSNormOp, RopeOp
from mk.models import decode_program, prefill_program, preset


def _args(*shapes: tuple[int, ...]) -> Block:
    return Block(arg_types=[TensorType(f32, s) for s in shapes])


def _namer(block: Block) -> Callable[[SSAValue], str]:
    """Block arguments are a0, a1, ...; anything else (the op's result) is r."""
    names = {arg: f"a{i}" for i, arg in enumerate(block.args)}
    return lambda value: names.get(value, "r")


@pytest.mark.parametrize(
    ("x", "g", "sized"),
    [
        ((1, 1, 1, 128), (128,), True),  # one head of QK-norm
        ((8, 64), (64,), True),  # a row per warp
        ((9, 64), (64,), True),  # more rows than warps: the warps walk them
        ((1, 1, 37, 128), (128,), True),  # a prefill's block of QK-norm rows
        ((2, 48), (48,), False),  # not a multiple of 32
        ((1, 32), (32,), True),  # one element per lane
        ((1, 16), (16,), False),
    ],
)
def test_rms_norm_rows_takes_short_row_sets(
    x: tuple[int, ...], g: tuple[int, ...], sized: bool
) -> None:
    b = _args(x, g)
    name = _namer(b)
    line = rms_norm_rows(RMSNormOp(b.args[0], b.args[1], 1e-5), name, name)
    assert (line is not None) == sized
    if line is not None:
        rows = math.prod(x[:-1])
        many = ", true" if rows > 8 else ""
        assert line == f"mk::gpu::rms_norm_rows<{x[-1]}{many}>(r, a0, a1, {rows}, 1e-05f);"


@pytest.mark.parametrize(
    ("x", "cos", "sized"),
    [
        ((1, 1, 1, 128), (1, 64), True),  # one position for every head
        ((4, 128), (64,), True),
        ((4, 128), (4, 64), True),  # a position per row
        ((1, 2, 37, 128), (37, 64), True),  # a prefill's block: two heads of 37 positions
        ((4, 128), (2, 64), False),  # positions that are not x's rows: the broadcast walk
        ((2, 4, 128), (2, 4, 64), False),  # a table per head too
        ((1, 7), (1, 3), False),  # odd width
    ],
)
def test_rope_rows_takes_shared_or_per_position_tables(
    x: tuple[int, ...], cos: tuple[int, ...], sized: bool
) -> None:
    b = _args(x, cos, cos)
    name = _namer(b)
    line = rope_rows(RopeOp(b.args[0], b.args[1], b.args[2]), name, name)
    assert (line is not None) == sized
    if line is not None:
        rows = math.prod(x[:-1])
        if math.prod(cos) == x[-1] // 2:
            assert line == f"mk::gpu::rope_rows<{x[-1]}>(r, a0, a1, a2, {rows});"
        else:
            want = f"mk::gpu::rope_rows<{x[-1]}, true>(r, a0, a1, a2, {rows}, {x[-2]});"
            assert line == want


@pytest.mark.usefixtures("no_nvcc")
def test_qk_norm_and_rope_are_sized_calls(tmp_path: Path) -> None:
    """A Qwen3 step's per-head norm and RoPE become the sized calls: no generic call left."""
    program = decode_program(preset("tiny-qwen3"), 1, 32, 1)
    text = mk.compile(program, target="cuda", cache_dir=tmp_path).cuda_source or ""
    assert "mk::gpu::rms_norm_rows<" in text and "mk::gpu::rope_rows<" in text
    assert "mk::gpu::rms_norm_tile(" not in text and "mk::gpu::lib_rope(" not in text


@pytest.mark.usefixtures("no_nvcc")
def test_a_prefills_qk_norm_and_rope_are_sized_calls(tmp_path: Path) -> None:
    """A Qwen3 prefill's blocks of rows: the warps walk the norm's rows, the RoPE reads a table
    row per position."""
    program = prefill_program(preset("tiny-qwen3"), 1, 150, 160)
    text = mk.compile(program, target="cuda", cache_dir=tmp_path).cuda_source or ""
    calls = re.findall(r"mk::gpu::rms_norm_rows<(\d+)(, true)?>\([^;]*, (\d+), [^,;]*\);", text)
    assert any(many for _, many, _ in calls), calls  # the QK-norm's blocks of 50 rows
    assert all(bool(many) == (int(rows) > 8) for _, many, rows in calls), calls
    assert "true>(" in text.split("mk::gpu::rope_rows<", 1)[1].split(";", 1)[0]
    assert "mk::gpu::lib_rope(" not in text  # (the final norm, a library kernel, stays generic)
