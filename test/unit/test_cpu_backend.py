"""The CPU backend: emitted C++ tile kernels, run task by task through the mk_dispatch ABI."""

from __future__ import annotations

import ctypes
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from nn_programs import programs
from xdsl.dialects import arith
from xdsl.dialects.builtin import ModuleOp, f32, i32, i64
from xdsl.ir import Attribute
from xdsl.passes import PassPipeline

import mk
from mk.backends.cpu import build_library, emit_source, include_dir
from mk.backends.cpu.build import compiler
from mk.backends.cpu.emit_scalar import scalar_expr
from mk.diagnostics import MkError
from mk.dialects import make_context
from mk.dialects.task import BufferOp, GraphOp, GridOp
from mk.dialects.task_maps import grid_points, int_value
from mk.inputs import numpy_dtype, random_inputs
from mk.interp.mugraph_tiles import SCALAR_KERNELS
from mk.interp.task import sequential
from mk.passes import get_all_passes
from mk.source import entry_function, load_module

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.mlir") if "llama3" not in p.name)
PIPELINE = "nn-to-mugraph,mugraph-to-task,task-schedule{num-sms=4}"
BF16 = np.dtype(ml_dtypes.bfloat16)


class TaskDesc(ctypes.Structure):
    """mk::TaskDesc of mk/tables.h."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("grid", ctypes.c_int32),
        ("coord", ctypes.c_int32 * 3),
        ("wait_begin", ctypes.c_int32),
        ("wait_end", ctypes.c_int32),
        ("signal_begin", ctypes.c_int32),
        ("signal_end", ctypes.c_int32),
        ("args", ctypes.c_int32 * 7),
    ]


class Library:
    """A built program: the ABI functions through ctypes."""

    def __init__(self, path: Path) -> None:
        self.dll = ctypes.CDLL(str(path))
        self.dll.mk_dispatch.restype = ctypes.c_int32
        self.dll.mk_dispatch.argtypes = [
            ctypes.c_int32,
            ctypes.POINTER(TaskDesc),
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int32,
        ]
        self.dll.mk_last_error.restype = ctypes.c_char_p
        self.dll.mk_kind_name.restype = ctypes.c_char_p
        self.dll.mk_kind_name.argtypes = [ctypes.c_int32]

    def dispatch(
        self, kind: int, coords: Sequence[int], ptrs: ctypes.Array, iteration: int = 0
    ) -> int:
        task = TaskDesc()
        task.kind, task.grid = kind, kind - 16
        for i, c in enumerate(coords):
            task.coord[i] = int(c)
        return int(self.dll.mk_dispatch(kind, ctypes.byref(task), ptrs, iteration))

    def error(self) -> str:
        return self.dll.mk_last_error().decode()


def run_tasks(
    lib: Library, graph: GraphOp, inputs: Sequence[np.ndarray], threads: int = 1
) -> tuple[np.ndarray, ...]:
    """Every task once per iteration in global task-id order (a valid topological order).

    Each buffer gets its own array (no arena aliasing), which the sequential order allows.
    With `threads` > 1 the tasks of one grid run concurrently (they write disjoint tiles).
    """
    buffers = [op for op in graph.body.block.ops if isinstance(op, BufferOp)]
    arrays = []
    for buf in buffers:
        array = np.zeros(buf.shape, dtype=numpy_dtype(buf.buffer_type.get_element_type()))
        if buf.kind.data in ("input", "weight"):
            assert buf.index is not None
            array[...] = inputs[int_value(buf.index)]
        arrays.append(array)
    ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    grids = [op for op in graph.body.block.ops if isinstance(op, GridOp)]

    def one(kind: int, point: Sequence[int], iteration: int) -> None:
        if lib.dispatch(kind, point, ptrs, iteration) != 0:
            raise RuntimeError(lib.error())

    with ThreadPoolExecutor(threads) as pool:
        for it in range(int_value(graph.iterations)):
            for gi, grid in enumerate(grids):
                points = list(grid_points(grid.shape_tuple))
                list(pool.map(lambda p, k=16 + gi, t=it: one(k, p, t), points))
    outs = {
        int_value(b.index): a
        for b, a in zip(buffers, arrays, strict=True)
        if b.kind.data == "output" and b.index is not None
    }
    return tuple(outs[i] for i in sorted(outs))


def lower(module: ModuleOp, spec: str = PIPELINE) -> GraphOp:
    PassPipeline.parse_spec(get_all_passes(), spec).apply(make_context(), module)
    (graph,) = [op for op in module.walk() if isinstance(op, GraphOp)]
    return graph


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))


def check_close_to_simulator(got: np.ndarray, want: np.ndarray) -> None:
    """Same rounding points as the Python simulator: f32 to 1e-6, bf16/f16 nearly all equal."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    elif want.dtype == np.float32:
        assert relative_error(got, want) <= 1e-6
    else:
        # One ulp flips where the f32 value sits on a rounding tie boundary, never more.
        differ = np.mean(got.astype(np.float32) != want.astype(np.float32))
        assert differ <= 0.01, f"{differ:.2%} of the elements differ"
        assert relative_error(got, want) <= 1e-2


