"""mk-opt in-process: located errors, exit codes, no tracebacks."""

from pathlib import Path

import pytest

from mk.tools.mk_opt import main


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_valid_program_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ok.mlir"
    f.write_text(
        "func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {\n  func.return %a : tensor<2xf32>\n}\n"
    )
    code, out, err = _run([str(f)], capsys)
    assert code == 0 and err == ""
    assert "func.return %a : tensor<2xf32>" in out


def test_verify_error_is_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.mlir"
    f.write_text(
        "func.func @f(%a: tensor<2xf32>) -> tensor<3xf32> {\n  func.return %a : tensor<2xf32>\n}\n"
    )
    code, out, err = _run([str(f)], capsys)
    assert code == 1
    assert err.startswith(f"{f}:2:3: error: 'func.return'")
    assert "Traceback" not in err


def test_split_input_keeps_line_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "split.mlir"
    ok = "func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {\n  func.return %a : tensor<2xf32>\n}\n"
    bad = (
        "func.func @g(%a: tensor<2xf32>) -> tensor<3xf32> {\n  func.return %a : tensor<2xf32>\n}\n"
    )
    f.write_text(ok + "// -----\n" + bad)
    code, out, _ = _run([str(f), "--split-input-file", "--verify-diagnostics"], capsys)
    assert code == 0
    assert f"{f}:6:3: error: 'func.return'" in out


def test_unknown_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ok.mlir"
    f.write_text("func.func @f() {\n  func.return\n}\n")
    code, _, err = _run([str(f), "-p", "nope"], capsys)
    assert code == 1 and "Unrecognized passes" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "nn-to-mugraph{tile-n=abc}",
            "pass nn-to-mugraph: option tile-n must be an int, got 'abc'",
        ),
        (
            "task-schedule{bandwidth-gbs=4100}",
            "pass task-schedule: option bandwidth-gbs must be a float, got 4100 (write 4100.0)",
        ),
        (
            "mugraph-to-task{flag-values=1}",
            "pass mugraph-to-task: option flag-values must be a bool",
        ),
    ],
)
def test_an_option_of_the_wrong_type_names_its_pass_and_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, message: str
) -> None:
    f = tmp_path / "ok.mlir"
    f.write_text("func.func @f() {\n  func.return\n}\n")
    code, _, err = _run([str(f), "-p", spec], capsys)
    assert code == 1 and err.startswith(f"error: {message}") and "Traceback" not in err


@pytest.mark.parametrize("text", ["", "\n", "// a comment, nothing else\n"])
def test_an_empty_file_is_an_empty_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    f = tmp_path / "empty.mlir"
    f.write_text(text)
    code, out, err = _run([str(f)], capsys)
    assert code == 0 and err == "" and out.split() == ["builtin.module", "{", "}"]
