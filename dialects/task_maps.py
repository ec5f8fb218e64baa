"""Maps of the task dialect: footprint/edge attributes, affine arithmetic and task-map evaluation."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from itertools import product
from typing import TYPE_CHECKING, Self

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import (
    I64,
    AffineMapAttr,
    DenseArrayBase,
    IntAttr,
    IntegerAttr,
    SymbolRefAttr,
    i64,
)
from xdsl.ir import Attribute, Block, ParametrizedAttribute, Region
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
    from .task import GridOp

# Grids up to this many tasks are checked at every point; larger ones only at their corners,
# which is exact for the monotone maps the lowering builds.
EXHAUSTIVE_LIMIT = 1 << 18
# More tasks in one grid, or counters in one event, than any GPU schedule needs: a typo guard
# that also bounds the arrays verification allocates.
MAX_ELEMENTS = 1 << 24

_ADD_PREC = 1
_MUL_PREC = 2
_ATOM_PREC = 3
_MUL_KINDS = {
    AffineBinaryOpKind.Mul: "*",
    AffineBinaryOpKind.FloorDiv: "floordiv",
    AffineBinaryOpKind.CeilDiv: "ceildiv",
    AffineBinaryOpKind.Mod: "mod",
}


@functools.cache
def parse_map(text: str) -> AffineMap:
    """An affine map from its text, e.g. `(d0) -> (d0 * 128, 0)` (no `affine_map<>` wrapper).
    Maps are immutable, and a model repeats a few hundred texts thousands of times: cached."""
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
    return math.prod(shape)


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


def wait_threshold(count: int, iteration: int, distance: int = 0) -> int:
    """The counter value a wait needs in `iteration` (0-based): counters are never reset.

    Each iteration adds `count` signals to every element, so iteration t's signals are all in
    once the counter reaches count * (t + 1); a wait with distance k needs those of t - k.
    """
    return max(0, count * (iteration + 1 - distance))


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
    too_big = [grid_size(shape), *(grid.num_tasks for grid, _ in producers)]
    if max(too_big) > MAX_ELEMENTS:
        return None
    counts = np.zeros(grid_size(shape), dtype=np.int64)
    for grid, edge in producers:
        elements = edge_elements(grid, edge)
        if elements is None or elements.shape[1] != len(shape):
            return None
        if first_outside(elements, np.zeros(len(shape)), np.asarray(shape) - 1) is not None:
            return None
        counts += np.bincount(linearize(elements, shape), minlength=counts.size)
    return counts


# --------------------------------------------------------------------------- syntax helpers


def int_value(attr: IntegerAttr | IntAttr) -> int:
    return attr.data if isinstance(attr, IntAttr) else attr.value.data


def parse_attributes(parser: Parser) -> dict[str, Attribute]:
    """The discardable `attributes {...}` an op's custom syntax may carry."""
    attrs = parser.parse_optional_attr_dict_with_keyword()
    return dict(attrs.data) if attrs is not None else {}


def parse_block_region(parser: Parser) -> Region:
    """A region that keeps one (possibly empty) block: `{ }` parses to no block at all."""
    region = parser.parse_region()
    if not region.blocks:
        region.add_block(Block())
    return region
