"""bench/trace_svg.py: a megakernel trace drawn as SVG (one row per SM, boxes by grid kind)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest
from bench_scripts import load

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/trace_svg.py"


def _module() -> ModuleType:
    return load("trace_svg")


def _event(task: int, grid: str, sm: int, ts: float, dur: float, it: int = 0) -> dict[str, object]:
    return {"name": f"task {task} (@{grid}[0])", "ph": "X", "pid": 0, "tid": sm, "ts": ts,
            "dur": dur, "args": {"iteration": it}}  # fmt: skip


def test_kinds_group_the_layers() -> None:
    kind_of = _module().kind_of
    assert kind_of("task 53 (@k12_l3_q[5])") == "q"
    assert kind_of("task 0 (@k30_logits[0])") == "logits"


def test_picture_of_the_last_step(tmp_path: Path) -> None:
    events = [
        _event(0, "k1_l0_q", 0, 0.0, 10.0, 0),
        _event(1, "k1_l0_q", 1, 0.0, 10.0, 1),
        _event(2, "k2_l0_att", 1, 12.0, 4.0, 1),
        _event(3, "k9_l1_q", 0, 20.0, 6.0, 1),
    ]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    out = tmp_path / "t.svg"
    subprocess.run([sys.executable, str(SCRIPT), str(trace), str(out)], check=True)
    svg = ET.parse(out).getroot()  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    boxes = [r for r in svg.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    assert len(boxes) == 3  # the last step only
    titles = [r.find(f"{ns}title").text for r in boxes]  # type: ignore[union-attr]
    assert any("@k2_l0_att" in (t or "") for t in titles)
    legend = [t.text for t in svg.iter(f"{ns}text")]
    assert "q 80%" in legend and "att 20%" in legend  # SM time in step 1: q 16 µs, att 4 µs


def test_empty_trace_is_an_error() -> None:
    with pytest.raises(ValueError, match="no task events"):
        _module().render([], "x")
