"""The superoptimize pass: replaces each small nn function by the cheapest verified μGraph the
search finds, where that beats the rule-based lowering (nn-to-mugraph lowers what is left)."""

from __future__ import annotations

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
from xdsl.ir import Attribute, SSAValue
from xdsl.passes import ModulePass

from mk.diagnostics import MkError
from mk.passes.search import cache
from mk.passes.search.driver import FunctionSearch, SearchOptions
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


def _splice(func: FuncOp, text: str) -> None:
    """Replace func's body ops by the kernels of the cached/searched module's function."""
    from mk.source import load_module

    found = load_module(text)
    new = found.body.block.first_op
    assert isinstance(new, FuncOp)
    block = func.body.block
    mapping: dict[SSAValue, SSAValue] = dict(zip(new.body.block.args, block.args, strict=True))
    old = list(block.ops)
    for op in new.body.block.ops:
        block.add_op(op.clone(value_mapper=mapping))
    for op in reversed(old):
        block.detach_op(op)
    for op in old:
        op.erase(safe_erase=False)


def _search(func: FuncOp, opts: SearchOptions) -> tuple[str, dict[str, object]]:
    try:
        result = FunctionSearch(func, opts).run()
    except Unsupported as e:
        return "", {"chosen": "rules", "reason": str(e)}
    return (str(result.module) if result.module else ""), result.summary()


@dataclass(frozen=True)
class SuperoptimizePass(ModulePass):
    """`superoptimize{budget-s=30 max-ops=7 num-sms=132 seed=0 smem-kb=227 max-nn-ops=12
    progress=false stats=false cache=true cache-dir=""}`."""

    name = "superoptimize"

    budget_s: float | int = 30.0  # wall-clock seconds of enumeration per function
    max_ops: int = 7  # block-graph ops per kernel (inputs and outputs not counted)
    num_sms: int = 132
    seed: int = 0  # verification inputs and keys
    smem_kb: int = 227  # shared memory per block
    max_nn_ops: int = 12  # larger functions are left to the rules
    progress: bool = False  # the progress bar also when stderr is not a terminal
    stats: bool = False  # attach the search statistics as `mk.search` on each function
    cache: bool = True  # on-disk cache (the in-memory one is always used)
    cache_dir: str = ""  # default: mk.compile's cache root

    def options(self) -> SearchOptions:
        if self.budget_s <= 0 or self.max_ops < 1 or self.num_sms < 1 or self.smem_kb < 1:
            raise MkError("superoptimize: budget-s, max-ops, num-sms and smem-kb must be positive")
        progress = True if self.progress else None
        return SearchOptions(
            self.budget_s, self.max_ops, self.num_sms, self.seed, self.smem_kb, progress=progress
        )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        opts = self.options()
        for func in [f for f in op.walk() if isinstance(f, FuncOp) and not f.is_declaration]:
            self._function(func, opts)

    def _function(self, func: FuncOp, opts: SearchOptions) -> None:
        nn_ops = [o for o in func.body.block.ops if o.dialect_name() == "nn"]
        if (
            not nn_ops
            or len(nn_ops) > self.max_nn_ops
            or len(nn_ops) + 1 != len(func.body.block.ops)
        ):
            return
        key_opts = (opts.max_ops, opts.num_sms, opts.seed, opts.smem_kb, opts.budget_s, opts.bits)
        key = cache.canonical_key(func, key_opts)
        hit = cache.load(key, self.cache_dir, self.cache)
        if hit is None:
            hit = _search(func, opts)
            cache.store(key, *hit, self.cache_dir, self.cache)
        text, summary = hit
        RESULTS[func.sym_name.data] = {**summary, "cache_key": key}
        if text:
            _splice(func, text)
        if self.stats:
            func.attributes["mk.search"] = DictionaryAttr({k: _attr(v) for k, v in summary.items()})


__all__ = ["RESULTS", "SuperoptimizePass"]
