"""Search results cached by the canonical hash of the searched function: in memory, and on disk
under `<cache root>/search/` (the root mk.compile uses for its builds)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from xdsl.dialects.func import FuncOp

from mk.passes.search.blockgraph import digest

SEARCH_VERSION = 1  # bump when the search or its IR changes what a key should give

_MEMORY: dict[str, tuple[str, dict[str, object]]] = {}
STATS = {"memory_hits": 0, "disk_hits": 0, "misses": 0}


def canonical_key(func: FuncOp, options: object) -> str:
    """128-bit hash of the function with names erased (so renaming values or the function does
    not miss), the search options and the search version."""
    clone = func.clone()
    clone.sym_name = type(clone.sym_name)("f")
    for op in clone.walk():
        for r in op.results:
            r.name_hint = None
        for region in op.regions:
            for block in region.blocks:
                for a in block.args:
                    a.name_hint = None
    return digest(SEARCH_VERSION, str(clone), repr(options)).hex()


def _root(cache_dir: str) -> Path:
    from mk.compiler import cache_root

    return cache_root(cache_dir or None) / "search"


def load(key: str, cache_dir: str, use_disk: bool) -> tuple[str, dict[str, object]] | None:
    """(module text or "" when the rules won, summary) of a cached search."""
    if key in _MEMORY:
        STATS["memory_hits"] += 1
        return _MEMORY[key]
    path = _root(cache_dir) / f"{key}.json"
    if use_disk and path.exists():
        try:
            entry = json.loads(path.read_text())
            _MEMORY[key] = (entry["module"], entry["summary"])
        except (OSError, ValueError, KeyError):
            return None  # a damaged entry is a miss; the search rewrites it
        STATS["disk_hits"] += 1
        return _MEMORY[key]
    STATS["misses"] += 1
    return None


def store(key: str, text: str, summary: dict[str, object], cache_dir: str, use_disk: bool) -> None:
    """Remember a search: the chosen module's text ("" when the rules won) and its summary."""
    _MEMORY[key] = (text, summary)
    if not use_disk:
        return
    root = _root(cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=root)
        with os.fdopen(fd, "w") as f:
            json.dump({"module": text, "summary": summary}, f, sort_keys=True)
        os.replace(tmp, root / f"{key}.json")  # readers never see half an entry
    except OSError:
        pass  # a read-only cache only costs the next search


def clear_memory() -> None:
    _MEMORY.clear()
