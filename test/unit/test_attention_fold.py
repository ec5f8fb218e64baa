"""Decode attention that computes q's norm and RoPE and reads the new K/V rows itself
(nn-to-mugraph's attention-fold=1, the default), or only the rows (attention-fold=2): structure,
agreement on the CPU, the streamed CUDA call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mk
from mk import compiler
from mk.backends.cuda.stream_attention import plan_attention
from mk.dialects import make_context
from mk.dialects import mugraph as mg
from mk.dialects.mugraph_tiles import RMSNormOp, RopeOp
from mk.dialects.nn_decode import donated_args
from mk.inputs import random_inputs
from mk.interp.mugraph import run_mugraph
from mk.interp.nn import run_reference
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import entry_function, load_module


def decode_attention(
    b: int = 1, hq: int = 4, hkv: int = 2, seq: int = 64, d: int = 16, *, norm: bool = True,
    rope: bool = True, per_row: bool = False,
) -> str:  # fmt: skip
    """q, k, v rows of a decode step: QK-norm and/or RoPE per head, K and V written into donated
    caches at %p (one position, or one per batch row), then attention over kv_len = p + 1."""
    t = "bf16"
    row = lambda h: f"tensor<{b}x{h * d}x{t}>"  # noqa: E731
    head = lambda h: f"tensor<{b}x{h}x1x{d}x{t}>"  # noqa: E731
    cache = f"tensor<{b}x{hkv}x{seq}x{d}x{t}>"
    table = f"tensor<1x{d // 2}x{t}>"
    index = f"tensor<{b if per_row else 1}xi32>"
    lines = [
        f"  %p = nn.step %pos {{offset = 0 : i64}} : (tensor<1xi32>) -> {index}",
        f"  %len = nn.step %pos {{offset = 1 : i64}} : (tensor<1xi32>) -> tensor<{b}xi32>",
        f"  %q4 = nn.reshape %q : ({row(hq)}) -> {head(hq)}",
        f"  %k4 = nn.reshape %k : ({row(hkv)}) -> {head(hkv)}",
        f"  %v4 = nn.reshape %v : ({row(hkv)}) -> {head(hkv)}",
    ]
    q, k = "%q4", "%k4"
    for name, h in (("q", hq), ("k", hkv)):
        src = f"%{name}4"
        if norm:
            lines.append(
                f"  %{name}n = nn.rms_norm {src}, %{name}w {{epsilon = 1.0e-06 : f32}} : "
                f"({head(h)}, tensor<{d}x{t}>) -> {head(h)}"
            )
            src = f"%{name}n"
        if rope:
            lines.append(
                f"  %{name}r = nn.rope {src}, %cos, %sin : ({head(h)}, {table}, {table}) -> {head(h)}"
            )
            src = f"%{name}r"
        q, k = (src, k) if name == "q" else (q, src)
    lines += [
        f"  %kc = nn.cache_write %k_cache, {k}, %p {{dim = 2 : i64}} : ({cache}, {head(hkv)}, "
        f"{index}) -> {cache}",
        f"  %vc = nn.cache_write %v_cache, %v4, %p {{dim = 2 : i64}} : ({cache}, {head(hkv)}, "
        f"{index}) -> {cache}",
        f"  %att = nn.attention {q}, %kc, %vc, %len {{scale = {d**-0.5!r} : f32, causal = false}}"
        f" : ({head(hq)}, {cache}, {cache}, tensor<{b}xi32>) -> {head(hq)}",
        f"  %o = nn.reshape %att : ({head(hq)}) -> {row(hq)}",
        f"  func.return %o : {row(hq)}",
    ]
    args = (
        f"%q: {row(hq)}, %k: {row(hkv)}, %v: {row(hkv)}, %qw: tensor<{d}x{t}>, "
        f"%kw: tensor<{d}x{t}>, %cos: {table}, %sin: {table}, %pos: tensor<1xi32>, "
        f"%k_cache: {cache} {{nn.donated}}, %v_cache: {cache} {{nn.donated}}"
    )
    return f"func.func @step({args}) -> {row(hq)} {{\n" + "\n".join(lines) + "\n}"


def lowered(text: str, **options: int) -> list[mg.KernelOp | mg.GraphDefOp]:
    module = load_module(text)
    NnToMugraphPass(**{"attention_fold": 1, **options}).apply(make_context(), module)
    module.verify()
    return [op for op in module.walk() if isinstance(op, mg.KernelOp | mg.GraphDefOp)]


def split_kernel(kernels: list[mg.KernelOp | mg.GraphDefOp]) -> mg.GraphDefOp:
    return next(
        k
        for k in kernels
        if isinstance(k, mg.GraphDefOp) and any(isinstance(o, mg.AccumSoftmaxOp) for o in k.walk())
    )


# --------------------------------------------------------------------------- structure


def test_attention_reads_the_caches_before_their_writes() -> None:
    kernels = lowered(decode_attention())
    split = split_kernel(kernels)
    names = [v.name_hint for v in split.args]
    # The raw rows and the caches' arguments, not the QK-norm/RoPE results or the writes.
    assert {"q", "k", "v", "k_cache", "v_cache", "p", "qw", "kw", "cos", "sin"} <= set(names)
    assert "qr" not in names and "kc" not in names and "vc" not in names
    writes = [k for k in kernels if isinstance(k, mg.KernelOp) and k.kind.data == "cache_write"]
    assert len(writes) == 2 and all(kernels.index(w) > kernels.index(split) for w in writes)
    # q's chain is the attention's own now; k's stays a kernel, for the cache write.
    defs = {k.results[0].name_hint for k in kernels if isinstance(k, mg.GraphDefOp)}
    assert "kr" in defs and "qr" not in defs


def test_rows_only_fold_reads_q_from_its_kernel() -> None:
    """attention-fold=2: the new K/V rows as with 1, but q's norm and RoPE keep their kernel."""
    kernels = lowered(decode_attention(), attention_fold=2)
    split = split_kernel(kernels)
    names = {v.name_hint for v in split.args}
    assert {"qr", "k", "v", "k_cache", "v_cache", "p", "kw"} <= names
    assert "qw" not in names and "kc" not in names and "vc" not in names
    defs = {k.results[0].name_hint for k in kernels if isinstance(k, mg.GraphDefOp)}
    assert {"qr", "kr"} <= defs


