"""The task dialect: the megakernel's SM-level schedule as task grids, event tensors and queues.

A `task.graph` holds buffers (arguments, results and an activation arena), event tensors
(counters indexed by tile coordinates), task grids (one task per grid point, with affine
read/write footprints and affine maps to the event elements they wait on and signal) and,
after scheduling, one ordered queue of global task ids per SM. Everything is symbolic: a grid
of 10,000 tiles is one op.

    task.graph @step iterations 4 arena 65536 {
      task.buffer @x input 0 : tensor<8x4096xbf16>
      task.buffer @h activation offset 0 : tensor<8x4096xbf16>
      task.event @h_ready [16] count 3
      task.grid @norm [48]
          reads(@x[(d0) -> (0, 0)] [8, 4096])
          writes(@h[(d0) -> (0, d0 * 128)] [8, 128])
          signals(@h_ready (d0) -> (d0 floordiv 3)) {
      ^bb0(%x: tensor<8x4096xbf16>, %h: tensor<8x4096xbf16>):
        task.yield %h : tensor<8x4096xbf16>
      }
      task.schedule num_sms 132 {
        task.queue sm 0 [0, 1, 2]
      }
    }

A grid body sees whole buffers, as an MPK task gets tensor pointers plus its tile coordinates:
its block arguments are the buffers of its read footprints then of its write footprints (a
buffer both read and written appears twice), and `task.yield` gives one whole-buffer value per
write. The body holds the original kernel; one task runs that kernel's block at the task's
coordinates. Footprints bound what a task may touch: outside its read footprints a task's
inputs are undefined, and only its write footprints of the yielded values are kept.

Global task ids number the grids' tasks in block order, row-major inside a grid. An event
element is ready in iteration t (0-based) once its counter reaches count * (t + 1 - distance),
where `distance` (default 0) of a wait makes it loop-carried (iteration t waits on t - distance).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar
from weakref import WeakKeyDictionary

import numpy as np
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    lazy_traits_def,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, NoTerminator, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

# Relative, so that type checkers that see this folder as `dialects` keep one module identity.
from .task_index import GraphIndex
from .task_maps import (
    MAX_ELEMENTS,
    EdgeAttr,
    FootprintAttr,
    check_points,
    delinearize,
    element_problem,
    format_coords,
    format_int_list,
    grid_size,
    int_value,
    parse_attributes,
    parse_block_region,
    parse_int_list,
    rectangle_problem,
    signal_counts,
)
from .task_schedule import QueueOp, ScheduleOp

ARENA_ALIGNMENT = 128
ARENA_KINDS = ("activation", "workspace")
BUFFER_KINDS = ("input", "weight", "output", "activation", "workspace")
_T = TypeVar("_T")
_OpT = TypeVar("_OpT", bound=Operation)


def _i64s(values: Sequence[int]) -> DenseArrayBase:
    return DenseArrayBase.from_list(i64, [int(v) for v in values])


def _parent_graph(op: Operation) -> GraphOp:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, GraphOp):
        parent = parent.parent_op()
    if parent is None:
        raise VerifyException(f"'{op.name}' must be inside a task.graph")
    return parent


# Verifying a graph must stay linear in its size (a model has thousands of declarations), so
# symbol lookups go through a per-graph table, rebuilt whenever an entry proves stale, and the
# event checks, which read every grid, are computed for all events at once by GraphOp.verify.
_SYMBOL_TABLES: WeakKeyDictionary[GraphOp, dict[str, Operation]] = WeakKeyDictionary()
_PENDING_EVENT_CHECKS: WeakKeyDictionary[GraphOp, dict[EventOp, str | None]] = WeakKeyDictionary()


def _lookup(graph: GraphOp, name: str, kind: type[_OpT]) -> _OpT | None:
    """The declaration `@name` of the graph if it is a `kind` op (the first one, if repeated)."""
    block = graph.body.block
    table = _SYMBOL_TABLES.get(graph, {})
    op = table.get(name)
    if op is None or op.parent is not block or _symbol(op) != name:
        table = {}
        for candidate in block.ops:
            if (symbol := _symbol(candidate)) is not None:
                table.setdefault(symbol, candidate)
        _SYMBOL_TABLES[graph] = table
        op = table.get(name)
    return op if isinstance(op, kind) else None


def _symbol(op: Operation) -> str | None:
    name = op.properties.get("sym_name")
    return name.data if isinstance(name, StringAttr) else None


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


# --------------------------------------------------------------------------- task.graph


@irdl_op_definition
class GraphOp(IRDLOperation):
    """The task graph of one program, run `iterations` times inside the megakernel."""

    name = "task.graph"

    sym_name = prop_def(SymbolNameConstraint())
    iterations = prop_def(IntegerAttr.constr(type=i64))
    arena = prop_def(IntegerAttr.constr(type=i64))
    body = region_def("single_block")

    traits = traits_def(NoTerminator(), SymbolOpInterface())

    def __init__(self, name: str, iterations: int, arena: int, body: Region | None = None) -> None:
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "iterations": IntegerAttr(iterations, i64),
                "arena": IntegerAttr(arena, i64),
            },
            regions=[body if body is not None else Region(Block())],
        )

    def index(self) -> GraphIndex:
        """A snapshot of the declarations by name and the grids' first task ids."""
        index = GraphIndex(self)
        for op in self.body.block.ops:
            if isinstance(op, BufferOp):
                index.buffers.setdefault(op.sym_name.data, op)
            elif isinstance(op, EventOp):
                index.add_event(op)
            elif isinstance(op, GridOp):
                index.add_grid(op)
            elif isinstance(op, ScheduleOp) and index.schedule is None:
                index.schedule = op
        return index

    def verify(self, verify_nested_ops: bool = True) -> None:
        index = self.index()
        _PENDING_EVENT_CHECKS[self] = {e: _event_problem(e, index) for e in index.events.values()}
        super().verify(verify_nested_ops)

    def verify_(self) -> None:
        if int_value(self.iterations) < 1:
            raise VerifyException(f"iterations must be >= 1, got {int_value(self.iterations)}")
        if int_value(self.arena) < 0:
            raise VerifyException(f"arena size must be >= 0, got {int_value(self.arena)}")
        names: set[str] = set()
        slots: dict[tuple[str, int], str] = {}
        schedules = 0
        for op in self.body.block.ops:
            if not isinstance(op, BufferOp | EventOp | GridOp | ScheduleOp):
                raise VerifyException(f"'{op.name}' is not allowed in a task.graph")
            schedules += isinstance(op, ScheduleOp)
            if isinstance(op, ScheduleOp):
                continue
            name = op.sym_name.data
            if name in names:
                raise VerifyException(f"symbol @{name} is defined twice")
            names.add(name)
            if isinstance(op, BufferOp) and op.index is not None:
                self._claim_slot(op, slots)
        if schedules > 1:
            raise VerifyException(f"has {schedules} task.schedule ops, expected at most one")

    @staticmethod
    def _claim_slot(buffer: BufferOp, slots: dict[tuple[str, int], str]) -> None:
        space = "result" if buffer.kind.data == "output" else "argument"
        key = (space, int_value(buffer.index))  # type: ignore[arg-type]
        if key in slots:
            raise VerifyException(
                f"@{buffer.sym_name.data} and @{slots[key]} are both {space} #{key[1]}"
            )
        slots[key] = buffer.sym_name.data

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string(
            f" iterations {int_value(self.iterations)} arena {int_value(self.arena)}"
        )
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> GraphOp:
        name = parser.parse_symbol_name().data
        parser.parse_keyword("iterations")
        iterations = parser.parse_integer(allow_boolean=False)
        parser.parse_keyword("arena")
        arena = parser.parse_integer(allow_boolean=False)
        attrs = parse_attributes(parser)
        op = cls(name, iterations, arena, parse_block_region(parser))
        op.attributes |= attrs
        return op


