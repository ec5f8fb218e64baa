"""Generic bodies' products of 16-bit floats on tensor cores: more activation rows than the
streamed decode products take (prefill-shaped linears). A loop that only multiplies x and w
rows becomes mk::gpu::wgmma_gemm_tile (or, with MK_CUDA_GEMM=mma, mk::gpu::gemm_tile), any other
2-D matmul of such tiles mk::gpu::mma_tile."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from linear_programs import agrees_with_the_reference, cuda_source, linear_program

import mk
from mk.backends.cuda import build as cuda_build
from mk.models import prefill_program, preset

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
    return re.findall(r"mk::gpu::(mma_tile<\w+>|(?:wgmma_)?gemm_tile<\w+|matmul_tile\b)", src)


@pytest.fixture(params=["wgmma", "mma", "called", "drained", "slots"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The gemm tiles: wgmma through CuTe in a megakernel whose bodies are inlined (the
    default), mma.sync, wgmma in bodies called (MK_CUDA_INLINE_BODIES=0), wgmma draining the
    tensor cores at every chunk (MK_CUDA_GEMM_IN_FLIGHT=0), and wgmma handing its sums over
    register by register rather than through shared memory (MK_CUDA_GEMM_STAGED_SUMS=0); the
    call's prefix."""
    monkeypatch.setenv("MK_CUDA_GEMM", "mma" if request.param == "mma" else "wgmma")
    monkeypatch.setenv("MK_CUDA_INLINE_BODIES", "0" if request.param == "called" else "")
    monkeypatch.setenv("MK_CUDA_GEMM_IN_FLIGHT", "0" if request.param == "drained" else "")
    monkeypatch.setenv("MK_CUDA_GEMM_STAGED_SUMS", "0" if request.param == "slots" else "")
    return "" if request.param == "mma" else "wgmma_"


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("switch", "value", "define"),
    [
        ("MK_CUDA_GEMM_IN_FLIGHT", "0", "MK_WGMMA_DRAIN"),
        ("MK_CUDA_GEMM_STAGED_SUMS", "0", "MK_WGMMA_SLOT_SUMS"),
    ],
)
def test_the_wgmma_tiles_build_switches(
    switch: str, value: str, define: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = linear(256, 1024, 512, "bf16")
    assert define not in cuda_source(text, tmp_path / "a", num_sms=132)
    monkeypatch.setenv(switch, value)
    assert f"#define {define} 1" in cuda_source(text, tmp_path / "b", num_sms=132)


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("dtype", "call"), [("bf16", "gemm_tile<true"), ("f16", "gemm_tile<false")]
)
def test_a_linear_of_many_rows_runs_its_k_loop_on_tensor_cores(
    dtype: str, call: str, engine: str, tmp_path: Path
) -> None:
    src = cuda_source(linear(256, 1024, 512, dtype), tmp_path, num_sms=132)
    assert products(src) == [engine + call]
    assert "load_runs" not in src  # x and w reach shared memory inside gemm_tile only
    assert src == cuda_source(linear(256, 1024, 512, dtype), tmp_path / "again", num_sms=132)
    # CuTe's headers (a long compile) come in only with the wgmma tile.
    assert ('#include "mk/cuda_wgmma_tile.cuh"' in src) == (engine == "wgmma_")


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("norm", [False, True], ids=["plain", "norm"])
def test_linears_sharing_x_and_a_fused_norm_run_in_one_gemm_tile(
    norm: bool, tmp_path: Path
) -> None:
    """Each weight adds its rows (gw.add) and the norm weight scales x in shared memory; Σx²
    goes to the norm's accumulator (norm-rows=0: fused at any row count)."""
    src = cuda_source(linear_program(64, 256, 512, norm, 3), tmp_path, num_sms=132, norm_rows=0)
    assert products(src) == ["wgmma_gemm_tile<true"]
    assert src.count("gw.add(") == 3
    (call,) = re.findall(r"mk::gpu::wgmma_gemm_tile<.*>\((.*)\);", src)
    assert ("nullptr" in call) != norm, call
    assert '#include "mk/cuda_mma_tile.cuh"' in src