def test_rows_as_made_fold_waits_for_the_row_kernels_not_the_writes() -> None:
    """attention-fold=3: the new K/V rows as their kernels made them (kr's result, v itself),
    so the attention reads no norm weight or RoPE table and the writes follow it."""
    kernels = lowered(decode_attention(), attention_fold=3)
    split = split_kernel(kernels)
    names = {v.name_hint for v in split.args}
    assert {"qr", "kr", "v", "k_cache", "v_cache", "p"} <= names
    assert not names & {"qw", "kw", "cos", "sin", "kc", "vc", "k"}
    writes = [k for k in kernels if isinstance(k, mg.KernelOp) and k.kind.data == "cache_write"]
    assert len(writes) == 2 and all(kernels.index(w) > kernels.index(split) for w in writes)
    assert not any(isinstance(o, RMSNormOp | RopeOp) for o in split.walk())


def test_attention_fold_off_reads_the_written_caches() -> None:
    split = split_kernel(lowered(decode_attention(), attention_fold=0))
    names = {v.name_hint for v in split.args}
    assert {"qr", "kc", "vc"} <= names and "k_cache" not in names


@pytest.mark.parametrize(
    "form",
    [{}, {"norm": False}, {"rope": False}, {"norm": False, "rope": False}, {"b": 2},
     {"b": 2, "per_row": True}, {"hq": 2, "hkv": 2}],
)  # fmt: skip
@pytest.mark.parametrize(
    "options",
    [{}, {"kv_splits": 4}, {"kv_splits": 1, "kv_chunk": 16}, {"attention_fold": 2, "kv_splits": 4},
     {"attention_fold": 3, "kv_splits": 4}],
)  # fmt: skip
def test_folded_attention_agrees_with_the_reference(
    form: dict[str, int], options: dict[str, int]
) -> None:
    """The mugraph interpreter against the nn reference: the output and both caches."""
    text = decode_attention(**form)  # type: ignore[arg-type]
    for seed in (0, 1):
        module = load_module(text)
        func = entry_function(module)
        inputs = random_inputs(func, seed)
        ref_inputs = [x.copy() for x in inputs]
        (ref,) = run_reference(module, *ref_inputs)
        NnToMugraphPass(**{"attention_fold": 1, **options}).apply(make_context(), module)
        (out,) = run_mugraph(module, *inputs)
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound, (form, options, seed, error)
        for i in donated_args(func):  # the row's kernel rounds once, after norm and RoPE
            error, bound = compiler.output_error(inputs[i], ref_inputs[i])
            assert error <= bound, (form, options, seed, error)


