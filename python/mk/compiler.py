"""mk.compile: nn source through the stage pipeline to a runnable Program, cached on disk."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.dialects.func import FuncOp

from mk.diagnostics import MkError, op_location
from mk.dialects.nn_decode import donated_args
from mk.dialects.task import GraphOp
from mk.inputs import check_donated, check_inputs, numpy_dtype
from mk.pipeline import (
    PIPELINE,
    SEARCH_PIPELINE,
    STAGES,
    check_options,
    run_pipeline,
)
from mk.runtime_tables import Tables
from mk.source import Source, entry_function, load_module

TARGETS = ("cpu", "cuda")
DEFAULT_NUM_SMS = 8  # the CPU target: small programs do not need an H200's 132 queues
DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_CUDA_NUM_SMS = 132  # an H200: one queue per SM

# Counts of library builds and cache hits in this process (tests check that a hit skips g++).
STATS = {"builds": 0, "hits": 0}


@dataclass(frozen=True)
class Options:
    """Everything besides the program that decides the compiled artefact."""

    target: str
    num_sms: int
    pass_options: tuple[tuple[str, Any], ...]

    def as_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)


def runtime() -> ModuleType:
    """The mk._runtime extension (looked up by name: type checkers cannot see the built module)."""
    return importlib.import_module("mk._runtime")


# --------------------------------------------------------------------------- cache


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """`cache_dir`, else $MK_CACHE_DIR, else ~/.cache/mk."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("MK_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "mk"