@pytest.mark.usefixtures("no_nvcc")
def test_a_gemm_tile_writes_its_sums_whole(tmp_path: Path) -> None:
    """Every sum has one owner in the tile (gw.assign): no zeroing loop before it; the fused
    norm's Σx² (added to by the tile) keeps its own."""
    plain = cuda_source(linear_program(64, 256, 512, False, 2), tmp_path, num_sms=132)
    assert "gw.assign = true;" in plain and "// init" not in plain
    fused = cuda_source(linear_program(64, 256, 512, True, 2), tmp_path, num_sms=132, norm_rows=0)
    assert fused.count("// init") == 1, fused


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
@pytest.mark.parametrize("which", ["wgmma_gemm", "mma", "called", "drained", "slots"])
def test_the_tensor_core_bodies_build_without_spills(
    which: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CuTe's headers (the nvidia-cutlass package) the wgmma tile, else its mma.sync
    stand-in; both within the registers, inlined into the dispatcher or called, the wgmma
    products kept in flight across a chunk's barrier or drained."""
    if which == "called":
        monkeypatch.setenv("MK_CUDA_INLINE_BODIES", "0")
    if which == "drained":
        monkeypatch.setenv("MK_CUDA_GEMM_IN_FLIGHT", "0")
    if which == "slots":
        monkeypatch.setenv("MK_CUDA_GEMM_STAGED_SUMS", "0")
    if which in ("called", "drained", "slots"):
        which = "wgmma_gemm"
    text = linear_program(40, 48, 72, True, 3) if which == "wgmma_gemm" else matmul(96, 40, 200)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, norm_rows=0)  # the norm fused
    assert any(c.startswith(which) for c in products(prog.cuda_source))  # type: ignore[attr-defined]
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


# (m, n, k, dtype): whole 16 x 8 x 16 steps, and ragged edges in every dimension; 999 rows
# take blocks of 111 x 64 on 132 SMs.
SHAPES = [
    (256, 1024, 512, "bf16"),
    (999, 1024, 256, "bf16"),
    (40, 24, 72, "bf16"),
    (100, 200, 300, "f16"),
    (64, 33, 17, "bf16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tensor_core_tiles_match_the_reference(
    shape: tuple[int, int, int, str], engine: str, tmp_path: Path
) -> None:
    text = linear(*shape)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert any(c.startswith(engine + "gemm_tile") for c in products(prog.cuda_source))  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, shape)


# linear_program's (batch, n, k, norm, weights): linears sharing x, with and without a fused
# RMSNorm, one of them with rows that are not 16-byte aligned (k = 100).
PROGRAMS = [(64, 256, 512, True, 1), (64, 256, 512, False, 2), (40, 48, 72, True, 3),
            (48, 40, 100, True, 2)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("norm_rows", [0, 16], ids=["fused", "unfused"])
@pytest.mark.parametrize("shape", PROGRAMS, ids=lambda s: "x".join(map(str, s)))
def test_gemm_tiles_with_norms_and_several_weights_match_the_reference(
    shape: tuple[int, int, int, bool, int], norm_rows: int, engine: str, tmp_path: Path
) -> None:
    """norm-rows=0 fuses the norm into the tile (x·g per chunk); 16, the default, gives these
    rows a norm kernel of their own before it."""
    text = linear_program(*shape)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, norm_rows=norm_rows)
    assert products(prog.cuda_source) == [engine + "gemm_tile<true"]  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, shape)


