"""bench/code_size.py: the SASS bytes of each task body, from a cubin built without a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bench_scripts import load

import mk
from mk.backends.cuda import build

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    build.nvcc() is None or shutil.which("readelf") is None, reason="needs nvcc and readelf"
)
def test_every_task_body_has_a_size_within_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code_size = load("code_size")
    import mk.backends.cuda as backend

    monkeypatch.setattr(backend, "nvcc", lambda: None)
    source = mk.compile(ROOT / "examples/rmsnorm_linear.mlir", target="cuda", cache_dir=tmp_path)
    sizes = code_size.function_sizes(code_size.build_cubin(source.cuda_source, tmp_path))  # type: ignore[attr-defined]
    kernel = [n for n, name in sizes if "megakernel" in name]
    bodies = [n for n, name in sizes if name.startswith("task_")]
    assert len(kernel) == 1 and bodies and all(n > 0 for n in bodies)
    assert sum(bodies) < kernel[0]  # the bodies are inside the kernel's code
    log = (tmp_path / "ptxas.log").read_text()
    assert 0 < code_size.kernel_registers(log) <= 255
    reported = code_size.spills(log)
    assert {name for name in reported if name.startswith("task_")} == {
        name for _, name in sizes if name.startswith("task_")
    }
    assert all(min(v) >= 0 for v in reported.values())


@pytest.mark.skipif(
    build.nvcc() is None or shutil.which("readelf") is None, reason="needs nvcc and readelf"
)
def test_pass_options_reach_the_build(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--option NAME=VALUE compiles with that pass option (the folded attention, the default,
    is a larger body than the unfolded one); an unknown one is a clear error."""
    code_size = load("code_size")
    argv = ["code_size.py", "--model", "tiny", "--layers", "1"]

    def attention_bytes(*options: str) -> str:
        monkeypatch.setattr("sys.argv", [*argv, *options])
        assert code_size.main() == 0
        out = capsys.readouterr().out
        return next(line.split()[0] for line in out.splitlines() if "_att" in line)

    assert float(attention_bytes("--option", "attention_fold=0")) < float(attention_bytes())
    monkeypatch.setattr("sys.argv", [*argv, "--option", "bogus=1"])
    with pytest.raises(SystemExit, match="unknown pass option"):
        code_size.main()
    monkeypatch.setattr("sys.argv", [*argv, "--option", "tile_k=-1"])  # fails in mk.compile
    with pytest.raises(mk.MkError):
        code_size.main()
    assert build.nvcc() is not None  # neither failure left nvcc hidden from later tests


def test_a_called_function_is_named_by_its_own_name() -> None:
    """The cubin names a function the kernel calls `$<kernel>$<function>`: a task body and a
    mk::gpu helper are named for themselves, so neither counts as the kernel."""
    code_size = load("code_size")
    kernel = "_ZN2mk10megakernelIN37_GLOBAL__N__1_5_mk_cu_2DispatchEEEvNS_12LaunchParamsE"
    task = f"${kernel}$_ZN35_INTERNAL_1_5_mk_cu_2task_13_k13_l0_rEPKN2mk8TaskDescEPKPvRNS1_3gpu5ArenaEii"
    helper = f"${kernel}$_ZN2mk3gpu14rows_dot_lanesILi1ELi24ELi1024ELb1ELb0EEEvPKfPKtlPf"
    assert code_size.short_name(kernel) == kernel
    assert code_size.short_name(task) == "task_13_k13_l0_r"
    assert code_size.short_name(helper) == "rows_dot_lanes<1, 24, 1024, 1, 0>"


def test_a_layer_is_the_first_layers_bodies() -> None:
    code_size = load("code_size")
    sizes = [(4096, "task_8_k8_l0_q"), (2048, "task_9_k9_l0_m"), (8192, "task_16_k16_logits")]
    assert code_size.layer_bytes([*sizes, (99999, "megakernel")]) == 6144
    assert code_size.dispatcher_bytes([*sizes, (99999, "megakernel")]) == 99999 - 14336


@pytest.mark.skipif(
    build.nvcc() is None or shutil.which("readelf") is None, reason="needs nvcc and readelf"
)
def test_the_folded_attention_body_spills_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """qwen3-0.6b's folded decode attention (attention_fold=1): its row ops once a task and the
    new key outside the key stream keep it within the registers. Testing the new rows key by
    key inside the unrolled rounds spilled 384 B there, and the kernel's other bodies with it."""
    code_size = load("code_size")
    argv = [
        "code_size.py",
        "--model",
        "qwen3-0.6b",
        "--layers",
        "1",
        "--option",
        "attention_fold=1",
    ]
    monkeypatch.setattr("sys.argv", argv)
    assert code_size.main() == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if "task_" in line]
    assert rows and all(row[2] == "0/0" for row in rows if row[3].endswith("_att2_o")), rows
    assert any(row[3].endswith("_att2_o") for row in rows)


