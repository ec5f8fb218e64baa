"""Tiles written and read within one element loop become locals of the loop: no memory at all.

After fuse_loops.py a tile is often made and consumed in one `MK_FOR_EACH_U32` loop, each
element read back by the thread that wrote it (a decode task's q rounded then stored, a prefill
attention's normalised output stored through its reshape). Kept as a tile, every element goes to
the arena and back, and a large one takes the arena's shared memory from others or lands in
global scratch (the prefill attention's 64 KB f32 output: written and reloaded through the L2).
A tile that nothing outside its loop names, save its declaration, sizes and views, and that the
loop writes once at `e` before reading it only at `e`, becomes one local per element; its
declaration, sizes and views go. On the H200 qwen3-0.6b's prefill took 11.07 against 11.37 ms
without (bench/RESULTS.md, session 51).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mk.backends.cuda.barriers import ALIAS, ELEMENT_LOOP, PLACEHOLDER, RESIZE, Loop

_DECL = re.compile(r"^(?:mk::gpu::Tile<(\w+)> (\w+)\(|std::vector<(\w+)> (\w+);$)")


def _declared(decl: re.Match[str]) -> tuple[str, str]:
    """The name and element type of a tile's declaration (the CUDA form or the CPU one)."""
    if decl.group(2) is not None:
        return decl.group(2), decl.group(1)
    return decl.group(4), decl.group(3)


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def _root(tile: str, views: dict[str, str]) -> str:
    while tile in views:
        tile = views[tile]
    return tile


def _family(tile: str, views: dict[str, str]) -> set[str]:
    """Every name of the storage `tile` names: what it views, and that tile's other views."""
    root = _root(tile, views)
    return {root} | {v for v in views if _root(v, views) == root}


def _bookkeeping(line: str, names: set[str]) -> bool:
    """A declaration, size or view line of one of `names`."""
    decl, alias = _DECL.match(line), ALIAS.match(line)
    if decl:
        return _declared(decl)[0] in names
    if alias:
        return alias.group(1) in names
    size = RESIZE.match(line)
    return size is not None and size.group(1) in names


def _localised(text: Sequence[str], tile: str, names: set[str], ctype: str) -> list[str] | None:
    """The loop's statements with `tile` as a local, or None where it cannot be one."""
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b(\[e\])?")
    local = f"{tile}_e"  # still `t<k>_...`: shared_bodies.py matches bodies up to those names
    out: list[str] = []
    written = False
    for line in text[1:-1]:
        hits = list(pattern.finditer(line))
        if not hits:
            out.append(line)
            continue
        write = re.match(r"^(\s*)(\w+)\[e\] = (.*);$", line)
        if write and write.group(2) in names and len(hits) == 1:
            if written:
                return None
            written = True
            out.append(
                f"{write.group(1)}const {ctype} {local} = static_cast<{ctype}>({write.group(3)});"
            )
            continue
        if not written or any(h.group(2) is None for h in hits):
            return None  # read before its write, or not at `e`
        out.append(pattern.sub(local, line))
    return [text[0], *out, text[-1]] if written else None


def localise_tiles(lines: Sequence[str], loops: Sequence[Loop]) -> tuple[list[str], list[Loop]]:
    """`lines` and `loops` (placeholders as for place_barriers, tiles named by what they view,
    as fuse_element_loops leaves them) with each tile that only one element loop uses made a
    local of that loop."""
    types = {_declared(m)[0]: _declared(m)[1] for line in lines if (m := _DECL.match(line))}
    views = {a.group(1): a.group(2) for line in lines if (a := ALIAS.match(line))}
    loops = list(loops)
    gone: set[str] = set()
    for index, loop in enumerate(loops):
        if not loop.text or not ELEMENT_LOOP.match(loop.text[0]):
            continue
        for tile in dict.fromkeys(loop.writes):
            names = _family(tile, views)
            if tile not in types or not _only_here(lines, loops, index, names):
                continue
            text = _localised(loop.text, tile, names, types[tile])
            if text is None:
                continue
            reads = tuple((t, at) for t, at in loop.reads if t not in names)
            loop = Loop(loop.n, reads, tuple(t for t in loop.writes if t not in names), tuple(text))
            loops[index] = loop
            gone |= names
    return [line for line in lines if not _bookkeeping(line, gone)], loops


def _only_here(lines: Sequence[str], loops: Sequence[Loop], index: int, names: set[str]) -> bool:
    """No line but the tiles' bookkeeping, and no other loop, names any of `names`."""
    for line in lines:
        if line.startswith(PLACEHOLDER):
            other = int(line[len(PLACEHOLDER) :])
            if other != index and any(names & _words(t) for t in loops[other].text):
                return False
        elif names & _words(line) and not _bookkeeping(line, names):
            return False
    return True