def test_cpu_target_agrees_with_the_fold_on_and_off(tmp_path: Path) -> None:
    text = decode_attention(b=2)
    results = []
    for fold in (1, 2, 3, 0):
        prog = mk.compile(text, target="cpu", cache_dir=tmp_path, attention_fold=fold)
        inputs = random_inputs(prog.func, seed=3)
        ref_inputs = [x.copy() for x in inputs]
        (out,) = prog(*inputs)
        (ref,) = mk.reference(text, *ref_inputs)
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound, (fold, error)
        results.append((np.asarray(out), inputs[-2], inputs[-1]))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_cache_write_costs_its_slab() -> None:
    """A one-row cache write is modelled in place: its new row read and written, nothing of the
    cache (the whole cache made the list schedule believe 135 µs per write)."""
    from mk.passes.cost_model import kernel_cost

    kernels = lowered(decode_attention(seq=1024, d=128), attention_fold=0)
    write = next(k for k in kernels if isinstance(k, mg.KernelOp) and k.kind.data == "cache_write")
    cost = kernel_cost(write)
    row = 1 * 2 * 1 * 128 * 2  # [1, hkv, 1, d] bf16
    assert cost.dram_write_bytes == row
    assert row <= cost.dram_read_bytes <= row + 64  # the row and its index


@pytest.mark.parametrize(("fold", "batch"), [(0, 1), (2, 1), (3, 1), (0, 8)])
def test_decode_phases_get_one_task_per_sm(fold: int, batch: int) -> None:
    """qwen3-0.6b's step, with its cache writes after the attention (folds 2 and 3) or at batch
    8: no SM queues two tasks of one phase that fits the SMs (it did while a cache write looked
    slow, and at batch 8 while QK-norm took a block per row and head: 244 such queues)."""
    import dataclasses

    from mk.dialects.task import GraphOp
    from mk.models import decode_program, preset
    from mk.passes.task_stats import STATS_ATTR, TaskStatsPass

    config = dataclasses.replace(preset("qwen3-0.6b"), layers=3)
    module = load_module(decode_program(config, batch, 1024, 2))
    compiler.run_pipeline(module, {"tile_n": 0, "attention_fold": fold})
    TaskStatsPass().apply(make_context(), module)
    graph = next(op for op in module.walk() if isinstance(op, GraphOp))
    stats = graph.attributes[STATS_ATTR].data  # type: ignore[attr-defined]
    assert stats["stacked_queues"].value.data == 0


# --------------------------------------------------------------------------- CUDA


@pytest.mark.parametrize(
    ("form", "ops"),
    [({}, ("norm", "rope")), ({"norm": False}, ("rope",)), ({"rope": False}, ("norm",)),
     ({"rope": False, "norm": False}, ())],
)  # fmt: skip
def test_folded_attention_streams_its_rows_in_registers(
    form: dict[str, bool], ops: tuple[str, ...]
) -> None:
    plan = plan_attention(split_kernel(lowered(decode_attention(d=64, **form), kv_splits=4)))
    assert plan is not None and plan.k_new is not None and plan.v_new is not None
    # q's and the new K row's norm and RoPE run in the call as it loads them: no tile steps.
    assert plan.prologue == ()
    q_row, k_row, v_row = (plan.head_row(v) for v in (plan.q, plan.k_new.new, plan.v_new.new))
    if not ops:  # q without per-head ops is read in place, as before
        assert isinstance(plan.q, mg.InputOp) and q_row is None
        q_row = k_row
    for row in (q_row, k_row):
        assert row is not None
        assert tuple(n for n in ("norm", "rope") if getattr(row, n) is not None) == ops
    assert v_row is not None and v_row.norm is None and v_row.rope is None
    assert plan.new_at() is not None and plan.new_at() in plan.scalars()


