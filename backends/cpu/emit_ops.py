"""C++ for one block of a `mugraph.graph_def`: tile loads, tile ops, accumulators, tile stores.

The emitted code mirrors `interp/mugraph.py _run_block` step for step: each for-loop iteration
loads the input tiles and runs the loop ops (accumulators update), then the accumulator results
and the epilogue ops, then every output tile goes to its result buffer. Each tile op rounds its
result to the result's element type, as the interpreter's `astype` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_scalar import (
    dims,
    dtype_code,
    float_literal,
    is_float,
    scalar_body,
    tile_ctype,
)
from mk.diagnostics import MkError, op_location
from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph import ArgmaxOp, GraphDefOp, InputOp, OutputOp, PositionOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import (
    AccumOp,
    AccumSoftmaxOp,
    BinaryOp,
    ConcatOp,
    MatmulOp,
    ReduceOp,
    ReshapeOp,
    RMSNormOp,
    RopeOp,
    ThreadMapOp,
    UnaryOp,
)

UNARY_ENUM = {k: f"mk::cpu::U_{k.upper()}" for k in maps.UNARY_KINDS}
BINARY_ENUM = {"add": "B_ADD", "sub": "B_SUB", "mul": "B_MUL", "div": "B_DIV"}
BINARY_ENUM |= {"maximum": "B_MAX", "minimum": "B_MIN"}
REDUCE_ENUM = {"sum": "mk::cpu::R_SUM", "max": "mk::cpu::R_MAX", "mean": "mk::cpu::R_MEAN"}


@dataclass(frozen=True)
class BufferRef:
    """Where a kernel operand or result lives: its buffers[] index, storage dtype and shape, and
    whether its elements carry flags (a flagged task.buffer)."""

    index: int
    dtype: str
    shape: tuple[int, ...]
    flagged: bool = False


def _affine(terms: Sequence[tuple[int, str]]) -> str:
    parts = [f"{c} * {v}" for c, v in terms if c]
    return " + ".join(parts) if parts else "0"


# The task's block coordinates, which the maps' start expressions use.
BLOCK_COORDS = (
    "const int64_t bx = t->coord[0], by = t->coord[1], bz = t->coord[2];",
    "(void)bx; (void)by; (void)bz;",
)


class GraphDefEmitter:
    """Emits the statements of one task of a graph_def; `lines` holds them after `emit()`."""

    def __init__(
        self, op: GraphDefOp, operands: Sequence[BufferRef], results: dict[int, list[BufferRef]]
    ) -> None:
        self.op, self.operands, self.results = op, operands, results
        self.grid, self.forloop = op.grid_shape(), op.forloop_range()
        self.names: dict[SSAValue, str] = {}
        self.lines: list[str] = []
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"s{self.count}"

    def var(self, value: SSAValue) -> str:
        if value not in self.names:
            hint = value.name_hint or "t"
            clean = "".join(c if c.isalnum() else "_" for c in hint)
            self.names[value] = f"t{len(self.names)}_{clean}"
        return self.names[value]

    def f(self, value: SSAValue) -> str:
        """The tile as floats (integer tiles are converted, as the interpreter's _f32 does)."""
        return self.var(value) if is_float(value.type) else f"mk::cpu::as_float({self.var(value)})"

    def emit(self) -> list[str]:
        out = self.lines
        out += BLOCK_COORDS
        body = self.op.body.block
        for op in body.ops:
            for r in op.results:
                if self.materialised(r):
                    out.append(f"std::vector<{tile_ctype(r.type)}> {self.var(r)};")
        loop, epilogue = self.op.loop_ops(), self.op.epilogue_ops()
        accs = [o for o in loop if isinstance(o, AccumOp | AccumSoftmaxOp)]
        for acc in accs:
            self.init_accumulator(acc)
        after = self.after_loop(loop, epilogue)
        self.emit_loop([op for op in loop if op not in after])
        out.append(f"const int64_t last = {self.forloop - 1};")
        out.append("(void)last;")
        for acc in accs:
            self.finish_accumulator(acc)
        for op in after:
            self.load(op, "last")
        for op in epilogue:
            if not isinstance(op, OutputOp):
                self.step(op, "last")
        for op in self.op.output_ops():
            self.store(op)
        return out

    def after_loop(self, loop: Sequence[Operation], epilogue: Sequence[Operation]) -> list[InputOp]:
        """Loop-invariant inputs only the epilogue reads: loaded once, after the loop (an
        accumulating output's weight columns would otherwise be read every iteration)."""
        later = set(epilogue)
        return [
            op for op in loop
            if isinstance(op, InputOp) and op.fmap_dim() < 0 and op.tile.uses
            and all(u.operation in later for u in op.tile.uses)
        ]  # fmt: skip

    def materialised(self, value: SSAValue) -> bool:
        """Whether `value` is held as a tile (a backend may compute some values without one)."""
        return True

    def emit_loop(self, loop: Sequence[Operation]) -> None:
        """The for-loop over the reduction: every loop op per iteration (accumulators set)."""
        self.lines.append(f"for (int64_t it = 0; it < {self.forloop}; ++it) {{")
        for op in loop:
            self.step(op, "it")
        self.lines.append("}")

    # -------------------------------------------------------------------------- inputs, outputs

    def start_terms(self, op: InputOp, it: str) -> list[list[tuple[int, str]]]:
        """Per dimension of the source, the (step, variable) terms of where this block's tile
        starts in for-loop iteration `it`."""
        shape, imap, fmap = shape_of(op.source), op.imap_dims(), op.fmap_dim()
        tile = op.tile_shape()
        starts = []
        for d in range(len(shape)):
            terms = [
                (shape[d] // self.grid[a], ("bx", "by", "bz")[a]) for a in range(3) if imap[a] == d
            ]
            if fmap == d:
                terms.append((tile[d], it))
            starts.append(terms)
        return starts

    def input_starts(self, op: InputOp, it: str) -> list[str]:
        return [_affine(terms) for terms in self.start_terms(op, it)]

    def load(self, op: InputOp, it: str) -> None:
        ref = self.operands[op.source_index()]
        starts = "mk::cpu::Dims{" + ", ".join(self.input_starts(op, it)) + "}"
        self.lines.append(
            f"mk::cpu::load_box({self.var(op.tile)}, buffers[{ref.index}], {ref.dtype}, "
            f"{dims(ref.shape)}, {starts}, {dims(op.tile_shape())});"
        )
        if dtype_code(op.tile.type) != ref.dtype:
            self.round(op.tile)

    def output_starts(self, op: OutputOp) -> list[str]:
        """Per dimension of the result, where this block's tile starts (the omap's part)."""
        tile, omap = shape_of(op.tile), op.omap_dims()
        return [
            _affine([(tile[d], ("bx", "by", "bz")[a]) for a in range(3) if omap[a] == d])
            for d in range(len(tile))
        ]

    def store(self, op: OutputOp) -> None:
        tile = shape_of(op.tile)
        starts = self.output_starts(op)
        if (at := op.position()) is not None:
            pos, d, _ = at
            offset = "" if starts[d] == "0" else f" + {starts[d]}"  # the block's, if split
            starts[d] = f"static_cast<int64_t>({self.var(pos)}[0]){offset}"
            self.position_check(op, starts[d], tile[d], shape_of(op.dest)[d], d)
        for ref in self.results.get(op.result_index(), []):
            if op.accumulate is not None:
                self.add_box(ref, starts, op)
            else:
                self.store_box(ref, starts, op)

    def position_check(self, op: OutputOp, pos: str, n: int, extent: int, d: int) -> None:
        """Fails the task when an in-place output's rows [pos, pos + n) leave [0, extent)."""
        loc = op_location(self.op)
        prefix = f"{loc}: " if loc else ""
        self.lines += [
            f"if ({pos} < 0 || {pos} + {n} > {extent}) {{",
            f"  return fail(\"{prefix}error: 'mugraph.graph_def' writes positions [\" + "
            f'std::to_string({pos}) + ", " + std::to_string({pos} + {n}) + ") outside '
            f'[0, {extent}) of dim {d}");',
            "}",
        ]

    def store_box(self, ref: BufferRef, starts: Sequence[str], op: OutputOp) -> None:
        """Write `op`'s tile into the result buffer `ref` at the per-dimension `starts`."""
        start = "mk::cpu::Dims{" + ", ".join(starts) + "}"
        self.lines.append(
            f"mk::cpu::store_box(buffers[{ref.index}], {ref.dtype}, {dims(ref.shape)}, "
            f"{start}, {dims(shape_of(op.tile))}, {self.var(op.tile)});"
        )

    def add_box(self, ref: BufferRef, starts: Sequence[str], op: OutputOp) -> None:
        """Add `op`'s tile into the f32 result buffer `ref` (blocks add concurrently)."""
        start = "mk::cpu::Dims{" + ", ".join(starts) + "}"
        self.lines.append(
            f"mk::cpu::add_box(static_cast<float*>(buffers[{ref.index}]), {dims(ref.shape)}, "
            f"{start}, {dims(shape_of(op.tile))}, {self.var(op.tile)});"
        )

    def round(self, value: SSAValue) -> None:
        if is_float(value.type) and dtype_code(value.type) != "mk::DTYPE_F32":
            self.lines.append(f"mk::cpu::round_tile({self.var(value)}, {dtype_code(value.type)});")

    # -------------------------------------------------------------------------- accumulators

    def init_accumulator(self, op: Operation) -> None:
        if isinstance(op, AccumOp):
            kind = maps.ACCUM_KINDS[op.kind.data]
            start = "0.0f" if kind.combine == "sum" else "-INFINITY"
            n = _numel(shape_of(op.res))
            self.lines.append(f"{self.var(op.res)}.assign({n}, {start});")
            return
        assert isinstance(op, AccumSoftmaxOp)
        for value, start in ((op.o, "0.0f"), (op.m, "-INFINITY"), (op.l, "0.0f")):
            self.lines.append(f"{self.var(value)}.assign({_numel(shape_of(value))}, {start});")

    def update_accumulator(self, op: Operation) -> None:
        if isinstance(op, AccumOp):
            kind = maps.ACCUM_KINDS[op.kind.data]
            flags = ", ".join(
                "true" if f else "false"
                for f in (kind.square, kind.reduce_last, kind.combine == "max")
            )
            self.lines.append(
                f"mk::cpu::accum_update({self.var(op.res)}, {self.f(op.x)}, "
                f"{dims(shape_of(op.x))}, {flags});"
            )
            return
        assert isinstance(op, AccumSoftmaxOp)
        self.lines.append(
            f"mk::cpu::accum_softmax_update({self.var(op.o)}, {self.var(op.m)}, "
            f"{self.var(op.l)}, {dims(shape_of(op.o))}, {self.f(op.scores)}, "
            f"{dims(shape_of(op.scores))}, {self.f(op.v)}, {dims(shape_of(op.v))});"
        )

    def finish_accumulator(self, op: Operation) -> None:
        if isinstance(op, AccumOp):
            kind = maps.ACCUM_KINDS[op.kind.data]
            if kind.mean:
                shape = shape_of(op.x)
                extent = (shape[-1] if shape else 1) * self.forloop
                self.lines.append(
                    f"for (float& e : {self.var(op.res)}) e = e / {float_literal(extent)};"
                )
            self.round(op.res)
            return
        for value in op.results:
            self.round(value)

    # -------------------------------------------------------------------------- tile ops

    def step(self, op: Operation, it: str) -> None:
        if isinstance(op, InputOp):
            self.load(op, it)
        elif isinstance(op, AccumOp | AccumSoftmaxOp):
            self.update_accumulator(op)
        elif isinstance(op, ThreadMapOp):
            self.thread_map(op)
        else:
            self.tile_op(op, it)
            for r in op.results:
                self.round(r)

    def tile_op(self, op: Operation, it: str) -> None:
        emit, v, f = self.lines.append, self.var, self.f
        if isinstance(op, MatmulOp):
            tb = "true" if op.transpose_b is not None else "false"
            emit(
                f"mk::cpu::matmul_tile({v(op.res)}, {dims(shape_of(op.res))}, {f(op.a)}, "
                f"{dims(shape_of(op.a))}, {f(op.b)}, {dims(shape_of(op.b))}, {tb});"
            )
        elif isinstance(op, UnaryOp):
            factor = float_literal(float(op.factor.value.data)) if op.factor is not None else "0.0f"
            emit(
                f"mk::cpu::unary_tile({v(op.res)}, {f(op.x)}, {UNARY_ENUM[op.kind.data]}, {factor});"
            )
        elif isinstance(op, BinaryOp):
            emit(
                f"mk::cpu::binary_tile({v(op.res)}, {dims(shape_of(op.res))}, {f(op.a)}, "
                f"{dims(shape_of(op.a))}, {f(op.b)}, {dims(shape_of(op.b))}, "
                f"mk::cpu::{BINARY_ENUM[op.kind.data]});"
            )
        elif isinstance(op, ReduceOp):
            emit(
                f"mk::cpu::reduce_tile({v(op.res)}, {f(op.x)}, {dims(shape_of(op.x))}, "
                f"{op.dim.value.data}, {REDUCE_ENUM[op.kind.data]});"
            )
        elif isinstance(op, RopeOp):
            emit(
                f"mk::cpu::lib_rope({v(op.res)}, {f(op.x)}, {dims(shape_of(op.x))}, {f(op.cos)}, "
                f"{dims(shape_of(op.cos))}, {f(op.sin)}, {dims(shape_of(op.sin))});"
            )
        elif isinstance(op, RMSNormOp):
            emit(
                f"mk::cpu::rms_norm_tile({v(op.res)}, {dims(shape_of(op.res))}, {f(op.x)}, "
                f"{dims(shape_of(op.x))}, {f(op.g)}, {dims(shape_of(op.g))}, "
                f"{float_literal(float(op.epsilon.value.data))});"
            )
        else:
            self.layout_op(op, it)

    def layout_op(self, op: Operation, it: str) -> None:
        emit, v = self.lines.append, self.var
        if isinstance(op, ConcatOp):
            floats = is_float(op.res.type)
            parts = [self.f(x) if floats else v(x) for x in op.inputs]
            ctype = tile_ctype(op.res.type)
            tmp = self.fresh()
            for i, p in enumerate(parts):
                emit(f"const std::vector<{ctype}> {tmp}_{i} = {p};")
            ptrs = ", ".join(f"&{tmp}_{i}" for i in range(len(parts)))
            shapes = ", ".join(dims(shape_of(x)) for x in op.inputs)
            emit(
                f"mk::cpu::concat_tile<{ctype}>({v(op.res)}, {{{ptrs}}}, {{{shapes}}}, "
                f"{op.dim.value.data});"
            )
        elif isinstance(op, ReshapeOp):
            if is_float(op.res.type) == is_float(op.x.type):
                emit(f"{v(op.res)} = {v(op.x)};")
            else:
                emit(f"{v(op.res)} = mk::cpu::as_float({v(op.x)});")
        elif isinstance(op, PositionOp):
            d = op.dim.value.data
            src = op.source()
            assert src is not None
            starts = (
                self.input_starts(src, it) if isinstance(src, InputOp) else self.output_starts(src)
            )
            start = starts[d]
            emit(f"mk::cpu::position_tile({v(op.res)}, {dims(shape_of(op.x))}, {d}, {start});")
        elif isinstance(op, ArgmaxOp):
            emit(
                f"mk::cpu::argmax_tile({v(op.max)}, {v(op.arg)}, {self.f(op.values)}, "
                f"{v(op.payload)}, {dims(shape_of(op.values))}, {op.dim.value.data});"
            )
        else:
            raise MkError(f"'{op.name}' is not supported by the CPU backend", op_location(op))

    def thread_map(self, op: ThreadMapOp) -> None:
        out_shape = maps.broadcast_shapes(*(shape_of(a) for a in op.args))
        assert out_shape is not None
        n = _numel(out_shape)
        for r in op.res:
            self.lines.append(f"{self.var(r)}.resize({n});")
        operand_shapes = ", ".join(dims(shape_of(a)) for a in op.args)
        self.lines += [
            "{",
            f"mk::cpu::Walk w({dims(out_shape)}, {{{operand_shapes}}});",
            f"for (int64_t e = 0; e < {n}; ++e, w.next()) {{",
        ]
        self.thread_map_element(op, lambda k: f"w.at({k})")
        self.lines += ["}", "}"]

    def thread_map_element(self, op: ThreadMapOp, offset: Callable[[int], str]) -> None:
        """The body of a thread_map's element loop: read each operand at `offset(k)` (a C++
        expression of the element index `e`), run the scalar region, write each result at `e`."""
        emit = self.lines.append
        inputs = []
        for k, (a, arg) in enumerate(zip(op.args, op.body.block.args, strict=True)):
            name = self.fresh()
            ctype = "float" if is_float(arg.type) else "int64_t"
            emit(f"const {ctype} {name} = static_cast<{ctype}>({self.var(a)}[{offset(k)}]);")
            inputs.append(name)
        lines, yielded = scalar_body(op.body.block, inputs, self.fresh)
        self.lines.extend(lines)
        for r, y in zip(op.res, yielded, strict=True):
            if is_float(r.type):
                emit(
                    f"{self.var(r)}[e] = mk::cpu::round_to(static_cast<float>({y}), "
                    f"{dtype_code(r.type)});"
                )
            else:
                emit(f"{self.var(r)}[e] = static_cast<int64_t>({y});")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def tensor_shape(value: SSAValue) -> tuple[int, ...]:
    ty = value.type
    assert isinstance(ty, TensorType)
    return tuple(ty.get_shape())
