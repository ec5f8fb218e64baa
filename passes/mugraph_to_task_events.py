"""Dependencies and event tensors of mugraph-to-task, from exact tile footprints.

For every pair of grids that touch the same bytes, `need[c, p]` says whether consumer task c
must wait for producer task p: read-after-write through a buffer (rectangle intersection of
the producer's write footprint and the consumer's read footprint), and, where the arena reuses
bytes, write-after-read / write-after-write (conservative per-task byte spans), plus, with
several iterations, the loop-carried write-after-read of the next iteration (`distance 1`).

An event tensor then serves `need` with two affine maps (MPK / Event Tensor style): producer
task p signals element `p floordiv k` (per grid dim; dims of extent 1 dropped) and consumer task
c waits on element `g(c)`, with `count = prod(k)`. The factors k come from the consumers' needed
producer sets: when they are aligned boxes of one extent the event is exact; otherwise the
smallest factors that put each needed set inside one element are used and the event is marked
`mk.coarse`. g is fitted from a small family (constant; integer-linear; `d floordiv m + b`) and
checked at every task. Dependences already implied by earlier waits (transitively, per task)
are dropped, and with `merge` an event with the same producer grouping serves every consumer.

A read-after-write through a flagged buffer gets a `flagged` event of its own, built after the
others: a backend that waits on the flags instead drops it, so it implies nothing for the
pruning (a reader that saw some flagged words knows nothing of the writer's other writes). It
implies one thing: a task stores its outputs only after every value it loaded has been used (a
body loads, computes, then stores), so a reader that saw a task's flagged words knows that
task's reads are over. The next iteration's write after those reads (a decode step's embedding
over the x that the last step's q projection read) then needs no wait of its own where every
task of a grid it waits for in the previous iteration saw the flags of every producer task, and
the producer, with no counter left to signal, skips its fence. (A task's declared reads of
flagged words stand for loads it makes; a decode attention's new K and V rows are loaded by the
one split that holds the new key, and one reader of each producer task is all this needs.)

And since a flagged read implies nothing of what its writer waited for, the reader waits for
the grids its writer waited for whole (a decode layer's attention, for the previous layer's
output its q projection waited for): one wait that implies the reader's other producers, met
long before the flags come.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.ir.affine import AffineMap

from mk.dialects.task_maps import EdgeAttr, eval_map, grid_points, linearize, parse_map
from mk.passes.mugraph_to_task_buffers import BufferPlan, SymbolNames

# Transitive pruning keeps one bit per pair of tasks; beyond this many tasks it is skipped.
PRUNE_LIMIT = 4096
# Producer groupings tried (smallest first) before falling back to one element for all.
MAX_GROUPINGS = 64


@dataclass(eq=False)
class Access:
    """One footprint of a grid: the rectangle `starts[t] + [0, sizes)` of task t in a buffer."""

    buffer: str
    start: AffineMap
    sizes: tuple[int, ...]
    starts: np.ndarray


@dataclass
class GridInfo:
    """What the event construction needs of one task grid."""

    name: str
    shape: tuple[int, ...]
    reads: list[Access]
    writes: list[Access]
    base: int = 0

    @property
    def num_tasks(self) -> int:
        return int(np.prod(self.shape))

    def accesses(self, buffer: str) -> list[Access]:
        return [a for a in (*self.reads, *self.writes) if a.buffer == buffer]


@dataclass
class EventDecl:
    name: str
    shape: tuple[int, ...]
    count: int
    coarse: str | None = None
    flagged: bool = False


@dataclass
class EventPlan:
    """The events to declare and each grid's signal and wait edges."""

    events: list[EventDecl] = field(default_factory=list)
    signals: dict[str, list[EdgeAttr]] = field(default_factory=dict)
    waits: dict[str, list[EdgeAttr]] = field(default_factory=dict)


# --------------------------------------------------------------------------- needs


def rect_overlap(a: Access, b: Access) -> np.ndarray:
    """[i, j]: task i's rectangle of `a` meets task j's rectangle of `b` (same buffer)."""
    hit = np.ones((a.starts.shape[0], b.starts.shape[0]), dtype=bool)
    for d, (za, zb) in enumerate(zip(a.sizes, b.sizes, strict=True)):
        sa, sb = a.starts[:, d][:, None], b.starts[:, d][None, :]
        hit &= (sa < sb + zb) & (sb < sa + za)
    return hit


