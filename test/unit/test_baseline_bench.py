"""bench/baseline.py: bench.py's rows against an earlier run's, on the same card and on another."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from bench_scripts import ROOT, load

baseline = load("baseline")


def _row(name: str, mk_ms: float | None, floor_ms: float) -> dict[str, object]:
    return {"workload": name, "floor_ms": floor_ms, "mk_ms": mk_ms}


BEFORE = {
    "device": "GPU A",
    "rows": [
        _row("gated B8", 0.1122, 0.0853),
        _row("rms B1", 0.0200, 0.0122),
        _row("gone", 1.0, 1.0),
    ],
}


def test_same_card_compares_milliseconds_and_marks_what_got_slower() -> None:
    rows = [_row("gated B8", 0.1309, 0.0853), _row("rms B1", 0.0198, 0.0122), _row("new", 1.0, 1.0)]
    found = baseline.changes(rows, "GPU A", BEFORE)
    assert [(n, was, now) for n, was, now, _ in found] == [
        ("gated B8", 0.1122, 0.1309),
        ("rms B1", 0.0200, 0.0198),
    ]
    text = baseline.report(rows, "GPU A", BEFORE)
    assert "the same card (GPU A)" in text
    assert "| gated B8 | 0.1122 | 0.1309 | +16.7 % **slower** |" in text
    assert "| rms B1 | 0.0200 | 0.0198 | -1.0 % |" in text  # faster: not marked
    assert "new" not in text and "gone" not in text


def test_another_card_compares_ratios_to_each_floor() -> None:
    """A card with more bandwidth has lower milliseconds; only the ratio to its floor compares."""
    rows = [_row("gated B8", 0.1122 * 1.39, 0.0853 * 1.39)]  # same ratio on a slower card
    (name, was, now, change) = baseline.changes(rows, "GPU B", BEFORE)[0]
    assert name == "gated B8" and was == pytest.approx(now) and abs(change) < 1e-9
    text = baseline.report(rows, "GPU B", BEFORE)
    assert "another card (GPU A; this one GPU B)" in text and "**slower**" not in text


def test_rows_mk_did_not_run_are_left_out() -> None:
    rows = [_row("gated B8", None, 0.0853)]
    assert baseline.changes(rows, "GPU A", BEFORE) == []
    assert "(no workload timed in both)" in baseline.report(rows, "GPU A", BEFORE)


def test_the_kept_baselines_read_and_name_their_card(tmp_path: Path) -> None:
    for card in ("h100", "h200"):
        data = baseline.read(ROOT / "bench" / "baselines" / f"{card}.json")
        assert card.upper() in data["device"].upper() and len(data["rows"]) == 7
    for card in ("h100", "h200"):
        models = baseline.read(ROOT / "bench" / "baselines" / f"models-{card}.json")
        assert card.upper() in models["device"].upper() and len(models["rows"]) == 6
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"bandwidth": 1.0}))
    with pytest.raises(ValueError, match="no rows"):
        baseline.read(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="neither a bench.json nor JSON lines"):
        baseline.read(bad)


def test_mk_generate_rows_compare_against_an_earlier_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """mk-generate --bench --bench-json appends a row named by what sets its time (build
    switches included); two runs' files compare on the same device, and a row of another setup
    is not compared."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    from mk.tools.mk_generate import main

    for name in [k for k in os.environ if k.startswith("MK_CUDA_")]:
        monkeypatch.delenv(name)

    argv = ["--model", "tiny", "--steps", "2", "--target", "cpu", "--bench", "--runs", "3"]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    before, now = tmp_path / "before.jsonl", tmp_path / "now.jsonl"
    assert main([*argv, "--bench-json", str(before)]) == 0
    assert main([*argv, "--bench-json", str(now)]) == 0
    assert main([*argv, "--batch", "2", "--bench-json", str(now)]) == 0
    monkeypatch.setenv("MK_CUDA_LOADS", "8")
    assert main([*argv, "--bench-json", str(now)]) == 0
    rows = [json.loads(line) for line in now.read_text().splitlines()]
    assert [r["workload"] for r in rows] == [
        "tiny B1 steps 2 context 3 prompt 1",
        "tiny B2 steps 2 context 3 prompt 1",
        "tiny B1 steps 2 context 3 prompt 1 MK_CUDA_LOADS=8",
    ]
    assert rows[0]["device"] == "cpu" and rows[0]["mk_ms"] > 0 and rows[0]["floor_ms"] is None
    capsys.readouterr()
    assert baseline.main([str(now), str(before)]) == 0
    out = capsys.readouterr().out
    assert "the same card (cpu)" in out and "| tiny B1 steps 2 context 3 prompt 1 |" in out
    assert "tiny B2" not in out and "LOADS" not in out  # not in the earlier run
