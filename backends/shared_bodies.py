"""Task bodies that differ only in the buffers they touch share one emitted function.

The layers of a model lower to grids whose bodies are the same code on other buffers. Each
body's `buffers[i]` become `buffers[bi[k]]` (k numbering the distinct buffers in order of first
use; the CUDA backend reads `bp[k]`, a table its dispatcher resolved); texts equal up to the value names in tile variables then share a function (the first
grid's text), and each grid passes its own slice of one table of
buffer indices. This keeps the emitted source, and the compiler's time on it, proportional to
the distinct layer shapes instead of the layer count.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

_BUFFER = re.compile(r"\bbuffers\[(\d+)\]")
# Tile variables are `t<k>_<value name>`; k alone is unique in a body, the name is for readers.
_TILE = re.compile(r"\bt(\d+)_\w+")


def parametrize_buffers(
    body: Sequence[str], slot_format: str = "buffers[bi[{k}]]"
) -> tuple[list[str], list[int]]:
    """The body with each buffer read through its slot (`slot_format` of the slot number k),
    and the buffer indices it had, in slot order."""
    slots: dict[int, int] = {}

    def slot(match: re.Match[str]) -> str:
        k = slots.setdefault(int(match.group(1)), len(slots))
        return slot_format.format(k=k)

    return [_BUFFER.sub(slot, line) for line in body], list(slots)


def rebind(body: Sequence[str], theirs: Sequence[int], mine: Sequence[int]) -> list[str]:
    """`body`, emitted for a grid whose buffers by slot are `theirs`, on the buffers `mine` of a
    grid that shares its function."""
    to = dict(zip(theirs, mine, strict=True))
    return [_BUFFER.sub(lambda m: f"buffers[{to[int(m.group(1))]}]", line) for line in body]


@dataclass
class SharedFunction:
    """One emitted function and the grids (by name) that run it."""

    name: str
    body: list[str]
    slots: int = 0  # distinct buffers the body touches
    grids: list[str] = field(default_factory=list)

    def comment(self) -> str:
        more = f" and {len(self.grids) - 1} more grid(s) on other buffers" if self.grids[1:] else ""
        return f"// task.grid @{self.grids[0]}{more}"


@dataclass
class SharedBodies:
    """The distinct bodies of a program's grids, and per grid its function and table slice."""

    functions: list[SharedFunction] = field(default_factory=list)
    calls: list[tuple[str, SharedFunction, int]] = field(default_factory=list)  # grid, fn, offset
    table: list[int] = field(default_factory=list)
    slot_format: str = "buffers[bi[{k}]]"
    _by_body: dict[str, SharedFunction] = field(default_factory=dict)

    def add(self, name: str, grid: str, body: Sequence[str]) -> SharedFunction:
        """Register the next grid's body; returns the function that runs it."""
        lines, indices = parametrize_buffers(body, self.slot_format)
        key = _TILE.sub(r"t\1", "\n".join(lines))
        fn = self._by_body.get(key)
        if fn is None:
            fn = self._by_body[key] = SharedFunction(name, lines, len(indices))
            self.functions.append(fn)
        fn.grids.append(grid)
        self.calls.append((grid, fn, len(self.table)))
        self.table += indices or [0]
        return fn

    def buffers(self, call: int) -> list[int]:
        """The buffer indices, by slot, of the `call`-th grid added."""
        _, fn, offset = self.calls[call]
        return self.table[offset : offset + fn.slots]

    def table_decl(self, qualifier: str) -> str:
        """The buffer-index table as a C array definition (`qualifier` e.g. `static const`)."""
        values = ", ".join(str(v) for v in self.table)
        return f"{qualifier} int32_t kBufferIndex[{len(self.table)}] = {{{values}}};\n"