def check_close_to_reference(got: np.ndarray, want: np.ndarray) -> None:
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        assert relative_error(got, want) <= (1e-5 if want.dtype == np.float32 else 2e-2)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk_cpu_cache")


def build(graph: GraphOp, cache: Path) -> Library:
    return Library(build_library(emit_source(graph), cache))


# ------------------------------------------------------------------------------------------------
# End to end on the examples and on random programs
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_match_simulator_and_reference(path: Path, cache: Path) -> None:
    module = load_module(path)
    inputs = random_inputs(entry_function(module), seed=1)
    want = mk.reference(module, *inputs)
    graph = lower(module)
    got = run_tasks(build(graph, cache), graph, inputs)
    sim = sequential(graph, inputs).outputs
    assert len(got) == len(want) == len(sim)
    for g, w, s in zip(got, want, sim, strict=True):
        check_close_to_reference(g, w)
        check_close_to_simulator(g, s)


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(module=programs())
def test_random_programs(module: ModuleOp, cache: Path) -> None:
    module = load_module(str(module))
    inputs = random_inputs(entry_function(module), seed=3)
    want = mk.reference(module, *inputs)
    graph = lower(module, "nn-to-mugraph,mugraph-to-task,task-schedule{num-sms=3}")
    got = run_tasks(build(graph, cache), graph, inputs)
    for g, w, s in zip(got, want, sequential(graph, inputs).outputs, strict=True):
        check_close_to_reference(g, w)
        check_close_to_simulator(g, s)


# ------------------------------------------------------------------------------------------------
# Every library kernel
# ------------------------------------------------------------------------------------------------

