"""Maps of the task dialect: footprint/edge attributes, affine arithmetic, task queries, deadlock check."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import TYPE_CHECKING, Self

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import I64, AffineMapAttr, DenseArrayBase, IntAttr, SymbolRefAttr, i64
from xdsl.ir import Attribute, ParametrizedAttribute
from xdsl.ir.affine import (
    AffineBinaryOpExpr,
    AffineBinaryOpKind,
    AffineConstantExpr,
    AffineDimExpr,
    AffineExpr,
    AffineMap,
    AffineSymExpr,
)
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

if TYPE_CHECKING:
    from .task import BufferOp, EventOp, GraphOp, GridOp, ScheduleOp

# Grids up to this many tasks are checked at every point; larger ones only at their corners,
# which is exact for the monotone maps the lowering builds.
EXHAUSTIVE_LIMIT = 1 << 18

_ADD_PREC = 1
_MUL_PREC = 2
_ATOM_PREC = 3
_MUL_KINDS = {
    AffineBinaryOpKind.Mul: "*",
    AffineBinaryOpKind.FloorDiv: "floordiv",
    AffineBinaryOpKind.CeilDiv: "ceildiv",
    AffineBinaryOpKind.Mod: "mod",
}


def parse_map(text: str) -> AffineMap:
    """An affine map from its text, e.g. `(d0) -> (d0 * 128, 0)` (no `affine_map<>` wrapper)."""
    return Parser(Context(), text, "<map>").parse_affine_map()


def _subtrahend(expr: AffineExpr) -> str | None:
    """`x * 16` for an added `x * -16` term (printed as `- x * 16`), or None."""
    if isinstance(expr, AffineConstantExpr) and expr.value < 0:
        return str(-expr.value)
    if (
        isinstance(expr, AffineBinaryOpExpr)
        and expr.kind == AffineBinaryOpKind.Mul
        and isinstance(expr.rhs, AffineConstantExpr)
        and expr.rhs.value < 0
    ):
        factor = "" if expr.rhs.value == -1 else f" * {-expr.rhs.value}"
        return format_expr(expr.lhs, _ATOM_PREC) + factor
    return None


def format_expr(expr: AffineExpr, min_prec: int = 0) -> str:
    """An affine expression with few parentheses (`(d0 floordiv 4) * 128 - d1`).

    The text re-parses to the same tree for the simplified expressions xDSL's parser builds.
    """
    if isinstance(expr, AffineDimExpr):
        return f"d{expr.position}"
    if isinstance(expr, AffineSymExpr):
        return f"s{expr.position}"
    if isinstance(expr, AffineConstantExpr):
        return str(expr.value)
    assert isinstance(expr, AffineBinaryOpExpr)
    if expr.kind == AffineBinaryOpKind.Add:
        lhs = format_expr(expr.lhs, _ADD_PREC)
        if (sub := _subtrahend(expr.rhs)) is not None:
            text = f"{lhs} - {sub}"
        else:
            text = f"{lhs} + {format_expr(expr.rhs, _MUL_PREC)}"
        prec = _ADD_PREC
    elif expr.kind == AffineBinaryOpKind.Mul and expr.rhs == AffineConstantExpr(-1):
        text, prec = "-" + format_expr(expr.lhs, _ATOM_PREC), _MUL_PREC
    else:
        lhs = format_expr(expr.lhs, _ATOM_PREC)
        text = f"{lhs} {_MUL_KINDS[expr.kind]} {format_expr(expr.rhs, _ATOM_PREC)}"
        prec = _MUL_PREC
    return f"({text})" if prec < min_prec else text


def format_map(amap: AffineMap) -> str:
    """`(d0, d1) -> (d0 * 128, d1)`: MLIR's map syntax without redundant parentheses."""
    dims = ", ".join(f"d{i}" for i in range(amap.num_dims))
    syms = ", ".join(f"s{i}" for i in range(amap.num_symbols))
    space = f"({dims})" + (f"[{syms}]" if amap.num_symbols else "")
    return f"{space} -> ({', '.join(format_expr(e) for e in amap.results)})"


