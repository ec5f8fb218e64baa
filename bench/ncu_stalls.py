"""Summarise an `ncu --page raw --csv` report: warp stall reasons, largest first.

Usage: python bench/ncu_stalls.py REPORT.csv
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path


def rows(path: Path) -> list[dict[str, str]]:
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu csv table (see the .err log)")
    table = list(csv.DictReader(lines[start:]))
    return [r for r in table[1:] if r.get("ID")]  # row 0 holds the units


def _number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def main() -> int:
    for row in rows(Path(sys.argv[1])):
        print(row.get("Kernel Name", "")[:80])
        stalls = {
            k: float(v.replace(",", "")) for k, v in row.items() if "stalled" in k and _number(v)
        }
        for key, value in sorted(stalls.items(), key=lambda kv: -kv[1])[:30]:
            print(f"  {value:12.3f}  {key}")
        for key in sorted(row):
            if key.startswith(
                ("smsp__inst_executed.sum", "sm__cycles_elapsed.avg", "smsp__warps_launched")
            ):
                print(f"  {key} = {row[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