def residual_linear(m: int, n: int, k: int) -> str:
    """y = r + x·wᵀ, r made by a kernel of its own (a transformer layer's o-projection)."""
    x, w, y = f"tensor<{m}x{k}xbf16>", f"tensor<{n}x{k}xbf16>", f"tensor<{m}x{n}xbf16>"
    return (
        f"func.func @res(%x: {x}, %w: {w}, %a: {y}, %b: {y}) -> {y} {{\n"
        f"  %r = nn.mul %a, %b : ({y}, {y}) -> {y}\n"
        f"  %o = nn.linear %x, %w : ({x}, {w}) -> {y}\n"
        f"  %y = nn.add %r, %o : ({y}, {y}) -> {y}\n  func.return %y : {y}\n}}"
    )


@pytest.mark.usefixtures("no_nvcc")
def test_a_residual_is_loaded_after_the_gemm_tile(engine: str, tmp_path: Path) -> None:
    """The residual's tile does not walk K: the tile runs the loop, the residual loads after."""
    src = cuda_source(residual_linear(111, 256, 512), tmp_path, num_sms=132)
    assert products(src) == [engine + "gemm_tile<true"]
    body = src[src.index("gemm_tile<") :]
    assert "load_runs<" in body[: body.index("return 0;")]


@pytest.mark.usefixtures("no_nvcc")
def test_a_wide_block_shares_its_columns_among_the_heads(tmp_path: Path) -> None:
    """Three heads of many rows (a prefill's q/k/v): at most 128 columns a block in all, here
    32 of each head, which one gemm tile's sums hold, rather than 128 columns of each."""
    src = cuda_source(linear_program(999, 1024, 1024, True, 3), tmp_path, num_sms=132)
    assert re.findall(r"gemm_tile<true, (\d+), (\d+)", src) == [("111", "96")]
    assert len(re.findall(r"gw\.add\([^;]*, 32, ", src)) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(111, 256, 512), (40, 24, 72)], ids=["111x256", "40x24"])
def test_residual_gemm_tiles_match_the_reference(
    shape: tuple[int, int, int], engine: str, tmp_path: Path
) -> None:
    text = residual_linear(*shape)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert products(prog.cuda_source) == [engine + "gemm_tile<true"]  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, shape)


@pytest.mark.gpu
def test_untransposed_tensor_core_tiles_match_the_reference(tmp_path: Path) -> None:
    text = matmul(96, 40, 200)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert "mma_tile<true>" in products(prog.cuda_source)  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, "mm")


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("m", "n", "tile"),
    [(4096, 4096, (128, 128)), (1024, 4096, (128, 128)), (256, 2048, (64, 64)),
     (999, 1024, (111, 64)), (999, 2048, (111, 64)), (999, 4096, (111, 128)),
     (200, 1024, (50, 64)), (1073, 4096, (37, 64)), (1008, 1024, (126, 64)),
     (1024, 1024, (128, 64))],
)  # fmt: skip
def test_blocks_of_many_rows_are_square(
    m: int, n: int, tile: tuple[int, int], tmp_path: Path
) -> None:
    """tile_n 0 sizes decode tiles by waves over the weights; a block of many rows is bound by
    its arithmetic instead (4096 x 4096 took 2048 columns a block before): 128 x 128 where
    that still gives every SM a block, else 128 rows x 64 columns where those do (a prefill's
    o/down projections: 9 x 16 or 9 x 32 blocks of 111 rows; 128 blocks count as every one of
    132 SMs, 1,008 rows' 8 x 16 blocks of 126), else 64 x 64. Rows that no
    divisor cuts into blocks of 65-128 (1,073 = 29 x 37) take 64-row blocks, not one block."""
    src = cuda_source(linear(m, n, 512), tmp_path, num_sms=132)
    ((tm, nt),) = re.findall(r"gemm_tile<true, (\d+), (\d+)", src)
    assert (int(tm), int(nt)) == tile


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("tile_m", "tile_n"), [(128, 64), (64, 128), (128, 128)])
def test_tile_m_and_tile_n_set_a_gemm_tiles_shape(tile_m: int, tile_n: int, tmp_path: Path) -> None:
    prog = mk.compile(
        linear(512, 512, 256), target="cuda", tile_m=tile_m, tile_n=tile_n, cache_dir=tmp_path
    )
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert re.findall(r"gemm_tile<true, (\d+), (\d+)", src) == [(str(tile_m), str(tile_n))]