# --------------------------------------------------------------------------- task.buffer


@irdl_op_definition
class BufferOp(IRDLOperation):
    """A named tensor: a program argument/result, or a slice of the activation arena."""

    name = "task.buffer"

    sym_name = prop_def(SymbolNameConstraint())
    buffer_type = prop_def(TensorType)
    kind = prop_def(StringAttr)
    index = opt_prop_def(IntegerAttr.constr(type=i64))
    offset = opt_prop_def(IntegerAttr.constr(type=i64))

    traits = lazy_traits_def(lambda: (SymbolOpInterface(), HasParent(GraphOp)))

    def __init__(
        self,
        name: str,
        buffer_type: TensorType,
        kind: str,
        index: int | None = None,
        offset: int | None = None,
    ) -> None:
        props: dict[str, Attribute] = {
            "sym_name": StringAttr(name),
            "buffer_type": buffer_type,
            "kind": StringAttr(kind),
        }
        if index is not None:
            props["index"] = IntegerAttr(index, i64)
        if offset is not None:
            props["offset"] = IntegerAttr(offset, i64)
        super().__init__(properties=props)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.buffer_type.get_shape())

    @property
    def nbytes(self) -> int:
        element = self.buffer_type.get_element_type()
        bits = getattr(element, "bitwidth", 0)
        return grid_size(self.shape) * max(bits // 8, 1)

    def verify_(self) -> None:
        kind = self.kind.data
        if kind not in BUFFER_KINDS:
            raise VerifyException(f"unknown buffer kind '{kind}', expected one of {BUFFER_KINDS}")
        if not self.buffer_type.has_static_shape():
            raise VerifyException(f"@{self.sym_name.data} must have a static shape")
        in_arena = kind in ARENA_KINDS
        if (self.offset is not None) != in_arena:
            need = "needs" if in_arena else "cannot have"
            raise VerifyException(f"{_article(kind)} {kind} buffer {need} an arena offset")
        if (self.index is not None) == in_arena:
            need = "cannot have" if in_arena else "needs"
            raise VerifyException(f"{_article(kind)} {kind} buffer {need} an index")
        if self.index is not None and int_value(self.index) < 0:
            raise VerifyException(f"index must be >= 0, got {int_value(self.index)}")
        if self.offset is not None:
            self._verify_offset(int_value(self.offset))

    def _verify_offset(self, offset: int) -> None:
        name = self.sym_name.data
        if offset < 0 or offset % ARENA_ALIGNMENT:
            raise VerifyException(
                f"offset {offset} of @{name} is not a non-negative multiple of "
                f"{ARENA_ALIGNMENT} bytes"
            )
        arena = int_value(_parent_graph(self).arena)
        if offset + self.nbytes > arena:
            raise VerifyException(
                f"@{name} occupies bytes [{offset}, {offset + self.nbytes}) but the arena "
                f"has {arena} bytes"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string(f" {self.kind.data}")
        if self.index is not None:
            printer.print_string(f" {int_value(self.index)}")
        if self.offset is not None:
            printer.print_string(f" offset {int_value(self.offset)}")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" : ")
        printer.print_attribute(self.buffer_type)

    @classmethod
    def parse(cls, parser: Parser) -> BufferOp:
        name = parser.parse_symbol_name().data
        start = parser.pos
        kind = parser.parse_optional_keyword_in(BUFFER_KINDS)
        if kind is None:
            parser.raise_error(f"expected a buffer kind, one of {', '.join(BUFFER_KINDS)}", start)
        index = parser.parse_optional_integer(allow_boolean=False)
        offset = None
        if parser.parse_optional_keyword("offset") is not None:
            offset = parser.parse_integer(allow_boolean=False)
        attrs = parse_attributes(parser)
        parser.parse_punctuation(":")
        start = parser.pos
        buffer_type = parser.parse_type()
        if not isinstance(buffer_type, TensorType):
            parser.raise_error("a task.buffer must have a tensor type", start, parser.pos)
        op = cls(name, buffer_type, kind, index, offset)
        op.attributes |= attrs
        return op


# --------------------------------------------------------------------------- task.event


@irdl_op_definition
class EventOp(IRDLOperation):
    """An event tensor: one counter per element, each signalled by `count` tasks per iteration."""

    name = "task.event"

    sym_name = prop_def(SymbolNameConstraint())
    shape = prop_def(DenseArrayBase.constr(i64))
    count = prop_def(IntegerAttr.constr(type=i64))

    traits = lazy_traits_def(lambda: (SymbolOpInterface(), HasParent(GraphOp)))

    def __init__(self, name: str, shape: Sequence[int], count: int) -> None:
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "shape": _i64s(shape),
                "count": IntegerAttr(count, i64),
            }
        )

    @property
    def shape_tuple(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.shape.get_values())

    @property
    def count_value(self) -> int:
        return int_value(self.count)

    def verify_(self) -> None:
        shape = self.shape_tuple
        if not shape or any(s < 1 for s in shape):
            raise VerifyException(f"shape must be non-empty with extents >= 1, got {list(shape)}")
        if grid_size(shape) > MAX_ELEMENTS:
            raise VerifyException(f"has {grid_size(shape)} elements, more than {MAX_ELEMENTS}")
        if self.count_value < 1:
            raise VerifyException(f"count must be >= 1, got {self.count_value}")
        graph = _parent_graph(self)
        pending = _PENDING_EVENT_CHECKS.get(graph, {})
        problem = pending.pop(self) if self in pending else _event_problem(self, graph.index())
        if problem is not None:
            raise VerifyException(problem)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string(" ")
        printer.print_string(format_int_list(self.shape_tuple))
        printer.print_string(f" count {self.count_value}")
        printer.print_op_attributes(self.attributes, print_keyword=True)

    @classmethod
    def parse(cls, parser: Parser) -> EventOp:
        name = parser.parse_symbol_name().data
        shape = parse_int_list(parser)
        parser.parse_keyword("count")
        count = parser.parse_integer(allow_boolean=False)
        op = cls(name, shape, count)
        op.attributes |= parse_attributes(parser)
        return op


