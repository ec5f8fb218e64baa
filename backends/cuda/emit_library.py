"""The CUDA form of a library kernel's body: the CPU library emitter with byte copies for
concat, reshape and slice, binary kernels as one element loop, and failures returned as task
codes."""

from __future__ import annotations

import math
from collections.abc import Sequence

from mk.backends.cpu.emit import LibraryEmitter, int_list
from mk.backends.cpu.emit_ops import BINARY_ENUM, BufferRef
from mk.backends.cpu.emit_scalar import dims, dtype_code, is_float
from mk.backends.cuda.elementwise import element_offset
from mk.backends.cuda.failures import PICK_CODE
from mk.inputs import numpy_dtype, tensor_type


class DeviceLibraryEmitter(LibraryEmitter):
    """The CPU library emitter; an embedding id out of range fails the task with its index;
    concat and reshape between buffers of one dtype copy bytes (contiguous runs, 16-byte
    vectors where aligned) instead of going through float tiles."""

    def emit(self) -> list[str]:
        if self.slice_copy():
            return self.lines
        runs = self.copy_runs()
        if runs is None:
            return super().emit()
        outer, parts = runs
        srcs = ", ".join(f"mk::gpu::CopyPart{{buffers[{ref.index}], {run}}}" for ref, run in parts)
        self.lines.append("(void)t;  // a library kernel runs whole: no tile coordinates")
        self.lines.append(f"const mk::gpu::CopyPart parts[] = {{{srcs}}};")
        for ref, _ in self.results:
            self.lines.append(
                f"mk::gpu::concat_runs(buffers[{ref.index}], parts, {len(parts)}, {outer});"
            )
        return self.lines

    def slice_copy(self) -> bool:
        """A slice into whole result buffers of its source's dtype: each element copied from
        where it is (a prefill's last row of 2 MB had gone through a tile of all of it)."""
        if self.op.kind.data != "slice" or not self._whole_results():
            return False
        source = self.operands[0]
        if source.dtype != dtype_code(self.op.res[0].type):
            return False
        size = numpy_dtype(tensor_type(self.op.res[0]).get_element_type()).itemsize
        full, start, box = (
            f"mk::gpu::Dims{{{', '.join(map(str, v))}}}"
            for v in (source.shape, int_list(self.attrs["offsets"]), int_list(self.attrs["sizes"]))
        )
        self.lines.append("(void)t;  // a library kernel runs whole: no tile coordinates")
        for ref, _ in self.results:
            self.lines.append(
                f"mk::gpu::slice_copy<{size}>(buffers[{ref.index}], buffers[{source.index}], "
                f"{full}, {start}, {box});"
            )
        return True

    def _whole_results(self) -> bool:
        """Whether every result buffer is written whole, in the kernel's own shape."""
        return bool(self.results) and not any(
            any(sl.start != 0 or sl.stop != n for sl, n in zip(where, ref.shape, strict=True))
            or math.prod(ref.shape) != math.prod(self.out_shape)
            for ref, where in self.results
        )

    def copy_runs(self) -> tuple[int, list[tuple[BufferRef, int]]] | None:
        """(outer rows, [(source, bytes per row)]) when the kernel is a byte copy into whole
        result buffers of its own dtype, else None."""
        kind = self.op.kind.data
        out_dtype = dtype_code(self.op.res[0].type)
        if kind not in ("concat", "reshape") or not self._whole_results():
            return None
        if any(r.dtype != out_dtype for r in self.operands):
            return None
        size = numpy_dtype(tensor_type(self.op.res[0]).get_element_type()).itemsize
        if kind == "reshape":
            return 1, [(self.operands[0], math.prod(self.shapes[0]) * size)]
        d = self.dim("dim", len(self.shapes[0]))
        outer = math.prod(self.shapes[0][:d])
        return outer, [
            (ref, math.prod(shape[d:]) * size)
            for ref, shape in zip(self.operands, self.shapes, strict=True)
        ]

    def compute(self) -> None:
        """A binary kernel is one element loop with its broadcasts resolved here (the runtime
        walk over shape arrays gave wrong products on the H200 for f32 [1, 4096] operands)."""
        kind = self.op.kind.data
        if kind not in BINARY_ENUM:
            super().compute()
            return
        n = math.prod(self.out_shape)

        def read(i: int) -> str:
            at = f"a{i}[{element_offset(self.out_shape, self.shapes[i])}]"
            return at if is_float(self.op.operands[i].type) else f"static_cast<float>({at})"

        value = f"mk::gpu::binary(mk::gpu::{BINARY_ENUM[kind]}, {read(0)}, {read(1)})"
        self.lines += [
            f"r.resize({n});",
            f"{{  // {kind}",
            f"MK_FOR_EACH_U32(e, {n}) r[e] = {value};",
            "__syncthreads();",
            "}",
        ]

    def cache_write(self) -> list[str]:
        """The CPU form, or for new rows in a flagged buffer (mugraph-to-task's flag-rows)
        mk::gpu::cache_write_flagged, which polls each word for its flag."""
        cache, new, index = self.operands
        if not new.flagged:
            return super().cache_write()
        (out, _), *_ = self.results
        s = self.shapes
        dim = self.dim("dim", len(s[0]))
        n = math.prod(s[1]) * s[0][dim] // max(math.prod(s[0]), 1)
        dtype = dtype_code(tensor_type(self.op.operands[0]).element_type)
        self.lines += [
            "std::vector<int64_t> a2;",
            f"mk::cpu::load_all(a2, buffers[{index.index}], {index.dtype}, {dims(index.shape)});",
            f"const int64_t bad = mk::gpu::cache_write_flagged(buffers[{out.index}], "
            f"buffers[{cache.index}], buffers[{new.index}], a2, {dims(s[0])}, {dim}, {n}, "
            f"{dtype}, {numpy_dtype(tensor_type(self.op.operands[0]).element_type).itemsize}, "
            "arena);",
        ]
        self.cache_write_failure(dim, n, s[0][dim])
        return self.lines

    def cache_write_failure(self, dim: int, n: int, extent: int) -> None:
        # The bad start itself, which the host words as the CPU executor does (failures.py).
        outer = math.prod(self.shapes[0][:dim])
        self.lines.append(
            f"if (bad >= 0) return mk::gpu::cache_write_code(a2.p[bad * a2.n / {outer}]);"
        )

    def embedding_failure(self, picked: str, shape: Sequence[int]) -> None:
        self.lines.append("if (bad >= 0) return static_cast<int32_t>(bad) + 1;")

    def pick_failure(self) -> None:
        # A position out of the ids table: its index in `at`, above the picked ids' codes.
        self.lines.append(
            f"if (bad_at >= 0) return static_cast<int32_t>(bad_at) + 1 + {PICK_CODE};"
        )
