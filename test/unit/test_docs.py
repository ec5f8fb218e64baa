"""The documentation keeps up with the code: every build switch the code reads is described, and
the README's local links lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ("backends", "python", "passes", "tools", "dialects", "interp")
DOCS = ("README.md", "docs/cuda-backend.md")


def switches_read_by_the_code() -> set[str]:
    """Every MK_CUDA_* / MK_PASS_* name that appears as a string literal in the package's code."""
    found: set[str] = set()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            found |= set(re.findall(r"[\"'](MK_(?:CUDA|PASS)_[A-Z0-9_]+)[\"']", path.read_text()))
    return found


def test_every_build_switch_is_documented() -> None:
    switches = switches_read_by_the_code()
    assert len(switches) > 40  # the scan found the switches module's names
    text = "\n".join((ROOT / doc).read_text() for doc in DOCS)
    missing = sorted(s for s in switches if not re.search(rf"\b{s}\b", text))
    assert not missing, f"switches described in neither {' nor '.join(DOCS)}: {missing}"


def test_local_links_lead_to_files() -> None:
    for doc in DOCS:
        path = ROOT / doc
        for target in re.findall(r"\]\(([^)#:]+)\)", path.read_text()):
            assert (path.parent / target).exists(), f"{doc} links to {target}, which is missing"
