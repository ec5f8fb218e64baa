"""mk.reference on whole programs (calls, rounding, entry, sources), its input checks, and mk-run."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from test_reference import f64, one_op

import mk
from mk.diagnostics import MkError
from mk.inputs import random_inputs
from mk.source import entry_function, load_module
from mk.tools.mk_run import main as mk_run

# --- whole programs: calls, rounding, entry, sources --------------------------------------------

CHAIN = """
func.func @main(%x: tensor<4xbf16>, %e: tensor<4xbf16>) -> tensor<4xbf16> {
  %s = func.call @add(%x, %e) : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  %d = nn.sub %s, %x : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  func.return %d : tensor<4xbf16>
}
func.func private @add(%a: tensor<4xbf16>, %b: tensor<4xbf16>) -> tensor<4xbf16> {
  %r = nn.add %a, %b : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  func.return %r : tensor<4xbf16>
}
func.func @other(%x: tensor<4xbf16>) -> (tensor<4xbf16>, tensor<4xbf16>) {
  %n = nn.neg %x : (tensor<4xbf16>) -> tensor<4xbf16>
  func.return %n, %x : tensor<4xbf16>, tensor<4xbf16>
}
"""


def test_bf16_rounds_after_every_op_through_a_call() -> None:
    # 1 + 2^-9 is not a bf16 value: rounded after the add it is 1, so the difference is 0; a
    # program rounded only at the end would return 2^-9.
    x = np.ones(4, ml_dtypes.bfloat16)
    e = np.full(4, 2.0**-9, ml_dtypes.bfloat16)
    (out,) = mk.reference(CHAIN, x, e)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(f64(out), np.zeros(4))


def test_named_entry_and_outputs_do_not_alias_inputs() -> None:
    x = np.array([1, -2, 3, 0.5], ml_dtypes.bfloat16)
    neg, same = mk.reference(CHAIN, x, entry="other")
    np.testing.assert_array_equal(f64(neg), -f64(x))
    np.testing.assert_array_equal(f64(same), f64(x))
    same[0] = 7
    assert x[0] == 1


def test_sources_path_and_module(tmp_path: Path) -> None:
    path = tmp_path / "chain.mlir"
    path.write_text(CHAIN)
    x, e = np.ones(4, ml_dtypes.bfloat16), np.ones(4, ml_dtypes.bfloat16)
    for source in (path, str(path), load_module(CHAIN)):
        (out,) = mk.reference(source, x, e)
        np.testing.assert_array_equal(f64(out), np.ones(4))


def test_unsupported_op_is_a_located_error() -> None:
    text = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = arith.addf %x, %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
}"""
    with pytest.raises(MkError, match=r"<source>:2:\d+: error: 'arith.addf' is not supported"):
        mk.reference(text, np.zeros(4, np.float32))


def test_call_to_a_declaration_is_a_located_error() -> None:
    text = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = func.call @ext(%x) : (tensor<4xf32>) -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}
func.func private @ext(tensor<4xf32>) -> tensor<4xf32>"""
    with pytest.raises(
        MkError, match=r"<source>:2:\d+: error: 'func.call' calls @ext, which has no body"
    ):
        mk.reference(text, np.zeros(4, np.float32))


def test_use_before_definition_is_a_located_error() -> None:
    """The parser resolves a name used before its definition to the later value: the verifier
    rejects it at the use, for the reference and the compiler alike (no pass sees it)."""
    text = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = nn.mul %x, %z : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %z = nn.relu %y : (tensor<4xf32>) -> tensor<4xf32>
  func.return %z : tensor<4xf32>
}"""
    message = r"<source>:2:3: error: 'nn.mul' operand #1 \(%z\) is used before its definition"
    with pytest.raises(MkError, match=message):
        mk.reference(text, np.zeros(4, np.float32))
    with pytest.raises(MkError, match=message):
        mk.compile(text, target="cuda")
    fine = text.replace("%x, %z", "%x, %x")
    (out,) = mk.reference(fine, np.full(4, 2, np.float32))
    np.testing.assert_array_equal(out, np.full(4, 4, np.float32))


