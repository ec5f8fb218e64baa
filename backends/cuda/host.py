"""The host side of the CUDA backend: a Program that binds buffers and launches the megakernel."""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from mk.backends.cuda.build import KernelResources, library_resources
from mk.backends.cuda.entries import launch_heads, queue_entries, resolve_heads
from mk.backends.cuda.failures import kernel_failure
from mk.backends.cuda.stream import STAGE_LOST
from mk.compiler import Program, _from_torch, _is_torch, _unwritten, _write_back
from mk.diagnostics import MkError
from mk.dialects.nn_decode import donated_args
from mk.inputs import check_donated, check_inputs, numpy_dtype, tensor_type
from mk.runtime_tables import RUN_STATUS

DEFAULT_NUM_SMS = 132  # an H200's SMs: one queue per SM
RUN_TIMEOUT, RUN_KERNEL_FAILED = 1, 2
FLAG_COUNTER = -2  # mk::gpu::kFlagCounter: a flagged value that never came
TAIL_OVERFLOW = 0x7FFFFFFD  # mk::kTailOverflow: a run status detail
# Every buffer the megakernel is given starts on this many bytes: its bodies' 16-byte vector
# loads and bulk copies take an aligned start for granted where the offsets are
# (StreamLinear::aligned, StreamAttention::aligned), so a call copies a tensor that is not, and
# launch() refuses one.
BUFFER_ALIGN = 16


class CudaRunError(RuntimeError):
    """A launch that stopped: a wait timed out (the watchdog) or a task body failed."""

    sm: int
    task: int
    counter: int
    iteration: int
    value: int
    threshold: int
    wait_ms: int


class LaunchParams(ctypes.Structure):
    """Mirror of mk::LaunchParams (mk/cuda_megakernel.cuh); its size is checked at load."""

    _fields_ = [
        *(
            (name, ctypes.c_uint64)
            for name in (
                "waits",
                "signals",
                "queue_offsets",
                "queue_entries",
                "buffers",
                "counters",
                "status",
                "abort_flag",
                "scratch",
                "scratch_per_sm",
                "timeline",
                "epoch",
                "heads",
            )
        ),  # fmt: skip
        ("num_sms", ctypes.c_int32),
        ("num_tasks", ctypes.c_int32),
        ("iterations", ctypes.c_int32),
        ("marks", ctypes.c_int32),
        ("timeout_ns", ctypes.c_int64),
    ]


def _torch() -> Any:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise MkError(
            "running a target='cuda' program needs an NVIDIA GPU and torch with CUDA; "
            "compiling works without one (see prog.cuda_source)"
        )
    return torch


def _torch_dtype(dtype: np.dtype) -> Any:
    torch = _torch()
    if dtype == ml_dtypes.bfloat16:
        return torch.bfloat16
    return getattr(torch, np.dtype(dtype).name if dtype != np.bool_ else "bool")


def _misalignment(x: Any) -> int:
    """Bytes past the last BUFFER_ALIGN boundary where a tensor's data starts."""
    return int(x.data_ptr()) % BUFFER_ALIGN


def _device_bytes(array: np.ndarray) -> Any:
    torch = _torch()
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if raw.size == 0:
        raw = np.zeros(16, np.uint8)
    return torch.from_numpy(raw.copy()).cuda()