def qwen3_layer(
    batch: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[str, float, dict[str, float]]:
    """code_size.py's report of a 2-layer qwen3-0.6b decode at `batch`: the text, a layer's KB
    and each body's KB by its name after the grid number (`l0_q`)."""
    code_size = load("code_size")
    argv = ["code_size.py", "--model", "qwen3-0.6b", "--layers", "2", "--batch", str(batch)]
    monkeypatch.setattr("sys.argv", [*argv, "--top", "40"])
    assert code_size.main() == 0
    out = capsys.readouterr().out
    layer = float(next(line for line in out.splitlines() if "a layer's bodies" in line).split()[3])
    rows = [line.split() for line in out.splitlines() if "task_" in line]
    return out, layer, {row[3].split("_", 3)[-1]: float(row[0]) for row in rows}


@pytest.mark.skipif(
    build.nvcc() is None or shutil.which("readelf") is None, reason="needs nvcc and readelf"
)
def test_a_batch8_layer_keeps_no_code_it_does_not_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode step fetches each body's code into a cold instruction cache at every layer (an
    SM keeps ~125-155 KB: bench/attention_alone.cu). stream_linear's paths for unaligned rows,
    kept by a run-time pointer test, were two thirds of qwen3-0.6b's batch-8 o-projection body
    (37.7 KB) and its layer 176 KB; with StreamLinear::aligned 12.3 and 129 KB, and the decode
    2.9 % faster on the H200 (bench/RESULTS.md, session 58)."""
    out, layer, size = qwen3_layer(8, monkeypatch, capsys)
    # StreamAttention::aligned: the attention's paths for unaligned caches went too (44.8 ->
    # 37.0 KB, the layer 121 KB).
    # (The o-projection body is l0_r's for every layer where no layer's r starts an accumulator.)
    o_proj = size.get("l1_r", size.get("l0_r"))
    assert o_proj is not None and o_proj < 16.0 and size["l0_att2_o"] < 40.0 and layer < 130, out
    # Dispatch::kTails, the ring's absence and one call site per body: the dispatcher 38.7 ->
    # 16.5 KB (every body then 5-9 % smaller, the layer 121 -> 112 KB); MK_MEGAKERNEL's
    # constant CTA size in the attention, stream and tile headers: 107 KB.
    dispatcher = float(
        next(line for line in out.splitlines() if "the dispatcher" in line).split()[2]
    )
    assert dispatcher < 24 and layer < 112, out


@pytest.mark.skipif(
    build.nvcc() is None or shutil.which("readelf") is None, reason="needs nvcc and readelf"
)
def test_a_batch1_layer_keeps_its_reductions_and_divisions_small(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """qwen3-0.6b's batch-1 layer went 95 -> 76 KB (session 63): a row group's sums reduced over
    the warp transposed (`q` 17.0 -> 14.5 KB, `r` 20.9 -> 14.1), one division a row in the
    QK-norm and the merge, and the scratch allocator called instead of inlined in every body.
    Measured without the first weight step loaded early (MK_CUDA_STAGE_FIRST=0), which the
    default adds to `q` and the fused MLP since session 80 (`q` 18.7 KB, the layer 84 KB; timed
    with that code, qwen3-0.6b was faster)."""
    monkeypatch.setenv("MK_CUDA_STAGE_FIRST", "0")
    out, layer, size = qwen3_layer(1, monkeypatch, capsys)
    assert size["l0_q"] < 15.5 and size["l0_r"] < 15.5 and layer < 80, out


@pytest.mark.skipif(
    build.nvcc() is None or shutil.which("readelf") is None, reason="needs nvcc and readelf"
)
def test_the_dispatcher_does_not_grow_with_the_layers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher calls each body from one place, whatever the kinds (layers) that run it:
    with a call per kind, qwen3-0.6b's 28 layers had 106 KB of dispatcher code against 39 KB
    for 2 layers, other lines at every layer. tiny at 2 and 6 layers: the same code (with a
    call per kind 38.5 and 48.7 KB)."""
    code_size = load("code_size")

    def dispatcher(layers: int) -> float:
        argv = ["code_size.py", "--model", "tiny", "--layers", str(layers)]
        monkeypatch.setattr("sys.argv", argv)
        assert code_size.main() == 0
        out = capsys.readouterr().out
        return float(next(line for line in out.splitlines() if "the dispatcher" in line).split()[2])

    assert abs(dispatcher(6) - dispatcher(2)) <= 0.5
