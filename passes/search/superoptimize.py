"""The superoptimize pass: replaces each nn subgraph (the whole function when it is small) by the
cheapest verified μGraph the search finds, where that beats the rule-based lowering of the same
subgraph (nn-to-mugraph lowers what is left)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    f64,
    i64,
)
from xdsl.dialects.func import FuncOp
from xdsl.ir import Attribute
from xdsl.passes import ModulePass

from mk.diagnostics import MkError
from mk.passes.search import cache
from mk.passes.search.driver import SearchOptions
from mk.passes.search.plans import search_subgraph
from mk.passes.search.subgraphs import Subgraph, subgraphs
from mk.passes.search.target import Unsupported

# The last result of each searched function in this process, by name (for tools and tests).
RESULTS: dict[str, dict[str, object]] = {}


def _attr(value: object) -> Attribute:
    if isinstance(value, bool):
        return StringAttr(str(value).lower())
    if isinstance(value, int):
        return IntegerAttr(value, i64)
    if isinstance(value, float):
        return FloatAttr(value, f64)
    return StringAttr(str(value))


def _search(func: FuncOp, opts: SearchOptions) -> tuple[str, dict[str, object]]:
    try:
        result = search_subgraph(func, opts)
    except Unsupported as e:
        return "", {"chosen": "rules", "reason": str(e)}
    return (str(result.module) if result.module else ""), result.summary()


@dataclass(frozen=True)
class SuperoptimizePass(ModulePass):
    """`superoptimize{budget-s=30 max-ops=7 max-kernels=2 num-sms=132 seed=0 smem-kb=227 max-nn-ops=8
    progress=false stats=false cache=true cache-dir=""}`."""

    name = "superoptimize"

    budget_s: float | int = 30.0  # seconds per subgraph: enumeration and tiling sweep
    max_ops: int = 7  # block-graph ops per kernel (inputs and outputs not counted)
    max_kernels: int = 2  # 2: also try the subgraph as two kernels, cut at a value
    num_sms: int = 132
    seed: int = 0  # verification inputs and keys
    smem_kb: int = 227  # shared memory per block
    max_nn_ops: int = 8  # nn ops per searched subgraph (RMSNorm spelled out + a linear is 7)
    progress: bool = False  # the progress bar also when stderr is not a terminal
    stats: bool = False  # attach the search statistics as `mk.search` on each function
    cache: bool = True  # on-disk cache (the in-memory one is always used)
    cache_dir: str = ""  # default: mk.compile's cache root

    def options(self) -> SearchOptions:
        if min(self.budget_s, self.max_ops, self.num_sms, self.smem_kb, self.max_kernels) <= 0:
            raise MkError(
                "superoptimize: budget-s, max-ops, num-sms, smem-kb and max-kernels must be positive"
            )
        progress = True if self.progress else None
        return SearchOptions(
            self.budget_s, self.max_ops, self.num_sms, self.seed, self.smem_kb,
            progress=progress, max_kernels=self.max_kernels,
        )  # fmt: skip

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        opts = self.options()
        for func in [f for f in op.walk() if isinstance(f, FuncOp) and not f.is_declaration]:
            summaries = [
                self._subgraph(part, f"{func.sym_name.data}.{i}", opts)
                for i, part in enumerate(subgraphs(func, self.max_nn_ops))
            ]
            if len(summaries) == 1:
                RESULTS[func.sym_name.data] = RESULTS.pop(f"{func.sym_name.data}.0")
            if self.stats:
                for i, summary in enumerate(summaries):
                    key = "mk.search" if len(summaries) == 1 else f"mk.search.{i}"
                    func.attributes[key] = DictionaryAttr({k: _attr(v) for k, v in summary.items()})

    def _subgraph(self, part: Subgraph, name: str, opts: SearchOptions) -> dict[str, object]:
        """Search (or look up) one subgraph and splice in the kernels when the search won."""
        func = part.extract(name)
        key = cache.canonical_key(func, dataclasses.replace(opts, progress=None))
        hit = cache.load(key, self.cache_dir, self.cache)
        if hit is None:
            hit = _search(func, opts)
            cache.store(key, *hit, self.cache_dir, self.cache)
        text, summary = hit
        RESULTS[name] = {**summary, "cache_key": key}
        if text:
            from mk.source import load_module

            kernels = load_module(text).body.block.first_op
            assert isinstance(kernels, FuncOp)
            part.replace(kernels)
        return summary


__all__ = ["RESULTS", "SuperoptimizePass"]
