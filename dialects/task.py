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

A `flagged` activation buffer stores each element with the iteration that wrote it (8 bytes
an element in the arena, shared with no other buffer), and a `flagged` event orders only reads
of flagged buffers: a backend may then drop the event's signals and waits and let each read wait
for its element's flag instead (the CUDA backend does; the CPU executor keeps the counters).

`task.grid` and `task.yield` live in `task_grid`, `task.schedule` and `task.queue` in
`task_schedule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from weakref import WeakKeyDictionary

import numpy as np
from xdsl.dialects.builtin import (
    DenseArrayBase,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, Region
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    lazy_traits_def,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, NoTerminator, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

# Relative, so that type checkers that see this folder as `dialects` keep one module identity.
from .task_grid import GridOp, YieldOp, i64s, parent_graph
from .task_index import GraphIndex
from .task_maps import (
    MAX_ELEMENTS,
    EdgeAttr,
    FootprintAttr,
    delinearize,
    format_coords,
    format_int_list,
    grid_size,
    int_value,
    parse_attributes,
    parse_block_region,
    parse_int_list,
    signal_counts,
)
from .task_schedule import QueueOp, ScheduleOp

ARENA_ALIGNMENT = 128
FLAGGED_ELEMENT_BYTES = 8  # a flagged element: its float bits, then its flag
ARENA_KINDS = ("activation", "workspace")
BUFFER_KINDS = ("input", "weight", "output", "activation", "workspace")


# Verifying a graph must stay linear in its size (a model has thousands of declarations), so the
# event checks, which read every grid, are computed for all events at once by GraphOp.verify.
_PENDING_EVENT_CHECKS: WeakKeyDictionary[GraphOp, dict[EventOp, str | None]] = WeakKeyDictionary()


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
    flagged = opt_prop_def(UnitAttr)

    traits = lazy_traits_def(lambda: (SymbolOpInterface(), HasParent(GraphOp)))

    def __init__(
        self,
        name: str,
        buffer_type: TensorType,
        kind: str,
        index: int | None = None,
        offset: int | None = None,
        flagged: bool = False,
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
        if flagged:
            props["flagged"] = UnitAttr()
        super().__init__(properties=props)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.buffer_type.get_shape())

    @property
    def is_flagged(self) -> bool:
        return self.flagged is not None

    @property
    def nbytes(self) -> int:
        element = self.buffer_type.get_element_type()
        bits = getattr(element, "bitwidth", 0)
        return grid_size(self.shape) * (
            FLAGGED_ELEMENT_BYTES if self.is_flagged else max(bits // 8, 1)
        )

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
        if self.is_flagged and kind != "activation":
            raise VerifyException(
                f"only an activation buffer can be flagged, not {_article(kind)} {kind}"
            )

    def _verify_offset(self, offset: int) -> None:
        name = self.sym_name.data
        if offset < 0 or offset % ARENA_ALIGNMENT:
            raise VerifyException(
                f"offset {offset} of @{name} is not a non-negative multiple of "
                f"{ARENA_ALIGNMENT} bytes"
            )
        arena = int_value(parent_graph(self).arena)
        if offset + self.nbytes > arena:
            raise VerifyException(
                f"@{name} occupies bytes [{offset}, {offset + self.nbytes}) but the arena "
                f"has {arena} bytes"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string(f" {self.kind.data}")
        if self.is_flagged:
            printer.print_string(" flagged")
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
        flagged = parser.parse_optional_keyword("flagged") is not None
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
        op = cls(name, buffer_type, kind, index, offset, flagged)
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
    flagged = opt_prop_def(UnitAttr)

    traits = lazy_traits_def(lambda: (SymbolOpInterface(), HasParent(GraphOp)))

    def __init__(self, name: str, shape: Sequence[int], count: int, flagged: bool = False) -> None:
        props: dict[str, Attribute] = {
            "sym_name": StringAttr(name),
            "shape": i64s(shape),
            "count": IntegerAttr(count, i64),
        }
        if flagged:
            props["flagged"] = UnitAttr()
        super().__init__(properties=props)

    @property
    def is_flagged(self) -> bool:
        return self.flagged is not None

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
        graph = parent_graph(self)
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
        if self.is_flagged:
            printer.print_string(" flagged")
        printer.print_op_attributes(self.attributes, print_keyword=True)

    @classmethod
    def parse(cls, parser: Parser) -> EventOp:
        name = parser.parse_symbol_name().data
        shape = parse_int_list(parser)
        parser.parse_keyword("count")
        count = parser.parse_integer(allow_boolean=False)
        flagged = parser.parse_optional_keyword("flagged") is not None
        op = cls(name, shape, count, flagged)
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


Task = Dialect(
    "task",
    [GraphOp, BufferOp, EventOp, GridOp, YieldOp, ScheduleOp, QueueOp],
    [FootprintAttr, EdgeAttr],
)
