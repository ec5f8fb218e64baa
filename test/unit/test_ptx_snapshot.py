"""bench/ptx_snapshot.py: the default build's PTX saved, then compared against a later build."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import load

from mk.backends.cuda import build


@pytest.mark.skipif(build.nvcc() is None, reason="nvcc is not on PATH")
def test_a_snapshot_compares_equal_and_names_a_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = load("ptx_snapshot")
    only = ["--only", "rmsnorm_linear"]
    assert snap.main(["save", str(tmp_path), *only]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"rmsnorm_linear.cu", "rmsnorm_linear.ptx"}
    assert snap.main(["compare", str(tmp_path), *only]) == 0
    assert "rmsnorm_linear: same" in capsys.readouterr().out
    ptx = tmp_path / "rmsnorm_linear.ptx"
    text = ptx.read_text()
    assert "ret;" in text
    ptx.write_text(text.replace("ret;", "exit;", 1))
    assert snap.main(["compare", str(tmp_path), *only]) == 1
    assert "rmsnorm_linear: PTX differs" in capsys.readouterr().out


def test_names_registers_and_labels_do_not_count() -> None:
    snap = load("ptx_snapshot")
    a = "call _ZN2mk3gpu4stepILi1ELi0EEEvv;\n\tadd.s32 %r12, %r3, 1;\n@%p4 bra $L__BB0_7;"
    b = "call _ZN2mk3gpu4stepILi1EEEvv;\n\tadd.s32 %r14, %r5, 1;\n@%p9 bra $L__BB0_9;"
    assert snap.normalised(a) == snap.normalised(b)
    assert snap.normalised(a) != snap.normalised(a.replace("add.s32", "sub.s32"))


def test_an_unknown_program_is_named() -> None:
    snap = load("ptx_snapshot")
    with pytest.raises(SystemExit, match="no program 'nope'; there are .*rmsnorm_linear"):
        snap.programs(["nope"])