LIBRARY = """\
func.func @lib(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>, %h: tensor<4x8xbf16>, %g: tensor<4x8xf16>, %w: tensor<8xf32>, %sq: tensor<8x8xf32>, %q: tensor<1x4x2x8xf32>, %k: tensor<1x2x5x8xf32>, %v: tensor<1x2x5x8xf32>, %len: tensor<1xi32>, %table: tensor<10x8xbf16>, %ids: tensor<2x3xi32>, %cos: tensor<4x4xf32>, %sin: tensor<4x4xf32>, %p: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xbf16>, tensor<4x8xf16>, tensor<4x8xf32>, tensor<4xf32>, tensor<4x1xf32>, tensor<8xf32>, tensor<4x8xf32>, tensor<4x8xbf16>, tensor<4x8xf32>, tensor<2x3x8xbf16>, tensor<8xi32>, tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x8xf32>, tensor<2x4xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %0 = mugraph.kernel "exp" (%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %1 = mugraph.kernel "gelu" (%h) : (tensor<4x8xbf16>) -> tensor<4x8xbf16>
  %2 = mugraph.kernel "silu" (%g) : (tensor<4x8xf16>) -> tensor<4x8xf16>
  %3 = mugraph.kernel "div" (%x, %y) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %4 = mugraph.kernel "reduce_sum" (%x) {dim = 1 : i64} : (tensor<4x8xf32>) -> tensor<4xf32>
  %5 = mugraph.kernel "reduce_max" (%x) {dim = -1 : i64, keepdim = true} : (tensor<4x8xf32>) -> tensor<4x1xf32>
  %6 = mugraph.kernel "reduce_mean" (%x) {dim = 0 : i64} : (tensor<4x8xf32>) -> tensor<8xf32>
  %7 = mugraph.kernel "softmax" (%x) {dim = -1 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %8 = mugraph.kernel "rms_norm" (%h, %w) {epsilon = 1.000000e-05 : f32} : (tensor<4x8xbf16>, tensor<8xf32>) -> tensor<4x8xbf16>
  %9 = mugraph.kernel "rope" (%x, %cos, %sin) : (tensor<4x8xf32>, tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x8xf32>
  %10 = mugraph.kernel "embedding" (%table, %ids) : (tensor<10x8xbf16>, tensor<2x3xi32>) -> tensor<2x3x8xbf16>
  %11 = mugraph.kernel "argmax" (%x) {dim = 0 : i64} : (tensor<4x8xf32>) -> tensor<8xi32>
  %12 = mugraph.kernel "reshape" (%x) : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %13 = mugraph.kernel "transpose" (%x) {perm = array<i64: 1, 0>} : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %14 = mugraph.kernel "concat" (%x, %y) {dim = 0 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  %15 = mugraph.kernel "slice" (%x) {offsets = array<i64: 1, 2>, sizes = array<i64: 2, 4>} : (tensor<4x8xf32>) -> tensor<2x4xf32>
  %16 = mugraph.kernel "attention" (%q, %k, %v, %len) {scale = 3.500000e-01 : f32, causal = true} : (tensor<1x4x2x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1xi32>) -> tensor<1x4x2x8xf32>
  %17 = mugraph.kernel "attention" (%q, %k, %v) {scale = 3.500000e-01 : f32} : (tensor<1x4x2x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>) -> tensor<1x4x2x8xf32>
  %18 = mugraph.kernel "matmul" (%sq, %sq) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %19 = mugraph.kernel "linear" (%sq, %sq) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %20 = mugraph.kernel "scale" (%x) {factor = 1.250000e-01 : f32} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %u0 = mugraph.kernel "sqrt" (%p) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %u1 = mugraph.kernel "rsqrt" (%p) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %u2 = mugraph.kernel "square" (%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %u3 = mugraph.kernel "neg" (%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %u4 = mugraph.kernel "relu" (%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %u5 = mugraph.kernel "sigmoid" (%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %u6 = mugraph.kernel "add" (%x, %y) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %u7 = mugraph.kernel "sub" (%x, %y) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %u8 = mugraph.kernel "mul" (%x, %y) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %u9 = mugraph.kernel "maximum" (%x, %y) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %u0, %u1, %u2, %u3, %u4, %u5, %u6, %u7, %u8, %u9 : tensor<4x8xf32>, tensor<4x8xbf16>, tensor<4x8xf16>, tensor<4x8xf32>, tensor<4xf32>, tensor<4x1xf32>, tensor<8xf32>, tensor<4x8xf32>, tensor<4x8xbf16>, tensor<4x8xf32>, tensor<2x3x8xbf16>, tensor<8xi32>, tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x8xf32>, tensor<2x4xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}
"""


def library_inputs(module: ModuleOp) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    values = []
    for arg in entry_function(module).args:
        ty = arg.type
        dtype = numpy_dtype(ty.get_element_type())  # type: ignore[attr-defined]
        shape = tuple(ty.get_shape())  # type: ignore[attr-defined]
        if dtype.kind == "i":
            # ids index a 10-row table; kv lengths are in 1..5 (5 keys)
            low, high = (0, 10) if arg.name_hint == "ids" else (1, 6)
            values.append(rng.integers(low, high, size=shape).astype(dtype))
        else:
            # %p feeds sqrt and rsqrt: positive; the rest mixes signs
            sign = rng.choice([-1.0, 1.0], size=shape) if arg.name_hint != "p" else 1.0
            values.append((rng.uniform(0.1, 2.0, size=shape) * sign).astype(dtype))
    return values


