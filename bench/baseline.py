"""bench.py's rows against an earlier run's (its --out bench.json): what got slower, on which card.

A regression of a row that no session looks at again can go unnoticed for many sessions (the
batch-8 tensor-core rows lost 10-17 % between two H200 tables sixteen sessions apart), and a
table from another card cannot be compared by eye. So bench.py --baseline FILE prints, after its
table, each row's change against FILE: in milliseconds when FILE was measured on the same card,
else as the ratio to each run's own floor (what the copy bandwidth of the card does not explain).
bench/baselines/ keeps the last full table of each card, of bench.py's workloads and of the models.

The models' rows come from mk-generate --bench --bench-json FILE (one JSON line a run):
    python bench/baseline.py FILE bench/baselines/models-h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# A row this much slower than its baseline is marked: one build's timings have differed by
# up to ~1 % between calls (bench/RESULTS.md, session 56), so 3 % is past the noise.
SLOWER = 0.03


def read(path: Path) -> dict[str, Any]:
    """A bench.json: {"device": ..., "bandwidth": ..., "rows": [...]} ("device" may be missing in
    files written before it was recorded), or mk-generate's --bench-json lines (a row each, with
    its device), read as one table."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if not (isinstance(data, dict) and isinstance(data.get("rows"), list)):
        data = _json_lines(path, text)
    if data is None:
        raise ValueError(
            f"{path}: no rows (a bench.py bench.json or mk-generate --bench-json lines)"
        )
    return data


def _json_lines(path: Path, text: str) -> dict[str, Any] | None:
    """mk-generate's rows, one JSON object a line, as a table of their one device."""
    try:
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: neither a bench.json nor JSON lines ({e})") from None
    if not lines or not all(isinstance(r, dict) and "workload" in r for r in lines):
        return None
    devices = {str(r.get("device")) for r in lines}
    if len(devices) > 1:
        raise ValueError(f"{path}: rows of {len(devices)} devices, one table needs one")
    return {"device": devices.pop(), "rows": lines}


def _mk_ms(row: Mapping[str, Any]) -> float | None:
    value = row.get("mk_ms")
    return float(value) if isinstance(value, int | float) else None


def changes(
    rows: Sequence[Mapping[str, Any]], device: str, baseline: Mapping[str, Any]
) -> list[tuple[str, float, float, float]]:
    """(workload, before, now, relative change) of each row that both runs timed mk on: ms on
    the same card, mk / floor on another."""
    same = baseline.get("device") == device

    def value(row: Mapping[str, Any]) -> float | None:
        """mk's ms on the same card, its ratio to the run's floor on another (None: not timed,
        or no floor to divide by)."""
        ms, floor = _mk_ms(row), row.get("floor_ms")
        if ms is None or same:
            return ms
        return ms / float(floor) if floor else None

    before = {str(r["workload"]): r for r in baseline["rows"]}
    out = []
    for row in rows:
        old = before.get(str(row["workload"]))
        now, was = value(row), None if old is None else value(old)
        if now is not None and was is not None:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("now", type=Path, help="bench.json or mk-generate --bench-json lines")
    parser.add_argument("baseline", type=Path, help="the table to compare with")
    args = parser.parse_args(argv)
    now, before = read(args.now), read(args.baseline)
    print(report(now["rows"], str(now.get("device")), before), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
