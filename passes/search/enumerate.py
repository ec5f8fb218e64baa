"""Enumerates block graphs: depth-first, each graph generated in one canonical op order, pruned
by abstract expressions and a dead-value bound, de-duplicated by 128-bit canonical hashes.

**Canonical order.** A graph is a set of ops; it is generated as a sequence in which each op
either uses the tile the previous op made, or comes after the previous op in the fixed order of
`Tile.key` (op kind, attributes, operand signatures). That keeps most orderings of independent
ops from being generated twice; the hash set catches the rest (its hit count is the duplicate
rate reported in the statistics).

**Pruning.** A new tile must (1) be well formed (labels broadcast, a matmul contracts a reduced
label, loop/epilogue phases do not mix), (2) have an abstract expression that is a subexpression
of a target's (`SubexpressionOracle`), (3) not repeat a tile already in the graph, and (4) leave
few enough unused tiles that the remaining op budget can still consume them.
"""

from __future__ import annotations

import bisect
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mk.passes.search.blockgraph import LOOP, Extender, Tile, Vocabulary, digest, input_tile
from mk.passes.search.expr import SubexpressionOracle
from mk.passes.search.target import Problem


def _key(t: Tile) -> tuple[int, str, bytes]:
    return t.key


class BudgetExhausted(Exception):
    """The time budget ran out; what was found so far stands."""


@dataclass
class SearchStats:
    """What a search did; `bytes_per_state` and `duplicate_rate` are the issue's measurements."""

    states: int = 0  # distinct states (graphs) visited
    expanded: int = 0  # states extended (visited ones that were not complete or at max-ops)
    generated: int = 0  # well-formed extensions considered
    pruned_expression: int = 0
    pruned_redundant: int = 0
    pruned_order: int = 0
    pruned_dead: int = 0
    duplicates: int = 0  # extensions whose graph was already visited (hash hit)
    candidates: int = 0  # distinct complete block graphs
    structures: int = 0  # block-graph searches run (one per loop choice and kernel)
    seconds: float = 0.0
    budget_exhausted: bool = False
    visited: set[bytes] = field(default_factory=set, repr=False)

    @property
    def duplicate_rate(self) -> float:
        """Hash hits / (hits + new states)."""
        total = self.duplicates + self.states
        return self.duplicates / total if total else 0.0

    @property
    def bytes_per_state(self) -> float:
        """Memory the de-duplication set holds per state: the 16-byte digest as a Python bytes
        object plus its share of the set's table."""
        n = len(self.visited)
        if not n:
            return 0.0
        total = sys.getsizeof(self.visited) + sum(sys.getsizeof(d) for d in self.visited)
        return total / n

    def as_dict(self) -> dict[str, float | int | bool]:
        return {
            "states": self.states,
            "expanded": self.expanded,
            "generated": self.generated,
            "duplicates": self.duplicates,
            "duplicate_rate": round(self.duplicate_rate, 4),
            "bytes_per_state": round(self.bytes_per_state, 1),
            "digest_bytes": 16,
            "pruned_expression": self.pruned_expression,
            "pruned_redundant": self.pruned_redundant,
            "pruned_order": self.pruned_order,
            "pruned_dead": self.pruned_dead,
            "candidates": self.candidates,
            "structures": self.structures,
            "seconds": round(self.seconds, 3),
            "budget_exhausted": self.budget_exhausted,
        }


@dataclass(frozen=True)
class Found:
    """A complete block graph: its tiles (dead ones removed, in topological order), the tile each
    problem output is written from, and the loop label it was searched with."""

    tiles: tuple[Tile, ...]
    outputs: tuple[int, ...]
    loop: int | None
    sig: bytes

    def op_count(self) -> int:
        return sum(t.kind != "input" for t in self.tiles)


def _prune_dead(tiles: list[Tile], outputs: list[int], loop: int | None) -> Found:
    keep: set[int] = set()
    stack = list(outputs)
    while stack:
        i = stack.pop()
        if i not in keep:
            keep.add(i)
            stack.extend(tiles[i].operands)
    order = sorted(keep)
    index = {old: new for new, old in enumerate(order)}
    kept = tuple(
        Tile(t.kind, t.attr, tuple(index[o] for o in t.operands), t.labels, t.chunked,
             t.phase, t.nf, t.sig, t.key)
        for t in (tiles[i] for i in order)
    )  # fmt: skip
    outs = tuple(index[o] for o in outputs)
    sig = digest(loop, *sorted(t.sig for t in kept), *(kept[o].sig for o in outs))
    return Found(kept, outs, loop, sig)