def byte_spans(access: Access, buffer: BufferPlan) -> tuple[np.ndarray, np.ndarray]:
    """Each task's [first, last) arena byte of its rectangle: a superset of the bytes it touches."""
    assert buffer.offset is not None
    shape, eb = buffer.shape, buffer.element_bytes
    last = access.starts + np.asarray(access.sizes, dtype=np.int64) - 1
    lo = buffer.offset + eb * linearize(access.starts, shape)
    hi = buffer.offset + eb * (linearize(last, shape) + 1)
    return lo, hi


def span_overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    return (a[0][:, None] < b[1][None, :]) & (b[0][None, :] < a[1][:, None])


def arena_overlap(a: Access, x: BufferPlan, b: Access, y: BufferPlan) -> np.ndarray:
    """[i, j]: task i's rectangle of `a` (in x) may share bytes with task j's of `b` (in y).

    Exact when both buffers lay the same elements on the same bytes; else byte spans.
    """
    if x.offset == y.offset and x.shape == y.shape and x.element_bytes == y.element_bytes:
        return rect_overlap(a, b)
    return span_overlap(byte_spans(a, x), byte_spans(b, y))


Thunk = Callable[[], np.ndarray]


@dataclass
class Needs:
    """The dependences of one consumer grid: producer grid position -> its need matrix, kept as
    the overlaps to compute, so that a producer the grid-level pruning drops costs nothing."""

    same: dict[int, list[Thunk]] = field(default_factory=dict)  # distance 0
    carried: dict[int, list[Thunk]] = field(default_factory=dict)  # distance 1
    # Writes after the reads of a grid that does not write those bytes (what flagged reads can
    # imply), in this iteration and after the previous one's.
    same_reads: dict[int, list[Thunk]] = field(default_factory=dict)
    carried_reads: dict[int, list[Thunk]] = field(default_factory=dict)

    def table(self, same: bool, reads: bool) -> dict[int, list[Thunk]]:
        """Where a write-after-access need goes: this iteration or the previous one's, after a
        grid's reads only (`reads`) or after its writes too."""
        if same:
            return self.same_reads if reads else self.same
        return self.carried_reads if reads else self.carried

    def of(self, producer: int, carried: bool) -> list[Thunk]:
        """Every need on `producer` at distance 1 (`carried`) or 0 (flagged reads aside)."""
        both = (self.carried, self.carried_reads) if carried else (self.same, self.same_reads)
        return [t for table in both for t in table.get(producer, [])]

    flags: dict[int, list[Thunk]] = field(default_factory=dict)  # distance 0, flagged buffers

    @staticmethod
    def add(table: dict[int, list[Thunk]], producer: int, need: Thunk) -> None:
        table.setdefault(producer, []).append(need)

    @staticmethod
    def matrix(thunks: Sequence[Thunk]) -> np.ndarray:
        """[c, p]: consumer task c needs producer task p (the union of the overlaps)."""
        need = thunks[0]()
        for thunk in thunks[1:]:
            need = need | thunk()
        return need


def collect_needs(
    grids: Sequence[GridInfo], buffers: dict[str, BufferPlan], iterations: int
) -> list[Needs]:
    """Every grid's dependences on other grids (RAW, arena WAR/WAW, loop-carried WAR).

    A buffer written in place (a donated argument's cache write) is also read before its write
    in program order: the write waits for those reads, and with several iterations a read before
    the write waits for the previous iteration's write (loop-carried RAW).
    """
    accessors: dict[str, list[tuple[int, Access]]] = {}
    for i, grid in enumerate(grids):
        for access in (*grid.reads, *grid.writes):
            accessors.setdefault(access.buffer, []).append((i, access))
    carry = iterations > 1
    spans = _arena_spans(buffers)
    result: list[Needs] = []
    for j, grid in enumerate(grids):
        needs = Needs()
        for read in grid.reads:
            for i, other in accessors[read.buffer]:
                if other not in grids[i].writes:
                    continue
                rect = functools.partial(rect_overlap, read, other)
                if i < j:
                    Needs.add(needs.flags if buffers[read.buffer].flagged else needs.same, i, rect)
                elif i > j and carry:  # written in place later: the previous step's value
                    Needs.add(needs.carried, i, rect)
        for write in grid.writes:
            target = buffers[write.buffer]
            for i, other in accessors[write.buffer]:
                rect = functools.partial(rect_overlap, write, other)
                read = other not in grids[i].writes
                if i < j and other in grids[i].reads:  # an in-place write after earlier reads
                    Needs.add(needs.table(True, read), i, rect)
                if i > j and carry:  # next iteration's write after this one's reads
                    Needs.add(needs.table(False, read), i, rect)
            for name in _sharing(target, spans):
                for i, other in accessors[name]:
                    if i == j or (i > j and not carry):
                        continue
                    span = functools.partial(arena_overlap, write, target, other, buffers[name])
                    Needs.add(needs.table(i < j, other not in grids[i].writes), i, span)
        result.append(needs)
    return result