@pytest.mark.usefixtures("no_nvcc")
def test_a_gemm_tiles_sums_get_the_arenas_shared_memory(engine: str, tmp_path: Path) -> None:
    """A 128 x 128 tile's f32 sums (64 KB) outgrow the arena's usual 48 KB of shared memory;
    decode programs keep those 48 KB."""
    src = cuda_source(linear(4096, 4096, 512), tmp_path, num_sms=132)
    (arena,) = re.findall(r"kArenaBytes = (\d+)", src)
    assert int(arena) >= 128 * 128 * 4
    decode = cuda_source(linear(8, 4096, 512), tmp_path / "decode", num_sms=132)
    assert re.findall(r"kArenaBytes = (\d+)", decode) == [str(48 << 10)]


@pytest.mark.usefixtures("no_nvcc")
def test_wgmma_bodies_are_inlined_leaving_the_megakernel_without_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ptxas serializes the wgmma of a function that makes any call: a program with a wgmma
    tile inlines its bodies and drops the arena's device printf; MK_CUDA_INLINE_BODIES sets it."""

    def inlined(text: str, where: str) -> bool:
        src = cuda_source(text, tmp_path / where, num_sms=132)
        called = "__noinline__ int32_t task_" in src
        assert called != ("__forceinline__ int32_t task_" in src)
        assert called != ("#define MK_NO_DEVICE_PRINTF 1" in src)
        return not called

    monkeypatch.setenv("MK_CUDA_GEMM", "wgmma")
    gemm, decode = linear(256, 1024, 512), linear(8, 4096, 512)
    assert inlined(gemm, "gemm") and not inlined(decode, "decode")
    monkeypatch.setenv("MK_CUDA_INLINE_BODIES", "0")
    assert not inlined(gemm, "gemm0")
    monkeypatch.setenv("MK_CUDA_INLINE_BODIES", "1")
    assert inlined(decode, "decode1")
    monkeypatch.setenv("MK_CUDA_GEMM", "mma")
    monkeypatch.setenv("MK_CUDA_INLINE_BODIES", "")
    assert not inlined(gemm, "mma")
    # Many bodies stay calls (ptxas takes minutes over one function holding them all).
    monkeypatch.setenv("MK_CUDA_GEMM", "wgmma")
    prefill = prefill_program(preset("tiny-qwen3"), 1, 150, 160)
    assert "wgmma_gemm_tile<" in cuda_source(prefill, tmp_path / "prefill", num_sms=132)
    assert not inlined(prefill, "prefill")


@pytest.mark.usefixtures("no_nvcc")
def test_a_tile_past_the_sums_registers_keeps_the_generic_loop(tmp_path: Path) -> None:
    prog = mk.compile(linear(64, 4096, 512), target="cuda", tile_n=4096, cache_dir=tmp_path)
    assert products(prog.cuda_source) == ["mma_tile<true>"]  # type: ignore[attr-defined]