class _DeviceState:
    """What a program keeps on the GPU between launches: the tables, the arena (0xFF-filled
    at the first launch and after a failed one, so a read of an unwritten intermediate shows as
    NaN), per-CTA scratch, the buffer pointers of the last launch with each CTA's launch head
    (entries.launch_heads), and the flags (counters, status, abort) and per-CTA epochs.
    Those are zeroed at the first launch and after a failed one only: a launch's iterations
    continue the earlier launches' counters (mk/events.h), so a launch is one graph node."""

    def __init__(
        self, tables: Any, num_sms: int, scratch_per_sm: int, entries: np.ndarray, slots: int
    ) -> None:
        torch = _torch()
        self.num_sms, self.scratch_per_sm = num_sms, scratch_per_sm
        self.source = tables
        self.tables = {
            "waits": _device_bytes(tables.waits),
            "signals": _device_bytes(tables.signals),
            "queue_offsets": _device_bytes(tables.queue_offsets.astype(np.int32)),
            "queue_entries": _device_bytes(entries),
        }
        # 0xFF-filled by reset_if_needed, before the first launch.
        self.arena = torch.empty(max(tables.arena_bytes, 1), dtype=torch.uint8, device="cuda")
        self.scratch = torch.empty(num_sms * scratch_per_sm, dtype=torch.uint8, device="cuda")
        self.counter_bytes = -(-max(tables.num_counters, 1) * 4 // 256) * 256
        self.flags = torch.zeros(self.counter_bytes + 256 + 256, dtype=torch.uint8, device="cuda")
        # Per CTA: the iterations the launches since the reset ran.
        self.epoch = torch.zeros(num_sms, dtype=torch.int32, device="cuda")
        if len(tables.queue_offsets) != num_sms + 1:
            raise MkError(f"{len(tables.queue_offsets) - 1} queues for {num_sms} CTAs")
        self.slots, self.heads = slots, launch_heads(entries, tables.queue_offsets, slots)
        self.heads_at = 0  # byte offset of the heads in `buffers`
        self.needs_reset = True
        self.buffers: Any = None
        self.bound: bytes = b""
        self.timeline: Any = None

    def bind(self, pointers: np.ndarray) -> None:
        """The buffer table and the heads with their addresses, in one copy when they change."""
        raw = pointers.tobytes()
        if raw != self.bound:
            self.heads_at = -(-len(raw) // 16) * 16
            heads = resolve_heads(self.heads, self.slots, pointers)
            table = np.zeros(self.heads_at + heads.nbytes, np.uint8)
            table[: len(raw)] = pointers.view(np.uint8)
            table[self.heads_at :] = heads.reshape(-1).view(np.uint8)
            self.buffers = _device_bytes(table)
            self.bound = raw

    def reset_if_needed(self) -> None:
        if self.needs_reset:
            self.flags.zero_()
            self.epoch.zero_()
            # The epochs restart: a flagged word a failed launch left could pass for
            # one of the next launch's.
            self.arena.fill_(0xFF)
            self.needs_reset = False

    def status(self) -> Any:
        at = self.counter_bytes
        return self.flags[at : at + RUN_STATUS.itemsize]

    def params(self, **fields: Any) -> LaunchParams:
        base = self.flags.data_ptr()
        return LaunchParams(
            **{name: tensor.data_ptr() for name, tensor in self.tables.items()},
            buffers=self.buffers.data_ptr(),
            heads=self.buffers.data_ptr() + self.heads_at,
            counters=base,
            status=base + self.counter_bytes,
            abort_flag=base + self.counter_bytes + 256,
            scratch=self.scratch.data_ptr(),
            scratch_per_sm=self.scratch_per_sm,
            epoch=self.epoch.data_ptr(),
            num_sms=self.num_sms,
            **fields,
        )


class CudaProgram(Program):
    """A program compiled for target='cuda': `cuda_source` always, a library when nvcc ran."""

    reads_wait_on_flags = True

    def __init__(
        self,
        *,
        cuda_source: str,
        scratch_per_sm: int,
        mark_labels: dict[str, tuple[str, ...]] | None = None,
        slot_rows: Sequence[Sequence[int]] = (),
        slots: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cuda_source = cuda_source
        self.scratch_per_sm = scratch_per_sm
        self._slot_rows, self._entry_slots = slot_rows, slots
        # A profile build's op-mark labels per grid (backends/cuda/op_marks.py), else None.
        self.mark_labels = mark_labels
        self.marks = max((len(v) for v in (mark_labels or {}).values()), default=0)
        self.last_marks: np.ndarray | None = None  # [iterations][tasks][marks] ns, 0 = none
        # With the timeline: [SMs] (entry, exit) ns of each CTA of the last launch, 0 where a
        # CTA stopped early.
        self.last_ctas: np.ndarray | None = None
        self._lib: Any = None
        self._state: _DeviceState | None = None

    @property
    def queue_entries(self) -> np.ndarray:
        """What the dispatcher reads at each queue position (entries.py), from the current
        tables: the device state is built from them once per tables object, so replacing
        `tables` (a test drops a signal that way) reaches the GPU."""
        return queue_entries(self.tables, self._slot_rows, self._entry_slots)

    @property
    def cuda_resources(self) -> KernelResources | None:
        """ptxas's report on the megakernel (registers a thread, spills); None without one."""
        return library_resources(self.library_path) if self.library_path is not None else None

    def __repr__(self) -> str:
        return f"<mk.Program @{self.name} (cuda): {len(self.tables.tasks)} tasks on {self.num_sms} SMs>"

    def library(self) -> Any:
        if self.library_path is None:
            raise MkError("this CUDA program was compiled without nvcc: no library to run")
        if self._lib is None:
            lib = ctypes.CDLL(str(self.library_path))
            lib.mk_cuda_launch.argtypes = [ctypes.POINTER(LaunchParams), ctypes.c_void_p]
            lib.mk_cuda_error_string.restype = ctypes.c_char_p
            if lib.mk_cuda_sizeof_params() != ctypes.sizeof(LaunchParams):
                raise MkError("mk::LaunchParams and host.LaunchParams differ in size")
            self._lib = lib
        return self._lib

    # ------------------------------------------------------------------------- calling

    def __call__(self, *inputs: Any, **run_options: Any) -> tuple[Any, ...]:
        """Torch CUDA tensors run in place (outputs are CUDA tensors); anything else is copied."""
        torch = _torch()
        if inputs and all(_is_torch(x) and x.is_cuda for x in inputs):
            self._check_tensors(inputs)
            aligned = [x if _misalignment(x) == 0 else x.clone() for x in inputs]
            outputs = self._new_outputs()
            self._launch_tensors(aligned, outputs, **run_options)
            for i in donated_args(self.func):  # updated in a copy: into the caller's tensor
                if aligned[i] is not inputs[i]:
                    inputs[i].copy_(aligned[i])
            return tuple(outputs)
        torch_in = any(_is_torch(x) for x in inputs)
        arrays = [_from_torch(x) if _is_torch(x) else x for x in inputs]
        checked = check_inputs(self.func, arrays)
        check_donated(self.func, checked)
        outs = self.run(checked, **run_options)
        _write_back(inputs, arrays, donated_args(self.func))
        if torch_in:
            return tuple(
                torch.from_numpy(o.view(np.int16)).view(torch.bfloat16)
                if o.dtype == ml_dtypes.bfloat16
                else torch.from_numpy(o)
                for o in outs
            )
        return outs

    def _check_tensors(self, inputs: Sequence[Any]) -> None:
        args = self.func.body.block.args
        if len(inputs) != len(args):
            raise ValueError(f"@{self.name} expects {len(args)} inputs, got {len(inputs)}")

        for i, (arg, x) in enumerate(zip(args, inputs, strict=True)):
            ty = tensor_type(arg)
            shape, dtype = tuple(ty.get_shape()), numpy_dtype(ty.get_element_type())
            if tuple(x.shape) != shape or x.dtype != _torch_dtype(dtype):
                raise ValueError(
                    f"@{self.name} input #{i}: expected {dtype}{list(shape)}, "
                    f"got {x.dtype}{list(x.shape)}"
                )
            if not x.is_contiguous():
                raise ValueError(f"@{self.name} input #{i}: expected a contiguous tensor")

    def run(
        self, inputs: Sequence[np.ndarray], *, timeout_ms: int | None = None, **_: Any
    ) -> tuple[np.ndarray, ...]:
        """Copies NumPy inputs to the GPU, runs, copies the outputs back."""
        torch = _torch()
        tensors = [_device_bytes(a) for a in inputs]
        outputs = self._new_outputs()
        self._launch_tensors(tensors, outputs, timeout_ms=timeout_ms)
        for i in donated_args(self.func):  # written in place on the GPU: copy the update back
            raw = tensors[i].view(-1).cpu().numpy()
            inputs[i].reshape(-1).view(np.uint8)[...] = raw
        result = []
        for (shape, dtype), out in zip(self._results, outputs, strict=True):
            raw = out.contiguous().view(-1).view(torch.uint8).cpu().numpy()
            result.append(raw.view(dtype).reshape(shape).copy())
        return tuple(result)

    def launch(self, *inputs: Any, out: Sequence[Any] | None = None) -> tuple[Any, ...]:
        """Enqueues one run on torch's current stream and returns its output tensors without
        waiting (NaN-filled until the run writes them, or the given `out` tensors, which keeps
        every pointer fixed, as a CUDA graph capture needs); `check()` waits and raises what
        the run reported. A failed run stops the program: later launches run nothing until
        `check()` has raised its error, and the launch after that starts afresh."""
        _torch()  # a clear error without torch or a GPU
        if not inputs or not all(_is_torch(x) and x.is_cuda for x in inputs):
            raise ValueError(f"@{self.name}: launch() takes CUDA tensors")
        self._check_tensors(inputs)
        for i, x in enumerate(inputs):
            self._check_aligned(f"input #{i}", x)
        if out is None:
            outputs = self._new_outputs()
        else:
            outputs = list(out)
            self._check_outputs(outputs)
        self._enqueue(list(inputs), outputs, None)
        return tuple(outputs)

    def _new_outputs(self) -> list[Any]:
        """CUDA tensors for the results, NaN-filled (integers: their minimum) so an element no
        task wrote shows."""
        torch = _torch()
        return [
            torch.full(shape, _unwritten(dtype), dtype=_torch_dtype(dtype), device="cuda")
            for shape, dtype in self._results
        ]

    def _check_outputs(self, outputs: Sequence[Any]) -> None:
        if len(outputs) != len(self._results):
            raise ValueError(f"@{self.name}: out= takes {len(self._results)} tensors")
        for i, ((shape, dtype), o) in enumerate(zip(self._results, outputs, strict=True)):
            if tuple(o.shape) != tuple(shape) or o.dtype != _torch_dtype(dtype) or not o.is_cuda:
                raise ValueError(f"@{self.name} out #{i}: expected a CUDA {dtype}{list(shape)}")
            if not o.is_contiguous():
                raise ValueError(f"@{self.name} out #{i}: expected a contiguous tensor")
            self._check_aligned(f"out #{i}", o)

    def _check_aligned(self, what: str, x: Any) -> None:
        """launch() keeps every pointer it is given (a CUDA graph captures them), so it cannot
        copy a misaligned tensor as a call does."""
        if off := _misalignment(x):
            raise ValueError(
                f"@{self.name} {what}: its data starts {off} bytes past a {BUFFER_ALIGN}-byte "
                f"boundary (a view at an offset?); launch() needs aligned tensors: pass a copy"
            )

    def check(self) -> None:
        """Waits for the last launch; raises CudaRunError for a timed-out wait or failed task."""
        state = self._state
        if state is None:
            return
        _torch().cuda.current_stream().synchronize()
        status = np.frombuffer(state.status().cpu().numpy().tobytes(), RUN_STATUS)[0]
        if self.record_timeline and state.timeline is not None:
            t = self.tables
            words = state.timeline.cpu().numpy()
            at = t.iterations * len(t.tasks) * (2 + self.marks)
            rows = words[:at].reshape(t.iterations, len(t.tasks), 2 + self.marks)
            self.last_timeline = rows[..., :2]
            self.last_ctas = words[at:].reshape(self.num_sms, 2)
            self.last_marks = rows[..., 2:] if self.marks else None
        if int(status["error"]) != 0:
            state.needs_reset = True
            raise self._run_error(status)

    def _launch_tensors(
        self,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        *,
        timeout_ms: int | None = None,
        **_: Any,
    ) -> None:
        self._enqueue(inputs, outputs, timeout_ms)
        self.check()

    def _enqueue(
        self, inputs: Sequence[Any], outputs: Sequence[Any], timeout_ms: int | None
    ) -> None:
        torch = _torch()
        lib = self.library()
        if self._state is None or self._state.source is not self.tables:
            self._state = _DeviceState(
                self.tables,
                self.num_sms,
                self.scratch_per_sm,
                self.queue_entries,
                self._entry_slots,
            )
        state = self._state
        state.bind(self._pointers(state, inputs, outputs))
        state.reset_if_needed()
        state.timeline = None
        t = self.tables
        if self.record_timeline:
            # Then each CTA's entry and exit (mk/cuda_megakernel.cuh).
            words = t.iterations * len(t.tasks) * (2 + self.marks) + 2 * self.num_sms
            state.timeline = torch.zeros(words, dtype=torch.int64, device="cuda")
        params = state.params(
            timeline=0 if state.timeline is None else state.timeline.data_ptr(),
            num_tasks=len(t.tasks),
            iterations=t.iterations,
            marks=self.marks if self.record_timeline else 0,
            timeout_ns=(self.timeout_ms if timeout_ms is None else timeout_ms) * 1_000_000,
        )
        rc = lib.mk_cuda_launch(
            ctypes.byref(params), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        )
        if rc != 0:
            message = lib.mk_cuda_error_string(rc).decode()
            raise MkError(
                f"@{self.name}: the megakernel launch failed ({num_sms_note(self.num_sms)}): {message}"
            )

    def _pointers(
        self, state: _DeviceState, inputs: Sequence[Any], outputs: Sequence[Any]
    ) -> np.ndarray:
        t = self.tables
        pointers = np.zeros(max(len(self._slots), 1), np.uint64)
        for row, slot in enumerate(self._slots):
            if slot.kind in ("input", "weight"):
                pointers[row] = inputs[slot.index or 0].data_ptr()
            elif slot.kind == "output":
                pointers[row] = outputs[slot.index or 0].data_ptr()
            else:
                pointers[row] = state.arena.data_ptr() + int(t.buffers[row]["offset_or_ptr"])
        return pointers

    def _run_error(self, status: np.void) -> CudaRunError:
        index = self.graph.index()
        task, sm = int(status["task"]), int(status["sm"])
        if int(status["error"]) == RUN_TIMEOUT and int(status["counter"]) == FLAG_COUNTER:
            text = (
                f"@{self.name}: {index.describe(task)} on SM {sm} waits for a value of a flagged "
                f"buffer it reads: the watchdog saw flag {int(status['value'])}, not "
                f"{int(status['threshold'])}, in iteration {int(status['iteration'])} after "
                f"{int(status['wait_ms'])} ms"
            )
        elif int(status["error"]) == RUN_TIMEOUT:
            event, element = index.locate_counter(int(status["counter"]))
            text = (
                f"@{self.name}: {index.describe(task)} waits on @{event}{list(element)} "
                f"(counter {int(status['counter'])}) on SM {sm}: the watchdog saw "
                f"{int(status['value'])} < {int(status['threshold'])} in iteration "
                f"{int(status['iteration'])} after {int(status['wait_ms'])} ms"
            )
        elif int(status["value"]) == TAIL_OVERFLOW and int(status["counter"]) == -1:
            text = (
                f"@{self.name}: {index.describe(task)} on SM {sm} in iteration "
                f"{int(status['iteration'])}: its signals completed more tail elements than "
                f"the dispatcher holds (mk::kTailStack)"
            )
        elif int(status["value"]) == STAGE_LOST - 1:
            text = (
                f"@{self.name}: {index.describe(task)} on SM {sm} in iteration "
                f"{int(status['iteration'])}: its weights or activation copied into shared "
                "memory did not land within 2 s (a backend bug)"
            )
        else:
            grid, _ = index.locate(task)
            what = kernel_failure(grid, int(status["value"])) or f"detail {int(status['value'])}"
            text = (
                f"@{self.name}: {index.describe(task)} failed on SM {sm} in iteration "
                f"{int(status['iteration'])}: {what}"
            )
        error = CudaRunError(text)
        for field in ("sm", "task", "counter", "iteration", "value", "threshold", "wait_ms"):
            setattr(error, field, int(status[field]))
        return error

    # ------------------------------------------------------------------------- trace


def num_sms_note(num_sms: int) -> str:
    return f"{num_sms} CTAs of 256 threads, cooperative"