def test_every_library_kernel(cache: Path) -> None:
    module = load_module(LIBRARY)
    kinds = {op.kind.data for op in module.walk() if op.name == "mugraph.kernel"}  # type: ignore[attr-defined]
    assert len(kinds) == 30
    inputs = library_inputs(module)
    graph = lower(module, "mugraph-to-task,task-schedule{num-sms=2}")
    got = run_tasks(build(graph, cache), graph, inputs)
    sim = sequential(graph, inputs).outputs
    for i, (g, s) in enumerate(zip(got, sim, strict=True)):
        assert not np.isnan(g.astype(np.float64)).any(), f"result {i}"
        check_close_to_simulator(g, s)


def test_embedding_out_of_range_reports_an_error(cache: Path) -> None:
    module = load_module(LIBRARY)
    inputs = library_inputs(module)
    ids = next(i for i, a in enumerate(entry_function(module).args) if a.name_hint == "ids")
    inputs[ids][1, 2] = 10
    graph = lower(module, "mugraph-to-task,task-schedule{num-sms=2}")
    with pytest.raises(RuntimeError, match=r"id 10 at index \(1, 2\) is out of range .* 10 rows"):
        run_tasks(build(graph, cache), graph, inputs)


# ------------------------------------------------------------------------------------------------
# ABI, determinism, errors
# ------------------------------------------------------------------------------------------------


def test_tasks_of_a_grid_run_concurrently(cache: Path) -> None:
    """The emitted kernels keep no shared state: many threads give the same bytes."""
    path = ROOT / "examples" / "decoder_block.mlir"
    module = load_module(path)
    inputs = random_inputs(entry_function(module), seed=2)
    graph = lower(module)
    lib = build(graph, cache)
    (once,) = run_tasks(lib, graph, inputs)
    for _ in range(3):
        (again,) = run_tasks(lib, graph, inputs, threads=8)
        assert once.tobytes() == again.tobytes()


def test_abi_entry_points(cache: Path) -> None:
    graph = lower(load_module(ROOT / "examples" / "gated_mlp.mlir"))
    lib = build(graph, cache)
    grids = [op for op in graph.body.block.ops if isinstance(op, GridOp)]
    version = (ROOT / "runtime" / "include" / "mk" / "version.h").read_text()
    assert f"MK_RUNTIME_ABI {lib.dll.mk_abi_version()}" in version
    assert lib.dll.mk_num_kinds() == len(grids)
    assert lib.dll.mk_kind_name(16).decode() == grids[0].sym_name.data
    assert lib.dll.mk_kind_name(3) is None
    ptrs = (ctypes.c_void_p * 1)()
    assert lib.dispatch(16 + len(grids), (0,), ptrs) != 0
    assert "unknown task kind" in lib.error()


def test_emit_is_deterministic() -> None:
    path = ROOT / "examples" / "decoder_block.mlir"
    first = emit_source(lower(load_module(path)))
    assert first == emit_source(lower(load_module(path)))
    assert "mk_dispatch" in first and "task_0_" in first


def test_build_reuses_the_cached_library(cache: Path) -> None:
    source = emit_source(lower(load_module(ROOT / "examples" / "rmsnorm_linear.mlir")))
    lib = build_library(source, cache)
    stamp = lib.stat().st_mtime_ns
    assert build_library(source, cache) == lib and lib.stat().st_mtime_ns == stamp


def test_compile_error_is_an_mk_error(cache: Path) -> None:
    with pytest.raises(MkError, match="error"):
        build_library("int broken( {\n", cache)


def test_unsupported_scalar_op_is_an_mk_error() -> None:
    a = arith.ConstantOp.from_int_and_width(1, i32)
    with pytest.raises(MkError, match="'arith.shli' is not supported by the CPU backend"):
        scalar_expr(arith.ShLIOp(a, a), ["x", "y"])


def test_emitted_source_is_warning_free(cache: Path) -> None:
    source = emit_source(lower(load_module(ROOT / "examples" / "decoder_block.mlir")))
    src = cache / "warnings.cpp"
    src.write_text(source)
    cmd = [*compiler(), "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror"]
    subprocess.run([*cmd, f"-I{include_dir()}", str(src)], check=True)


# ------------------------------------------------------------------------------------------------
# bf16 / f16 conversions against ml_dtypes (round to nearest, ties to even)
# ------------------------------------------------------------------------------------------------