def _event_problem(event: EventOp, index: GraphIndex) -> str | None:
    """What is wrong with the grids that signal and wait on an event, or None."""
    name, count, shape = event.sym_name.data, event.count_value, event.shape_tuple
    producers = index.producers.get(name, [])
    if not producers:
        return f"@{name} has no producer: no task.grid signals it"
    if not index.consumers.get(name):
        return f"@{name} has no consumer: no task.grid waits on it"
    signals = signal_counts(producers, shape)
    if signals is None:
        return None  # a producer grid reports its malformed or out-of-range map
    wrong = np.flatnonzero(signals != count)
    if not wrong.size:
        return None
    element = format_coords(delinearize(int(wrong[0]), shape))
    return (
        f"count {count} of @{name} does not match its producers: element {element} "
        f"is signalled by {int(signals[wrong[0]])} tasks per iteration"
    )


# --------------------------------------------------------------------------- task.grid


def tile_type(buffer: BufferOp, sizes: Sequence[int]) -> TensorType:
    """The tensor type of one task's rectangle of a buffer (a footprint's tile, not a body type)."""
    return TensorType(buffer.buffer_type.get_element_type(), list(sizes))


def make_grid_body(
    read_types: Sequence[Attribute], write_types: Sequence[Attribute], names: Sequence[str] = ()
) -> Region:
    """A placeholder grid body that yields its write buffers unchanged (for builders and tests).

    The types are whole-buffer types (`GridOp.body_types` gives them), reads then writes.
    """
    block = Block(arg_types=[*read_types, *write_types])
    for arg, hint in zip(block.args, names, strict=False):
        arg.name_hint = hint
    block.add_op(YieldOp(*block.args[len(read_types) :]))
    return Region(block)


