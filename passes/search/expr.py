"""Abstract expressions: a lax normal form of what a tensor or tile computes, to prune the search.

An expression is a sum of terms; a term is `coeff · Σ_{reductions} Π atoms`, where an atom is an
input tensor (`var`) or an opaque function (`fn`: exp, rsqrt, silu, recip, ...) of an expression.
Every reduction is pulled out to the term level (Σ_i a · b = a · Σ_i b without checking that `a`
does not depend on `i`), products distribute over sums, and nested reductions over the same
label stay a multiset. These axioms are *lax*: they identify more expressions than real
arithmetic does, so they can only let a wrong candidate through (verification rejects it later),
never prune a right one. A reduction is `(label, full)`: over the whole extent of a label of the
target, or over a part of it (one for-loop iteration's chunk); a partial reduction is a
subexpression of a full one.

Expressions are interned: every distinct normal form gets a small integer id, so equality is `==`
on ids and the search can key dictionaries on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Red = tuple[int, bool]  # (label, full)
Term = tuple[float, tuple[Red, ...], tuple[int, ...]]  # coefficient, reductions, atom ids
NF = tuple[Term, ...]


def _round(c: float) -> float:
    # Coefficients from different tilings (1/(64·8) vs 1/512) must intern to the same form.
    return float(f"{c:.10g}")


def _normalise(terms: Iterable[Term]) -> NF:
    merged: dict[tuple[tuple[Red, ...], tuple[int, ...]], float] = {}
    for c, reds, atoms in terms:
        key = (tuple(sorted(reds)), tuple(sorted(atoms)))
        merged[key] = merged.get(key, 0.0) + c
    return tuple(
        (_round(c), reds, atoms) for (reds, atoms), c in sorted(merged.items()) if _round(c) != 0.0
    )


SHADOW = 1 << 20  # offset of a shadowed reduction label


def _shadow(reds: tuple[Red, ...], free: tuple[int, ...]) -> tuple[Red, ...]:
    return tuple((label + SHADOW, full) if label in free else (label, full) for label, full in reds)


@dataclass
class Algebra:
    """The interning tables and the operations on interned expressions (memoised)."""

    nfs: list[NF] = field(default_factory=list)
    _nf_ids: dict[NF, int] = field(default_factory=dict)
    atoms: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, name, arg nf or -1)
    _atom_ids: dict[tuple[str, str, int], int] = field(default_factory=dict)
    _memo: dict[tuple[object, ...], int] = field(default_factory=dict)
    _free: dict[int, frozenset[int]] = field(default_factory=dict)

    def intern(self, nf: NF) -> int:
        found = self._nf_ids.get(nf)
        if found is None:
            found = self._nf_ids[nf] = len(self.nfs)
            self.nfs.append(nf)
        return found

    def _atom(self, kind: str, name: str, arg: int = -1) -> int:
        key = (kind, name, arg)
        found = self._atom_ids.get(key)
        if found is None:
            found = self._atom_ids[key] = len(self.atoms)
            self.atoms.append(key)
        return found

    def var(self, name: str, labels: Iterable[int] = ()) -> int:
        """An input tensor whose dims carry `labels` (what it depends on)."""
        atom = self._atom("var", name)
        self._free[atom] = frozenset(labels)
        return self.intern(((1.0, (), (atom,)),))

    def free(self, atom: int) -> frozenset[int]:
        """The labels an atom depends on: an input's dims; a function's argument's free labels."""
        found = self._free.get(atom)
        if found is None:
            found = self._free[atom] = self.nf_free(self.atoms[atom][2])
        return found

    def nf_free(self, a: int) -> frozenset[int]:
        out: set[int] = set()
        for _, reds, atoms in self.nfs[a]:
            bound = {label for label, _ in reds}
            for t in atoms:
                out |= self.free(t) - bound
        return frozenset(out)

    def const(self, value: float) -> int:
        return self.intern(_normalise([(value, (), ())]))

    def fn(self, name: str, arg: int) -> int:
        return self.intern(((1.0, (), (self._atom("fn", name, arg),)),))

    def add(self, a: int, b: int) -> int:
        key = ("add", *sorted((a, b)))
        if key not in self._memo:
            self._memo[key] = self.intern(_normalise([*self.nfs[a], *self.nfs[b]]))
        return self._memo[key]

    def scale(self, a: int, factor: float) -> int:
        key = ("scale", a, _round(factor))
        if key not in self._memo:
            terms = [(c * factor, r, t) for c, r, t in self.nfs[a]]
            self._memo[key] = self.intern(_normalise(terms))
        return self._memo[key]

    def mul(
        self, a: int, b: int, free_a: tuple[int, ...] = (), free_b: tuple[int, ...] = ()
    ) -> int:
        """a · b elementwise; `free_*` are the labels of each operand's dims. A reduction of one
        operand over a label the other has as a dim is *shadowed* (x_k · Σ_j x_j is not Σ_k x_k²)."""
        (a, fa), (b, fb) = sorted(((a, tuple(sorted(free_a))), (b, tuple(sorted(free_b)))))
        key = ("mul", a, b, fa, fb)
        if key not in self._memo:
            terms = [
                (ca * cb, _shadow(ra, fb) + _shadow(rb, fa), ta + tb)
                for ca, ra, ta in self.nfs[a]
                for cb, rb, tb in self.nfs[b]
            ]
            self._memo[key] = self.intern(_normalise(terms))
        return self._memo[key]

    def reduce(self, a: int, label: int, full: bool) -> int:
        """Σ over (a part of) `label`."""
        key = ("reduce", a, label, full)
        if key not in self._memo:
            terms = [(c, (*r, (label, full)), t) for c, r, t in self.nfs[a]]
            self._memo[key] = self.intern(_normalise(terms))
        return self._memo[key]

    def complete(self, a: int, label: int) -> int:
        """Σ over the for-loop walking `label`: a partial reduction over it becomes full; a term
        without one gains a partial one (the iterations' chunks, added elementwise)."""
        key = ("complete", a, label)
        if key not in self._memo:
            terms: list[Term] = []
            for c, reds, atoms in self.nfs[a]:
                if (label, False) in reds:
                    i = reds.index((label, False))
                    reds = (*reds[:i], (label, True), *reds[i + 1 :])
                else:
                    reds = (*reds, (label, False))
                terms.append((c, reds, atoms))
            self._memo[key] = self.intern(_normalise(terms))
        return self._memo[key]

    # -------------------------------------------------------------------------------- queries

    def fn_args(self, a: int) -> list[int]:
        """The arguments of the opaque functions in `a`, recursively (each once)."""
        out: list[int] = []
        stack = [a]
        while stack:
            for _, _, atoms in self.nfs[stack.pop()]:
                for atom in atoms:
                    kind, _, arg = self.atoms[atom]
                    if kind == "fn" and arg not in out:
                        out.append(arg)
                        stack.append(arg)
        return out

    def fn_names(self, a: int) -> set[str]:
        return {
            self.atoms[t][1]
            for n in [a, *self.fn_args(a)]
            for _, _, ts in self.nfs[n]
            for t in ts
            if self.atoms[t][0] == "fn"
        }

    def constants(self, a: int) -> list[float]:
        """Coefficients of constant-only terms (ε of a norm, ...), in first-seen order."""
        out: list[float] = []
        for n in [a, *self.fn_args(a)]:
            for c, reds, atoms in self.nfs[n]:
                if not reds and not atoms and c not in out:
                    out.append(c)
        return out

    def show(self, a: int) -> str:
        """A readable rendering, for messages and tests."""
        parts = []
        for c, reds, atoms in self.nfs[a]:
            body = "·".join(self._show_atom(t) for t in atoms) or "1"
            for label, full in reds:
                body = f"Σ{label}{'' if full else '~'}({body})"
            parts.append(body if c == 1.0 else f"{c:g}·{body}")
        return " + ".join(parts) or "0"

    def _show_atom(self, atom: int) -> str:
        kind, name, arg = self.atoms[atom]
        return name if kind == "var" else f"{name}({self.show(arg)})"


