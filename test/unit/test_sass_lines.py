"""bench/sass_lines.py: an address in the megakernel's code mapped to its function and source line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bench_scripts import load, run_main

from mk.backends.cuda import build

ROOT = Path(__file__).resolve().parents[2]

needs_tools = pytest.mark.skipif(
    build.nvcc() is None or shutil.which("readelf") is None, reason="needs nvcc and readelf"
)


@needs_tools
def test_a_bodys_first_instruction_is_its_own_line(tmp_path: Path) -> None:
    """Every task body starts at a row of the line table in the emitted source, inside its own
    definition (its signature, or its first statement where that is a call); the rows are in
    address order and inside the kernel's code."""
    sass = load("sass_lines")
    code_size = load("code_size")
    source = code_size.emit_source((ROOT / "examples/rmsnorm_linear.mlir").read_text(), {})
    cubin = code_size.build_cubin(source, tmp_path, ("-lineinfo",))
    rows = sass.line_table(cubin)
    assert rows and [r.address for r in rows] == sorted(r.address for r in rows)
    kernel = max(n for _, n, name in code_size.functions(cubin) if "megakernel" in name)
    assert all(0 <= r.address < kernel for r in rows)
    bodies = [
        (start, name) for start, _, name in code_size.functions(cubin) if name.startswith("task_")
    ]
    assert bodies
    lines = source.splitlines()
    for start, name in bodies:
        found = sass.line_at(rows, start)
        assert found is not None and Path(found.path).name == "mk.cu"
        defined = max(
            i for i in range(found.line) if "__device__" in lines[i] and "task_" in lines[i]
        )
        assert f"{name}(" in lines[defined], (name, lines[found.line - 1])
        assert sass.function_at(cubin, start) == name
    assert sass.function_at(cubin, 0).startswith("megakernel")
    assert sass.line_at(rows, -1) is None


@needs_tools
def test_the_command_line_prints_a_line_per_offset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_main("sass_lines", ["--example", "gated_mlp", "0x0", "0x40"], monkeypatch, capsys)
    assert len(out) == 2 and out[0].startswith("0x0  megakernel") and out[1].startswith("0x40  ")
    assert ".cuh:" in out[0] or "mk.cu:" in out[0]


@needs_tools
def test_lines_sum_a_functions_code_by_source_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--lines: the bodies' (or the dispatcher's) bytes of code per source line, largest first,
    never more than the functions hold."""
    for part in ("task_", "dispatcher"):
        args = ["--example", "gated_mlp", "--lines", part, "--top", "5"]
        out = run_main("sass_lines", args, monkeypatch, capsys)
        head, rows = out[0], [line.split() for line in out[1:]]
        assert head.startswith(f"{part}: ") and len(rows) == 5, out
        sizes = [int(row[0]) for row in rows]
        assert sizes == sorted(sizes, reverse=True) and sizes[-1] > 0
        assert all(":" in row[1] for row in rows)
        assert sum(sizes) <= float(head.split()[1]) * 1024 + 1


def test_bad_arguments_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    sass = load("sass_lines")
    for args, message in (
        (["--example", "gated_mlp", "xyz"], "offsets are hex numbers"),
        (["--example", "no_such", "0x0"], "no example 'no_such'"),
        (["--example", "gated_mlp"], "one of the two"),
        (["--example", "gated_mlp", "0x0", "--lines", "task_"], "one of the two"),
    ):
        monkeypatch.setattr("sys.argv", ["sass_lines.py", *args])
        monkeypatch.setattr(shutil, "which", lambda _: "/usr/bin/readelf")
        with pytest.raises(SystemExit, match=message):
            sass.main()
