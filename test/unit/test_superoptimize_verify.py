"""superoptimize's pruning and verification: abstract expressions reject what cannot be part of
the target; finite-field trials reject near misses (a wrong map, a missing rescale)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from superoptimize_programs import GATED, RMS_LINEAR
from xdsl.dialects.builtin import DenseArrayBase, ModuleOp, i64

from mk.compiler import output_error
from mk.dialects import mugraph as mg
from mk.inputs import random_inputs
from mk.interp.mugraph import run_mugraph
from mk.interp.nn import run_reference
from mk.passes.search.driver import FunctionSearch, SearchOptions, candidate_module
from mk.passes.search.emit import Tiling
from mk.passes.search.enumerate import Found, SearchStats, _prune_dead
from mk.passes.search.expr import SubexpressionOracle
from mk.passes.search.field import PRIMES, Field
from mk.passes.search.plans import cut_points, two_kernel_plan
from mk.passes.search.target import Problem, function_problem
from mk.passes.search.verify import verify
from mk.source import entry_function, load_module

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def problem(src: str) -> tuple[ModuleOp, Problem]:
    module = load_module(src)
    return module, function_problem(entry_function(module))


def founds(src: str) -> tuple[ModuleOp, Problem, list[Found]]:
    module, p = problem(src)
    # A ceiling, as test_superoptimize's BUDGET: the enumeration ends long before it.
    search = FunctionSearch(entry_function(module), SearchOptions(budget_s=60.0))
    return module, p, search.enumerate(p)


def test_oracle_keeps_parts_of_the_target_and_rejects_the_rest() -> None:
    _, p = problem(RMS_LINEAR)
    a = p.algebra
    x, g, w = (p.nf[v] for v in p.inputs)
    (k,) = p.reduced
    m, n, _ = p.labels[p.inputs[0]] + (0,)  # x is (M, K)
    ok = SubexpressionOracle(a, [p.nf[p.outputs[0]]])
    assert ok(a.mul(x, g)) and ok(a.mul(x, x))
    assert ok(a.reduce(a.mul(a.mul(x, g), w), k, False))  # one for-loop chunk of the matmul
    assert ok(a.reduce(a.mul(x, x), k, True))  # Σx² under the rsqrt
    assert not ok(a.reduce(x, k, True))  # Σ_k x_k leaves out w_k, which depends on k
    assert not ok(a.mul(g, g))
    # x_k · Σ_j x_j is not Σ_k x_k²: the reduction is shadowed by the free k
    shadowed = a.mul(x, a.reduce(x, k, True), p.labels[p.inputs[0]], (m, -1))
    assert shadowed != a.reduce(a.mul(x, x), k, True)
    assert not ok(shadowed)
    del n


def test_field_constants_and_functions_are_consistent() -> None:
    f = Field(np.random.default_rng(0))
    assert [int(r) * 512 % p for r, p in zip(f.const(1 / 512).a, PRIMES, strict=True)] == [1, 1]
    x = f.random((3, 4))
    assert np.array_equal(f.fn("exp", x).a, f.fn("exp", x).a)
    assert not np.array_equal(f.fn("exp", x).a, f.fn("rsqrt", x).a)
    assert f.uses["exp"] == 3 * 12  # scalar applications, counted for the bound


def _gated_wrong_map() -> tuple[ModuleOp, ModuleOp, ModuleOp]:
    module, p, found = founds(GATED)
    direct = min((f for f in found if f.loop is None), key=Found.op_count)
    m, n = p.output_labels()
    func = entry_function(module)
    # Grid x over columns, y over rows: x's rows follow grid y.
    right = candidate_module(func, p, direct, Tiling(((n, 2), (m, 2)), 1))
    wrong = candidate_module(func, p, direct, Tiling(((n, 2), (m, 2)), 1))
    assert right is not None and wrong is not None
    for op in wrong.walk():
        if isinstance(op, mg.InputOp) and op.source_index() == 0:
            assert op.imap_dims() == (-1, 0, -1)
            op.imap = DenseArrayBase.from_list(i64, [0, -1, -1])  # rows follow grid x: a near miss
    wrong.verify()  # well-formed: the same tile shapes
    return module, right, wrong


def test_verification_rejects_a_wrong_map() -> None:
    target, right, wrong = _gated_wrong_map()
    good = verify(target, right, "gated", seed=0)
    assert good.equivalent and good.log2_bound < -30
    assert good.trials == len(good.trial_log2) and math.isclose(
        sum(good.trial_log2), good.log2_bound
    )
    bad = verify(target, wrong, "gated", seed=0)
    assert not bad.equivalent and "differs" in bad.reason


def test_verification_rejects_a_missing_rescale() -> None:
    module, p, found = founds(RMS_LINEAR)
    (k,) = p.reduced
    mirage = next(
        f for f in found if f.loop == k and any(t.attr == "mean_sq_last" for t in f.tiles)
    )
    acc = next(i for i, t in enumerate(mirage.tiles) if t.kind == "accum" and t.attr == "sum")
    unscaled = _prune_dead(list(mirage.tiles), [acc], k)  # Σ x·g·w without the rsqrt factor
    func = entry_function(module)
    (n,) = [label for label in p.output_labels() if p.extents[label] == 256]
    tiling = Tiling(((n, 4),), 2)
    right = candidate_module(func, p, mirage, tiling)
    near = candidate_module(func, p, unscaled, tiling)
    assert right is not None and near is not None
    assert verify(module, right, "rms_linear", seed=1).equivalent
    bad = verify(module, near, "rms_linear", seed=1)
    assert not bad.equivalent and "differs" in bad.reason


def test_two_kernel_plans_compose_verified_kernels() -> None:
    src = (EXAMPLES / "gated_mlp.mlir").read_text()
    func = entry_function(load_module(src))
    cuts = cut_points(func)
    assert len(cuts) == 4  # g, u, silu(g), silu(g)·u
    opts = SearchOptions(budget_s=5.0, bits=31, max_kernels=1)
    plan = two_kernel_plan(func, cuts[-1], opts, SearchStats())  # cut at the gated product
    assert plan is not None
    module, cost, verdict = plan
    assert [type(op) for op in entry_function(module).body.block.ops][:2] == [mg.GraphDefOp] * 2
    assert cost.kernels == 2
    assert verdict.equivalent and verdict.log2_bound <= -30  # 2^-31 per kernel, union bound
    inputs = random_inputs(func, 4)
    for got, want in zip(run_mugraph(module, *inputs), run_reference(src, *inputs), strict=True):
        err, tol = output_error(got, want)
        assert err <= tol


def test_progress_bar_draws_only_when_asked() -> None:
    import io

    from mk.passes.search.progress import Progress

    shown, hidden = io.StringIO(), io.StringIO()
    for stream, enabled in ((shown, True), (hidden, None)):  # None: only on a terminal
        bar = Progress("@f", 10.0, enabled, stream)
        bar.update(123, 4, force=True)
        bar.close(456, 5)
    assert "[superoptimize @f]" in shown.getvalue() and "456 states, 5 graphs" in shown.getvalue()
    assert hidden.getvalue() == ""  # a StringIO is not a terminal


def _rms_eps(scale: bool) -> str:
    x, c = "tensor<2x64xf32>", "tensor<2x1xf32>"
    y = "%y = nn.mul %x, %r" if scale else "%y = nn.mul %x, %x"
    return f"""func.func @rms(%x: {x}, %eps: tensor<1xf32>) -> {x} {{
  %sq = nn.mul %x, %x : ({x}, {x}) -> {x}
  %ms = nn.reduce_mean %sq {{dim = 1 : i64, keepdim = true}} : ({x}) -> {c}
  %me = nn.add %ms, %eps : ({c}, tensor<1xf32>) -> {c}
  %r = nn.rsqrt %me : ({c}) -> {c}
  {y} : ({x}, {"tensor<2x1xf32>" if scale else x}) -> {x}
  func.return %y : {x}
}}"""


def test_float_check_draws_again_outside_the_domain() -> None:
    """With seed 1 the epsilon input is below -mean(x²): the reference itself is NaN there. The
    float check draws fresh inputs instead of rejecting a correct candidate, and still rejects a
    wrong one."""
    from mk.dialects import make_context
    from mk.passes.nn_to_mugraph import NnToMugraphPass
    from mk.passes.search.verify import float_check

    target = load_module(_rms_eps(scale=True))
    first = run_reference(target, *random_inputs(entry_function(target), 1), entry="rms")
    assert not np.isfinite(np.asarray(first[0], dtype=np.float64)).all()

    def lowered(src: str) -> ModuleOp:
        module = load_module(src)
        NnToMugraphPass().apply(make_context(), module)
        return module

    errors = float_check(target, lowered(_rms_eps(scale=True)), "rms", seed=1)
    assert errors is not None and all(e <= 1e-5 for e in errors)
    assert float_check(target, lowered(_rms_eps(scale=False)), "rms", seed=1) is None
