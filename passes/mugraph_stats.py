"""mugraph-stats: annotate every mugraph kernel and function with the cost model's counts.

Each `mugraph.graph_def` / `mugraph.kernel` gets a discardable attribute

    mugraph.cost = {read_bytes = .. : i64, write_bytes = .., tile_load_bytes = .., flops = .., blocks = ..}

and each defined `func.func` the totals of its kernels plus `kernels` and `est_us` (the
estimated time in microseconds on the target the options describe). The IR is otherwise
unchanged; see `mk.passes.cost_model` for what the numbers mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import DictionaryAttr, FloatAttr, IntegerAttr, ModuleOp, f64, i64
from xdsl.dialects.func import FuncOp
from xdsl.ir import Attribute
from xdsl.passes import ModulePass

from mk.passes.cost_model import KernelCost, ProgramCost, Target, kernel_cost, kernel_ops

COST_ATTR = "mugraph.cost"


def _ints(**values: int) -> dict[str, Attribute]:
    return {k: IntegerAttr(v, i64) for k, v in values.items()}


def kernel_cost_attr(cost: KernelCost) -> DictionaryAttr:
    return DictionaryAttr(
        _ints(
            read_bytes=cost.dram_read_bytes,
            write_bytes=cost.dram_write_bytes,
            tile_load_bytes=cost.tile_load_bytes,
            flops=cost.flops,
            blocks=cost.blocks,
        )
    )


def program_cost_attr(cost: ProgramCost) -> DictionaryAttr:
    ints = _ints(
        read_bytes=cost.dram_read_bytes,
        write_bytes=cost.dram_write_bytes,
        tile_load_bytes=cost.tile_load_bytes,
        flops=cost.flops,
        blocks=cost.blocks,
        kernels=cost.kernels,
    )
    # rounded to a nanosecond so the printed IR stays short and stable
    return DictionaryAttr({**ints, "est_us": FloatAttr(round(cost.est_us, 3), f64)})


@dataclass(frozen=True)
class MugraphStatsPass(ModulePass):
    """`mugraph-stats{num_sms=132 bandwidth_gbs=4100.0 peak_tflops=740.0}`."""

    name = "mugraph-stats"

    num_sms: int = 132
    bandwidth_gbs: float = 4100.0
    peak_tflops: float = 740.0

    def target(self) -> Target:
        return Target(
            num_sms=self.num_sms,
            bandwidth=self.bandwidth_gbs * 1e9,
            peak_flops=self.peak_tflops * 1e12,
        )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        target = self.target()
        for func in op.walk():
            if not isinstance(func, FuncOp) or func.is_declaration:
                continue
            costs: list[KernelCost] = []
            for kernel in kernel_ops(func):
                cost = kernel_cost(kernel, target)
                kernel.attributes[COST_ATTR] = kernel_cost_attr(cost)
                costs.append(cost)
            total = ProgramCost.total(func.sym_name.data, costs, target)
            func.attributes[COST_ATTR] = program_cost_attr(total)