def map_problem(amap: AffineMap) -> str | None:
    """Why a map cannot describe task coordinates (symbols, non-affine terms), or None."""
    if amap.num_symbols:
        return f"map {format_map(amap)} has symbols; task maps take grid coordinates only"
    for result in amap.results:
        for node in result.dfs():
            if not isinstance(node, AffineBinaryOpExpr):
                continue
            if not node.is_pure_affine():
                return f"map {format_map(amap)} is not affine"
            divisor = node.rhs
            if node.kind != AffineBinaryOpKind.Add and node.kind != AffineBinaryOpKind.Mul:
                if not isinstance(divisor, AffineConstantExpr) or divisor.value <= 0:
                    return f"map {format_map(amap)} divides by a non-positive constant"
    return None


def grid_size(shape: Sequence[int]) -> int:
    """Number of tasks of a grid."""
    return int(np.prod(shape, dtype=np.int64))


def grid_points(shape: Sequence[int]) -> np.ndarray:
    """Every coordinate of a grid, row-major (d0 slowest): an int64 array of shape (n, rank)."""
    axes = [np.arange(s, dtype=np.int64) for s in shape]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.reshape(-1) for m in mesh], axis=1)


def check_points(shape: Sequence[int]) -> np.ndarray:
    """The points a verifier evaluates: all of them, or the corners of a very large grid."""
    if grid_size(shape) <= EXHAUSTIVE_LIMIT:
        return grid_points(shape)
    corners = sorted(set(product(*[(0, s - 1) for s in shape])))
    return np.array(corners, dtype=np.int64)


def _eval_expr(expr: AffineExpr, points: np.ndarray) -> np.ndarray:
    if isinstance(expr, AffineConstantExpr):
        return np.full(points.shape[0], expr.value, dtype=np.int64)
    if isinstance(expr, AffineDimExpr):
        return points[:, expr.position]
    if not isinstance(expr, AffineBinaryOpExpr):
        raise ValueError(f"cannot evaluate {expr} on grid coordinates")
    lhs = _eval_expr(expr.lhs, points)
    rhs = _eval_expr(expr.rhs, points)
    match expr.kind:
        case AffineBinaryOpKind.Add:
            return lhs + rhs
        case AffineBinaryOpKind.Mul:
            return lhs * rhs
        case AffineBinaryOpKind.FloorDiv:
            return np.floor_divide(lhs, rhs)
        case AffineBinaryOpKind.CeilDiv:
            return -np.floor_divide(-lhs, rhs)
        case AffineBinaryOpKind.Mod:
            return np.mod(lhs, rhs)


def eval_map(amap: AffineMap, points: np.ndarray) -> np.ndarray:
    """A map applied to many coordinates at once: (n, num_dims) -> (n, num_results) int64."""
    if not amap.results:
        return np.zeros((points.shape[0], 0), dtype=np.int64)
    return np.stack([_eval_expr(e, points) for e in amap.results], axis=1)


def eval_point(amap: AffineMap, coords: Sequence[int]) -> tuple[int, ...]:
    """A map applied to one coordinate tuple."""
    return tuple(int(v) for v in amap.eval(list(coords), []))


