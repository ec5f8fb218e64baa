"""Decode attention programs and the reference check, shared by the CUDA attention and merge
test files."""

from __future__ import annotations

import numpy as np

import mk
from mk import compiler
from mk.inputs import random_inputs


def attention(
    b: int, hq: int, hkv: int, seq: int, d: int, *, dtype: str = "bf16", kv_len: bool = True,
    causal: bool = False, sq: int = 1, shared_kv: bool = False,
) -> str:  # fmt: skip
    """One nn.attention; with `shared_kv` its keys and values are one argument, %kv."""
    q = f"tensor<{b}x{hq}x{sq}x{d}x{dtype}>"
    kv = f"tensor<{b}x{hkv}x{seq}x{d}x{dtype}>"
    lens = f", %kv_len: tensor<{b}xi32>" if kv_len else ""
    operands = ("%q, %kv, %kv" if shared_kv else "%q, %k, %v") + (", %kv_len" if kv_len else "")
    types = f"{q}, {kv}, {kv}" + (f", tensor<{b}xi32>" if kv_len else "")
    flag = "true" if causal else "false"
    args = f"%kv: {kv}" if shared_kv else f"%k: {kv}, %v: {kv}"
    return (
        f"func.func @att(%q: {q}, {args}{lens}) -> {q} {{\n"
        f"  %o = nn.attention {operands} {{scale = {d**-0.5!r} : f32, causal = {flag}}} : "
        f"({types}) -> {q}\n"
        f"  func.return %o : {q}\n}}"
    )


def attention_oproj(hq: int, hkv: int, seq: int, d: int, n: int, batch: int = 1) -> str:
    """Decode attention whose merged heads feed a linear and a residual add."""
    k, b = hq * d, batch
    q, kv = f"tensor<{b}x{hq}x1x{d}xbf16>", f"tensor<{b}x{hkv}x{seq}x{d}xbf16>"
    rows_k, rows_n = f"tensor<{b}x{k}xbf16>", f"tensor<{b}x{n}xbf16>"
    return (
        f"func.func @attn_oproj(%q: {rows_k}, %k: {kv}, %v: {kv}, "
        f"%len: tensor<{b}xi32>, %wo: tensor<{n}x{k}xbf16>, %x: {rows_n}) -> {rows_n} {{\n"
        f"  %q4 = nn.reshape %q : ({rows_k}) -> {q}\n"
        f"  %att = nn.attention %q4, %k, %v, %len {{scale = {d**-0.5!r} : f32, causal = false}}"
        f" : ({q}, {kv}, {kv}, tensor<{b}xi32>) -> {q}\n"
        f"  %att2 = nn.reshape %att : ({q}) -> {rows_k}\n"
        f"  %o = nn.linear %att2, %wo : ({rows_k}, tensor<{n}x{k}xbf16>) -> {rows_n}\n"
        f"  %r = nn.add %x, %o : ({rows_n}, {rows_n}) -> {rows_n}\n"
        f"  func.return %r : {rows_n}\n}}"
    )


def matches_the_reference(prog: object, text: str, label: object) -> None:
    """prog's output within the tolerance of mk.reference's, on two fresh random inputs."""
    for seed in (0, 1):
        inputs = random_inputs(prog.func, seed=seed)  # type: ignore[attr-defined]
        (out,) = prog(*inputs)  # type: ignore[operator]
        (ref,) = mk.reference(text, *inputs)
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound, (label, seed, error)