def _arena_spans(buffers: dict[str, BufferPlan]) -> list[tuple[int, int, str]]:
    """(first byte, end, name) of every arena buffer, computed once: `_sharing` runs per write."""
    return [
        (b.offset, b.offset + b.nbytes, n)
        for n, b in buffers.items()
        if b.in_arena and b.offset is not None
    ]


def _sharing(target: BufferPlan, spans: list[tuple[int, int, str]]) -> list[str]:
    """The other arena buffers whose bytes overlap the target's."""
    if not target.in_arena:
        return []
    assert target.offset is not None
    first, end = target.offset, target.offset + target.nbytes
    return [n for o, e, n in spans if o < end and first < e and n != target.name]


# --------------------------------------------------------------------------- one event


@dataclass
class Choice:
    """A producer grouping `k` with its maps and the waits it implies."""

    k: tuple[int, ...]
    shape: tuple[int, ...]
    signal: AffineMap
    wait: AffineMap
    waits: np.ndarray  # [c, p]: consumer task c waits for producer task p
    exact: bool


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _bounding_boxes(need: np.ndarray, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per needing consumer row: the lowest and highest producer coordinates it needs."""
    big = np.iinfo(np.int64).max
    lo = np.empty((need.shape[0], points.shape[1]), dtype=np.int64)
    hi = np.empty_like(lo)
    for start in range(0, need.shape[0], 256):  # bounded temporaries for big grids
        rows = need[start : start + 256]
        for d in range(points.shape[1]):
            lo[start : start + 256, d] = np.where(rows, points[:, d], big).min(axis=1)
            hi[start : start + 256, d] = np.where(rows, points[:, d], -1).max(axis=1)
    return lo, hi


def _groupings(need: np.ndarray, pshape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Candidate factors k, exact first, then every feasible one by increasing element size."""
    points = grid_points(pshape)
    lo, hi = _bounding_boxes(need, points)
    extent = hi - lo + 1
    found: list[tuple[int, ...]] = []
    k0 = tuple(int(v) for v in extent[0])
    if (
        (extent == extent[0]).all()
        and all(p % k == 0 for p, k in zip(pshape, k0, strict=True))
        and (lo % np.asarray(k0) == 0).all()
        and (need.sum(axis=1) == int(np.prod(k0))).all()
    ):
        found.append(k0)
    feasible = [
        [k for k in _divisors(p) if (lo[:, d] // k == hi[:, d] // k).all()]
        for d, p in enumerate(pshape)
    ]
    combos = sorted(itertools.product(*feasible), key=lambda k: (int(np.prod(k)), k))
    found += [k for k in combos[:MAX_GROUPINGS] if k not in found]
    if pshape not in found:
        found.append(pshape)
    return found


def _map(rank: int, exprs: Sequence[str]) -> AffineMap:
    dims = ", ".join(f"d{i}" for i in range(rank))
    return parse_map(f"({dims}) -> ({', '.join(exprs) or '0'})")


def _signal_exprs(pshape: tuple[int, ...], k: tuple[int, ...]) -> list[str]:
    return [
        f"d{i}" if f == 1 else f"d{i} floordiv {f}"
        for i, (p, f) in enumerate(zip(pshape, k, strict=True))
        if p // f > 1
    ]


Form = tuple[str, Callable[[np.ndarray], np.ndarray]]


def _forms(x: np.ndarray, v: np.ndarray, cshape: tuple[int, ...]) -> list[Form]:
    """Affine expressions of consumer coordinates x that give values v on the needing rows."""
    forms: list[Form] = []
    if (v == v[0]).all():
        c = int(v[0])
        forms.append((str(c), lambda p, c=c: np.full(p.shape[0], c, dtype=np.int64)))
    coeffs = _integer_linear(x, v)
    if coeffs is not None:
        *a, b = coeffs
        terms = [f"d{i}" if ai == 1 else f"d{i} * {ai}" for i, ai in enumerate(a) if ai]
        text = " + ".join(terms + ([str(b)] if b or not terms else []))
        forms.append((text, lambda p, a=a, b=b: p @ np.asarray(a, dtype=np.int64) + b))
    for i, extent in enumerate(cshape):
        for m in range(2, extent + 1):
            b = v - x[:, i] // m
            if (b == b[0]).all() and b[0] >= 0:
                off = int(b[0])
                text = f"d{i} floordiv {m}" + (f" + {off}" if off else "")
                forms.append((text, lambda p, i=i, m=m, off=off: p[:, i] // m + off))
                break
    return forms


def _integer_linear(x: np.ndarray, v: np.ndarray) -> list[int] | None:
    """Non-negative integer a, b with v = x @ a + b on every row, or None."""
    design = np.concatenate([x, np.ones((x.shape[0], 1), dtype=np.int64)], axis=1)
    solution = np.linalg.lstsq(design.astype(np.float64), v.astype(np.float64), rcond=None)[0]
    coeffs = [int(round(c)) for c in solution]
    if any(c < 0 for c in coeffs) or not (design @ np.asarray(coeffs) == v).all():
        return None
    return coeffs


def _fit_wait(
    rows: np.ndarray, elements: np.ndarray, cshape: tuple[int, ...], eshape: tuple[int, ...]
) -> list[str] | None:
    """Per event dim, an expression of the consumer coordinates hitting `elements` on `rows`."""
    points = grid_points(cshape)
    exprs: list[str] = []
    for j, extent in enumerate(eshape):
        for text, evaluate in _forms(points[rows], elements[:, j], cshape):
            values = evaluate(points)
            if values.min() >= 0 and values.max() < extent:
                exprs.append(text)
                break
        else:
            return None
    return exprs


def choose_event(need: np.ndarray, pshape: tuple[int, ...], cshape: tuple[int, ...]) -> Choice:
    """The finest producer grouping whose elements the consumers can address with one wait."""
    rows = np.flatnonzero(need.any(axis=1))
    ppoints, cpoints = grid_points(pshape), grid_points(cshape)
    for k in _groupings(need[rows], pshape):
        kept = [i for i, (p, f) in enumerate(zip(pshape, k, strict=True)) if p // f > 1]
        eshape = tuple(pshape[i] // k[i] for i in kept) or (1,)
        lo, _ = _bounding_boxes(need[rows], ppoints)
        elements = (lo // np.asarray(k))[:, kept] if kept else np.zeros((len(rows), 1), np.int64)
        exprs = _fit_wait(rows, elements, cshape, eshape)
        if exprs is None:
            continue
        signal = _map(len(pshape), _signal_exprs(pshape, k))
        wait = _map(len(cshape), exprs)
        signalled = linearize(eval_map(signal, ppoints), eshape)
        waited = linearize(eval_map(wait, cpoints), eshape)
        waits = waited[:, None] == signalled[None, :]
        if (need & ~waits).any():
            continue  # a needed producer would be missed: not a correct event
        return Choice(k, eshape, signal, wait, waits, bool((waits == need).all()))
    raise AssertionError("the single-element grouping always fits")


# --------------------------------------------------------------------------- all events


@dataclass
class _Builder:
    grids: Sequence[GridInfo]
    names: SymbolNames
    merge: bool
    plan: EventPlan = field(default_factory=EventPlan)
    by_key: dict[tuple[int, tuple[int, ...], bool], EventDecl] = field(default_factory=dict)
    edges: dict[int, list[tuple[int, int, EdgeAttr]]] = field(default_factory=dict)

    def event_for(self, producer: int, choice: Choice, flagged: bool = False) -> EventDecl:
        key = (producer, choice.k, flagged)
        if self.merge and key in self.by_key:
            return self.by_key[key]
        grid = self.grids[producer]
        suffix = "flags" if flagged else "done"
        event = EventDecl(
            self.names.take(f"{grid.name}_{suffix}"), choice.shape, int(np.prod(choice.k)),
            flagged=flagged,
        )  # fmt: skip
        self.by_key[key] = event
        self.plan.events.append(event)
        self.plan.signals.setdefault(grid.name, []).append(EdgeAttr(event.name, choice.signal))
        return event

    def wait(
        self, consumer: int, producer: int, choice: Choice, distance: int, flagged: bool = False
    ) -> None:
        event = self.event_for(producer, choice, flagged)
        if not choice.exact and event.coarse is None:
            event.coarse = "waits on more producer tasks than the footprints need"
        edge = EdgeAttr(event.name, choice.wait, distance)
        edges = self.edges.setdefault(consumer, [])
        same = [e for _, _, e in edges if e.event_name == event.name and e.element == edge.element]
        if any(e.distance_value <= distance for e in same):
            return  # waiting for a later iteration's signals implies the earlier ones
        edges.append((distance, producer, edge))

    def finish(self) -> EventPlan:
        for consumer, edges in self.edges.items():
            ordered = sorted(edges, key=lambda e: (e[0], e[1]))
            self.plan.waits[self.grids[consumer].name] = [e for _, _, e in ordered]
        return self.plan


class _Ancestors:
    """Per task, the tasks it already waits for (transitively), this and the previous iteration."""

    def __init__(self, grids: Sequence[GridInfo]) -> None:
        total = sum(g.num_tasks for g in grids)
        self.enabled = total <= PRUNE_LIMIT
        size = total if self.enabled else 0
        self.same = np.zeros((size, size), dtype=bool)
        self.prev = np.zeros((size, size), dtype=bool)

    def implied(self, table: np.ndarray, consumer: GridInfo, producer: GridInfo) -> np.ndarray:
        if not self.enabled:
            return np.zeros((consumer.num_tasks, producer.num_tasks), dtype=bool)
        return table[_span(consumer)][:, _span(producer)]

    def _reach(
        self, choice: Choice, producer: GridInfo, table: np.ndarray, itself: bool
    ) -> np.ndarray:
        rows = table[_span(producer)].copy()
        if itself:
            rows[:, _span(producer)] |= np.eye(producer.num_tasks, dtype=bool)
        return _or_rows(choice.waits, rows)

    def absorb(self, consumer: GridInfo, producer: GridInfo, choice: Choice, distance: int) -> None:
        """Consumer tasks now wait for whole producer elements and what those tasks waited for."""
        if not self.enabled:
            return
        table = self.same if distance == 0 else self.prev
        table[_span(consumer)] |= self._reach(choice, producer, self.same, itself=True)

    def inherit(self, consumer: GridInfo, producer: GridInfo, choice: Choice) -> None:
        """A same-iteration wait also implies what the producer waited for in the previous one."""
        if self.enabled:
            self.prev[_span(consumer)] |= self._reach(choice, producer, self.prev, itself=False)


def _every_task(consumer: GridInfo, producer: GridInfo) -> np.ndarray:
    return np.ones((consumer.num_tasks, producer.num_tasks), dtype=bool)


def _span(grid: GridInfo) -> slice:
    return slice(grid.base, grid.base + grid.num_tasks)


def _or_rows(select: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[c] = OR of rows[p] over the p with select[c, p]: done per distinct selection row."""
    distinct, inverse = np.unique(select, axis=0, return_inverse=True)
    merged = np.stack([rows[s].any(axis=0) for s in distinct]) if len(distinct) else rows[:0]
    return merged[inverse.reshape(-1)]


def build_events(
    grids: Sequence[GridInfo],
    buffers: dict[str, BufferPlan],
    names: SymbolNames,
    iterations: int = 1,
    merge: bool = True,
) -> EventPlan:
    """Events, signals and waits covering every dependence between the grids (program order)."""
    base = 0
    for grid in grids:
        grid.base, base = base, base + grid.num_tasks
    needs = collect_needs(grids, buffers, iterations)
    builder = _Builder(grids, names, merge)
    ancestors = _Ancestors(grids)
    # Grids every task of grid j waits for, every task of them, transitively: the grid-level
    # pruning that still works when the task-level one is off (long programs). A wait on only
    # some tasks of i still implies whole[i] when every task of j waits on one of them: a
    # per-head QK-norm waits on its head's columns of q, and through them on every layer
    # before (without this, a 28-layer qwen3-0.6b's QK-norm kept ~56 waits on earlier layers'
    # attention, one L2 round trip each on the GPU).
    whole: list[set[int]] = [set() for _ in grids]
    some: list[set[int]] = [set() for _ in grids]  # grids each task of j waits on one task of
    # Grids whose every task some task of j waits for (transitively): what j's tasks wait for
    # together. A grid waiting on all of j waits on all of these (the o-projection, on all
    # attention splits, waits through them on every head's QK-norm).
    cover: list[set[int]] = [set() for _ in grids]
    chosen: list[list[tuple[int, Choice]]] = [[] for _ in grids]
    # Grids whose every task some task of j saw the flagged words of (its reads are over then).
    seen = [
        {i for i, thunks in needs[j].flags.items() if Needs.matrix(thunks).any(axis=0).all()}
        for j in range(len(grids))
    ]
    for j, grid in enumerate(grids):
        # A flagged read implies nothing of what its writer waited for: the reader waits for
        # that too, where the writer waited for all of a grid (one wait, met long before the
        # flags come and often remembered on the SM, that implies the reader's other producers).
        for i in needs[j].flags:
            for m, choice in chosen[i]:
                if choice.waits.all():
                    Needs.add(needs[j].same, m, functools.partial(_every_task, grid, grids[m]))
        producers = needs[j].same.keys() | needs[j].same_reads.keys()
        for i in sorted(producers, reverse=True):  # nearest producers imply the most
            if i in whole[j] or (i not in needs[j].same and any(i in seen[m] for m in whole[j])):
                continue  # ordered already, or its reads are over (flags seen)
            need = Needs.matrix(needs[j].of(i, carried=False))
            if (need & ~ancestors.implied(ancestors.same, grid, grids[i])).any():
                choice = choose_event(need, grids[i].shape, grid.shape)
                builder.wait(j, i, choice, 0)
                ancestors.absorb(grid, grids[i], choice, 0)
                chosen[j].append((i, choice))
                if choice.waits.all():
                    whole[j] |= {i} | whole[i] | cover[i]
                elif choice.waits.any(axis=1).all():
                    whole[j] |= whole[i]
                    some[j].add(i)
                if choice.waits.any(axis=0).all():
                    cover[j] |= {i} | cover[i]
                elif choice.waits.any():
                    cover[j] |= whole[i]
        cover[j] |= whole[j]
    # The same for the previous iteration: grids every task of j (in iteration t) waits for,
    # every task of them, in iteration t - 1. A decode loop's first grids wait on its last
    # (the next token), which already orders nearly everything before them.
    previous: list[set[int]] = [set() for _ in grids]
    for j, grid in enumerate(grids):
        for i, choice in chosen[j]:
            ancestors.inherit(grid, grids[i], choice)
        for m in whole[j] | some[j]:
            previous[j] |= previous[m]
        producers = needs[j].carried.keys() | needs[j].carried_reads.keys()
        for i in sorted(producers, reverse=True):
            if i in previous[j] or (
                i not in needs[j].carried and any(i in seen[m] for m in previous[j])
            ):
                continue  # ordered already, or its reads are over (flags seen)
            need = Needs.matrix(needs[j].of(i, carried=True))
            if (need & ~ancestors.implied(ancestors.prev, grid, grids[i])).any():
                choice = choose_event(need, grids[i].shape, grid.shape)
                builder.wait(j, i, choice, 1)
                ancestors.absorb(grid, grids[i], choice, 1)
                if choice.waits.all():
                    previous[j] |= {i} | whole[i]
    for j, grid in enumerate(grids):
        for i in sorted(needs[j].flags, reverse=True):
            need = Needs.matrix(needs[j].flags[i])
            if (
                i not in whole[j]
                and (need & ~ancestors.implied(ancestors.same, grid, grids[i])).any()
            ):
                builder.wait(j, i, choose_event(need, grids[i].shape, grid.shape), 0, flagged=True)
    return builder.finish()
