"""The search for one nn function: block-graph enumeration per loop choice, tiling sweep, cost
ranking against the rule-based lowering, verification of the winner."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Block, Region
from xdsl.utils.exceptions import VerifyException

from mk.dialects import nn
from mk.dialects.mugraph import GraphDefOp
from mk.passes.cost_model import ProgramCost, Target, function_cost
from mk.passes.search.blockgraph import vocabulary
from mk.passes.search.emit import Tiling, default_tiling, instantiate, smem_bytes, tilings
from mk.passes.search.enumerate import BlockSearch, Found, SearchStats
from mk.passes.search.progress import Progress
from mk.passes.search.target import Problem, attr_float, function_problem
from mk.passes.search.verify import Verdict, verify

MAX_VERIFIED = 4  # candidates verified, cheapest first, before the rules win
ENUMERATION_SHARE = 0.8  # of the budget; the tiling sweep may use the rest


@dataclass(frozen=True)
class SearchOptions:
    budget_s: float = 30.0
    max_ops: int = 7
    num_sms: int = 132
    seed: int = 0
    smem_kb: int = 227  # H200: 227 KiB of shared memory per block
    top_k: int = 3  # graphs whose tilings are swept
    bits: int = 30  # verification: false-positive bound 2^-bits
    max_kernels: int = 2  # kernels per subgraph (2: also try cutting it at an intermediate value)
    progress: bool | None = None  # None: when stderr is a terminal


@dataclass
class Ranked:
    found: Found
    tiling: Tiling
    module: ModuleOp
    cost: ProgramCost

    def order(self) -> tuple[float, int, int, int, bytes]:
        c = self.cost
        return (c.est_seconds, c.tile_load_bytes, c.flops, self.found.op_count(), self.found.sig)


@dataclass
class SearchResult:
    """What the search chose for a function (`module` is None when the rules' lowering won)."""

    name: str
    module: ModuleOp | None
    stats: SearchStats
    rule_cost: ProgramCost | None = None
    best_cost: ProgramCost | None = None
    tiling: str = ""
    verdict: Verdict | None = None
    rejected: list[str] = field(default_factory=list)  # verification failures of cheaper graphs

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = dict(self.stats.as_dict())
        if self.rule_cost is not None:
            out["rule_est_us"] = round(self.rule_cost.est_us, 4)
        if self.best_cost is not None:
            out["found_est_us"] = round(self.best_cost.est_us, 4)
            out["tiling"] = self.tiling
        if self.verdict is not None:
            out["verify_trials"] = self.verdict.trials
            out["verify_log2_bound"] = round(self.verdict.log2_bound, 1)
        out["chosen"] = "search" if self.module is not None else "rules"
        return out


def candidate_module(
    func: FuncOp, p: Problem, found: Found, tiling: Tiling, verify: bool = True
) -> ModuleOp | None:
    """A module holding @name whose body is the one kernel `found` under `tiling`."""
    block = Block(arg_types=[a.type for a in func.body.block.args])
    for new, old in zip(block.args, func.body.block.args, strict=True):
        new.name_hint = old.name_hint
    kernel = instantiate(p, found, tiling, list(block.args), verify)
    if kernel is None:
        return None
    block.add_ops([kernel, ReturnOp(*kernel.results)])
    out = FuncOp(func.sym_name.data, func.function_type, Region(block))
    return ModuleOp([out])


def _function(module: ModuleOp) -> FuncOp:
    op = module.body.block.first_op
    assert isinstance(op, FuncOp)
    return op


def rule_cost(func: FuncOp, num_sms: int, target: Target) -> ProgramCost:
    """The cost of what nn-to-mugraph makes of the function: the better of its CPU default
    (64-column tiles) and its CUDA default (tiles fitted to the SMs' waves)."""
    from mk.dialects import make_context
    from mk.passes.nn_to_mugraph import NnToMugraphPass

    costs = []
    for tile_n in (64, 0):
        module = ModuleOp([func.clone()])
        NnToMugraphPass(num_sms=num_sms, tile_n=tile_n).apply(make_context(), module)
        costs.append(function_cost(_function(module), target))
    return min(costs, key=lambda c: c.est_seconds)


class FunctionSearch:
    """One function's search; `run()` returns the SearchResult."""

    def __init__(self, func: FuncOp, opts: SearchOptions) -> None:
        self.func, self.opts = func, opts
        self.target = Target(num_sms=opts.num_sms)
        self.stats = SearchStats()
        self.progress = Progress(f"@{func.sym_name.data}", opts.budget_s, opts.progress)
        self.deadline = time.monotonic() + opts.budget_s  # enumeration and tiling sweep

    def _tick(self) -> None:
        self.progress.update(self.stats.states, self.stats.candidates)

    def enumerate(self, p: Problem) -> list[Found]:
        factors = [
            attr_float(op, "factor") for op in self.func.body.walk() if isinstance(op, nn.ScaleOp)
        ]
        vocab = vocabulary(p, factors)
        loops: list[int | None] = [*sorted(p.reduced), None]
        start = time.monotonic()
        end = start + ENUMERATION_SHARE * self.opts.budget_s
        found: list[Found] = []
        for i, loop in enumerate(loops):
            now = time.monotonic()
            deadline = now + (end - now) / (len(loops) - i)
            found += BlockSearch(
                p, vocab, loop, self.opts.max_ops, deadline, self.stats, self._tick
            ).run()
        self.stats.seconds = time.monotonic() - start
        self.progress.close(self.stats.states, self.stats.candidates)
        return found

    def _rank(self, p: Problem, found: Found, tiling: Tiling) -> Ranked | None:
        module = candidate_module(self.func, p, found, tiling, verify=False)
        if module is None:
            return None
        kernel = _function(module).body.block.first_op
        assert isinstance(kernel, GraphDefOp)
        if smem_bytes(kernel) > self.opts.smem_kb * 1024:
            return None
        return Ranked(found, tiling, module, function_cost(_function(module), self.target))

    def _first(self, p: Problem, found: Found) -> Ranked | None:
        """`found` at the default tiling, else (it does not fit) at its best tiling."""
        r = self._rank(p, found, default_tiling(p, found, self.opts.num_sms))
        if r is None:
            r = min(self._sweep(p, found), key=Ranked.order, default=None)
        return r

    def _sweep(self, p: Problem, found: Found) -> list[Ranked]:
        """`found` at every tiling that fits, until the budget's deadline."""
        out = []
        for t in tilings(p, found, self.opts.num_sms):
            if time.monotonic() > self.deadline and out:
                break
            if (r := self._rank(p, found, t)) is not None:
                out.append(r)
        return out

    def rank(self, p: Problem, found: list[Found]) -> list[Ranked]:
        """Each graph at the default tiling, then every tiling of the top_k graphs (the sweep
        stops at the budget's deadline)."""
        first = sorted((r for f in found if (r := self._first(p, f))), key=Ranked.order)
        swept = [x for r in first[: self.opts.top_k] for x in self._sweep(p, r.found)]
        return sorted(swept + first, key=Ranked.order)

    def prepare(self) -> tuple[list[Ranked], ProgramCost]:
        """The ranked candidates (not verified yet) and the rules' cost."""
        p = function_problem(self.func)
        ranked = self.rank(p, self.enumerate(p))
        return ranked, rule_cost(self.func, self.opts.num_sms, self.target)

    def run(self) -> SearchResult:
        return self.choose(*self.prepare())

    def choose(self, ranked: list[Ranked], rules: ProgramCost) -> SearchResult:
        """Verify candidates cheapest first; the first that passes and beats the rules wins."""
        name = self.func.sym_name.data
        result = SearchResult(name, None, self.stats, rules)
        target = ModuleOp([self.func.clone()])
        seen: set[bytes] = set()
        for r in ranked:
            if r.found.sig in seen:
                continue  # one verdict per graph: tilings do not change what it computes
            if len(seen) == MAX_VERIFIED or r.cost.est_seconds > rules.est_seconds:
                break
            seen.add(r.found.sig)
            try:
                r.module.verify()  # ranking skipped the IR verifier; what is emitted must pass
            except VerifyException as e:
                result.rejected.append(f"invalid IR: {e}")
                continue
            verdict = verify(target, r.module, name, self.opts.seed, self.opts.bits)
            if verdict.equivalent:
                result.module, result.best_cost, result.verdict = r.module, r.cost, verdict
                result.tiling = r.tiling.describe()
                break
            result.rejected.append(verdict.reason)
        return result
