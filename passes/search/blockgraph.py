"""The search's block graphs: tiles described by labels (not sizes), the ops that extend a graph,
and the 128-bit structural signatures that make equal graphs hash equal.

A block graph is searched once per *structure* (which label, if any, the for-loop walks); sizes
(grid extents, the for-loop range) are chosen afterwards, when a graph is instantiated as IR.
So a tile records, per dim, its label and whether the for-loop chunks it, plus its phase
(INVARIANT / LOOP / EPILOGUE, as in the mugraph verifier) and its abstract expression.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mk.passes.search.expr import Algebra
from mk.passes.search.target import UNIT, Problem

INVARIANT, LOOP, EPILOGUE = 0, 1, 2

# Op kinds in the canonical order (the first element of an op's ordering key).
KINDS = ("input", "matmul", "mul", "add", "sub", "unary", "addc", "scale", "reduce", "accum")
KIND_RANK = {k: i for i, k in enumerate(KINDS)}
UNARY_KINDS = ("exp", "sqrt", "rsqrt", "sigmoid", "silu", "gelu", "relu", "recip")
ACCUM_KINDS = ("sum", "sum_last", "mean_last", "sum_sq_last", "mean_sq_last")


def digest(*parts: object) -> bytes:
    """The 128-bit canonical hash of a serialisation."""
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
        h.update(b"\x00")
    return h.digest()


@dataclass(frozen=True)
class Tile:
    """One value of a block graph, with the op that made it."""

    kind: str
    attr: object  # input index, matmul transpose_b, unary kind, constant, (reduce kind, dim), ...
    operands: tuple[int, ...]  # tile indices
    labels: tuple[int, ...]
    chunked: tuple[bool, ...]  # per dim: the for-loop walks it (one chunk per iteration)
    phase: int
    nf: int
    sig: bytes  # structural signature: kind, attr and the operands' signatures
    key: tuple[int, str, bytes] = (0, "", b"")  # the op's place in the canonical order


@dataclass
class Vocabulary:
    """Which ops the target can use: its opaque functions, constants and scale factors."""

    unary: tuple[str, ...]
    constants: tuple[float, ...]
    factors: tuple[float, ...]
    add: bool
    sub: bool


def vocabulary(p: Problem, factors: Sequence[float]) -> Vocabulary:
    a = p.algebra
    names: set[str] = set()
    consts: list[float] = []
    multi, negative = False, False
    for out in p.outputs:
        n = p.nf[out]
        names |= a.fn_names(n)
        consts += [c for c in a.constants(n) if c not in consts]
        for e in [n, *a.fn_args(n)]:
            multi |= len(a.nfs[e]) > 1
            negative |= any(c < 0 for c, _, _ in a.nfs[e])
    unary = tuple(k for k in UNARY_KINDS if k in names)
    return Vocabulary(unary, tuple(consts), tuple(factors), multi, negative)


def input_tile(p: Problem, index: int, loop: int | None) -> Tile:
    v = p.inputs[index]
    labels = p.labels[v]
    fmap = labels.index(loop) if loop is not None and loop in labels else -1
    chunked = tuple(d == fmap for d in range(len(labels)))
    phase = LOOP if fmap >= 0 else INVARIANT
    return Tile("input", index, (), labels, chunked, phase, p.nf[v], digest("input", index))


def _phase(tiles: Sequence[Tile]) -> int | None:
    phases = {t.phase for t in tiles}
    if LOOP in phases and EPILOGUE in phases:
        return None  # after the loop only accumulator results and invariant tiles exist
    return max(phases)


def _broadcast(a: Tile, b: Tile) -> tuple[tuple[int, ...], tuple[bool, ...]] | None:
    """Labels and chunking of a NumPy-broadcast elementwise result, or None."""
    rank = max(len(a.labels), len(b.labels))
    la = (UNIT,) * (rank - len(a.labels)) + a.labels
    lb = (UNIT,) * (rank - len(b.labels)) + b.labels
    ca = (False,) * (rank - len(a.chunked)) + a.chunked
    cb = (False,) * (rank - len(b.chunked)) + b.chunked
    labels, chunked = [], []
    for x, y, cx, cy in zip(la, lb, ca, cb, strict=True):
        if x == UNIT:
            labels.append(y)
            chunked.append(cy)
        elif y == UNIT or (x == y and cx == cy):
            labels.append(x)
            chunked.append(cx)
        else:
            return None
    return tuple(labels), tuple(chunked)


def _with_operands(t: Tile, operands: tuple[int, ...]) -> Tile:
    return Tile(t.kind, t.attr, operands, t.labels, t.chunked, t.phase, t.nf, t.sig, t.key)


class Extender:
    """Makes the tiles one op can add to a graph (shape, phase and expression rules applied).

    `with_tile(tiles, i)` gives the ops that use tile i with any tile up to i: the search keeps
    the ops of a graph's older tiles from its parent state and asks only for the new tile's.
    Ops whose expression the oracle rejects are dropped here, before their signature is hashed.
    """

    def __init__(
        self, p: Problem, vocab: Vocabulary, loop: int | None, keep: Callable[[int], bool]
    ) -> None:
        self.p, self.vocab, self.loop, self.keep = p, vocab, loop, keep
        self.a: Algebra = p.algebra
        self.rejected = 0
        self._memo: dict[tuple[bytes, ...], list[Tile]] = {}

    def _tile(
        self, kind: str, attr: object, ops: tuple[int, ...], tiles: Sequence[Tile],
        labels: tuple[int, ...], chunked: tuple[bool, ...], phase: int, nf: int,
        out: list[Tile],
    ) -> None:  # fmt: skip
        if not self.keep(nf):
            self.rejected += 1
            return
        sigs = [tiles[i].sig for i in ops]
        if kind in ("mul", "add"):
            sigs.sort()
        key = (KIND_RANK[kind], repr(attr), b"".join(sigs))
        out.append(
            Tile(kind, attr, ops, labels, chunked, phase, nf, digest(kind, attr, *sigs), key)
        )

    def with_tile(self, tiles: Sequence[Tile], i: int) -> list[Tile]:
        """Every well-formed op using tile i and otherwise only tiles before it."""
        out: list[Tile] = []
        memo, si = self._memo, tiles[i].sig
        self._add(out, memo.get((si,)) or self._make(tiles, (i,), self._unary_ops), (i,))
        for j in range(i + 1):
            sj = tiles[j].sig
            made = memo.get((si, sj))
            if made is None:
                made = self._make(tiles, (i, j), self._pair_ops)
            if made:
                self._add(out, made, (i, j))
            if j == i:
                continue
            made = memo.get((sj, si))
            if made is None:
                made = self._make(tiles, (j, i), self._pair_ops)
            if made:
                self._add(out, made, (j, i))
        return out

    @staticmethod
    def _add(out: list[Tile], made: list[Tile], at: tuple[int, ...]) -> None:
        out += [_with_operands(t, tuple(at[r] for r in t.operands)) for t in made]

    def _make(
        self, tiles: Sequence[Tile], at: tuple[int, ...], make: Callable[..., None]
    ) -> list[Tile]:
        """The ops `make(tiles, *at, out)` gives, memoised on the operand tiles' signatures (an
        op depends on its operands' contents, not on where they sit in the graph); operands are
        stored as positions in `at`."""
        made: list[Tile] = []
        make(tiles, *at, made)
        roles = {i: r for r, i in reversed(list(enumerate(at)))}
        made = [_with_operands(t, tuple(roles[o] for o in t.operands)) for t in made]
        self._memo[tuple(tiles[i].sig for i in at)] = made
        return made

    def _pair_ops(self, tiles: Sequence[Tile], i: int, j: int, out: list[Tile]) -> None:
        a, b = tiles[i], tiles[j]
        phase = _phase([a, b])
        if phase is None:
            return
        self._matmul(tiles, i, j, phase, out)
        if i < j:
            return  # commutative ops: one operand order
        shape = _broadcast(a, b)
        if shape is None:
            return
        labels, chunked = shape
        same = (labels, chunked, phase)
        self._tile(
            "mul", None, (j, i), tiles, *same, self.a.mul(a.nf, b.nf, a.labels, b.labels), out
        )
        if i == j:
            return
        if self.vocab.add:
            self._tile("add", None, (j, i), tiles, *same, self.a.add(a.nf, b.nf), out)
        if self.vocab.sub:
            for x, y in ((i, j), (j, i)):
                nf = self.a.add(tiles[x].nf, self.a.scale(tiles[y].nf, -1.0))
                self._tile("sub", None, (x, y), tiles, *same, nf, out)

    def _matmul(self, tiles: Sequence[Tile], i: int, j: int, phase: int, out: list[Tile]) -> None:
        a, b = tiles[i], tiles[j]
        if len(a.labels) != 2 or len(b.labels) != 2 or i == j:
            return
        k = a.labels[-1]
        if k == UNIT or k not in self.p.reduced:
            return
        if b.labels[1] == k and b.chunked[1] == a.chunked[1]:
            transpose, other = True, 0
        elif b.labels[0] == k and b.chunked[0] == a.chunked[1]:
            transpose, other = False, 1
        else:
            return
        labels = (a.labels[0], b.labels[other])
        chunked = (a.chunked[0], b.chunked[other])
        nf = self.a.reduce(self.a.mul(a.nf, b.nf), k, not a.chunked[1])
        self._tile("matmul", transpose, (i, j), tiles, labels, chunked, phase, nf, out)

    def _unary_ops(self, tiles: Sequence[Tile], i: int, out: list[Tile]) -> None:
        t = tiles[i]
        same = (t.labels, t.chunked, t.phase)
        for k in self.vocab.unary:
            self._tile("unary", k, (i,), tiles, *same, self.a.fn(k, t.nf), out)
        for c in self.vocab.constants:
            self._tile("addc", c, (i,), tiles, *same, self.a.add(t.nf, self.a.const(c)), out)
        for f in self.vocab.factors:
            self._tile("scale", f, (i,), tiles, *same, self.a.scale(t.nf, f), out)
        self._reduces(tiles, i, out)
        if self.loop is not None and t.phase == LOOP:
            self._accums(tiles, i, out)

    def _reduces(self, tiles: Sequence[Tile], i: int, out: list[Tile]) -> None:
        t = tiles[i]
        for d, label in enumerate(t.labels):
            if label == UNIT or label not in self.p.reduced:
                continue
            labels = t.labels[:d] + (UNIT,) + t.labels[d + 1 :]
            chunked = t.chunked[:d] + (False,) + t.chunked[d + 1 :]
            total = self.a.reduce(t.nf, label, not t.chunked[d])
            same = (labels, chunked, t.phase)
            self._tile("reduce", ("sum", d), (i,), tiles, *same, total, out)
            if not t.chunked[d]:
                mean = self.a.scale(total, 1.0 / self.p.extents[label])
                self._tile("reduce", ("mean", d), (i,), tiles, *same, mean, out)

    def _accums(self, tiles: Sequence[Tile], i: int, out: list[Tile]) -> None:
        t, loop = tiles[i], self.loop
        assert loop is not None
        whole = self.a.complete(t.nf, loop)
        self._tile("accum", "sum", (i,), tiles, t.labels, t.chunked, EPILOGUE, whole, out)
        last = t.labels[-1]
        if last == UNIT or last not in self.p.reduced:
            return
        labels = (*t.labels[:-1], UNIT)
        chunked = (*t.chunked[:-1], False)
        for kind in ACCUM_KINDS[1:]:
            x = self.a.mul(t.nf, t.nf) if "sq" in kind else t.nf
            if last == loop and t.chunked[-1]:
                nf = self.a.reduce(x, last, True)
            elif "mean" in kind:
                continue  # the mean divides by last × forloop: only a whole label is a mean
            else:
                nf = self.a.complete(self.a.reduce(x, last, not t.chunked[-1]), loop)
            if "mean" in kind:
                nf = self.a.scale(nf, 1.0 / self.p.extents[last])
            self._tile("accum", kind, (i,), tiles, labels, chunked, EPILOGUE, nf, out)
