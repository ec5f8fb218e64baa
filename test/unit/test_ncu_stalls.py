"""bench/ncu_stalls.py: warp-stall summary of an `ncu --page raw --csv` report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/ncu_stalls.py"

REPORT = """==PROF== Connected to process 1
"ID","Kernel Name","smsp__pcsamp_warps_issue_stalled_barrier","smsp__pcsamp_warps_issue_stalled_wait","smsp__inst_executed.sum","launch__grid_size"
"","","","","inst",""
"0","void megakernel(LaunchParams)","22,003","7,470","67,907,861","132"
"""


def _run(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    report = tmp_path / "ncu.csv"
    report.write_text(text)
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(report)], capture_output=True, text=True, check=False
    )


def test_stalls_are_listed_largest_first(tmp_path: Path) -> None:
    done = _run(tmp_path, REPORT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("void megakernel")
    barrier = next(i for i, line in enumerate(lines) if line.endswith("stalled_barrier"))
    wait = next(i for i, line in enumerate(lines) if line.endswith("stalled_wait"))
    assert barrier < wait and "22003.000" in lines[barrier]
    assert "smsp__inst_executed.sum = 67,907,861" in done.stdout
    assert "grid_size" not in done.stdout


def test_a_report_without_a_table_is_a_clear_error(tmp_path: Path) -> None:
    done = _run(tmp_path, "==ERROR== the profiler could not attach\n")
    assert done.returncode != 0
    assert "no ncu csv table" in done.stderr
    assert "Traceback" not in done.stderr
