"""superoptimize: the search rediscovers fused RMSNorm+Linear, gated-MLP and LoRA kernels from
unfused nn, verifies them, beats the rules' cost, and compiles them to the CPU backend."""

from __future__ import annotations

import numpy as np
import pytest
from superoptimize_programs import GATED, LORA, RMS_LINEAR, RMS_UNFUSED
from xdsl.dialects.func import FuncOp

import mk
from mk.compiler import output_error
from mk.dialects import make_context
from mk.dialects import mugraph as mg
from mk.dialects.mugraph_tiles import AccumOp, MatmulOp
from mk.inputs import random_inputs
from mk.interp.mugraph import run_mugraph
from mk.passes.search import cache
from mk.passes.search.driver import FunctionSearch, SearchOptions, SearchResult
from mk.passes.search.superoptimize import RESULTS, SuperoptimizePass
from mk.source import entry_function, load_module

# A ceiling: a search stops once it has enumerated everything (about a second alone), but on a
# loaded machine (more pytest workers than cores, beside nvcc builds) one ran past 20 s.
BUDGET = 60.0


def search(src: str, **options: object) -> SearchResult:
    func = entry_function(load_module(src))
    return FunctionSearch(func, SearchOptions(budget_s=BUDGET, **options)).run()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def results() -> dict[str, SearchResult]:
    return {}


def found(results: dict[str, SearchResult], name: str, src: str) -> SearchResult:
    if name not in results:
        results[name] = search(src)
    return results[name]


def kernels(result: SearchResult) -> list[mg.GraphDefOp | mg.KernelOp]:
    assert result.module is not None
    return [op for op in result.module.walk() if isinstance(op, mg.GraphDefOp | mg.KernelOp)]


def agrees_with_reference(src: str, result: SearchResult, seed: int = 3) -> None:
    assert result.module is not None
    inputs = random_inputs(entry_function(load_module(src)), seed)
    want = mk.reference(src, *inputs)
    got = run_mugraph(result.module, *inputs)
    for g, w in zip(got, want, strict=True):
        err, tol = output_error(g, w)
        assert err <= tol


@pytest.mark.parametrize(
    ("name", "src", "matmuls"),
    [
        ("rms_linear", RMS_LINEAR, 1),
        ("rms_unfused", RMS_UNFUSED, 1),
        ("gated", GATED, 2),
        ("lora", LORA, 3),
    ],
)
def test_search_finds_one_fused_verified_kernel(
    results: dict[str, SearchResult], name: str, src: str, matmuls: int
) -> None:
    result = found(results, name, src)
    assert result.stats.seconds < BUDGET + 1
    (kernel,) = kernels(result)  # the whole unfused program in one graph-defined kernel
    assert isinstance(kernel, mg.GraphDefOp)
    ops = list(kernel.body.block.ops)
    assert sum(isinstance(op, MatmulOp) for op in ops) == matmuls
    assert result.verdict is not None and result.verdict.equivalent
    assert result.verdict.log2_bound < -30
    assert result.best_cost is not None and result.rule_cost is not None
    assert result.best_cost.est_seconds <= result.rule_cost.est_seconds
    assert result.best_cost.kernels <= result.rule_cost.kernels
    agrees_with_reference(src, result)


def test_gated_and_lora_beat_the_rules_kernel_count(results: dict[str, SearchResult]) -> None:
    # The rules need two kernels for LoRA ((x@A)@B is a second linear group).
    lora = found(results, "lora", LORA)
    assert lora.rule_cost is not None and lora.rule_cost.kernels == 2
    assert lora.best_cost is not None and lora.best_cost.kernels == 1


def test_tight_shared_memory_gives_the_mirage_rmsnorm_linear() -> None:
    # Whole-K tiles do not fit in 4 KiB: the for-loop walks K with the norm's Σx² accumulated
    # next to the matmul's partial sums and the rsqrt rescale after the loop (Mirage's kernel).
    result = search(RMS_LINEAR, smem_kb=4)
    (kernel,) = kernels(result)
    assert isinstance(kernel, mg.GraphDefOp) and kernel.forloop_range() > 1
    accums = sorted(op.kind.data for op in kernel.body.block.ops if isinstance(op, AccumOp))
    assert accums == ["mean_sq_last", "sum"]
    agrees_with_reference(RMS_LINEAR, result)


def test_search_is_deterministic() -> None:
    a, b = search(GATED), search(GATED)
    assert str(a.module) == str(b.module)
    assert a.stats.as_dict()["states"] == b.stats.as_dict()["states"]