def test_unknown_entry_is_an_error() -> None:
    with pytest.raises(MkError, match="no function named 'nope'"):
        mk.reference(CHAIN, entry="nope")


# --- input checks -----------------------------------------------------------------------------

SIGNATURE = """func.func @f(%x: tensor<2x8xbf16>, %w: tensor<8x3xbf16>, %ids: tensor<2xi32>) -> tensor<2x3xbf16> {
  %y = nn.matmul %x, %w : (tensor<2x8xbf16>, tensor<8x3xbf16>) -> tensor<2x3xbf16>
  func.return %y : tensor<2x3xbf16>
}"""


def _good() -> list[np.ndarray]:
    return [
        np.ones((2, 8), ml_dtypes.bfloat16),
        np.ones((8, 3), ml_dtypes.bfloat16),
        np.zeros(2, np.int32),
    ]


def test_good_inputs_run() -> None:
    (out,) = mk.reference(SIGNATURE, *_good())
    np.testing.assert_array_equal(f64(out), np.full((2, 3), 8.0))


@pytest.mark.parametrize("count", [0, 2, 4])
def test_wrong_input_count(count: int) -> None:
    inputs = (_good() + _good())[:count]
    with pytest.raises(ValueError, match=rf"@f expects 3 inputs \(%x, %w, %ids\), got {count}"):
        mk.reference(SIGNATURE, *inputs)


@pytest.mark.parametrize(
    ("index", "value", "message"),
    [
        (
            1,
            np.ones((8, 4), ml_dtypes.bfloat16),
            r"argument 1 \('%w'\): expected shape \(8, 3\), got \(8, 4\)",
        ),
        (
            0,
            np.ones((2, 8, 1), ml_dtypes.bfloat16),
            r"argument 0 \('%x'\): expected shape \(2, 8\), got \(2, 8, 1\)",
        ),
        (
            1,
            np.ones((8, 3), np.float32),
            r"argument 1 \('%w'\): expected dtype bfloat16 .*, got float32",
        ),
        (
            0,
            np.ones((2, 8), np.float16),
            r"argument 0 \('%x'\): expected dtype bfloat16 .*, got float16",
        ),
        (2, np.zeros(2, np.int64), r"argument 2 \('%ids'\): expected dtype int32 .*, got int64"),
        (2, [0, 1], r"argument 2 \('%ids'\): expected a numpy array .*, got list"),
        (0, 1.0, r"argument 0 \('%x'\): expected a numpy array .*, got float"),
    ],
)
def test_bad_input_names_the_argument(index: int, value: object, message: str) -> None:
    inputs: list[object] = list(_good())
    inputs[index] = value
    with pytest.raises(ValueError, match=message):
        mk.reference(SIGNATURE, *inputs)


def test_f64_input_for_f32_argument_is_rejected() -> None:
    text = one_op("nn.exp", [((3,), "f32")], ((3,), "f32"))
    with pytest.raises(
        ValueError, match=r"argument 0 \('%a0'\): expected dtype float32 .*, got float64"
    ):
        mk.reference(text, np.zeros(3))


def test_unnamed_argument_is_numbered() -> None:
    text = """func.func @f(%0: tensor<3xf32>) -> tensor<3xf32> {
  %1 = nn.exp %0 : (tensor<3xf32>) -> tensor<3xf32>
  func.return %1 : tensor<3xf32>
}"""
    with pytest.raises(ValueError, match=r"^argument 0: expected shape \(3,\), got \(4,\)"):
        mk.reference(text, np.zeros(4, np.float32))


# --- random inputs and mk-run -----------------------------------------------------------------