def test_rows_that_do_not_fit_the_call_stay_tile_steps() -> None:
    """Head dim 8: a lane's 8 elements hold both halves the RoPE pairs."""
    plan = plan_attention(split_kernel(lowered(decode_attention(d=8), kv_splits=4)))
    assert plan is not None and plan.head_row(plan.q) is None
    assert {type(o).__name__ for o in plan.prologue} >= {"RMSNormOp", "RopeOp"}


def test_a_select_of_another_form_keeps_the_tile_loop() -> None:
    from xdsl.dialects import arith

    split = split_kernel(lowered(decode_attention(d=64), kv_splits=4))
    cmp = next(o for o in split.walk() if isinstance(o, arith.CmpiOp))
    cmp.properties["predicate"] = arith.IntegerAttr(1, 64)  # ne: every other row is new
    assert plan_attention(split) is None


@pytest.mark.usefixtures("no_nvcc")
def test_emitted_call_takes_the_new_rows(tmp_path: Path) -> None:
    prog = mk.compile(decode_attention(d=64), target="cuda", cache_dir=tmp_path, attention_fold=1)
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert "sa.k_new = " in src and "sa.v_new = " in src and "sa.new_key = " in src
    assert "sa.q_ops.cos = " in src and "sa.k_ops.g = " in src
    # Only k's kernel, for the cache write.
    assert src.count("mk::gpu::rms_norm_tile(") + src.count("mk::gpu::rms_norm_rows<") == 1
    assert "accum_softmax_update" not in src


@pytest.mark.usefixtures("no_nvcc")
def test_rows_only_call_reads_q_in_place(tmp_path: Path) -> None:
    prog = mk.compile(decode_attention(d=64), target="cuda", cache_dir=tmp_path, attention_fold=2)
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert "sa.k_new = " in src and "sa.v_new = " in src and "sa.k_ops.g = " in src
    assert "sa.q_ops.cos = " not in src and "sa.q_ops.g = " not in src
    assert "accum_softmax_update" not in src


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("fold", "mma"),
    [(1, "0"), (2, "0"), (3, "0"), (1, "1"), (3, "1")],
    ids=["fold1", "fold2", "fold3", "fold1-mma", "fold3-mma"],
)
@pytest.mark.parametrize(
    "form", [{"d": 128, "hq": 16, "hkv": 8, "seq": 1024}, {"d": 64, "b": 2, "per_row": True},
             {"d": 64, "norm": False}, {"d": 64, "rope": False, "norm": False}, {"d": 8}],
)  # fmt: skip
def test_folded_attention_matches_the_reference_on_the_gpu(
    form: dict[str, int], fold: int, mma: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each fold, on CUDA cores and (MK_CUDA_ATTN_MMA=1, the new rows put in the staged chunk
    that holds their key) on tensor cores where the head dim allows."""
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", mma)
    text = decode_attention(**form)  # type: ignore[arg-type]
    for splits in (0, 3):
        prog = mk.compile(
            text, target="cuda", cache_dir=tmp_path, kv_splits=splits, attention_fold=fold
        )
        assert "sa.k_new = " in prog.cuda_source  # type: ignore[attr-defined]
        for seed in (0, 1):
            inputs = random_inputs(prog.func, seed=seed)
            ref_inputs = [x.copy() for x in inputs]
            (out,) = prog(*inputs)
            (ref,) = mk.reference(text, *ref_inputs)
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound, (form, splits, seed, error)
            for i in donated_args(prog.func):
                error, bound = compiler.output_error(inputs[i], ref_inputs[i])
                assert error <= bound, (form, splits, seed, error)
