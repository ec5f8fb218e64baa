"""Element loops of a task body merged where no barrier separates them: one loop, not several.

A decode task's epilogue is a handful of element loops (norm scale, silu·mul, residual, one
store per output), each a statement of its own: on the H200 every statement of a body costs
about 0.1–0.2 µs whatever it does (bench/RESULTS.md). A later loop over the same n whose reads
of earlier loops' tiles are all at its own element `e` (so barriers.py puts no barrier before
it) can run inside an earlier loop over that n: each thread still computes an element's
operands before the element, in the same thread. It moves up past the loops in between only
when it shares no tile with them. Only `MK_FOR_EACH_U32` loops the emitter wrote move; only
`resize` lines (a tile's logical size) and `alias` lines (a reshape's view) may lie between;
anything else ends the run. A view is the same elements in the same order, so the loops name
every tile by the tile it views (for this analysis and for barriers.py's); the view's line moves
above the loop its reader joins (a prefill attention's normalising loop and its store through
the output's reshape: one loop, whose output tile local_tiles.py then keeps out of memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mk.backends.cuda.barriers import ALIAS, ELEMENT_LOOP, PLACEHOLDER, RESIZE, Loop


@dataclass
class _Group:
    """A loop of the output, possibly grown by later loops."""

    loop: Loop
    movable: bool  # an MK_FOR_EACH_U32 loop others may join


def _names(loop: Loop) -> set[str]:
    return {t for t, _ in loop.reads}


def _element_loop(loop: Loop) -> bool:
    header = ELEMENT_LOOP.match(loop.text[0]) if loop.text else None
    return header is not None and int(header.group(1)) == loop.n and loop.text[-1] == "}"


def _independent(a: Loop, b: Loop) -> bool:
    """Neither reads or writes a tile the other writes."""
    wa, wb = set(a.writes), set(b.writes)
    return not (wa & wb or wa & _names(b) or wb & _names(a))


def _joinable(target: Loop, later: Loop) -> bool:
    """`later` may run inside `target`: same extent, and what it reads of target's tiles it
    reads at its own element."""
    if target.n != later.n:
        return False
    written = set(target.writes)
    return all(at == "e" for t, at in later.reads if t in written) and not (
        set(later.writes) & (written | _names(target))
    )


def _join(target: Loop, later: Loop) -> Loop:
    return Loop(
        target.n,
        target.reads + later.reads,
        target.writes + later.writes,
        (*target.text[:-1], *later.text[1:]),
    )


def _viewed(loop: Loop, views: dict[str, str]) -> Loop:
    """`loop` with every tile named by the tile it views."""
    reads = tuple((views.get(t, t), at) for t, at in loop.reads)
    return Loop(loop.n, reads, tuple(views.get(t, t) for t in loop.writes), loop.text)


def fuse_element_loops(lines: Sequence[str], loops: Sequence[Loop]) -> tuple[list[str], list[Loop]]:
    """`lines` and `loops` (placeholders as for place_barriers) with each movable loop merged
    into the latest earlier one it may join, and every loop's tiles named by what they view."""
    out: list[str] = []
    groups: list[_Group] = []
    run: list[int] = []  # groups since the last statement that ends a run, in order
    views: dict[str, str] = {}  # a view -> the tile it shares storage with
    for line in lines:
        if not line.startswith(PLACEHOLDER):
            if alias := ALIAS.match(line):
                views[alias.group(1)] = views.get(alias.group(2), alias.group(2))
            elif not RESIZE.match(line):
                run = []
            out.append(line)
            continue
        original = loops[int(line[len(PLACEHOLDER) :])]
        loop = _viewed(original, views)
        movable = _element_loop(loop)
        target = _target(groups, run, loop) if movable else None
        if target is not None:
            groups[target].loop = _join(groups[target].loop, loop)
            named = {t for t, _ in original.reads} | set(original.writes)
            _lines_first(out, f"{PLACEHOLDER}{target}", loop.writes, named)
            continue
        run.append(len(groups))
        groups.append(_Group(loop, movable))
        out.append(f"{PLACEHOLDER}{len(groups) - 1}")
    return out, [g.loop for g in groups]


def _lines_first(out: list[str], placeholder: str, tiles: Sequence[str], named: set[str]) -> None:
    """Moves the `resize` of each tile a joined loop writes, then the `alias` line of each view
    it names (in their order), above the loop it joined."""
    at = out.index(placeholder)
    later = range(at + 1, len(out))
    sizes = [i for i in later if RESIZE.match(out[i]) and out[i].split(".", 1)[0] in tiles]
    aliases = [i for i in later if (a := ALIAS.match(out[i])) and a.group(1) in named]
    moved = [out[i] for i in sizes] + [out[i] for i in aliases]
    for i in sorted(sizes + aliases, reverse=True):
        del out[i]
    out[at:at] = moved


def _target(groups: Sequence[_Group], run: Sequence[int], loop: Loop) -> int | None:
    """The latest group of the run that `loop` may join, moving up past only groups it shares
    no tile with."""
    for at in reversed(run):
        group = groups[at]
        if group.movable and _joinable(group.loop, loop):
            return at
        if not group.movable or not _independent(group.loop, loop):
            return None
    return None