@cache
def cxx_version() -> str:
    """The C++ compiler the CPU backend builds with, as `g++ 12.2.0` (part of the cache key)."""
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        return f"{cxx} (missing)"
    try:
        done = subprocess.run([cxx, "-dumpfullversion"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return f"{cxx} (unknown)"
    return f"{cxx} {done.stdout.strip()}"


def headers_digest(include: Path | None) -> str:
    """sha256 of the runtime headers the emitted code includes (they are part of the build)."""
    digest = hashlib.sha256()
    for path in sorted(include.glob("mk/*.h")) if include is not None else ():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cache_key(task_ir: str, options: Options, cpu_source: str, include: Path | None = None) -> str:
    """sha256 of the final IR, options, mk version, runtime ABI, C++ compiler and its extra flags
    ($MK_CPU_CXXFLAGS), the emitted code and the headers it includes (the emitter and headers
    change without a version bump)."""
    import mk

    digest = hashlib.sha256()
    flags = os.environ.get("MK_CPU_CXXFLAGS", "")
    parts = (task_ir, options.as_json(), mk.__version__, str(runtime().abi), cxx_version(), flags)
    for part in (*parts, cpu_source, headers_digest(include)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def cpu_backend() -> ModuleType:
    """mk.backends.cpu (emit_source, build_library); a seam that tests replace."""
    try:
        backend = importlib.import_module("mk.backends.cpu")
    except ImportError as e:
        raise MkError(f"the CPU backend is not available: {e}") from None
    if not all(hasattr(backend, f) for f in ("emit_source", "build_library")):
        raise MkError("the CPU backend is not available: mk.backends.cpu is incomplete")
    return backend


def _write_entry(entry: Path, library: Path, texts: Mapping[str, str], meta: str) -> None:
    """Fills a fresh directory, then renames it into place, so readers never see half of one."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
    try:
        shutil.copy2(library, tmp / "kernels.so")
        for name, text in texts.items():
            (tmp / name).write_text(text)
        (tmp / "meta.json").write_text(meta)
        os.rename(tmp, entry)
    except OSError:
        # Another process may have published the same key first; its entry is as good.
        shutil.rmtree(tmp, ignore_errors=True)
        if not (entry / "meta.json").exists():
            raise


def cached_library(
    key: str, cpu_source: str, texts: Mapping[str, str], root: Path
) -> tuple[Path, bool]:
    """The built kernel library of `key` (building and storing it on a miss), and whether it hit."""
    entry = root / "cpu" / key[:2] / key
    library = entry / "kernels.so"
    if (entry / "meta.json").exists() and library.exists():
        STATS["hits"] += 1
        return library, True
    backend = cpu_backend()
    with tempfile.TemporaryDirectory(prefix="mk-build-") as build:
        built = Path(backend.build_library(cpu_source, Path(build)))
        STATS["builds"] += 1
        files = {f"{stage}.mlir": text for stage, text in texts.items()}
        files["kernels.cpp"] = cpu_source
        _write_entry(entry, built, files, json.dumps({"key": key}))
    return library, False


# --------------------------------------------------------------------------- compile


def _load(source: Source) -> ModuleOp:
    module = load_module(source)
    # Passes rewrite in place: never lower the caller's own module.
    return module.clone() if isinstance(source, ModuleOp) else module


def compile(
    source: Source,
    target: str = "cpu",
    *,
    num_sms: int | None = None,
    num_threads: int | None = None,
    entry: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    search: bool = False,
    **pass_options: Any,
) -> Program:
    """Compile an nn program (MLIR text, a path or a ModuleOp) into a runnable `Program`.

    `num_sms`: queues of the schedule (default 8 on the CPU); `num_threads`: executor threads
    (default min(cpu_count, num_sms)); `search`: run the superoptimizer before the rules (its
    options, e.g. budget_s, are pass options too); other keywords are pass options (tile_n=32).
    """
    if target not in TARGETS:
        raise ValueError(f"mk.compile: unknown target {target!r}; expected one of {TARGETS}")
    pipeline = SEARCH_PIPELINE if search else PIPELINE
    check_options(pass_options, pipeline)
    if search and cache_dir is not None:
        pass_options = {"cache_dir": f'"{cache_root(cache_dir)}"', **pass_options}
    num_sms, pass_options = target_options(target, num_sms, pass_options)
    module = _load(source)
    func = entry_function(module, entry).clone()
    keyed = {**pass_options, "search": True} if search else pass_options
    options = Options(target, num_sms, tuple(sorted(keyed.items())))
    texts = run_pipeline(module, {**pass_options, "num_sms": num_sms}, pipeline)
    graph = find_graph(module, func.sym_name.data, func)
    if target == "cuda":
        return _compile_cuda(func, graph, texts, num_sms, timeout_ms, cache_root(cache_dir))
    backend = cpu_backend()
    cpu_source = backend.emit_source(graph)
    include = backend.include_dir() if hasattr(backend, "include_dir") else None
    key = cache_key(texts["task"], options, cpu_source, include)
    library, hit = cached_library(key, cpu_source, texts, cache_root(cache_dir))
    return Program(
        func=func,
        graph=graph,
        texts=texts,
        cpu_source=cpu_source,
        library_path=library,
        cache_key=key,
        cache_hit=hit,
        num_sms=num_sms,
        num_threads=num_threads,
        timeout_ms=timeout_ms,
    )


def target_options(
    target: str, num_sms: int | None, pass_options: Mapping[str, Any]
) -> tuple[int, dict[str, Any]]:
    """(queues, pass options) that mk.compile lowers with for `target`: the CUDA target's 132
    queues and linear tiles sized to fill the SMs' waves (tile_n=0), unless given."""
    if num_sms is None:
        num_sms = DEFAULT_CUDA_NUM_SMS if target == "cuda" else DEFAULT_NUM_SMS
    if num_sms < 1:
        raise ValueError(f"mk.compile: num_sms must be >= 1, got {num_sms}")
    return num_sms, {"tile_n": 0, **pass_options} if target == "cuda" else dict(pass_options)


def mugraph_estimate(
    source: Source, target: str = "cpu", num_sms: int | None = None, **pass_options: Any
) -> float:
    """Seconds the cost model (passes/cost_model.py) gives `source` lowered to μGraph kernels as
    mk.compile lowers it for `target`: a caller ranks shapes of one program by it without
    compiling any."""
    from mk.passes.cost_model import Target, module_cost

    if target not in TARGETS:
        raise ValueError(f"mk.compiler: unknown target {target!r}; expected one of {TARGETS}")
    check_options(pass_options)
    num_sms, pass_options = target_options(target, num_sms, pass_options)
    module = _load(source)
    run_pipeline(module, {**pass_options, "num_sms": num_sms}, PIPELINE[:2])
    return module_cost(module, Target(num_sms=num_sms)).est_seconds


def _compile_cuda(
    func: FuncOp,
    graph: GraphOp,
    texts: Mapping[str, str],
    num_sms: int,
    timeout_ms: int,
    root: Path,
) -> Program:
    """Emits the megakernel and, where nvcc exists, builds it (cached by content hash)."""
    from mk.backends.cuda import build_cuda, emit_cuda, nvcc
    from mk.backends.cuda.host import CudaProgram

    source = emit_cuda(graph)
    library, hit = build_cuda(source.text, root) if nvcc() is not None else (None, False)
    STATS["hits" if hit else "builds"] += library is not None
    return CudaProgram(
        func=func,
        graph=graph,
        texts=texts,
        cpu_source="",
        library_path=library,  # type: ignore[arg-type]
        cache_key=hashlib.sha256(source.text.encode()).hexdigest(),
        cache_hit=hit,
        num_sms=num_sms,
        timeout_ms=timeout_ms,
        cuda_source=source.text,
        scratch_per_sm=source.scratch_per_sm,
        mark_labels=source.mark_labels,
        slot_rows=source.slot_rows,
        slots=source.slots,
    )


def find_graph(module: ModuleOp, name: str, func: FuncOp | None = None) -> GraphOp:
    """The task.graph lowered from function @name (`func`, the entry before the lowering)."""
    for op in module.walk():
        if isinstance(op, GraphOp) and op.sym_name.data == name:
            return op
    if func is not None and not func.function_type.outputs.data:
        raise MkError(
            f"@{name} returns nothing: mk runs a function that returns tensors", op_location(func)
        )
    raise MkError(f"the lowering produced no task.graph for @{name}")


# --------------------------------------------------------------------------- checking


def tolerance(dtype: np.dtype) -> float:
    """DESIGN.md's bound on ||out - ref|| / ||ref||: 1e-5 for f32 (and f64), 2e-2 for 16-bit."""
    return 2e-2 if dtype.itemsize <= 2 else 1e-5


def output_error(out: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(error, tolerance): relative L2 error for floats; mismatch fraction (tolerance 0) else."""
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return float("inf"), 0.0
    if ref.dtype.kind in "biu":
        return (float(np.mean(out != ref)) if ref.size else 0.0), 0.0
    o, r = out.astype(np.float64), ref.astype(np.float64)
    if not np.isfinite(o).all():
        return float("inf"), tolerance(ref.dtype)
    return float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30)), tolerance(ref.dtype)


# --------------------------------------------------------------------------- Program


def _raw(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array (how buffers are bound, whatever the dtype)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _unwritten(dtype: np.dtype) -> float | int | bool:
    """The fill of fresh outputs: NaN, or the type's minimum for integers, so holes show."""
    if dtype.kind == "b":
        return False
    return int(np.iinfo(dtype).min) if dtype.kind in "iu" else float("nan")


def _write_back(
    inputs: Sequence[Any], arrays: Sequence[np.ndarray], donated: Sequence[int]
) -> None:
    """Donated torch tensors whose NumPy view was a copy (`_from_torch` copies a tensor that is
    not a contiguous CPU tensor) get its update."""
    for i in donated:
        x = inputs[i]
        if _is_torch(x) and not (x.device.type == "cpu" and x.is_contiguous()):
            x.copy_(_to_torch(arrays[i]))


def _is_torch(value: object) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def _from_torch(value: Any) -> np.ndarray:
    torch = importlib.import_module("torch")
    tensor = value.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _to_torch(array: np.ndarray) -> Any:
    torch = importlib.import_module("torch")
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class Program:
    """A compiled program: call it on arrays; `ir(stage)` and `cpu_source` show what it became."""

    # Whether the executor's reads of flagged buffers wait on the flags (then flagged events
    # need no counters in the tables): the CUDA target's do, the CPU executor's do not.
    reads_wait_on_flags: ClassVar[bool] = False

    def __init__(
        self,
        *,
        func: FuncOp,
        graph: GraphOp,
        texts: Mapping[str, str],
        cpu_source: str,
        library_path: Path,
        cache_key: str,
        cache_hit: bool,
        num_sms: int,
        num_threads: int | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        from mk.backends.tables import buffer_slots, tables_from_graph

        self.func = func
        self.graph = graph
        self.name = func.sym_name.data
        self.cpu_source = cpu_source
        self.library_path = library_path
        self.cache_key = cache_key
        self.cache_hit = cache_hit
        self.num_sms = num_sms
        self.num_threads = num_threads or max(1, min(os.cpu_count() or 1, num_sms))
        self.timeout_ms = timeout_ms
        self.max_delay_us = 0  # > 0: random sleeps around tasks (stress tests)
        self.seed = 0
        self.record_timeline = False
        self.last_timeline: np.ndarray | None = None  # [iterations][tasks] (start, end) ns
        self._texts = texts
        self._slots = buffer_slots(graph)
        self._results = [
            (tuple(t.get_shape()), numpy_dtype(t.get_element_type()))
            for t in func.function_type.outputs.data
            if isinstance(t, TensorType)
        ]
        bound = {s.index for s in self._slots if s.kind == "output"}
        missing = [k for k in range(len(self._results)) if k not in bound]
        if missing or len(self._results) != len(func.function_type.outputs.data):
            raise MkError(f"@{self.name}: result {missing[:1]} has no output buffer")
        self._executor: Any = None
        self._tables: Tables = tables_from_graph(graph, flags=self.reads_wait_on_flags)

    def __repr__(self) -> str:
        return (
            f"<mk.Program @{self.name}: {len(self._tables.tasks)} tasks on {self.num_sms} SMs, "
            f"{self.num_threads} threads>"
        )

    @property
    def tables(self) -> Tables:
        """The flat runtime tables the executor runs."""
        return self._tables

    @tables.setter
    def tables(self, tables: Tables) -> None:
        self._tables, self._executor = tables, None

    def ir(self, stage: str) -> str:
        """The IR text after a stage: "nn", "mugraph" or "task" (scheduled)."""
        if stage not in self._texts:
            raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
        return self._texts[stage]

    def executor(self) -> Any:
        """The mk._runtime.CpuExecutor over this program's tables and kernel library."""
        if self._executor is None:
            rt = runtime()
            t = self._tables
            self._executor = rt.CpuExecutor(
                t.tasks,
                t.waits,
                t.signals,
                t.queue_offsets,
                t.queue_tasks,
                t.buffers,
                num_counters=t.num_counters,
                iterations=t.iterations,
                arena_bytes=t.arena_bytes,
                library=rt.KernelLibrary(str(self.library_path)),
            )
        return self._executor

    def __call__(self, *inputs: Any, **run_options: Any) -> tuple[Any, ...]:
        """Run on `inputs` (checked: ValueError names the argument); returns the outputs.

        Keywords override the program's num_threads, timeout_ms, max_delay_us and seed.
        """
        torch_in = any(_is_torch(x) for x in inputs)
        arrays = [_from_torch(x) if _is_torch(x) else x for x in inputs]
        checked = check_inputs(self.func, arrays)
        check_donated(self.func, checked)
        outputs = self.run(checked, **run_options)
        _write_back(inputs, arrays, donated_args(self.func))
        return tuple(_to_torch(o) for o in outputs) if torch_in else outputs

    def run(
        self,
        inputs: Sequence[np.ndarray],
        *,
        num_threads: int | None = None,
        timeout_ms: int | None = None,
        max_delay_us: int | None = None,
        seed: int | None = None,
    ) -> tuple[np.ndarray, ...]:
        """Run on already checked NumPy inputs."""
        outputs = [np.full(shape, _unwritten(dtype), dtype) for shape, dtype in self._results]
        bindings: list[np.ndarray | None] = []
        for slot in self._slots:
            if slot.kind in ("input", "weight"):
                bindings.append(_raw(inputs[slot.index or 0]))
            elif slot.kind == "output":
                bindings.append(_raw(outputs[slot.index or 0]))
            else:
                bindings.append(None)
        # 0xFF bytes are NaN in every float type, so a read of unwritten arena data shows.
        arena = np.full(max(self._tables.arena_bytes, 1), 0xFF, dtype=np.uint8)
        options = {
            "num_threads": num_threads or self.num_threads,
            "timeout_ms": self.timeout_ms if timeout_ms is None else timeout_ms,
            "max_delay_us": self.max_delay_us if max_delay_us is None else max_delay_us,
            "seed": self.seed if seed is None else seed,
        }
        timeline = None
        if self.record_timeline:
            timeline = np.full((self._tables.iterations, len(self._tables.tasks), 2), -1, np.int64)
        self._launch(bindings, arena, {**options, "timeline": timeline})
        self.last_timeline = timeline
        return tuple(outputs)

    def trace(self, path: str | os.PathLike[str]) -> None:
        """Writes the last run's per-task timeline (record_timeline = True) as a Chrome trace:
        a row per SM (on the CPU, the executor's thread playing it), a box per task."""
        from mk.backends.trace import write_chrome_trace

        if self.last_timeline is None:
            raise MkError("no timeline: set prog.record_timeline = True and run first")
        write_chrome_trace(path, self.graph, self._tables, self.last_timeline)

    def _launch(
        self, bindings: list[np.ndarray | None], arena: np.ndarray, options: dict[str, Any]
    ) -> None:
        rt = runtime()
        try:
            self.executor().run(bindings, arena=arena, **options)
        except rt.DeadlockError as e:
            raise self._explain_deadlock(e) from None

    def _explain_deadlock(self, error: Any) -> Exception:
        """The executor's DeadlockError with the task and event named as in the IR."""
        rt = runtime()
        index = self.graph.index()
        event, element = index.locate_counter(int(error.counter))
        where = f"{index.describe(int(error.task))} waits on @{event}{list(element)}"
        better = rt.DeadlockError(f"@{self.name}: {where} on SM {error.sm}: {error}")
        for field in ("sm", "task", "counter", "iteration", "value", "threshold", "wait_ms"):
            setattr(better, field, getattr(error, field))
        return better