def _reds_fit(small: Sequence[Red], big: Sequence[Red]) -> bool:
    """Each reduction of `small` matches a distinct one of `big` (partial fits full)."""
    pool = list(big)
    for red in sorted(small, key=lambda r: not r[1]):  # full ones first: they fit only full
        label, full = red
        for i, (bl, bf) in enumerate(pool):
            if bl == label and (bf or not full):
                del pool[i]
                break
        else:
            return False
    return True


def _atoms_left(small: Sequence[int], big: Sequence[int]) -> list[int] | None:
    """The atoms of `big` not in `small` (multisets), or None if `small` is not inside `big`."""
    pool = list(big)
    for a in small:
        if a not in pool:
            return None
        pool.remove(a)
    return pool


def term_fits(algebra: Algebra, small: Term, big: Term) -> bool:
    """`small` is a partial product / partial reduction of `big` (coefficients ignored): its
    atoms and reductions are among big's, and it reduces no label that a factor it leaves out
    still depends on (Σ_k x_k is not part of Σ_k x_k·w_k, though Σ_k x_k·w_k is part of
    r·Σ_k x_k·w_k when r does not depend on k)."""
    left = _atoms_left(small[2], big[2])
    if left is None or not _reds_fit(small[1], big[1]):
        return False
    reduced = {label for label, _ in small[1]}
    return not any(reduced & algebra.free(a) for a in left)


def _match_terms(
    algebra: Algebra, small: Sequence[Term], big: Sequence[Term], used: frozenset[int]
) -> bool:
    if not small:
        return True
    head, rest = small[0], small[1:]
    return any(
        i not in used
        and term_fits(algebra, head, t)
        and _match_terms(algebra, rest, big, used | {i})
        for i, t in enumerate(big)
    )


@dataclass
class SubexpressionOracle:
    """Decides whether an expression can be part of computing the targets (memoised)."""

    algebra: Algebra
    targets: Sequence[int]
    _closure: list[int] = field(default_factory=list)
    _memo: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for t in self.targets:
            for n in [t, *self.algebra.fn_args(t)]:
                if n not in self._closure:
                    self._closure.append(n)

    def __call__(self, candidate: int) -> bool:
        found = self._memo.get(candidate)
        if found is None:
            found = self._memo[candidate] = self._decide(candidate)
        return found

    def _decide(self, candidate: int) -> bool:
        terms = self.algebra.nfs[candidate]
        if not terms:
            return False  # zero never helps
        for n in self._closure:
            big = self.algebra.nfs[n]
            a = self.algebra
            if len(terms) == 1 and any(term_fits(a, terms[0], t) for t in big):
                return True
            if 1 < len(terms) <= len(big) and _match_terms(a, terms, big, frozenset()):
                return True
        return False
