"""The task dialect's grids: `task.grid` (one task per grid point) and its `task.yield`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar
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
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    lazy_traits_def,
    opt_prop_def,
    prop_def,
    region_def,
    var_operand_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from .task_maps import (
    MAX_ELEMENTS,
    EdgeAttr,
    FootprintAttr,
    check_points,
    element_problem,
    format_int_list,
    grid_size,
    int_value,
    parse_attributes,
    parse_int_list,
    rectangle_problem,
)

if TYPE_CHECKING:
    from .task import BufferOp, EventOp, GraphOp

_T = TypeVar("_T")
_OpT = TypeVar("_OpT", bound=Operation)


def i64s(values: Sequence[int]) -> DenseArrayBase:
    """An i64 dense array of `values` (shapes of grids and events)."""
    return DenseArrayBase.from_list(i64, [int(v) for v in values])


def _graph_op() -> type[GraphOp]:
    from .task import GraphOp  # task.py imports this module: look GraphOp up lazily

    return GraphOp


def parent_graph(op: Operation) -> GraphOp:
    """The task.graph around `op`; a VerifyException if there is none."""
    graph_op = _graph_op()
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, graph_op):
        parent = parent.parent_op()
    if parent is None:
        raise VerifyException(f"'{op.name}' must be inside a task.graph")
    return parent


# Verifying a graph must stay linear in its size (a model has thousands of declarations), so
# symbol lookups go through a per-graph table, rebuilt whenever an entry proves stale.
_SYMBOL_TABLES: WeakKeyDictionary[GraphOp, dict[str, Operation]] = WeakKeyDictionary()


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


def _buffer(graph: GraphOp, name: str) -> BufferOp | None:
    from .task import BufferOp  # task.py imports this module: look BufferOp up lazily

    return _lookup(graph, name, BufferOp)


def _event(graph: GraphOp, name: str) -> EventOp | None:
    from .task import EventOp  # task.py imports this module: look EventOp up lazily

    return _lookup(graph, name, EventOp)


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

    traits = lazy_traits_def(
        lambda: (SymbolOpInterface(), HasParent(_graph_op()), IsolatedFromAbove())
    )

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
            "shape": i64s(shape),
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
        graph = parent_graph(self)
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
        buffer = _buffer(graph, name)
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
        event = _event(graph, name)
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
        graph = parent_graph(grid)
        for pos, (value, fp) in enumerate(zip(self.values, writes, strict=True)):
            buffer = _buffer(graph, fp.buffer_name)
            if buffer is not None and value.type != buffer.buffer_type:
                raise VerifyException(
                    f"value #{pos} has type {value.type}, expected "
                    f"{buffer.buffer_type} (the buffer @{fp.buffer_name})"
                )
