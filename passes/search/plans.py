"""Kernel graphs of two kernels: the subgraph cut at one of its intermediate values, each side
searched as a kernel of its own (or left to the rules), kept when the pair is cheaper than the
best single kernel and than the rules' lowering of the whole."""

from __future__ import annotations

import dataclasses
import math
import time

from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Operation, SSAValue

from mk.passes.cost_model import ProgramCost, Target
from mk.passes.search.driver import FunctionSearch, SearchOptions, SearchResult
from mk.passes.search.enumerate import SearchStats
from mk.passes.search.subgraphs import Subgraph
from mk.passes.search.verify import Verdict, float_check

WHOLE_SHARE = 0.75  # of the budget for the single-kernel search; cuts share the rest


def _body(func: FuncOp) -> list[Operation]:
    return [op for op in func.body.block.ops if not isinstance(op, ReturnOp)]


def _outputs(func: FuncOp) -> list[SSAValue]:
    ret = func.body.block.last_op
    assert isinstance(ret, ReturnOp)
    return list(ret.operands)


def cut_points(func: FuncOp) -> list[tuple[int, int]]:
    """(op index, result index) of each intermediate value, in program order."""
    outs = set(_outputs(func))
    return [
        (i, r.index)
        for i, op in enumerate(_body(func))
        for r in op.results
        if r.uses and r not in outs
    ]


def _closure(func: FuncOp, roots: list[SSAValue], stop: SSAValue | None) -> Subgraph:
    body = _body(func)
    members, chosen = set(body), set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        op = v.owner
        if v is stop or not isinstance(op, Operation) or op not in members or op in chosen:
            continue
        chosen.add(op)
        stack.extend(op.operands)
    return Subgraph.of([op for op in body if op in chosen], roots)


def two_parts(func: FuncOp, cut: tuple[int, int]) -> tuple[Subgraph, Subgraph] | None:
    """The cone of the cut value, and the rest reading it (None if the rest does not)."""
    v = _body(func)[cut[0]].results[cut[1]]
    second = _closure(func, _outputs(func), v)
    if v not in second.inputs:
        return None
    return _closure(func, [v], None), second


@dataclasses.dataclass
class _Side:
    result: SearchResult

    def cost(self) -> ProgramCost:
        r = self.result
        chosen = r.best_cost if r.module is not None else r.rule_cost
        assert chosen is not None
        return chosen

    def kernels(self) -> FuncOp | None:
        if self.result.module is None:
            return None
        func = self.result.module.body.block.first_op
        assert isinstance(func, FuncOp)
        return func


def _merge(into: SearchStats, other: SearchStats) -> None:
    for f in dataclasses.fields(SearchStats):
        if f.name == "visited":
            into.visited |= other.visited
        elif f.name == "budget_exhausted":
            into.budget_exhausted |= other.budget_exhausted
        elif f.name != "seconds":
            setattr(into, f.name, getattr(into, f.name) + getattr(other, f.name))
    into.seconds += other.seconds


def _compose(func: FuncOp, cut: tuple[int, int], sides: list[_Side]) -> ModuleOp:
    """The function with the second part, then the first, replaced by their kernels."""
    module = ModuleOp([func.clone()])
    clone = module.body.block.first_op
    assert isinstance(clone, FuncOp)
    parts = two_parts(clone, cut)
    assert parts is not None
    for part, side in reversed(list(zip(parts, sides, strict=True))):
        kernels = side.kernels()
        if kernels is not None:
            part.replace(kernels)
    return module


def two_kernel_plan(
    func: FuncOp, cut: tuple[int, int], opts: SearchOptions, stats: SearchStats,
    beat: float = math.inf,
) -> tuple[ModuleOp, ProgramCost, Verdict] | None:  # fmt: skip
    """The subgraph as two kernels cut at `cut`, if their estimated time can be below `beat`
    (checked before anything is verified)."""
    parts = two_parts(func, cut)
    if parts is None:
        return None
    name = func.sym_name.data
    searches = [FunctionSearch(part.extract(f"{name}.k{k}"), opts) for k, part in enumerate(parts)]
    prepared = [s.prepare() for s in searches]
    for s in searches:
        _merge(stats, s.stats)
    hope = sum(
        min([r.cost.est_seconds for r in ranked[:1]] + [rules.est_seconds])
        for ranked, rules in prepared
    )
    if hope >= beat or all(not ranked for ranked, _ in prepared):
        return None  # cannot win, or the rules with one more kernel boundary
    sides = [_Side(s.choose(*p)) for s, p in zip(searches, prepared, strict=True)]
    if all(s.kernels() is None for s in sides):
        return None
    target = Target(num_sms=opts.num_sms)
    cost = ProgramCost.total(name, [k for s in sides for k in s.cost().per_kernel], target)
    module = _compose(func, cut, sides)
    errors = float_check(ModuleOp([func.clone()]), module, name, opts.seed)
    if errors is None:
        return None
    verdicts = [s.result.verdict for s in sides if s.result.verdict is not None]
    bound = math.log2(sum(2.0**v.log2_bound for v in verdicts))  # union bound over the parts
    trials = sum(v.trials for v in verdicts)
    return module, cost, Verdict(True, "each searched kernel verified", trials, bound, [], errors)


def search_subgraph(func: FuncOp, opts: SearchOptions) -> SearchResult:
    """The best of one kernel, two kernels (cut at an intermediate value) and the rules."""
    deadline = time.monotonic() + opts.budget_s
    cuts = cut_points(func) if opts.max_kernels > 1 else []
    whole_opts = dataclasses.replace(opts, budget_s=opts.budget_s * WHOLE_SHARE) if cuts else opts
    best = FunctionSearch(func, whole_opts).run()
    if not cuts:
        return best
    # Each side of a cut is verified to 2^-(bits+1): the union bound keeps the pair at 2^-bits.
    part_opts = dataclasses.replace(
        opts,
        budget_s=opts.budget_s * (1 - WHOLE_SHARE) / 2 / len(cuts),
        bits=opts.bits + 1,
        max_kernels=1,
    )
    for cut in cuts:
        if time.monotonic() > deadline:
            break  # the budget is spent: the cuts not tried yet are not tried
        current = best.best_cost if best.module is not None else best.rule_cost
        beat = current.est_seconds if current is not None else math.inf
        plan = two_kernel_plan(func, cut, part_opts, best.stats, beat)
        if plan is None:
            continue
        module, cost, verdict = plan
        if cost.est_seconds < beat:
            best.module, best.best_cost, best.verdict = module, cost, verdict
            best.tiling = f"2 kernels cut at value #{cut[0]}"
    return best