@pytest.mark.skipif(NVCC is None or cuda_build.cute_include_dir() is None, reason="needs CuTe")
@pytest.mark.parametrize("inline", ["", "walk", "gemm"])
def test_a_walk_inlined_whole_keeps_the_wgmma_pipelined(
    inline: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill's many bodies stay calls by default, and ptxas serializes their wgmma (C7510);
    MK_CUDA_INLINE_BODIES=walk inlines the bodies, the tiles, `run` and the task runner, and
    the megakernel makes no call at all; `gemm` inlines the same around the wgmma bodies only,
    the others staying calls that no wgmma crosses."""
    monkeypatch.setenv("MK_CUDA_INLINE_BODIES", inline)
    prog = mk.compile(
        prefill_program(preset("tiny-qwen3"), 1, 150, 160), target="cuda", cache_dir=tmp_path
    )
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert ("#define MK_INLINE_WALK 1" in src) == (inline != "")
    assert ("__forceinline__ int32_t run(" in src) == (inline != "")
    if inline == "gemm":
        bodies = re.findall(r"__(force|no)inline__ int32_t (task_\w+)\(", src)
        assert {how for how, _ in bodies} == {"force", "no"}
        for how, name in bodies:  # exactly the bodies that run a wgmma tile are inlined
            body = src[src.index(f"int32_t {name}(") :].split("\n}\n", 1)[0]
            assert ("wgmma_gemm_tile<" in body) == (how == "force"), name
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and used.wgmma_serialized == (inline == ""), used


def prefill_attention(s: int, heads: int = 4, d: int = 64) -> str:
    t = f"tensor<1x{heads}x{s}x{d}xbf16>"
    return (
        f"func.func @pa(%q: {t}, %k: {t}, %v: {t}) -> {t} {{\n"
        f"  %o = nn.attention %q, %k, %v {{scale = 0.125 : f32, causal = true}} : "
        f"({t}, {t}, {t}) -> {t}\n  func.return %o : {t}\n}}"
    )


@pytest.mark.usefixtures("no_nvcc")
def test_prefill_attention_runs_on_tensor_cores(tmp_path: Path) -> None:
    """A block of queries against all keys is one block_attention call, not tile products."""
    src = cuda_source(prefill_attention(128), tmp_path)
    assert "mk::gpu::block_attention<" in src and not products(src)


@pytest.mark.gpu
@pytest.mark.parametrize("s", [128, 72])
def test_prefill_attention_matches_the_reference(s: int, tmp_path: Path) -> None:
    text = prefill_attention(s)
    agrees_with_the_reference(mk.compile(text, target="cuda", cache_dir=tmp_path), text, s)


def test_cute_headers_come_from_the_environment_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$CUTLASS_INCLUDE_DIR wins where it holds CuTe; a directory without it is passed over."""
    (tmp_path / "cute").mkdir()
    (tmp_path / "cute" / "tensor.hpp").write_text("// stand-in\n")
    monkeypatch.setenv("CUTLASS_INCLUDE_DIR", str(tmp_path))
    assert cuda_build.cute_include_dir() == tmp_path
    monkeypatch.setenv("CUTLASS_INCLUDE_DIR", str(tmp_path / "cute"))
    assert cuda_build.cute_include_dir() != tmp_path / "cute"


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_without_cute_the_wgmma_call_builds_as_mma_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No CuTe headers found: the same source builds (the mma.sync tile in the call's place),
    under another cache key than a build with CuTe."""
    text = linear(64, 64, 128)
    with_cute = cuda_build.cute_include_dir()
    monkeypatch.setattr(cuda_build, "cute_include_dir", lambda: None)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert products(src) == ["wgmma_gemm_tile<true"]
    assert prog.cuda_resources is not None  # type: ignore[attr-defined]
    if with_cute is not None:
        key = cuda_build.library_key(src, NVCC)  # type: ignore[arg-type]
        monkeypatch.setattr(cuda_build, "cute_include_dir", lambda: with_cute)
        assert cuda_build.library_key(src, NVCC) != key  # type: ignore[arg-type]


@pytest.mark.gpu
def test_the_gemm_bench_names_its_tile_and_matches_pytorch() -> None:
    """bench/gemm.py's row for one small shape: the tile the build took, and mk's error."""
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[2] / "bench" / "gemm.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--runs", "50", "--shapes", "256x256x512"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("| 256x256x512")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "`wgmma_gemm_tile<true, 64, 64, 4>`", row
    assert float(cells[-1]) <= 2e-2, row
