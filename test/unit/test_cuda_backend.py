"""The CUDA backend: emission everywhere, nvcc builds where nvcc exists, runs on a GPU."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from bench_scripts import load

import mk
from mk import compiler
from mk.backends.cuda import build as cuda_build
from mk.backends.cuda import switches
from mk.backends.cuda.emit import emit_cuda
from mk.backends.cuda.host import CudaProgram, CudaRunError
from mk.diagnostics import MkError
from mk.inputs import random_inputs
from mk.source import entry_function, load_module

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))
SMALL = [p for p in EXAMPLES if "llama3" not in p.name]
CI_BUILDS = ("rmsnorm_linear", "attention_decode")  # nvcc takes seconds each: two in CI
HAS_NVCC = cuda_build.nvcc() is not None


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-cuda-cache")


def _no_nvcc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_build, "nvcc", lambda: None)
    import mk.backends.cuda as backend

    monkeypatch.setattr(backend, "nvcc", lambda: None)


# --------------------------------------------------------------------------- no GPU needed


def _kind_functions(src: str) -> list[str]:
    """The body function each lowered kind runs: kBodyOfKind's number, then its one case."""
    table = re.search(r"kBodyOfKind\[\d+\] = \{([\d, ]*)\};", src)
    assert table is not None
    cases = dict(re.findall(r"case (\d+): return (task_\w+)\(t, bp, arena, iteration\);", src))
    return [cases[n.strip()] for n in table.group(1).split(",")]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_emits_a_megakernel(
    path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_nvcc(monkeypatch)
    prog = mk.compile(path, target="cuda", cache_dir=cache)
    assert isinstance(prog, CudaProgram) and prog.library_path is None
    src = prog.cuda_source
    grids = prog.graph.index().grids
    functions = re.findall(r"^__device__ __noinline__ int32_t (task_\w+)\(", src, re.M)
    emitted = emit_cuda(prog.graph)
    assert 1 <= len(functions) <= len(grids)  # grids differing only in buffers share one
    called = _kind_functions(src)
    assert len(called) == len(grids) and sorted(set(called)) == sorted(functions)
    # One call site per function, whatever the kinds that run it (dispatch.body_numbers).
    assert src.count("(t, bp, arena, iteration);") == len(functions)
    for i in range(len(grids)):
        _check_slots(src, called[i], emitted.slot_rows[i], len(prog.tables.buffers))
    assert src.rstrip().endswith("MK_CUDA_ENTRY_POINTS(Dispatch)")
    # The headers take the CTA's threads as the constant mk::kCudaThreads (MK_CTA_THREADS).
    assert (
        src.startswith("// Generated") and "\n#define MK_MEGAKERNEL 1" in src.split("#include")[0]
    )
    # Nothing of the host-only CPU helpers survives into device code.
    assert "std::vector" not in src and "mk::cpu::" not in src and "std::" not in src
    assert prog.scratch_per_sm > 0 and prog.num_sms == compiler.DEFAULT_CUDA_NUM_SMS
    assert emitted.text == src  # deterministic


def _check_slots(src: str, function: str, rows: tuple[int, ...], buffers: int) -> None:
    """The queue entries resolve exactly the buffers the body reads: its kind's slot rows have
    one entry per `bp[k]` slot of the function, each a row of the buffer table."""
    body = re.search(rf"int32_t {function}\(.*?\n}}\n", src, re.S)
    assert body is not None
    used = {int(k) for k in re.findall(r"\bbp\[(\d+)\]", body.group(0))}
    assert used == set(range(len(rows)))
    assert all(0 <= r < buffers for r in rows)
    slots = re.search(r"static constexpr int kSlots = (\d+);", src)
    assert slots is not None and len(rows) <= int(slots.group(1))


def test_tile_sizes_cover_the_declared_tiles(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_nvcc(monkeypatch)
    prog = mk.compile(ROOT / "examples" / "gated_mlp.mlir", target="cuda", cache_dir=cache)
    src = prog.cuda_source
    sizes = [int(n) for n in re.findall(r"mk::gpu::Tile<\w+> \w+\(.*, (\d+)\);", src)]
    assert sizes and all(n > 0 for n in sizes)
    assert prog.scratch_per_sm >= 4 * sum(sizes)
    # Small bodies take their tiles as one block: each tile inside it, 16-byte aligned.
    for block in re.findall(r"arena\.alloc\((\d+)\)\);((?:\n.*mk::gpu::Tile<.*)+)", src):
        total, decls = int(block[0]), block[1]
        for ctype, at, n in re.findall(
            r"reinterpret_cast<(\w+)\*>\(tiles \+ (\d+)\), (\d+)\)", decls
        ):
            assert int(at) % 16 == 0 and int(at) + int(n) * (4 if ctype == "float" else 8) <= total


def test_calling_without_a_library_or_gpu_is_a_clear_error(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_nvcc(monkeypatch)
    prog = mk.compile(ROOT / "examples" / "rmsnorm_linear.mlir", target="cuda", cache_dir=cache)
    pattern = "NVIDIA GPU" if not _has_gpu() else "without nvcc"
    with pytest.raises(MkError, match=pattern):
        prog(*random_inputs(prog.func))


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name", CI_BUILDS)
def test_nvcc_builds_the_megakernel_once(name: str, cache: Path) -> None:
    path = ROOT / "examples" / f"{name}.mlir"
    prog = mk.compile(path, target="cuda", cache_dir=cache)
    assert prog.library_path is not None and prog.library_path.is_file()
    again = mk.compile(path, target="cuda", cache_dir=cache)
    assert again.cache_hit and again.library_path == prog.library_path
    # Every body shares the entry's 255 registers a thread: past them, every task spills.
    used = again.cuda_resources
    assert used is not None and 0 < used.registers <= 255
    assert (used.spill_stores, used.spilling) == (0, 0), used
    assert used.warnings == (), used.warnings  # -Wall -Wextra on the host pass, and nvcc's own


PTXAS = """\
ptxas info    : Compiling entry function '_ZN2mk10megakernelIN12_GLOBAL__N_18DispatchEEEvNS_12LaunchParamsE' for 'sm_90a'
ptxas info    : Function properties for _ZN2mk10megakernelIN12_GLOBAL__N_18DispatchEEEvNS_12LaunchParamsE
    752 bytes stack frame, 504 bytes spill stores, 868 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 752 bytes cumulative stack size, 2640 bytes smem
ptxas info    : Function properties for _ZN12_GLOBAL__N_19task_5_k5_xEPKN2mk8TaskDescEPKPvRNS0_3gpu5ArenaEii
    0 bytes stack frame, 64 bytes spill stores, 112 bytes spill loads
ptxas info    : Function properties for _ZN12_GLOBAL__N_19task_0_k0_pEPKN2mk8TaskDescEPKPvRNS0_3gpu5ArenaEii
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""


def test_ptxas_reports_the_megakernels_registers_and_spills() -> None:
    found = cuda_build.kernel_resources(PTXAS)
    spilled = ("megakernel", "k5_x")
    assert found == cuda_build.KernelResources(255, 752, 504, 868, 2, spilled=spilled)
    assert found.summary() == (
        "255 registers, 752 B of stack, SPILLS (504 B stored by the entry) in megakernel, k5_x"
    )
    assert cuda_build.kernel_resources("ptxas info    : 0 bytes gmem") is None
    note = "ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are "
    serialized = cuda_build.kernel_resources(PTXAS + note + "serialized due to ...\n")
    assert serialized == cuda_build.KernelResources(
        255, 752, 504, 868, 2, wgmma_serialized=True, spilled=spilled
    )
    clean = cuda_build.KernelResources(213, 304, 0, 0, 0)
    assert clean.summary() == "213 registers, 304 B of stack, no spills"
    host = "mk.cu:3:5: warning: unused variable 'x' [-Wunused-variable]"
    warned = cuda_build.kernel_resources(f"{host}\n{PTXAS}")
    assert warned == cuda_build.KernelResources(
        255, 752, 504, 868, 2, spilled=spilled, warnings=(host,)
    )
    assert warned.summary().startswith("255 registers, 752 B of stack, 1 compiler warnings, SPILLS")


def test_a_libraries_resources_read_back_as_written(tmp_path: Path) -> None:
    lib = tmp_path / "k.so"
    found = cuda_build.kernel_resources(PTXAS)
    assert found is not None
    cuda_build.resources_path(lib).write_text(json.dumps(dataclasses.asdict(found)))
    assert cuda_build.library_resources(lib) == found
    older = {k: v for k, v in dataclasses.asdict(found).items() if k not in ("spilled", "warnings")}
    cuda_build.resources_path(lib).write_text(json.dumps(older))  # written before both
    assert cuda_build.library_resources(lib) == dataclasses.replace(found, spilled=())
    warned = dataclasses.replace(found, warnings=("mk.cu:1:1: warning: w",))
    cuda_build.resources_path(lib).write_text(json.dumps(dataclasses.asdict(warned)))
    assert cuda_build.library_resources(lib) == warned


# Build switches that change the emitted CUDA beyond the default (bench/RESULTS.md measures them).
SWITCHES = [
    {"MK_CUDA_WEIGHT_L2": "evict_first"},
    {"MK_CUDA_MMA_PIPE": "1"},
    {"MK_CUDA_MMA_L1": "1"},
    {"MK_CUDA_MMA_RING": "3"},
    {"MK_CUDA_MMA_RING": "4"},
    {"MK_CUDA_WAIT_BATCH": "0"},
    {"MK_CUDA_LEAN": "0"},
    {"MK_CUDA_FUSE_LOOPS": "0"},
    {"MK_CUDA_POLL_SLEEP": "0"},
    {"MK_CUDA_FLAG_POLL": "all"},
    {"MK_CUDA_FLAG_SLEEP": "0"},
    {"MK_CUDA_LOAD_GROUPS": "0"},
    {"MK_CUDA_LAUNCH": "plain"},
    {"MK_CUDA_ATTN_KEYS": "8"},
    {"MK_CUDA_ATTN_KV_EARLY": "0"},
    {"MK_CUDA_MERGE_EARLY": "0"},
    {"MK_CUDA_MERGE_EARLY": "beside"},
    {"MK_CUDA_MMA_RING": "2", "MK_CUDA_STREAM_KB": "192"},
    {"MK_CUDA_RAW_BARS": "launch"},
    {"MK_CUDA_SMEM_ALIGN": "16"},
    {"MK_CUDA_ATTN_ROWS_FIRST": "0"},
    {"MK_CUDA_ATTN_ROWS_FIRST": "3"},
    {"MK_CUDA_STAGE_FIRST": "1"},
    {"MK_CUDA_STAGE_FIRST": "0"},
    {"MK_CUDA_ATTN_MERGE_WEIGHTS": "0"},
    {"MK_CUDA_STAGE_FIRST_HELD": "4"},
]


@pytest.fixture(params=SWITCHES, ids=lambda env: ",".join(f"{k}={v}" for k, v in env.items()))
def switch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """One build switch set in the environment for the test."""
    for name, value in request.param.items():
        monkeypatch.setenv(name, value)
    return request.param


# Every switch of SWITCHES in a build with nvcc, in eight builds (nvcc takes seconds each): the
# switches that can go together, and each on an example whose code it changes (tensor cores:
# gated_mlp, batch 4). The GPU test below runs each alone.
SWITCH_BUILDS = [
    ("decoder_block", {"MK_CUDA_WEIGHT_L2": "evict_first", "MK_CUDA_WAIT_BATCH": "0",
                       "MK_CUDA_LOAD_GROUPS": "0",
                       "MK_CUDA_ATTN_KEYS": "8"}),
    ("decoder_block", {"MK_CUDA_LEAN": "0",
                       "MK_CUDA_FUSE_LOOPS": "0", "MK_CUDA_LAUNCH": "plain"}),
    ("decoder_block", {"MK_CUDA_POLL_SLEEP": "0", "MK_CUDA_FLAG_POLL": "all",
                       "MK_CUDA_FLAG_SLEEP": "0"}),
    ("gated_mlp", {"MK_CUDA_MMA_PIPE": "1"}),
    ("gated_mlp", {"MK_CUDA_MMA_RING": "4", "MK_CUDA_MMA_L1": "1"}),
    ("gated_mlp", {"MK_CUDA_MMA_RING": "2", "MK_CUDA_STREAM_KB": "192",
                   "MK_CUDA_RAW_BARS": "launch"}),
    ("decode_loop", {"MK_CUDA_ATTN_KV_EARLY": "0", "MK_CUDA_STAGE_FIRST": "0"}),
    ("decode_loop", {"MK_CUDA_RAW_BARS": "launch", "MK_CUDA_SMEM_ALIGN": "16"}),
    ("decode_loop", {"MK_CUDA_STAGE_FIRST_HELD": "4"}),
    ("decoder_block", {"MK_CUDA_ATTN_MERGE_WEIGHTS": "0"}),
    ("decoder_block", {"MK_CUDA_MERGE_EARLY": "0", "MK_CUDA_ATTN_ROWS_FIRST": "0",
                       "MK_CUDA_STAGE_FIRST": "1"}),
    ("llama3_8b_block", {"MK_CUDA_MERGE_EARLY": "beside"}),
]  # fmt: skip


def test_every_switch_is_built() -> None:
    """Each switch of SWITCHES is in one of the builds (a depth of the ring stands for all)."""
    built = {name for _, env in SWITCH_BUILDS for name in env}
    assert built == {name for switch in SWITCHES for name in switch}


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.parametrize(
    ("example", "env"), SWITCH_BUILDS, ids=lambda v: v if isinstance(v, str) else ",".join(v)
)
def test_nvcc_builds_the_switches(
    example: str, env: dict[str, str], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    prog = mk.compile(ROOT / "examples" / f"{example}.mlir", target="cuda", cache_dir=cache)
    assert prog.library_path is not None and prog.library_path.is_file()
    used = prog.cuda_resources
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.parametrize(("switch", "align"), [("", "128"), ("16", "16"), ("1024", "1024")])
def test_dynamic_shared_memory_starts_where_the_switch_says(
    switch: str, align: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_SMEM_ALIGN sets the alignment of the dynamic shared memory's start (128 B unless
    set; at 16 the static shared memory before it decides; the PTX declaration carries it)."""
    monkeypatch.setenv("MK_CUDA_SMEM_ALIGN", switch)
    _no_nvcc(monkeypatch)
    src = mk.compile(ROOT / "examples" / "rmsnorm_linear.mlir", target="cuda").cuda_source
    (tmp_path / "k.cu").write_text(src)
    nvcc = shutil.which("nvcc")
    assert nvcc is not None
    include = f"-I{cuda_build.cuda_include_dir()}"
    flags = ["-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a"]
    cmd = [nvcc, *flags, "-ptx", include, "-o", str(tmp_path / "k.ptx"), str(tmp_path / "k.cu")]
    subprocess.run(cmd, check=True, capture_output=True)
    ptx = (tmp_path / "k.ptx").read_text()
    assert re.search(rf"\.extern \.shared \.align {align} \.b8 \w*mk_dynamic_smem", ptx)


def test_smem_align_takes_only_its_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_SMEM_ALIGN", "64")
    with pytest.raises(MkError, match="MK_CUDA_SMEM_ALIGN must be one of 128, 16, 1024"):
        switches.smem_align()


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_nvcc_errors_are_reported(tmp_path: Path) -> None:
    with pytest.raises(MkError, match="nvcc failed"):
        cuda_build.build_cuda("this is not C++;\n", tmp_path)


def test_another_header_tree_builds_its_own_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_INCLUDE: the CUDA build compiles against another tree's runtime headers (a
    device-side change timed against the installed headers in one process), cached apart."""
    from mk.backends.cpu.build import include_dir

    assert cuda_build.cuda_include_dir() == include_dir()
    installed = cuda_build.headers_digest()
    other = tmp_path / "include"
    shutil.copytree(include_dir(), other)
    attention = other / "mk" / "cuda_attention.cuh"
    attention.write_text(attention.read_text() + "\n// another tree\n")
    monkeypatch.setenv("MK_CUDA_INCLUDE", str(other))
    assert cuda_build.cuda_include_dir() == other
    assert cuda_build.headers_digest() != installed
    if HAS_NVCC:
        prog = mk.compile(ROOT / "examples/rmsnorm_linear.mlir", target="cuda", cache_dir=tmp_path)
        monkeypatch.delenv("MK_CUDA_INCLUDE")
        again = mk.compile(ROOT / "examples/rmsnorm_linear.mlir", target="cuda", cache_dir=tmp_path)
        assert prog.library_path != again.library_path
    monkeypatch.setenv("MK_CUDA_INCLUDE", str(tmp_path / "nowhere"))
    with pytest.raises(MkError, match="MK_CUDA_INCLUDE=.*nowhere: no mk/cuda_megakernel.cuh"):
        cuda_build.cuda_include_dir()


# --------------------------------------------------------------------------- on the GPU


def _assert_close(outs: tuple[np.ndarray, ...], refs: tuple[np.ndarray, ...]) -> None:
    assert len(outs) == len(refs)
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound, f"output {i} {ref.dtype}{list(ref.shape)}: error {error:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_matches_the_reference_on_the_gpu(path: Path, cache: Path) -> None:
    prog = mk.compile(path, target="cuda", cache_dir=cache)
    for seed in (0, 1):
        inputs = random_inputs(prog.func, seed=seed)
        refs = mk.reference(path, *[x.copy() for x in inputs])  # donated inputs change in place
        _assert_close(prog(*inputs), refs)


def _unfused_rms(b: int, k: int) -> str:
    """RMSNorm spelled out in f32 (elementwise library kernels with broadcasts) before a linear:
    bench/search_bench.py's program."""
    return load("search_bench").rms_unfused(b, 64, k)


@pytest.mark.gpu
@pytest.mark.parametrize(("b", "k"), [(1, 4096), (3, 200)])
def test_unfused_f32_elementwise_kernels_on_the_gpu(cache: Path, b: int, k: int) -> None:
    """Found on the H200 by bench/search_bench.py: the f32 square of a [1, 4096] tensor came
    back as garbage, so the output was the reference scaled by 1/sqrt(eps)."""
    text = _unfused_rms(b, k)
    prog = mk.compile(text, target="cuda", cache_dir=cache)
    inputs = random_inputs(prog.func, seed=2)
    inputs[1][...] = 1e-6  # the epsilon
    _assert_close(prog(*inputs), mk.reference(text, *inputs))


@pytest.mark.gpu
def test_torch_cuda_tensors_run_in_place(cache: Path) -> None:

    path = ROOT / "examples" / "decoder_block.mlir"
    prog = mk.compile(path, target="cuda", num_sms=16, cache_dir=cache)
    inputs = random_inputs(prog.func, seed=4)
    tensors = [compiler._to_torch(a).cuda() for a in inputs]
    outs = prog(*tensors)
    assert all(o.is_cuda for o in outs)
    _assert_close(tuple(compiler._from_torch(o) for o in outs), mk.reference(path, *inputs))
    with pytest.raises(ValueError, match="input #0"):
        prog(*[t[..., :1].contiguous() for t in tensors])


@pytest.mark.gpu
@pytest.mark.usefixtures("switch")
@pytest.mark.parametrize("example", ["decoder_block", "gated_mlp"])
def test_switches_on_the_gpu(cache: Path, example: str) -> None:
    """The build switches change no result: at batch 1 (CUDA cores) and at batch 4 (tensor
    cores)."""
    path = ROOT / "examples" / f"{example}.mlir"
    prog = mk.compile(path, target="cuda", num_sms=16, cache_dir=cache)
    inputs = random_inputs(prog.func, seed=5)
    _assert_close(prog(*inputs), mk.reference(path, *inputs))


@pytest.mark.gpu
def test_dropped_signal_trips_the_watchdog(cache: Path) -> None:
    prog = mk.compile(
        ROOT / "examples" / "decoder_block.mlir", target="cuda", num_sms=8, cache_dir=cache
    )
    tasks = prog.tables.tasks.copy()
    victim = int(np.flatnonzero(tasks["signal_end"] > tasks["signal_begin"])[0])
    tasks[victim]["signal_end"] = tasks[victim]["signal_begin"]
    prog.tables = dataclasses.replace(prog.tables, tasks=tasks)
    start = time.perf_counter()
    with pytest.raises(
        CudaRunError, match=r"task \d+ \(@\w+.*\) waits on @\w+.* on SM \d+"
    ) as info:
        prog(*random_inputs(prog.func), timeout_ms=300)
    assert time.perf_counter() - start < 20
    assert info.value.wait_ms >= 300 and info.value.value < info.value.threshold


@pytest.mark.gpu
def test_timeline_exports_a_chrome_trace(cache: Path, tmp_path: Path) -> None:
    prog = mk.compile(
        ROOT / "examples" / "rmsnorm_linear.mlir", target="cuda", num_sms=4, cache_dir=cache
    )
    prog.record_timeline = True
    prog(*random_inputs(prog.func))
    prog.trace(tmp_path / "trace.json")
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert len(events) == len(prog.tables.tasks) * prog.tables.iterations
    assert all(e["dur"] >= 0 and 0 <= e["tid"] < 4 for e in events)
    # Each CTA's entry comes before its first task's start, its exit after its last task's end.
    t, ctas = prog.tables, prog.last_ctas
    assert ctas.shape == (4, 2) and (ctas > 0).all()
    for sm in range(4):
        queue = t.queue_tasks[t.queue_offsets[sm] : t.queue_offsets[sm + 1]]
        if len(queue):
            assert ctas[sm, 0] <= prog.last_timeline[0, queue[0], 0]
            assert prog.last_timeline[-1, queue[-1], 1] <= ctas[sm, 1]


@pytest.mark.gpu
@pytest.mark.parametrize("num_sms", [1, 4])
def test_single_split_attention_on_the_gpu(num_sms: int, cache: Path) -> None:
    # One KV split (few SMs): the kernel normalises o/l itself. Its loop streams
    # (stream_attention.py; head dim 64: on tensor cores under MK_CUDA_ATTN_MMA=auto).
    path = ROOT / "examples/attention_decode.mlir"
    inputs = random_inputs(entry_function(load_module(path)), seed=0)
    prog = mk.compile(path, target="cuda", num_sms=num_sms, cache_dir=cache)
    assert "mk::gpu::stream_attention" in prog.cuda_source
    _assert_close(prog(*inputs), mk.reference(path, *inputs))


# 16 query rows per KV head: more than the streamed attention takes, so the generic tile loop.
def _wide_group_attention(dtype: str) -> str:
    """One KV head read by 16 query heads: one kernel walking 256 keys in 4 chunks."""
    q, kv = f"tensor<1x16x1x64x{dtype}>", f"tensor<1x1x256x64x{dtype}>"
    return f"""
func.func @att(%q: {q}, %k: {kv}, %v: {kv}, %kv_len: tensor<1xi32>) -> {q} {{
  %o = nn.attention %q, %k, %v, %kv_len {{scale = 0.125 : f32, causal = false}} : ({q}, {kv}, {kv}, tensor<1xi32>) -> {q}
  func.return %o : {q}
}}
"""


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "body"), [("f32", None), ("bf16", "block_attention<")])
def test_single_split_attention_loop_on_the_gpu(dtype: str, body: str | None, cache: Path) -> None:
    # One kernel (a single KV split, so its epilogue normalises o/l itself) with a for-loop of
    # 4 chunks: f32 through the generic tile loop, bf16 through block_attention. Once gave 0 or
    # inf that changed from launch to launch, so several launches are checked.
    text = _wide_group_attention(dtype)
    prog = mk.compile(text, target="cuda", num_sms=1, cache_dir=cache)
    source = prog.cuda_source  # type: ignore[attr-defined]
    assert "mk::gpu::stream_attention" not in source
    assert "for (int64_t it = 0; it < 4; ++it)" in source if body is None else body in source
    for seed in range(4):
        inputs = random_inputs(entry_function(load_module(text)), seed=seed)
        _assert_close(prog(*inputs), mk.reference(text, *inputs))


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("value", "arena"), [("0", 0), ("4096", 4096), ("1000000", None)])
def test_arena_shared_memory_cap(
    value: str, arena: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_ARENA_SMEM", value)
    src = mk.compile(ROOT / "examples/rmsnorm_linear.mlir", target="cuda", cache_dir=tmp_path)
    text = src.cuda_source  # type: ignore[attr-defined]
    got = int(text.split("kArenaBytes = ")[1].split(";")[0])
    offset = int(text.split("kArenaOffset = ")[1].split(";")[0])
    total = int(text.split("kSmemBytes = ")[1].split(";")[0])
    assert total == offset + got and offset % 16 == 0
    # Too large a cap is cut to what a Hopper CTA can opt into beside the staging area.
    assert got == arena if arena is not None else offset + got <= (227 - 16) << 10


@pytest.mark.usefixtures("no_nvcc")
def test_arena_cap_must_be_a_byte_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_ARENA_SMEM", "lots")
    with pytest.raises(mk.MkError, match="MK_CUDA_ARENA_SMEM must be a byte count, got 'lots'"):
        mk.compile(ROOT / "examples/rmsnorm_linear.mlir", target="cuda", cache_dir=tmp_path)


@pytest.mark.usefixtures("no_nvcc")
def test_reshapes_in_task_bodies_are_views(tmp_path: Path) -> None:
    # Every block-level reshape of the Llama block keeps its dtype: a handle copy, no tile copy
    # (unfolded: q's and k's RoPE blocks read their head views, five reshapes in all).
    prog = mk.compile(
        ROOT / "examples/llama3_8b_block.mlir", target="cuda", cache_dir=tmp_path, attention_fold=0
    )
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert src.count(".alias(") >= 5 and "copy_tile(" not in src