@irdl_op_definition
class GridOp(IRDLOperation):
    """A grid of tasks, one per coordinate, with affine footprints and event edges.

    The body runs one task: its block arguments are the whole buffers of the read footprints
    then of the write footprints, and its `task.yield` gives the new value of each written
    buffer; only the task's write footprint of that value counts.
    """

    name = "task.grid"

    sym_name = prop_def(SymbolNameConstraint())
    shape = prop_def(DenseArrayBase.constr(i64))
    reads = prop_def(ArrayAttr[FootprintAttr])
    writes = prop_def(ArrayAttr[FootprintAttr])
    waits = prop_def(ArrayAttr[EdgeAttr])
    signals = prop_def(ArrayAttr[EdgeAttr])
    prefetch = prop_def(ArrayAttr[SymbolRefAttr])
    cost_bytes = opt_prop_def(IntegerAttr.constr(type=i64))
    cost_flops = opt_prop_def(IntegerAttr.constr(type=i64))
    body = region_def("single_block")

    traits = lazy_traits_def(lambda: (SymbolOpInterface(), HasParent(GraphOp), IsolatedFromAbove()))

    def __init__(
        self,
        name: str,
        shape: Sequence[int],
        body: Region,
        reads: Sequence[FootprintAttr] = (),
        writes: Sequence[FootprintAttr] = (),
        waits: Sequence[EdgeAttr] = (),
        signals: Sequence[EdgeAttr] = (),
        prefetch: Sequence[str] = (),
        cost: Mapping[str, int] | None = None,
    ) -> None:
        props: dict[str, Attribute] = {
            "sym_name": StringAttr(name),
            "shape": _i64s(shape),
            "reads": ArrayAttr(reads),
            "writes": ArrayAttr(writes),
            "waits": ArrayAttr(waits),
            "signals": ArrayAttr(signals),
            "prefetch": ArrayAttr([SymbolRefAttr(p) for p in prefetch]),
        }
        for key, value in (cost or {}).items():
            props[f"cost_{key}"] = IntegerAttr(value, i64)
        super().__init__(properties=props, regions=[body])

    @property
    def shape_tuple(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.shape.get_values())

    @property
    def num_tasks(self) -> int:
        return grid_size(self.shape_tuple)

    @property
    def footprints(self) -> list[tuple[str, FootprintAttr]]:
        """("reads" | "writes", footprint), in block-argument order."""
        return [("reads", f) for f in self.reads] + [("writes", f) for f in self.writes]

    @property
    def cost(self) -> dict[str, int]:
        pairs = (("bytes", self.cost_bytes), ("flops", self.cost_flops))
        return {key: int_value(attr) for key, attr in pairs if attr is not None}

    def body_types(self, buffers: Mapping[str, BufferOp]) -> list[TensorType]:
        """The buffer type of each footprint (reads then writes): the body's argument types."""
        return [buffers[f.buffer_name].buffer_type for _, f in self.footprints]

    def tile_types(self, buffers: Mapping[str, BufferOp]) -> list[TensorType]:
        """The tile type of each footprint (reads then writes): one task's rectangles."""
        return [tile_type(buffers[f.buffer_name], f.size_tuple) for _, f in self.footprints]

    def verify_(self) -> None:
        shape = self.shape_tuple
        if not 1 <= len(shape) <= 3 or any(s < 1 for s in shape):
            raise VerifyException(f"shape must have 1 to 3 extents >= 1, got {list(shape)}")
        if self.num_tasks > MAX_ELEMENTS:
            raise VerifyException(f"has {self.num_tasks} tasks, more than {MAX_ELEMENTS}")
        graph = _parent_graph(self)
        points = check_points(shape)
        buffers: dict[str, BufferOp] = {}
        for role, footprint in self.footprints:
            buffers[footprint.buffer_name] = self._verify_footprint(role, footprint, graph, points)
        for role, edges in (("waits on", self.waits), ("signals", self.signals)):
            for edge in edges:
                self._verify_edge(role, edge, graph, points)
        self._verify_no_self_dependence()
        self._verify_prefetch(buffers)
        self._verify_body_arguments(buffers)

    def _verify_footprint(
        self, role: str, fp: FootprintAttr, graph: GraphOp, points: np.ndarray
    ) -> BufferOp:
        name = fp.buffer_name
        buffer = _lookup(graph, name, BufferOp)
        if buffer is None:
            raise VerifyException(f"{role} unknown buffer @{name}")
        if role == "writes" and buffer.kind.data == "weight":
            raise VerifyException(f"writes weight buffer @{name}, but weights are read-only")
        problem = rectangle_problem(fp.start_map, fp.size_tuple, buffer.shape, points)
        if problem is not None:
            raise VerifyException(f"{role} @{name}: {problem}")
        return buffer

    def _verify_edge(self, role: str, edge: EdgeAttr, graph: GraphOp, points: np.ndarray) -> None:
        name = edge.event_name
        event = _lookup(graph, name, EventOp)
        if event is None:
            raise VerifyException(f"{role} unknown event @{name}")
        if role == "signals" and edge.distance_value:
            raise VerifyException(f"signals @{name} with a distance; only waits have one")
        if (problem := element_problem(edge.element_map, event.shape_tuple, points)) is not None:
            raise VerifyException(f"{role} @{name}: {problem}")

    def _verify_no_self_dependence(self) -> None:
        signalled = {e.event_name for e in self.signals}
        for edge in self.waits:
            if edge.distance_value == 0 and edge.event_name in signalled:
                raise VerifyException(
                    f"waits on and signals @{edge.event_name} (a grid cannot depend on itself "
                    f"within an iteration)"
                )

    def _verify_prefetch(self, buffers: Mapping[str, BufferOp]) -> None:
        read = {f.buffer_name for f in self.reads}
        for ref in self.prefetch:
            name = ref.root_reference.data
            buffer = buffers.get(name)
            if name not in read or buffer is None or buffer.kind.data != "weight":
                raise VerifyException(
                    f"prefetch @{name}: only weight buffers the grid reads can be prefetched"
                )

    def _verify_body_arguments(self, buffers: Mapping[str, BufferOp]) -> None:
        args = self.body.block.args
        footprints = self.footprints
        if len(args) != len(footprints):
            raise VerifyException(
                f"body has {len(args)} block arguments, expected {len(footprints)}: "
                f"{len(self.reads)} read buffer(s), then {len(self.writes)} write buffer(s)"
            )
        for pos, (arg, expected) in enumerate(zip(args, self.body_types(buffers), strict=True)):
            if arg.type != expected:
                name = footprints[pos][1].buffer_name
                raise VerifyException(
                    f"body argument #{pos} has type {arg.type}, expected {expected} "
                    f"(the buffer @{name})"
                )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string(" " + format_int_list(self.shape_tuple))
        with printer.indented(2):
            for keyword, items in (
                ("reads", self.reads),
                ("writes", self.writes),
                ("waits", self.waits),
                ("signals", self.signals),
            ):
                if items:
                    printer.print_string(f"\n{keyword}(")
                    printer.print_list(items, lambda a: a.print_body(printer))
                    printer.print_string(")")
            if self.prefetch:
                printer.print_string("\nprefetch(")
                printer.print_list(
                    self.prefetch, lambda r: printer.print_symbol_name(r.root_reference.data)
                )
                printer.print_string(")")
            if cost := self.cost:
                printer.print_string("\ncost(" + ", ".join(f"{k} = {v}" for k, v in cost.items()))
                printer.print_string(")")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body)

    @classmethod
    def parse(cls, parser: Parser) -> GridOp:
        name = parser.parse_symbol_name().data
        shape = parse_int_list(parser)
        reads = _parse_clause(parser, "reads", FootprintAttr.parse_body)
        writes = _parse_clause(parser, "writes", FootprintAttr.parse_body)
        waits = _parse_clause(parser, "waits", EdgeAttr.parse_body)
        signals = _parse_clause(parser, "signals", EdgeAttr.parse_body)
        prefetch = _parse_clause(parser, "prefetch", lambda p: p.parse_symbol_name().data)
        cost = dict(_parse_clause(parser, "cost", _parse_cost_entry))
        attrs = parse_attributes(parser)
        body = parser.parse_region()
        op = cls(name, shape, body, reads, writes, waits, signals, prefetch, cost)
        op.attributes |= attrs
        return op