DECODE = """func.func @decode(%ids: tensor<64xi32>, %emb: tensor<5x32xbf16>, %g: tensor<32xbf16>,
    %w: tensor<48x32xbf16>, %k: tensor<2x2x6x8xbf16>, %v: tensor<2x2x6x8xbf16>,
    %q: tensor<2x4x1x8xbf16>, %len: tensor<2xi32>) -> (tensor<64x48xbf16>, tensor<2x4x1x8xbf16>) {
  %x = nn.embedding %emb, %ids : (tensor<5x32xbf16>, tensor<64xi32>) -> tensor<64x32xbf16>
  %n = nn.rms_norm %x, %g : (tensor<64x32xbf16>, tensor<32xbf16>) -> tensor<64x32xbf16>
  %y = nn.linear %n, %w : (tensor<64x32xbf16>, tensor<48x32xbf16>) -> tensor<64x48xbf16>
  %o = nn.attention %q, %k, %v, %len {scale = 0.35 : f32} : (tensor<2x4x1x8xbf16>, tensor<2x2x6x8xbf16>, tensor<2x2x6x8xbf16>, tensor<2xi32>) -> tensor<2x4x1x8xbf16>
  func.return %y, %o : tensor<64x48xbf16>, tensor<2x4x1x8xbf16>
}
"""


def test_random_inputs_respect_roles_and_seed() -> None:
    func = entry_function(load_module(DECODE))
    inputs = random_inputs(func, seed=5)
    ids, emb, g, w, _k, _v, _q, kv_len = inputs
    assert [a.dtype for a in inputs] == [np.int32] + [ml_dtypes.bfloat16] * 6 + [np.int32]
    assert ids.min() >= 0 and ids.max() < 5 and len(set(ids.tolist())) > 1
    assert kv_len.min() >= 1 and kv_len.max() <= 6
    assert np.count_nonzero(f64(g)) > 0 and np.count_nonzero(f64(emb)) > 0
    assert f64(w).std() < 0.5  # scaled by 1/sqrt(32)
    again = random_inputs(func, seed=5)
    assert all(np.array_equal(f64(a), f64(b)) for a, b in zip(inputs, again, strict=True))
    assert not np.array_equal(f64(random_inputs(func, seed=6)[1]), f64(emb))
    mk.reference(DECODE, *inputs)  # ids in range: no error


def test_mk_run_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "decode.mlir"
    path.write_text(DECODE)
    assert mk_run([str(path), "--reference", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert "output 0: shape (64, 48) dtype bfloat16 mean " in first
    assert "output 1: shape (2, 4, 1, 8) dtype bfloat16 mean " in first
    assert re.search(r"first \[-?\d", first)
    assert re.search(r"reference time: \d+\.\d ms", first)
    assert mk_run([str(path), "--reference", "--seed", "3", "--entry", "decode"]) == 0
    second = capsys.readouterr().out
    assert first.split("reference time")[0] == second.split("reference time")[0]


def test_mk_run_cuda_without_a_gpu_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpu_present: bool
) -> None:
    path = tmp_path / "decode.mlir"
    path.write_text(DECODE)
    if gpu_present:
        pytest.skip("a GPU is present: the cuda target runs")
    assert mk_run([str(path), "--target", "cuda"]) == 2
    assert "'cuda' target needs an NVIDIA GPU" in capsys.readouterr().err


def test_mk_run_user_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.mlir"
    bad.write_text(
        "func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = nn.exp %x : (tensor<2xf32>) ->\n}\n"
    )
    assert mk_run([str(bad), "--reference"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"bad\.mlir:3:1: error: ", err) and "Traceback" not in err
    assert mk_run([str(tmp_path / "missing.mlir"), "--reference"]) == 1
    assert "missing.mlir" in capsys.readouterr().err
    private = tmp_path / "private.mlir"
    private.write_text(CHAIN.replace("func.func @", "func.func private @"))
    assert mk_run([str(private), "--reference"]) == 1
    assert "no public function" in capsys.readouterr().err