CONVERT = """
#include "mk/cpu_kernels.h"
extern "C" void to_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = mk::cpu::f32_to_bf16(x[i]);
}
extern "C" void to_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = mk::cpu::f32_to_f16(x[i]);
}
extern "C" void from_f16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = mk::cpu::f16_to_f32(x[i]);
}
"""


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_half_conversions_round_like_ml_dtypes(cache: Path) -> None:
    dll = ctypes.CDLL(str(build_library(CONVERT, cache)))
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), rng.standard_normal(10_000).astype(np.float32)])
    x = np.concatenate(
        [x, np.array([0, -0.0, np.inf, -np.inf, 65504, 65520, 6e-8, 3e-8], dtype=np.float32)]
    )
    ties = (np.arange(1, 2**16, 7, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    x = np.ascontiguousarray(np.concatenate([x, ties, ties * np.float32(2**-20)]))
    out = np.empty(x.size, dtype=np.uint16)
    ptr = ctypes.c_void_p
    for fn, dtype in (("to_bf16", BF16), ("to_f16", np.dtype(np.float16))):
        getattr(dll, fn)(ptr(x.ctypes.data), ptr(out.ctypes.data), ctypes.c_int64(x.size))
        want = x.astype(dtype).view(np.uint16)
        finite = ~np.isnan(x)
        np.testing.assert_array_equal(out[finite], want[finite], err_msg=fn)
        assert np.isnan(out[~finite].view(dtype).astype(np.float32)).all()
    halves = np.arange(2**16, dtype=np.uint16)
    back = np.empty(halves.size, dtype=np.float32)
    dll.from_f16(ptr(halves.ctypes.data), ptr(back.ctypes.data), ctypes.c_int64(halves.size))
    np.testing.assert_array_equal(back, halves.view(np.float16).astype(np.float32))


# ------------------------------------------------------------------------------------------------
# The llama3 block: built and run against the reference (the Python simulator is too slow on it)
# ------------------------------------------------------------------------------------------------


def test_llama3_block_builds_and_matches_the_reference(cache: Path) -> None:
    graph = lower(load_module(ROOT / "examples" / "llama3_8b_block.mlir"))
    source = emit_source(graph)
    start = time.perf_counter()
    lib = build(graph, cache)
    if time.perf_counter() - start > 30:
        pytest.skip("llama3 build took over 30 s")
    grids = [op for op in graph.body.block.ops if isinstance(op, GridOp)]
    assert lib.dll.mk_num_kinds() == len(grids) and "mk_dispatch" in source
    module = load_module(ROOT / "examples" / "llama3_8b_block.mlir")
    inputs = random_inputs(entry_function(module), seed=1)
    (got,) = run_tasks(lib, graph, inputs)
    (want,) = mk.reference(module, *inputs)
    check_close_to_reference(got, want)


class _StubOp:
    """Just what scalar_expr reads of an op without properties: its name and result type."""

    def __init__(self, name: str, result: Attribute) -> None:
        self.name = name
        self.results = [SimpleNamespace(type=result)]


def test_every_interpreter_scalar_op_emits_valid_cpp(cache: Path) -> None:
    """Every arith/math op the interpreter runs has a C++ expression that compiles."""
    needs_properties = {"arith.constant", "arith.cmpf", "arith.cmpi"}
    functions = []
    for k, name in enumerate(sorted(set(SCALAR_KERNELS) - needs_properties)):
        integer = name.endswith(("i", "si", "ui")) and "fpowi" not in name or name == "math.absi"
        ctype, ty = ("int64_t", i64) if integer else ("float", f32)
        expr = scalar_expr(_StubOp(name, ty), ["a", "b", "c"])  # type: ignore[arg-type]
        functions.append(f"{ctype} f{k}({ctype} a, {ctype} b, {ctype} c) {{ return {expr}; }}")
    src = cache / "scalars.cpp"
    body = "\n".join(functions)
    src.write_text(
        '#include "mk/cpu_kernels.h"\n#pragma GCC diagnostic ignored "-Wunused-parameter"\n' + body
    )
    cmd = [*compiler(), "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", f"-I{include_dir()}"]
    subprocess.run([*cmd, str(src)], check=True)
