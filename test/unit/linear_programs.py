"""Decode-shaped linear programs and what the stream tests ask of them, shared by the CUDA
stream and tensor-core test files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import mk
from mk import compiler
from mk.dialects import make_context
from mk.dialects.mugraph import GraphDefOp
from mk.inputs import random_inputs
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import load_module


def graph_defs(path: Path | str, **options: int) -> dict[str, GraphDefOp]:
    text = path.read_text() if isinstance(path, Path) else path
    module = load_module(text)
    NnToMugraphPass(**options).apply(make_context(), module)
    return {op.results[0].name_hint or "": op for op in module.walk() if isinstance(op, GraphDefOp)}


def linear_program(b: int, n: int, k: int, norm: bool, heads: int = 1, dtype: str = "bf16") -> str:
    x, y = f"tensor<{b}x{k}x{dtype}>", f"tensor<{b}x{n}x{dtype}>"
    w, gt = f"tensor<{n}x{k}x{dtype}>", f"tensor<{k}x{dtype}>"
    args = [f"%x: {x}", f"%g: {gt}"] + [f"%w{i}: {w}" for i in range(heads)]
    body = []
    h = "%x"
    if norm:
        body.append(f"%h = nn.rms_norm %x, %g {{epsilon = 1.0e-05 : f32}} : ({x}, {gt}) -> {x}")
        h = "%h"
    outs = []
    for i in range(heads):
        body.append(f"%y{i} = nn.linear {h}, %w{i} : ({x}, {w}) -> {y}")
        outs.append(f"%y{i}")
    if not norm:
        body.append(f"%s = nn.mul %g, %g : ({gt}, {gt}) -> {gt}")
        outs.append("%s")
        types = ", ".join([y] * heads + [gt])
    else:
        types = ", ".join([y] * heads)
    lines = "\n  ".join(body)
    return (
        f"func.func @lin({', '.join(args)}) -> ({types}) {{\n  {lines}\n"
        f"  func.return {', '.join(outs)} : {types}\n}}"
    )


def cuda_source(text: str, cache: Path, num_sms: int = 8, **options: int) -> str:
    """The emitted megakernel of `text` under the current build switches and pass options."""
    prog = mk.compile(text, target="cuda", num_sms=num_sms, cache_dir=cache, **options)
    return prog.cuda_source  # type: ignore[attr-defined]


def agrees_with_the_reference(prog: Any, text: str, label: object) -> None:
    """The program's outputs against mk.reference on two seeds' random inputs."""
    for seed in (0, 1):
        inputs = random_inputs(prog.func, seed=seed)
        for out, ref in zip(prog(*inputs), mk.reference(text, *inputs), strict=True):
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound, (label, seed, error)
