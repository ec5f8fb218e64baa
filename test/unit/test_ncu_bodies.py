"""bench/ncu_bodies.py: an ncu per-instruction report split by task body."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from bench_scripts import load

ROOT = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    return load("ncu_bodies")


REPORT = """"Kernel Name","void mk::megakernel<Dispatch>(mk::LaunchParams)",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_barrier","stall_lg","stall_lg (Not Issued)"
"0x1000","  BAR.SYNC 0x0","10","4","9","0","0"
"0x1010","  CALL.REL.NOINC 0x20","0","4","0","0","0"
"0x1020","  STL.64 [R1], RZ","6","8","0","5","5"
"0x1030","  LDG.E.128 R4, [R2]","2","8","0","1","1"
"0x1040","  RET.REL.NODEC R4","1","8","1","0","0"
"""


def test_samples_are_split_by_body(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb = _module()
    report = tmp_path / "sass.csv"
    report.write_text(REPORT)
    spans = [(0x0, 0x50, "_ZN2mk10megakernel"), (0x20, 0x30, "task_3_k3_m")]
    monkeypatch.setattr(nb, "functions", lambda cubin: spans)
    found = nb.bodies(report, tmp_path / "k.cubin")
    assert set(found) == {"dispatcher", "task_3_k3_m"}
    m = found["task_3_k3_m"]
    assert (m.samples, m.executed) == (9.0, 24.0)
    assert m.stalls["lg"] == 6.0 and m.stalls["barrier"] == 1.0  # "Not Issued" columns skipped
    assert max(m.hot)[2] == "STL.64 [R1], RZ"
    assert found["dispatcher"].samples == 10.0


def test_a_report_without_instructions_is_a_clear_error(tmp_path: Path) -> None:
    nb = _module()
    report = tmp_path / "raw.csv"
    report.write_text('"ID","Kernel Name"\n"0","megakernel"\n')
    with pytest.raises(SystemExit, match="no per-instruction table"):
        nb.bodies(report, tmp_path / "k.cubin")


def test_another_modules_cubin_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A library's second cubin holds none of the launch's bodies: every sample would land on
    the dispatcher, so the table is refused rather than printed."""
    nb = _module()
    report = tmp_path / "sass.csv"
    report.write_text(REPORT)
    monkeypatch.setattr(nb, "functions", lambda cubin: [(0x0, 0x2000, "_ZN2mk10megakernel")])
    monkeypatch.setattr("sys.argv", ["ncu_bodies.py", str(report), str(tmp_path / "k.cubin")])
    assert nb.main() == 1
    assert "not this launch's cubin" in capsys.readouterr().out
