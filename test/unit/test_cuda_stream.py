"""Decode-shaped linears on the GPU: the streamed plan, wave-fitted tiles, byte copies, launch."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from linear_programs import agrees_with_the_reference, cuda_source, graph_defs, linear_program

import mk
from mk import compiler
from mk.backends.cuda import build as cuda_build
from mk.backends.cuda.stream import plan_stream
from mk.inputs import random_inputs
from mk.models.config import PRESETS
from mk.passes.nn_to_mugraph_groups import _wave_blocks

ROOT = Path(__file__).resolve().parents[2]
NVCC = cuda_build.nvcc()  # before any test patches it out


# --------------------------------------------------------------------------- no GPU needed


def test_every_linear_of_the_llama_block_streams() -> None:
    kernels = graph_defs(ROOT / "examples/llama3_8b_block.mlir", tile_n=0)
    streamed = {name for name, op in kernels.items() if plan_stream(op) is not None}
    assert streamed == {"q", "r", "m", "y"}, streamed
    plan = plan_stream(kernels["q"])
    assert plan is not None and plan.rows == 1 and len(plan.products) == 3
    assert plan.g is not None and plan.sum_sq is not None
    down = plan_stream(kernels["y"])
    assert down is not None and down.g is None and len(down.invariant) == 1  # the residual


def test_attention_and_merge_do_not_stream() -> None:
    kernels = graph_defs(ROOT / "examples/attention_decode.mlir")
    assert kernels and all(plan_stream(op) is None for op in kernels.values())


@pytest.mark.parametrize(
    ("common", "widest", "rows", "sms", "blocks"),
    [(4096, 4096, 1, 132, 128), (14336, 14336, 1, 132, 128), (1024, 1024, 1, 132, 128),
     (12288, 12288, 1, 132, 128), (64, 64, 1, 132, 8), (1024, 1024, 1, 8, 8), (24, 24, 1, 132, 3)],
)  # fmt: skip
def test_wave_fitted_column_blocks(
    common: int, widest: int, rows: int, sms: int, blocks: int
) -> None:
    assert _wave_blocks(common, widest, rows, sms) == blocks


def test_wave_fitted_tiles_agree_with_the_reference(tmp_path: Path) -> None:
    text = linear_program(3, 96, 128, norm=True, heads=2)
    prog = mk.compile(text, num_sms=5, tile_n=0, cache_dir=tmp_path)
    inputs = random_inputs(prog.func, seed=3)
    for out, ref in zip(prog(*inputs), mk.reference(text, *inputs), strict=True):
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound


@pytest.mark.usefixtures("no_nvcc")
def test_emitted_source_streams_and_copies(tmp_path: Path) -> None:
    # Unfolded (attention_fold=0): K's RoPE blocks write the cache; the folded default is
    # test_attention_fold.py's.
    prog = mk.compile(
        ROOT / "examples/llama3_8b_block.mlir", target="cuda", cache_dir=tmp_path, attention_fold=0
    )
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::stream_linear<1, ") == 4
    # No reshape copy: q's and k's head views are read through by their RoPE blocks, v's by its
    # cache write. K's RoPE blocks write their rows into the cache in place; V's write is the
    # library's (no concat).
    assert src.count("mk::gpu::concat_runs(") == 0
    assert src.count("mk::gpu::cache_write_bytes(") == 1
    calls = re.findall(r"return (task_\w+_[kv]_cache)\(", src)
    assert len(calls) == 2 and len(set(calls)) == 2
    assert re.search(r"if \(static_cast<int64_t>\(\w+\[0\]\) < 0 \|\| .* > 1024\) return 1;", src)
    assert "static constexpr unsigned kSmemBytes = " in src


# --------------------------------------------------------------------------- on the GPU

SHAPES = [
    (1, 200, 776, True, 1),
    (3, 64, 1024, False, 2),
    (16, 48, 512, True, 3),
    (5, 40, 100, True, 1),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_streamed_linears_match_the_reference(
    shape: tuple[int, int, int, bool, int], tmp_path: Path
) -> None:
    """On the GPU, weights streamed from global memory."""
    text = linear_program(*shape)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    agrees_with_the_reference(prog, text, shape)


# Raw activations on tensor cores (no norm: x is the mma operand as it is), in several chunks
# that mk::gpu::mma_raw_chunks copies ahead: (batch, n, k, norm, weights) and the chunk.
RAW_CHUNKS = [((8, 64, 12288, False, 1), 5120), ((2, 48, 40960, False, 2), 20480),
              ((16, 32, 7168, False, 1), 2560)]  # fmt: skip


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("shape", "kc"), RAW_CHUNKS, ids=[f"{s[0]}x{s[2]}" for s, _ in RAW_CHUNKS])
def test_raw_activations_take_several_chunks(
    shape: tuple[int, int, int, bool, int],
    kc: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MK_CUDA_MMA_RING", "0")  # the chunk as large as shared memory allows
    monkeypatch.setenv("MK_CUDA_WIDE_ROOM", "0")  # in the usual room
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", "0")  # K slices would take no chunks at all
    src = cuda_source(linear_program(*shape), tmp_path)
    assert f"sl.k = {shape[2]};" in src and f"sl.kc = {kc};" in src
    assert f"mk::gpu::stream_linear<{shape[0]}, " in src and ", true>(sl)) return" in src  # Mma


# Every K of a preset's linears (hidden, intermediate, heads x head dim).
PRESET_KS = sorted({k for c in PRESETS.values() for k in (c.hidden, c.intermediate, c.heads * c.head_dim)})  # fmt: skip


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("norm", [False, True], ids=["raw", "norm"])
@pytest.mark.parametrize("k", PRESET_KS)
def test_chunk_rows_start_on_128_bytes(k: int, norm: bool, tmp_path: Path) -> None:
    """A tensor-core chunk's row m lands at m * kc * 2 bytes from the dynamic shared memory's
    start (on 128 B, MK_CUDA_SMEM_ALIGN), by bulk copies where the activation is raw. Rows off
    128 B made the gated MLP at batch 8 9 % slower on the H100 (session 68, the start itself
    off), so every preset's K must give chunks of whole 64-column runs."""
    src = cuda_source(linear_program(8, 64, k, norm=norm), tmp_path)
    assert "mk::gpu::stream_linear<8, " in src, "not a streamed batch-8 linear"
    chunks = [int(c) for c in re.findall(r"sl\.kc = (\d+);", src)]
    assert chunks and all(kc * 2 % 128 == 0 for kc in chunks), chunks


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "kc"), RAW_CHUNKS, ids=[f"{s[0]}x{s[2]}" for s, _ in RAW_CHUNKS])
def test_raw_activation_chunks_match_the_reference(
    shape: tuple[int, int, int, bool, int], kc: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_MMA_SLICE", "0")  # the chunks, not K slices
    text = linear_program(*shape)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    agrees_with_the_reference(prog, text, (shape, kc))


@pytest.mark.gpu
def test_launch_into_given_outputs_then_check(tmp_path: Path) -> None:
    import torch

    text = linear_program(2, 64, 256, True)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    inputs = random_inputs(prog.func, seed=5)
    tensors = [compiler._to_torch(a).cuda() for a in inputs]
    (out,) = prog.launch(*tensors)  # type: ignore[attr-defined]
    given = torch.full_like(out, float("nan"))
    (same,) = prog.launch(*tensors, out=[given])  # type: ignore[attr-defined]
    prog.check()  # type: ignore[attr-defined]
    assert same is given and torch.equal(out, given)
    (ref,) = mk.reference(text, *inputs)
    error, bound = compiler.output_error(compiler._from_torch(given), np.asarray(ref))
    assert error <= bound
    with pytest.raises(ValueError, match="out #0"):
        prog.launch(*tensors, out=[given[:1]])  # type: ignore[attr-defined]


@pytest.mark.usefixtures("no_nvcc")
def test_loads_in_flight_is_a_build_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MK_CUDA_LOADS sets the 16-byte loads a lane keeps in flight: a task of 8 rows per warp
    over 1,024 columns streams them in one batch of 32 instead of two of 16."""
    text = linear_program(1, 1024, 1024, norm=True)
    assert "mk::gpu::stream_linear<1, 8, 2, 1, false>" in cuda_source(text, tmp_path, 16)
    monkeypatch.setenv("MK_CUDA_LOADS", "32")
    assert "mk::gpu::stream_linear<1, 8, 4, 1, false>" in cuda_source(text, tmp_path, 16)
    monkeypatch.setenv("MK_CUDA_LOADS", "0")
    with pytest.raises(mk.MkError, match="MK_CUDA_LOADS must be a number of loads from 1 to 64"):
        cuda_source(text, tmp_path, 16)


def layers_program(layers: int, k: int, batch: int = 1) -> str:
    """`layers` norm + linear layers of [k, k] (the same body on other buffers), then a linear
    of [2k, k] that runs once, on `batch` activation rows."""
    x, w, g = f"tensor<{batch}x{k}xbf16>", f"tensor<{k}x{k}xbf16>", f"tensor<{k}xbf16>"
    args = ["%x0: " + x] + [f"%g{i}: {g}, %w{i}: {w}" for i in range(layers)]
    args.append(f"%head: tensor<{2 * k}x{k}xbf16>")
    body = []
    for i in range(layers):
        body.append(
            f"%h{i} = nn.rms_norm %x{i}, %g{i} {{epsilon = 1.0e-05 : f32}} : ({x}, {g}) -> {x}"
        )
        body.append(f"%x{i + 1} = nn.linear %h{i}, %w{i} : ({x}, {w}) -> {x}")
    out = f"tensor<{batch}x{2 * k}xbf16>"
    head = f"tensor<{2 * k}x{k}xbf16>"
    body.append(f"%y = nn.linear %x{layers}, %head : ({x}, {head}) -> {out}")
    lines = "\n  ".join(body)
    return (
        f"func.func @layers({', '.join(args)}) -> {out} {{\n  {lines}\n  func.return %y : {out}\n}}"
    )


@pytest.mark.usefixtures("no_nvcc")
def test_repeated_bodies_take_the_layer_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bodies that several grids share (a model's layers) keep MK_CUDA_LAYER_LOADS' loads in
    flight and the others MK_CUDA_LOADS': with 8, a layer's 1,024-column rows stream one
    256-column step at a time, the last linear's two; with 0 the layers take two as well."""
    text = layers_program(3, 1024)
    monkeypatch.setenv("MK_CUDA_LAYER_LOADS", "8")
    bodies = re.split(r"\n(?=// task.grid)", cuda_source(text, tmp_path, 16))
    layer = [b for b in bodies if "and 2 more grid(s)" in b]
    once = [b for b in bodies if b.startswith("// task.grid") and "more grid(s)" not in b]
    assert len(layer) == 1 and "stream_linear<1, 8, 1, 1, false>" in layer[0]
    assert "stream_linear<1, 8, 2" not in layer[0]
    assert any("stream_linear<1, 8, 2, 1, false>" in b for b in once)
    monkeypatch.setenv("MK_CUDA_LAYER_LOADS", "0")
    assert set(re.findall(r"mk::gpu::stream_linear<[^>]*>", cuda_source(text, tmp_path, 16))) == {
        "mk::gpu::stream_linear<1, 8, 2, 1, false>"
    }
    monkeypatch.setenv("MK_CUDA_LAYER_LOADS", "65")
    with pytest.raises(
        mk.MkError, match="MK_CUDA_LAYER_LOADS must be a number of loads from 0 to 64"
    ):
        cuda_source(text, tmp_path, 16)


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("batch", "default"), [(1, 16), (2, 8), (8, 8)])
def test_layer_loads_default_by_batch(
    batch: int, default: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unless MK_CUDA_LAYER_LOADS says, a layer's body of one activation row keeps 16 loads in
    flight and one of more rows 8: the default build is the build with that count set, and not
    the build with the other."""
    text = layers_program(3, 1024, batch)
    built = cuda_source(text, tmp_path, 16)
    other = 24 - default
    monkeypatch.setenv("MK_CUDA_LAYER_LOADS", str(default))
    assert cuda_source(text, tmp_path, 16) == built
    monkeypatch.setenv("MK_CUDA_LAYER_LOADS", str(other))
    assert cuda_source(text, tmp_path, 16) != built


def sums_as_the_default(
    name: str, value: str, sms: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    """A 3-layer stack's outputs with the build switch `name`=`value` are bit-identical to the
    default build's and agree with the reference; the two builds' sources."""
    text = layers_program(3, 1024)
    plain = mk.compile(text, target="cuda", num_sms=sms, cache_dir=tmp_path)
    inputs = random_inputs(plain.func, seed=3)
    (want,) = plain(*inputs)
    monkeypatch.setenv(name, value)
    switched = mk.compile(text, target="cuda", num_sms=sms, cache_dir=tmp_path)
    (got,) = switched(*inputs)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    agrees_with_the_reference(switched, text, value)
    return plain.cuda_source, switched.cuda_source  # type: ignore[attr-defined]


@pytest.mark.gpu
@pytest.mark.parametrize(("held", "sms"), [("3", 8), ("5", 16)])
def test_a_first_step_in_part_sums_as_the_register_stream(
    held: str, sms: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With MK_CUDA_STAGE_FIRST_HELD=H a layer stack's bodies past the default's rule load
    part of their first step early (H - XB rows of each warp's first group, the rest at its
    turn): the outputs are bit-identical to the default's (the same loads, the same products)
    and agree with the reference."""
    _, part = sums_as_the_default("MK_CUDA_STAGE_FIRST_HELD", held, sms, tmp_path, monkeypatch)
    assert f", 2, {held}>(sl);" in part


def test_a_repeated_body_is_rebound_to_each_grids_buffers() -> None:
    """The first grid of a shared body is emitted again as repeated; the others take its new text
    on their own buffers, slot by slot."""
    from mk.backends.shared_bodies import rebind

    body = ["z(buffers[5]); x(buffers[3]);", "y(buffers[5], buffers[3]);"]
    assert rebind(body, [3, 5], [7, 9]) == [
        "z(buffers[9]); x(buffers[7]);",
        "y(buffers[9], buffers[7]);",
    ]


@pytest.mark.usefixtures("no_nvcc")
def test_rebound_layers_match_layers_emitted_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layers rebound from the first one's repeated body give the program (source and each
    body's buffer-table rows) that emitting each layer anew gives."""
    from mk.backends.cuda import emit
    from mk.backends.shared_bodies import SharedBodies

    graph = mk.compile(layers_program(3, 1024), target="cuda", num_sms=16, cache_dir=tmp_path).graph  # type: ignore[attr-defined]
    rebound = emit.emit_cuda(graph)

    def anew(grids, refs, bodies, steps):  # type: ignore[no-untyped-def]
        shared = SharedBodies()
        fns = [
            shared.add(g.sym_name.data, g.sym_name.data, b[0])
            for g, b in zip(grids, bodies, strict=True)
        ]
        return [
            emit._grid_body(g, refs, steps, True) if len(fn.grids) > 1 else b
            for g, fn, b in zip(grids, fns, bodies, strict=True)
        ]

    monkeypatch.setattr(emit, "_as_repeated", anew)
    assert emit.emit_cuda(graph) == rebound
    assert len(set(rebound.slot_rows)) == len(rebound.slot_rows)  # every grid its own buffers


@pytest.mark.usefixtures("no_nvcc")
def test_batched_first_look_at_the_waits_is_a_build_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher reads every near wait's counter at once by default;
    MK_CUDA_WAIT_BATCH=0 looks at one wait at a time."""
    text = linear_program(1, 512, 1024, norm=True)
    batched = cuda_source(text, tmp_path)
    assert "kBatchWaits = true;" in batched
    monkeypatch.setenv("MK_CUDA_WAIT_BATCH", "0")
    single = cuda_source(text, tmp_path)
    assert "kBatchWaits = false;" in single


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("rows", "assigned"), [(1, True), (4, False)])
def test_lean_linears_are_a_build_option(
    rows: int, assigned: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lean linears (the default): a CUDA-core streamed linear writes its sums and Σx² (no
    zeroing loops before it); tensor cores (4 rows) still add into zeroed sums. MK_CUDA_LEAN=0
    keeps the zeroing."""
    text = linear_program(rows, 512, 1024, norm=True, heads=2)
    monkeypatch.setenv("MK_CUDA_LEAN", "0")
    plain = cuda_source(text, tmp_path)
    assert "sl.assign" not in plain and plain.count("// init") == 3
    monkeypatch.delenv("MK_CUDA_LEAN")
    src = cuda_source(text, tmp_path)
    assert ("sl.assign = true;" in src) == assigned
    assert src.count("// init") == (0 if assigned else 3)


def _ptx_functions(ptx: str) -> dict[str, str]:
    """Each function of a PTX file, by (mangled) name: its text up to the next function."""
    parts = re.split(r"^(?=\.func|\.visible \.entry|\.entry)", ptx, flags=re.M)
    named = (re.match(r"[^(]*?(\w+)\s*\(", part.replace("\n", " ")) for part in parts[1:])
    return {m.group(1): part for m, part in zip(named, parts[1:], strict=True) if m}


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("lean", ["0", "1"])
def test_a_multi_weight_linear_keeps_its_descriptor_in_registers(
    lean: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fused RMSNorm + three-weight linear (q/k/v) must not put its StreamLinear in local
    memory: choosing a weight's row by field address once did, and every thread then stored
    ~40 words before each task (about 2 us per task on the H200). The 24 bytes every body
    declares are the argument buffer of its printf."""
    import subprocess

    from mk.backends.cpu.build import include_dir
    from mk.backends.cuda.build import NVCC_FLAGS

    monkeypatch.setenv("MK_CUDA_LEAN", lean)
    source, ptx = tmp_path / "mk.cu", tmp_path / "mk.ptx"
    source.write_text(cuda_source(linear_program(1, 512, 1024, norm=True, heads=3), tmp_path))
    flags = [f for f in NVCC_FLAGS if f not in ("-shared", "-Xcompiler", "-fPIC")]
    subprocess.run(
        [str(NVCC), *flags, f"-I{include_dir()}", "-ptx", str(source), "-o", str(ptx)],
        check=True,
    )
    depots = {
        name: int(m.group(1)) if (m := re.search(r"__local_depot\d+\[(\d+)\]", body)) else 0
        for name, body in _ptx_functions(ptx.read_text()).items()
        if "ld.global.nc.L1::no_allocate" in body and "task_" in name
    }
    assert depots and all(size <= 24 for size in depots.values()), depots


ALIGNED = [((8, 64, 2048, False, 1), True), ((1, 200, 776, True, 1), True),
           ((5, 40, 100, True, 1), False)]  # fmt: skip


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("shape", "aligned"), ALIGNED, ids=lambda s: str(s))
def test_streams_whose_starts_are_aligned_say_so(
    shape: tuple[int, int, int, bool, int], aligned: bool, tmp_path: Path
) -> None:
    """StreamLinear::aligned where every tile's rows start on 8 elements (K = 2048, 776); not
    for K = 100, whose rows start 200 bytes apart."""
    src = cuda_source(linear_program(*shape), tmp_path)
    assert ("sl.aligned = true;" in src) == aligned


def _body_sass_bytes(cubin: Path) -> int:
    """The machine code of the largest task body in a cubin (its symbol table's sizes)."""
    import subprocess

    table = subprocess.run(["readelf", "-s", "-W", str(cubin)], capture_output=True, text=True)
    sizes = [
        int(parts[2], 0)
        for parts in (line.split() for line in table.stdout.splitlines())
        if len(parts) >= 8 and parts[3] == "FUNC" and "task_" in parts[-1]
    ]
    return max(sizes)


@pytest.mark.skipif(NVCC is None or shutil.which("readelf") is None, reason="needs nvcc, readelf")
@pytest.mark.usefixtures("no_nvcc")
def test_an_aligned_stream_compiles_without_its_unaligned_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The aligned flag is a constant in the body, so the inlined stream_linear drops the paths
    for unaligned rows: a batch-8 tensor-core linear's body is well under its size without it
    (a decode step runs its bodies from a cold instruction cache at every layer). Its chunks'
    paths: K slices have no unaligned path."""
    import subprocess

    monkeypatch.setenv("MK_CUDA_MMA_SLICE", "0")

    from mk.backends.cpu.build import include_dir
    from mk.backends.cuda.build import NVCC_FLAGS

    src = cuda_source(linear_program(8, 64, 2048, False), tmp_path)
    assert "sl.aligned = true;" in src
    flags = [f for f in NVCC_FLAGS if f not in ("-shared", "-Xcompiler", "-fPIC")]
    size = {}
    for name, text in (("aligned", src), ("checked", src.replace("sl.aligned = true;", ""))):
        source, cubin = tmp_path / f"{name}.cu", tmp_path / f"{name}.cubin"
        source.write_text(text)
        subprocess.run(
            [str(NVCC), *flags, f"-I{include_dir()}", "-cubin", str(source), "-o", str(cubin)],
            check=True,
        )
        size[name] = _body_sass_bytes(cubin)
    assert size["aligned"] < 0.6 * size["checked"], size


def _misaligned(t: Any) -> Any:
    """A contiguous copy of `t` whose data starts 2 bytes past a 16-byte boundary."""
    import torch

    flat = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    view = flat[1 : 1 + t.numel()].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.gpu
def test_misaligned_tensors_are_copied_by_a_call_and_refused_by_launch(tmp_path: Path) -> None:
    """Bodies take 16-byte aligned buffers for granted (StreamLinear::aligned): a call runs a
    misaligned tensor from an aligned copy, with the same result; launch(), which keeps its
    pointers for CUDA graphs, names the input instead."""
    import torch

    text = linear_program(8, 64, 2048, False)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    inputs = [torch.from_numpy(np.asarray(a).view(np.int16)).view(torch.bfloat16).cuda()
              for a in random_inputs(prog.func, seed=0)]  # fmt: skip
    want = prog(*inputs)
    odd = [_misaligned(inputs[0]), *inputs[1:]]
    assert odd[0].data_ptr() % 16 == 2
    got = prog(*odd)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"input #0: its data starts 2 bytes past a 16-byte"):
        prog.launch(*odd)  # type: ignore[attr-defined]


# (batch, n, k, norm, weights) and its chunk: one, and two in a 32 KiB room (the second adds).
LEAN = [((1, 200, 776, True, 1), 776), ((1, 64, 8704, True, 2), 8192)]


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "kc"), LEAN, ids=["one-chunk", "two-chunks"])
def test_lean_linears_match_the_reference(
    shape: tuple[int, int, int, bool, int],
    kc: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the GPU, lean linears (the default): one chunk, and two chunks (the second adds)."""
    monkeypatch.setenv("MK_CUDA_STREAM_KB", "32")
    monkeypatch.setenv("MK_CUDA_WIDE_ROOM", "0")
    text = linear_program(*shape)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path)
    assert "sl.assign = true;" in prog.cuda_source  # type: ignore[attr-defined]
    assert f"sl.kc = {kc};" in prog.cuda_source  # type: ignore[attr-defined]
    agrees_with_the_reference(prog, text, shape)
