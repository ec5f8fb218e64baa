"""Turning what a user passes as a program (MLIR text, a path, or a ModuleOp) into a verified module."""

from __future__ import annotations

import os
from pathlib import Path

from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.func import FuncOp

from mk.diagnostics import MkError, parse_module, verify_located
from mk.dialects import make_context

Source = str | os.PathLike[str] | ModuleOp


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and text.strip().endswith(".mlir")


def is_blank(text: str) -> bool:
    """Whether MLIR text holds nothing but whitespace and `//` comments."""
    return all(not line.strip() or line.strip().startswith("//") for line in text.splitlines())


def load_module(source: Source) -> ModuleOp:
    """Parse (if needed) and verify a program; errors are MkError with file:line:col."""
    if isinstance(source, ModuleOp):
        module = source
    else:
        if isinstance(source, os.PathLike) or _looks_like_path(source):
            path = Path(source)
            try:
                text, name = path.read_text(), str(path)
            except OSError as e:
                raise MkError(f"cannot read program: {e.strerror}: {path}") from None
        else:
            text, name = str(source), "<source>"
        if is_blank(text):  # xDSL's parser says "Could not parse entire input!" of nothing
            raise MkError(f"the program is empty: {name}")
        module = parse_module(make_context(), text, name)
    verify_located(module)
    return module


def entry_function(module: ModuleOp, name: str | None = None) -> FuncOp:
    """The named function, else the first public one (DESIGN.md's entry rule)."""
    funcs = [op for op in module.ops if isinstance(op, FuncOp)]
    if name is not None:
        for f in funcs:
            if f.sym_name.data == name:
                return f
        raise MkError(f"no function named '{name}' in the program")
    for f in funcs:
        if f.sym_visibility is None or f.sym_visibility.data == "public":
            if not f.is_declaration:
                return f
    raise MkError("the program has no public function to run")