def test_statistics_measure_states_and_duplicates(results: dict[str, SearchResult]) -> None:
    stats = found(results, "rms_linear", RMS_LINEAR).stats.as_dict()
    assert stats["states"] > 1000 and stats["candidates"] >= 2
    assert 0 < stats["duplicate_rate"] < 1
    assert 16 < stats["bytes_per_state"] < 400  # the 16-byte digest plus Python's overhead
    assert not stats["budget_exhausted"]


def test_pass_caches_by_canonical_hash(tmp_path: object) -> None:
    cache.clear_memory()
    renamed = LORA.replace("@lora", "@other").replace("%xw", "%p")
    one, two = load_module(LORA), load_module(renamed)
    sopt = SuperoptimizePass(budget_s=BUDGET, cache_dir=str(tmp_path), stats=True)
    sopt.apply(make_context(), one)
    misses = cache.STATS["misses"]
    sopt.apply(make_context(), two)  # same program up to names: a memory hit
    assert cache.STATS["misses"] == misses and cache.STATS["memory_hits"] >= 1
    assert RESULTS["other"]["cache_key"] == RESULTS["lora"]["cache_key"]
    cache.clear_memory()
    three = load_module(LORA)
    sopt.apply(make_context(), three)  # a fresh process would find it on disk
    assert cache.STATS["disk_hits"] >= 1
    funcs = [m.body.block.first_op for m in (one, three)]
    for func in funcs:
        assert isinstance(func, FuncOp) and "mk.search" in func.attributes
        del func.attributes["mk.search"]
    assert str(three) == str(one)


def test_compile_with_search_runs_on_the_cpu(tmp_path: object) -> None:
    prog = mk.compile(LORA, target="cpu", search=True, cache_dir=tmp_path, budget_s=BUDGET)
    assert prog.ir("mugraph").count("mugraph.graph_def") == 1
    inputs = random_inputs(entry_function(load_module(LORA)), 5)
    (got,) = prog(*inputs)
    (want,) = mk.reference(LORA, *inputs)
    err, tol = output_error(got, want)
    assert err <= tol
    assert np.isfinite(got.astype(np.float32)).all()


def test_unsupported_programs_are_left_to_the_rules() -> None:
    src = """
func.func @sm(%x: tensor<4x64xf32>) -> tensor<4x64xf32> {
  %y = nn.softmax %x : (tensor<4x64xf32>) -> tensor<4x64xf32>
  func.return %y : tensor<4x64xf32>
}
"""
    module = load_module(src)
    SuperoptimizePass(budget_s=1.0, cache=False, stats=True).apply(make_context(), module)
    assert "nn.softmax" in str(module) and "mk.search" not in str(module)
    assert "sm" not in RESULTS  # no modelled subgraph: nothing searched


def test_bad_options_are_user_errors() -> None:
    with pytest.raises(mk.MkError, match="must be positive"):
        SuperoptimizePass(budget_s=0).apply(make_context(), load_module(LORA))


CONES = """
func.func @cones(%x: tensor<4x128xf32>, %g: tensor<128xf32>, %wq: tensor<64x128xf32>, %wk: tensor<64x128xf32>) -> (tensor<4x64xf32>, tensor<4x64xf32>) {
  %h = nn.rms_norm %x, %g : (tensor<4x128xf32>, tensor<128xf32>) -> tensor<4x128xf32>
  %q = nn.linear %h, %wq : (tensor<4x128xf32>, tensor<64x128xf32>) -> tensor<4x64xf32>
  %k = nn.linear %h, %wk : (tensor<4x128xf32>, tensor<64x128xf32>) -> tensor<4x64xf32>
  %s = nn.softmax %q : (tensor<4x64xf32>) -> tensor<4x64xf32>
  func.return %s, %k : tensor<4x64xf32>, tensor<4x64xf32>
}
"""


def test_larger_functions_are_searched_as_cones() -> None:
    # softmax is not modelled, so the function is cut into cones: q and k each with the
    # RMSNorm recomputed (the same program up to names: the second is a cache hit).
    cache.clear_memory()
    module = load_module(CONES)
    SuperoptimizePass(budget_s=BUDGET, cache=False, num_sms=8).apply(make_context(), module)
    text = str(module)
    assert "nn.rms_norm" not in text and "nn.linear" not in text and "nn.softmax" in text
    graphs = [op for op in module.walk() if isinstance(op, mg.GraphDefOp)]
    assert [len(g.args) for g in graphs] == [3, 3]  # x, g and one weight each
    assert cache.STATS["memory_hits"] >= 1
    from mk.passes.nn_to_mugraph import NnToMugraphPass

    NnToMugraphPass(num_sms=8).apply(make_context(), module)
    inputs = random_inputs(entry_function(load_module(CONES)), 2)
    for got, want in zip(run_mugraph(module, *inputs), mk.reference(CONES, *inputs), strict=True):
        err, tol = output_error(got, want)
        assert err <= tol
