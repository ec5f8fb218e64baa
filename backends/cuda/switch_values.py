"""How a build switch's value is read from the environment and checked (MK_CUDA_*)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from mk.diagnostics import MkError


def byte_count(name: str, default: int) -> int:
    """A whole number of bytes (>= 0), or `default` when `name` is unset or empty."""
    text = os.environ.get(name, "")
    if not text:
        return default
    if not text.isdigit():
        raise MkError(f"{name} must be a byte count, got {text!r}")
    return int(text)


def count(name: str, default: int, low: int, high: int, unit: str) -> int:
    """A number of `unit` in [low, high], or `default` when `name` is unset or empty."""
    text = os.environ.get(name, "")
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise MkError(f"{name} must be a number of {unit} from {low} to {high}, got {text!r}")
    return int(text)


def choice(name: str, choices: Sequence[str]) -> str:
    """One of `choices` (the first when `name` is unset or empty)."""
    text = os.environ.get(name, "") or choices[0]
    if text not in choices:
        raise MkError(f"{name} must be one of {', '.join(choices)}, got {text!r}")
    return text


def flag(name: str, default: bool = False) -> bool:
    """0 or 1, or `default` when `name` is unset or empty."""
    text = os.environ.get(name, "") or ("1" if default else "0")
    if text not in ("0", "1"):
        raise MkError(f"{name} must be 0 or 1, got {text!r}")
    return text == "1"