def _parse_clause(parser: Parser, keyword: str, item: Callable[[Parser], _T]) -> list[_T]:
    """`keyword(item, ...)`, or nothing (an empty list) when the keyword is absent."""
    if parser.parse_optional_keyword(keyword) is None:
        return []
    return parser.parse_comma_separated_list(parser.Delimiter.PAREN, lambda: item(parser))


def _parse_cost_entry(parser: Parser) -> tuple[str, int]:
    start = parser.pos
    key = parser.parse_optional_keyword_in(("bytes", "flops"))
    if key is None:
        parser.raise_error("expected a cost entry, `bytes` or `flops`", start)
    parser.parse_punctuation("=")
    return key, parser.parse_integer(allow_boolean=False)


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a grid body with the new value of each written buffer, in `writes` order."""

    name = "task.yield"

    values = var_operand_def()

    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(GridOp)))

    assembly_format = "attr-dict ($values^ `:` type($values))?"

    def __init__(self, *values: SSAValue) -> None:
        super().__init__(operands=[values])

    def verify_(self) -> None:
        grid = self.parent_op()
        if not isinstance(grid, GridOp):
            return  # HasParent reports it
        writes = list(grid.writes)
        if len(self.values) != len(writes):
            raise VerifyException(
                f"yields {len(self.values)} value(s), but @{grid.sym_name.data} writes "
                f"{len(writes)} buffer(s)"
            )
        graph = _parent_graph(grid)
        for pos, (value, fp) in enumerate(zip(self.values, writes, strict=True)):
            buffer = _lookup(graph, fp.buffer_name, BufferOp)
            if buffer is not None and value.type != buffer.buffer_type:
                raise VerifyException(
                    f"value #{pos} has type {value.type}, expected "
                    f"{buffer.buffer_type} (the buffer @{fp.buffer_name})"
                )


Task = Dialect(
    "task",
    [GraphOp, BufferOp, EventOp, GridOp, YieldOp, ScheduleOp, QueueOp],
    [FootprintAttr, EdgeAttr],
)
