"""bench.py's rows against an earlier run's (its --out bench.json): what got slower, on which card.

A regression of a row that no session looks at again can go unnoticed for many sessions (the
batch-8 tensor-core rows lost 10-17 % between two H200 tables sixteen sessions apart), and a
table from another card cannot be compared by eye. So bench.py --baseline FILE prints, after its
table, each row's change against FILE: in milliseconds when FILE was measured on the same card,
else as the ratio to each run's own floor (what the copy bandwidth of the card does not explain).
bench/baselines/ keeps the last full table of each card.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# A row this much slower than its baseline is marked: one build's timings have differed by
# up to ~1 % between calls (bench/RESULTS.md, session 56), so 3 % is past the noise.
SLOWER = 0.03


def read(path: Path) -> dict[str, Any]:
    """A bench.json: {"device": ..., "bandwidth": ..., "rows": [...]} ("device" may be missing in
    files written before it was recorded)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: not a bench.py --out bench.json (no rows)")
    return data


def _mk_ms(row: Mapping[str, Any]) -> float | None:
    value = row.get("mk_ms")
    return float(value) if isinstance(value, int | float) else None


def changes(
    rows: Sequence[Mapping[str, Any]], device: str, baseline: Mapping[str, Any]
) -> list[tuple[str, float, float, float]]:
    """(workload, before, now, relative change) of each row that both runs timed mk on: ms on
    the same card, mk / floor on another."""
    same = baseline.get("device") == device
    before = {str(r["workload"]): r for r in baseline["rows"]}
    out = []
    for row in rows:
        old = before.get(str(row["workload"]))
        now_ms, old_ms = _mk_ms(row), None if old is None else _mk_ms(old)
        if old is None or now_ms is None or old_ms is None:
            continue
        now = now_ms if same else now_ms / float(row["floor_ms"])
        was = old_ms if same else old_ms / float(old["floor_ms"])
        out.append((str(row["workload"]), was, now, now / was - 1.0))
    return out


def report(rows: Sequence[Mapping[str, Any]], device: str, baseline: Mapping[str, Any]) -> str:
    """The change table bench.py prints after its own."""
    same = baseline.get("device") == device
    unit = "mk ms" if same else "mk / floor"
    where = (
        f"the same card ({device})"
        if same
        else f"another card ({baseline.get('device', 'not recorded')}; this one {device}): "
        "ratios to each run's floor"
    )
    lines = [
        f"Against the baseline, {where}:",
        "",
        f"| workload | baseline {unit} | {unit} | change |",
        "|---|---:|---:|---:|",
    ]
    found = changes(rows, device, baseline)
    for name, was, now, change in found:
        mark = " **slower**" if change > SLOWER else ""
        lines.append(f"| {name} | {was:.4f} | {now:.4f} | {change * 100:+.1f} %{mark} |")
    if not found:
        lines.append("| (no workload timed in both) | | | |")
    return "\n".join(lines) + "\n"
