"""Generic bodies' 2-D matmuls of 16-bit floats on tensor cores (mk::gpu::mma_tile): more
activation rows than the streamed decode products take (prefill-shaped linears)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from linear_programs import agrees_with_the_reference, cuda_source

import mk
from mk.backends.cuda import build as cuda_build

NVCC = cuda_build.nvcc()


def linear(m: int, n: int, k: int, dtype: str = "bf16") -> str:
    x, w, y = f"tensor<{m}x{k}x{dtype}>", f"tensor<{n}x{k}x{dtype}>", f"tensor<{m}x{n}x{dtype}>"
    return (
        f"func.func @big(%x: {x}, %w: {w}) -> {y} {{\n"
        f"  %y = nn.linear %x, %w : ({x}, {w}) -> {y}\n  func.return %y : {y}\n}}"
    )


def matmul(m: int, n: int, k: int) -> str:
    a, b, y = f"tensor<{m}x{k}xbf16>", f"tensor<{k}x{n}xbf16>", f"tensor<{m}x{n}xbf16>"
    return (
        f"func.func @mm(%a: {a}, %b: {b}) -> {y} {{\n"
        f"  %y = nn.matmul %a, %b : ({a}, {b}) -> {y}\n  func.return %y : {y}\n}}"
    )


def products(src: str) -> list[str]:
    return re.findall(r"mk::gpu::(mma_tile<\w+>|matmul_tile)\(", src)


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("dtype", "call"), [("bf16", "mma_tile<true>"), ("f16", "mma_tile<false>")]
)
def test_many_rows_of_16_bit_floats_run_on_tensor_cores(
    dtype: str, call: str, tmp_path: Path
) -> None:
    src = cuda_source(linear(256, 1024, 512, dtype), tmp_path, num_sms=132)
    assert products(src) == [call]
    assert '#include "mk/cuda_mma_tile.cuh"' in src
    assert src == cuda_source(linear(256, 1024, 512, dtype), tmp_path / "again", num_sms=132)


@pytest.mark.usefixtures("no_nvcc")
def test_f32_operands_keep_the_exact_product(tmp_path: Path) -> None:
    """mma_tile packs its operands into 16-bit pairs: f32 tiles keep matmul_tile."""
    assert products(cuda_source(linear(64, 256, 128, "f32"), tmp_path)) == ["matmul_tile"]


@pytest.mark.usefixtures("no_nvcc")
def test_an_untransposed_matmul_passes_its_layout(tmp_path: Path) -> None:
    src = cuda_source(matmul(64, 96, 128), tmp_path)
    calls = re.findall(r"mk::gpu::mma_tile<true>\((.*)\);", src)
    assert calls and all(c.endswith(", false") for c in calls), calls


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_the_tensor_core_tile_builds_without_spills(tmp_path: Path) -> None:
    prog = mk.compile(linear(256, 1024, 512), target="cuda", cache_dir=tmp_path)
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


# (m, n, k, dtype): whole 16 x 8 x 16 steps, and ragged edges in every dimension.
SHAPES = [
    (256, 1024, 512, "bf16"),
    (40, 24, 72, "bf16"),
    (100, 200, 300, "f16"),
    (64, 33, 17, "bf16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tensor_core_tiles_match_the_reference(
    shape: tuple[int, int, int, str], tmp_path: Path
) -> None:
    text = linear(*shape)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert any(c.startswith("mma_tile") for c in products(prog.cuda_source))  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, shape)


@pytest.mark.gpu
def test_untransposed_tensor_core_tiles_match_the_reference(tmp_path: Path) -> None:
    text = matmul(96, 40, 200)
    agrees_with_the_reference(mk.compile(text, target="cuda", cache_dir=tmp_path), text, "mm")