def linearize(coords: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Row-major linear indices of (n, rank) coordinates inside `shape`."""
    index = np.zeros(coords.shape[0], dtype=np.int64)
    for axis, extent in enumerate(shape):
        index = index * extent + coords[:, axis]
    return index


def delinearize(index: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The row-major coordinates of a linear index."""
    coords: list[int] = []
    for extent in reversed(shape):
        index, rem = divmod(index, extent)
        coords.append(rem)
    return tuple(reversed(coords))


def rectangle_slices(
    amap: AffineMap, sizes: Sequence[int], coords: Sequence[int]
) -> tuple[slice, ...]:
    """The rectangle a footprint covers for one task, as NumPy slices."""
    starts = eval_point(amap, coords)
    return tuple(slice(s, s + n) for s, n in zip(starts, sizes, strict=True))


def first_outside(values: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> int | None:
    """Row index of the first row with a value < lower or > upper (per column), or None."""
    bad = np.any((values < lower) | (values > upper), axis=1)
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else None


def format_coords(coords: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(c)) for c in coords) + "]"


def format_shape(shape: Sequence[int]) -> str:
    return "x".join(str(int(s)) for s in shape)


def format_rect(starts: Sequence[int], sizes: Sequence[int]) -> str:
    return (
        "["
        + ", ".join(f"{int(s)}:{int(s) + int(n)}" for s, n in zip(starts, sizes, strict=True))
        + "]"
    )


def rectangle_problem(
    start: AffineMap, sizes: Sequence[int], shape: Sequence[int], points: np.ndarray
) -> str | None:
    """Why the rectangles `start(p) + [0, sizes)` at grid points do not all fit in `shape`."""
    rank = points.shape[1]
    if start.num_dims != rank:
        return f"map {format_map(start)} takes {start.num_dims} coordinates, but the grid has rank {rank}"
    if len(start.results) != len(shape) or len(sizes) != len(shape):
        return (
            f"map gives {len(start.results)} and sizes give {len(sizes)} coordinates, "
            f"but the buffer has rank {len(shape)}"
        )
    if any(not 1 <= n <= d for n, d in zip(sizes, shape, strict=True)):
        return f"tile {format_shape(sizes)} does not fit in {format_shape(shape)}"
    starts = eval_map(start, points)
    upper = np.asarray(shape) - np.asarray(sizes)
    if (bad := first_outside(starts, np.zeros(len(shape)), upper)) is not None:
        return (
            f"out of bounds: task {format_coords(points[bad])} covers "
            f"{format_rect(starts[bad], sizes)} of a {format_shape(shape)} buffer"
        )
    return None


def element_problem(element: AffineMap, shape: Sequence[int], points: np.ndarray) -> str | None:
    """Why the event elements `element(p)` at grid points are not all inside `shape`."""
    rank = points.shape[1]
    if element.num_dims != rank or len(element.results) != len(shape):
        return (
            f"map {format_map(element)} does not take the grid's {rank} coordinates "
            f"to the event's {len(shape)}"
        )
    elements = eval_map(element, points)
    if (bad := first_outside(elements, np.zeros(len(shape)), np.asarray(shape) - 1)) is not None:
        return (
            f"task {format_coords(points[bad])} maps to element "
            f"{format_coords(elements[bad])}, outside the event shape {list(shape)}"
        )
    return None


# --------------------------------------------------------------------------- attributes


def _parse_task_map(parser: AttrParser) -> AffineMap:
    start = parser.pos
    try:
        amap = parser.parse_affine_map()
    except (NotImplementedError, ZeroDivisionError) as e:  # xDSL's folding of bad terms
        parser.raise_error(f"not an affine task map: {e}", start, parser.pos)
    if (problem := map_problem(amap)) is not None:
        parser.raise_error(problem, start, parser.pos)
    return amap


def parse_int_list(parser: AttrParser) -> list[int]:
    """`[1, 2, 3]`."""
    return parser.parse_comma_separated_list(
        parser.Delimiter.SQUARE, lambda: parser.parse_integer(allow_boolean=False)
    )


def format_int_list(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


class _InlineAttr(ParametrizedAttribute):
    """An attribute whose `#task.name<body>` body is also written inline in task.grid's syntax."""

    @classmethod
    def parse_body(cls, parser: AttrParser) -> Self:
        raise NotImplementedError

    def print_body(self, printer: Printer) -> None:
        raise NotImplementedError

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        parser.parse_punctuation("<")
        attr = cls.parse_body(parser)
        parser.parse_punctuation(">")
        return attr.parameters

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            self.print_body(printer)


@irdl_attr_definition
class FootprintAttr(_InlineAttr):
    """The rectangle one task reads or writes: `@buf[start-map] [sizes]`."""

    name = "task.footprint"

    buffer: SymbolRefAttr
    start: AffineMapAttr
    sizes: DenseArrayBase[I64]

    def __init__(self, buffer: str, start: AffineMap | str, sizes: Sequence[int]) -> None:
        start = parse_map(start) if isinstance(start, str) else start
        sizes_attr = DenseArrayBase.from_list(i64, [int(s) for s in sizes])
        super().__init__(SymbolRefAttr(buffer), AffineMapAttr(start), sizes_attr)

    @property
    def buffer_name(self) -> str:
        return self.buffer.root_reference.data

    @property
    def start_map(self) -> AffineMap:
        return self.start.data

    @property
    def size_tuple(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.sizes.get_values())

    def slices(self, coords: Sequence[int]) -> tuple[slice, ...]:
        """The rectangle of the task at `coords`, as NumPy slices into the buffer."""
        return rectangle_slices(self.start_map, self.size_tuple, coords)

    def verify(self) -> None:
        if (problem := map_problem(self.start_map)) is not None:
            raise VerifyException(problem)

    @classmethod
    def parse_body(cls, parser: AttrParser) -> FootprintAttr:
        buffer = parser.parse_symbol_name().data
        parser.parse_punctuation("[")
        start = _parse_task_map(parser)
        parser.parse_punctuation("]")
        return FootprintAttr(buffer, start, parse_int_list(parser))

    def print_body(self, printer: Printer) -> None:
        printer.print_symbol_name(self.buffer_name)
        printer.print_string(f"[{format_map(self.start_map)}] {format_int_list(self.size_tuple)}")


@irdl_attr_definition
class EdgeAttr(_InlineAttr):
    """Task coordinates -> one event element: `@event (d0) -> (d0 floordiv 4)` [`distance k`].

    On a wait, `distance k` (loop-carried) waits on the signals of iteration t - k.
    """

    name = "task.edge"

    event: SymbolRefAttr
    element: AffineMapAttr
    distance: IntAttr

    def __init__(self, event: str, element: AffineMap | str, distance: int = 0) -> None:
        element = parse_map(element) if isinstance(element, str) else element
        super().__init__(SymbolRefAttr(event), AffineMapAttr(element), IntAttr(distance))

    @property
    def event_name(self) -> str:
        return self.event.root_reference.data

    @property
    def element_map(self) -> AffineMap:
        return self.element.data

    @property
    def distance_value(self) -> int:
        return self.distance.data

    def verify(self) -> None:
        if (problem := map_problem(self.element_map)) is not None:
            raise VerifyException(problem)
        if self.distance.data < 0:
            raise VerifyException(f"distance must be >= 0, got {self.distance.data}")

    @classmethod
    def parse_body(cls, parser: AttrParser) -> EdgeAttr:
        event = parser.parse_symbol_name().data
        element = _parse_task_map(parser)
        distance = 0
        if parser.parse_optional_keyword("distance") is not None:
            start = parser.pos
            distance = parser.parse_integer(allow_boolean=False)
            if distance < 0:
                parser.raise_error(f"distance must be >= 0, got {distance}", start, parser.pos)
        return EdgeAttr(event, element, distance)

    def print_body(self, printer: Printer) -> None:
        printer.print_symbol_name(self.event_name)
        printer.print_string(f" {format_map(self.element_map)}")
        if self.distance.data:
            printer.print_string(f" distance {self.distance.data}")


def edge_elements(grid: GridOp, edge: EdgeAttr) -> np.ndarray | None:
    """The event element of every task of `grid` (row-major), or None if the map's arity is off."""
    if edge.element_map.num_dims != len(grid.shape_tuple):
        return None
    return eval_map(edge.element_map, grid_points(grid.shape_tuple))


def signal_counts(
    producers: Sequence[tuple[GridOp, EdgeAttr]], shape: Sequence[int]
) -> np.ndarray | None:
    """Signals each element of an event gets per iteration (flat), or None for a bad map."""
    counts = np.zeros(grid_size(shape), dtype=np.int64)
    for grid, edge in producers:
        elements = edge_elements(grid, edge)
        if elements is None or elements.shape[1] != len(shape):
            return None
        if first_outside(elements, np.zeros(len(shape)), np.asarray(shape) - 1) is not None:
            return None
        counts += np.bincount(linearize(elements, shape), minlength=counts.size)
    return counts


# --------------------------------------------------------------------------- graph index


@dataclass
class GraphIndex:
    """A task.graph's declarations by name, each grid's first global task id, and task queries.

    Built by `GraphOp.index()`; it is a snapshot, so rebuild it after changing the graph.
    """

    graph: GraphOp
    buffers: dict[str, BufferOp] = field(default_factory=dict)
    events: dict[str, EventOp] = field(default_factory=dict)
    grids: list[GridOp] = field(default_factory=list)
    grids_by_name: dict[str, GridOp] = field(default_factory=dict)
    bases: list[int] = field(default_factory=list)
    producers: dict[str, list[tuple[GridOp, EdgeAttr]]] = field(default_factory=dict)
    consumers: dict[str, list[tuple[GridOp, EdgeAttr]]] = field(default_factory=dict)
    schedule: ScheduleOp | None = None
    total_tasks: int = 0

    def add_grid(self, grid: GridOp) -> None:
        self.grids.append(grid)
        self.grids_by_name.setdefault(grid.sym_name.data, grid)
        self.bases.append(self.total_tasks)
        self.total_tasks += grid.num_tasks
        for edge in grid.signals:
            self.producers.setdefault(edge.event_name, []).append((grid, edge))
        for edge in grid.waits:
            self.consumers.setdefault(edge.event_name, []).append((grid, edge))

    def base_of(self, grid: GridOp) -> int:
        """The global id of a grid's first task (the sum of the sizes of earlier grids)."""
        for candidate, base in zip(self.grids, self.bases, strict=True):
            if candidate is grid:
                return base
        raise ValueError(f"grid @{grid.sym_name.data} is not in this graph")

    def tasks(self, grid: GridOp) -> Iterator[tuple[tuple[int, ...], int]]:
        """(coordinates, global task id) of every task of a grid, in id order."""
        base = self.base_of(grid)
        for offset, coords in enumerate(grid_points(grid.shape_tuple)):
            yield tuple(int(c) for c in coords), base + offset

    def task_id(self, grid: GridOp, coords: Sequence[int]) -> int:
        return self.base_of(grid) + int(linearize(np.array([coords]), grid.shape_tuple)[0])

    def locate(self, task_id: int) -> tuple[GridOp, tuple[int, ...]]:
        """The grid and coordinates of a global task id."""
        if not 0 <= task_id < self.total_tasks:
            raise ValueError(f"task {task_id} out of range [0, {self.total_tasks})")
        pos = int(np.searchsorted(np.asarray(self.bases), task_id, side="right")) - 1
        grid = self.grids[pos]
        return grid, delinearize(task_id - self.bases[pos], grid.shape_tuple)

    def describe(self, task_id: int) -> str:
        """`task 53 (@qkv[5])`, for messages."""
        grid, coords = self.locate(task_id)
        return f"task {task_id} (@{grid.sym_name.data}{format_coords(coords)})"

    def waits_of(self, task_id: int) -> list[tuple[str, tuple[int, ...], int]]:
        """(event, element, distance) of every wait of a task, in declaration order."""
        grid, coords = self.locate(task_id)
        return [
            (e.event_name, eval_point(e.element_map, coords), e.distance_value) for e in grid.waits
        ]

    def signals_of(self, task_id: int) -> list[tuple[str, tuple[int, ...]]]:
        """(event, element) of every signal of a task, in declaration order."""
        grid, coords = self.locate(task_id)
        return [(e.event_name, eval_point(e.element_map, coords)) for e in grid.signals]

    def _tasks_hitting(
        self, edges: list[tuple[GridOp, EdgeAttr]], element: Sequence[int]
    ) -> list[int]:
        found: list[int] = []
        for grid, edge in edges:
            elements = edge_elements(grid, edge)
            if elements is not None:
                hits = np.flatnonzero(np.all(elements == np.asarray(element), axis=1))
                found.extend(self.base_of(grid) + int(h) for h in hits)
        return sorted(set(found))

    def producers_of(self, event: str, element: Sequence[int]) -> list[int]:
        """Global ids of the tasks that signal one event element."""
        return self._tasks_hitting(self.producers.get(event, []), element)

    def consumers_of(self, event: str, element: Sequence[int]) -> list[int]:
        """Global ids of the tasks that wait on one event element (at any distance)."""
        return self._tasks_hitting(self.consumers.get(event, []), element)


# --------------------------------------------------------------------------- deadlock check


@dataclass
class _DepGraph:
    """Tasks (nodes 0..T-1) and event elements (nodes T..) with signal, wait and queue edges."""

    index: GraphIndex
    element_base: dict[str, int]
    src: np.ndarray
    dst: np.ndarray
    size: int

    def label(self, node: int) -> str:
        if node < self.index.total_tasks:
            return self.index.describe(node)
        name, base = max(
            ((n, b) for n, b in self.element_base.items() if b <= node), key=lambda nb: nb[1]
        )
        shape = self.index.events[name].shape_tuple
        return f"@{name}{format_coords(delinearize(node - base, shape))}"


def _queue_problem(index: GraphIndex, queues: list[tuple[int, tuple[int, ...]]]) -> str | None:
    owner: dict[int, int] = {}
    for sm, ids in queues:
        for task in ids:
            if not 0 <= task < index.total_tasks:
                return f"task {task} on SM {sm} is out of range [0, {index.total_tasks})"
            if task in owner:
                return f"{index.describe(task)} is queued on SM {owner[task]} and SM {sm}"
            owner[task] = sm
    for task in range(index.total_tasks):
        if task not in owner:
            return f"{index.describe(task)} is in no queue"
    return None


def _dependence_graph(index: GraphIndex, queues: list[tuple[int, tuple[int, ...]]]) -> _DepGraph:
    element_base: dict[str, int] = {}
    size = index.total_tasks
    for name, event in index.events.items():
        element_base[name] = size
        size += grid_size(event.shape_tuple)
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    for name, edges in index.producers.items():
        for grid, edge in edges:
            nodes = _element_nodes(index, element_base, name, grid, edge)
            src.append(index.base_of(grid) + np.arange(grid.num_tasks))
            dst.append(nodes)
    for name, edges in index.consumers.items():
        for grid, edge in edges:
            if edge.distance_value == 0:  # loop-carried waits are met by earlier iterations
                src.append(_element_nodes(index, element_base, name, grid, edge))
                dst.append(index.base_of(grid) + np.arange(grid.num_tasks))
    for _, ids in queues:
        src.append(np.asarray(ids[:-1], dtype=np.int64))
        dst.append(np.asarray(ids[1:], dtype=np.int64))
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
    return _DepGraph(index, element_base, cat(src), cat(dst), size)


def _element_nodes(
    index: GraphIndex, element_base: dict[str, int], name: str, grid: GridOp, edge: EdgeAttr
) -> np.ndarray:
    event = index.events.get(name)
    elements = edge_elements(grid, edge)
    if event is None or elements is None:
        raise ValueError(f"@{grid.sym_name.data} has a malformed edge to @{name}; verify first")
    return element_base[name] + linearize(elements, event.shape_tuple)


def _unsignalled_wait(deps: _DepGraph) -> str | None:
    signalled = np.zeros(deps.size, dtype=bool)
    tasks = deps.index.total_tasks
    signalled[deps.dst[deps.dst >= tasks]] = True
    waited = deps.src[(deps.src >= tasks) & ~signalled[deps.src]]
    if waited.size == 0:
        return None
    node = int(waited[0])
    waiter = int(deps.dst[np.flatnonzero(deps.src == node)[0]])
    return f"{deps.index.describe(waiter)} waits on {deps.label(node)}, which no task signals"


def _find_cycle(deps: _DepGraph, done: np.ndarray) -> list[int]:
    """A cycle among the nodes Kahn's algorithm could not finish, in edge order."""
    pending = np.flatnonzero(~done)
    node = int(pending[0])
    seen: dict[int, int] = {}
    walk: list[int] = []
    while node not in seen:
        seen[node] = len(walk)
        walk.append(node)
        preds = deps.src[(deps.dst == node) & ~done[deps.src]]
        node = int(preds.min())
    cycle = walk[seen[node] :][::-1]
    # Start at the lowest-numbered task that signals, so the story reads producer first.
    tasks = deps.index.total_tasks
    signallers = [
        i for i, n in enumerate(cycle) if n < tasks and cycle[(i + 1) % len(cycle)] >= tasks
    ]
    first = min(signallers, key=lambda i: cycle[i]) if signallers else 0
    return cycle[first:] + cycle[:first]


def _describe_cycle(deps: _DepGraph, cycle: list[int], sm_of: dict[int, int]) -> str:
    """One clause per edge; a run of queue edges (all on one SM) is told as a single clause."""
    tasks = deps.index.total_tasks
    steps: list[str] = []
    run_start: int | None = None
    for pos, node in enumerate(cycle):
        nxt = cycle[(pos + 1) % len(cycle)]
        if node >= tasks:
            steps.append(f"{deps.label(nxt)} waits on {deps.label(node)}")
        elif nxt >= tasks:
            steps.append(f"{deps.label(node)} signals {deps.label(nxt)}")
        else:
            run_start = node if run_start is None else run_start
            if cycle[(pos + 2) % len(cycle)] >= tasks:
                first = deps.label(run_start)
                steps.append(f"SM {sm_of[run_start]} runs {first} before {deps.label(nxt)}")
                run_start = None
    return "queues deadlock: " + "; ".join(steps)


def check_queues_deadlock_free(graph: GraphOp) -> str | None:
    """The first reason the graph's static queues could deadlock (or are malformed), or None.

    Sufficient condition checked: the union of the dependences (producer -> event element ->
    consumer, for same-iteration waits) and each queue's program order is acyclic, i.e. one
    global topological order runs every queue in its order.
    """
    index = graph.index()
    if index.schedule is None:
        return f"@{graph.sym_name.data} has no task.schedule"
    queues = [(int(q.sm.value.data), q.task_ids) for q in index.schedule.queues]
    if (problem := _queue_problem(index, queues)) is not None:
        return problem
    deps = _dependence_graph(index, queues)
    if (problem := _unsignalled_wait(deps)) is not None:
        return problem
    order = np.argsort(deps.src, kind="stable")
    succ_src, succ_dst = deps.src[order], deps.dst[order]
    starts = np.searchsorted(succ_src, np.arange(deps.size + 1))
    indegree = np.bincount(deps.dst, minlength=deps.size)
    ready = [int(n) for n in np.flatnonzero(indegree == 0)]
    done = np.zeros(deps.size, dtype=bool)
    while ready:
        node = ready.pop()
        done[node] = True
        for nxt in succ_dst[starts[node] : starts[node + 1]]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(int(nxt))
    if done.all():
        return None
    sm_of = {task: sm for sm, ids in queues for task in ids}
    return _describe_cycle(deps, _find_cycle(deps, done), sm_of)