class BlockSearch:
    """Depth-first enumeration of the block graphs of one problem and one loop choice."""

    def __init__(
        self, p: Problem, vocab: Vocabulary, loop: int | None, max_ops: int, deadline: float,
        stats: SearchStats, tick: Callable[[], None] = lambda: None,
    ) -> None:  # fmt: skip
        self.p, self.loop, self.max_ops, self.deadline = p, loop, max_ops, deadline
        self.stats, self.tick = stats, tick
        self.oracle = SubexpressionOracle(p.algebra, [p.nf[o] for o in p.outputs])
        self.ext = Extender(p, vocab, loop, self.oracle)
        self.goals = [(p.nf[o], p.labels[o]) for o in p.outputs]
        self.found: dict[bytes, Found] = {}
        self.base = [input_tile(p, i, loop) for i in range(len(p.inputs))]

    def run(self) -> list[Found]:
        self.stats.structures += 1
        tiles = list(self.base)
        valid = [t for i in range(len(tiles)) for t in self.ext.with_tile(tiles, i)]
        try:
            self._expand(tiles, [0] * len(tiles), [], valid, None, set(), 0)
        except BudgetExhausted:
            self.stats.budget_exhausted = True
        finally:
            self.stats.pruned_expression += self.ext.rejected
        return list(self.found.values())

    def _goal_tile(self, t: Tile, goal: tuple[int, tuple[int, ...]]) -> bool:
        if t.nf != goal[0] or t.labels != goal[1] or any(t.chunked):
            return False
        return not (self.loop is not None and t.phase == LOOP)

    def _complete(self, tiles: list[Tile]) -> list[int] | None:
        outs = []
        for goal in self.goals:
            match = next((i for i, t in enumerate(tiles) if self._goal_tile(t, goal)), None)
            if match is None:
                return None
            outs.append(match)
        return outs

    def _expand(
        self, tiles: list[Tile], uses: list[int], older: list[Tile], fresh: list[Tile],
        last: tuple[int, str, bytes] | None, present: set[tuple[object, ...]], depth: int,
    ) -> None:  # fmt: skip
        """Try every extension of `tiles` by one op: `fresh` are the well-formed ops using the
        newest tile, `older` (sorted by key) those on older tiles, allowed after `last` only."""
        stats = self.stats
        stats.expanded += 1
        if time.monotonic() > self.deadline:
            raise BudgetExhausted
        if stats.expanded % 256 == 0:
            self.tick()
        dangling = sum(1 for i in range(len(self.base), len(tiles)) if not uses[i])
        room = self.max_ops - depth - 1
        start = 0 if last is None else bisect.bisect_right(older, last, key=_key)
        stats.pruned_order += start
        merged: list[Tile] | None = None
        for t in itertools.chain(fresh, itertools.islice(older, start, None)):
            stats.generated += 1
            ident = (t.nf, t.labels, t.chunked, t.phase)
            if ident in present or any(tiles[i].nf == t.nf for i in t.operands):
                stats.pruned_redundant += 1
                continue
            freed = len({i for i in t.operands if i >= len(self.base) and not uses[i]})
            if dangling + 1 - freed - len(self.goals) > room:
                stats.pruned_dead += 1
                continue
            state = digest(self.loop, *sorted([*(x.sig for x in tiles[len(self.base) :]), t.sig]))
            if state in stats.visited:
                stats.duplicates += 1
                continue
            stats.visited.add(state)
            stats.states += 1
            if merged is None:
                merged = sorted(older + fresh, key=_key)
            self._push(tiles, uses, merged, t, present, ident, depth)

    def _push(
        self, tiles: list[Tile], uses: list[int], older: list[Tile], t: Tile,
        present: set[tuple[object, ...]], ident: tuple[object, ...], depth: int,
    ) -> None:  # fmt: skip
        tiles.append(t)
        uses.append(0)
        for i in t.operands:
            uses[i] += 1
        present.add(ident)
        try:
            outs = self._complete(tiles) if any(self._goal_tile(t, g) for g in self.goals) else None
            if outs is not None:
                found = _prune_dead(tiles, outs, self.loop)
                if found.sig not in self.found:
                    self.found[found.sig] = found
                    self.stats.candidates += 1
            elif depth + 1 < self.max_ops:
                fresh = self.ext.with_tile(tiles, len(tiles) - 1)
                self._expand(tiles, uses, older, fresh, t.key, present, depth + 1)
        finally:
            present.discard(ident)
            for i in t.operands:
                uses[i] -= 1
            uses.pop()
            tiles.pop()
