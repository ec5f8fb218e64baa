"""mugraph-append-writes: a cache write at one index becomes an in-place output of the kernel
that made its rows.

A `mugraph.kernel "cache_write"` (cache, new, index) into a donated argument costs a task and a
hop between the kernel that makes `new` and every reader of the cache: in a decode layer, the K
rows' QK-norm + RoPE and the attention. When `new` is a graph_def's result that only the write
reads, the graph_def writes those rows into the cache itself: its output becomes
`mugraph.output ... at %index dim D over %cache` and its result the written cache (in the
argument's own buffer), and the write kernel goes.

Conditions, each checked: the cache is a donated argument of the function and the index one
element; the graph_def's output of `new` is a plain one (its blocks may split D: a prefill's
rows land side by side from the index), and `new` is the cache's shape but for D; the write is `new`'s only user; nothing else uses the cache
after the graph_def (the write moves up to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from mk.diagnostics import MkError
from mk.dialects.mugraph import FUSED_ATTR, GraphDefOp, InputOp, KernelOp, OutputOp
from mk.dialects.mugraph_base import shape_of, tensor_type
from mk.dialects.nn_decode import donated_arg


@dataclass(frozen=True)
class Append:
    """A cache write whose rows `producer` makes, written by `out` (result `index`)."""

    write: KernelOp
    producer: GraphDefOp
    out: OutputOp
    index: int
    dim: int


def _later_uses(value: SSAValue, after: Operation, but: Operation) -> bool:
    """Whether an op other than `but` uses `value` after `after` in their block."""
    block = after.parent_block()
    assert block is not None
    at = block.get_operation_index(after)
    return any(
        u.operation is not but
        and u.operation.parent_block() is block
        and block.get_operation_index(u.operation) > at
        for u in value.uses
    )


def match_append(write: KernelOp) -> Append | None:
    """The in-place form of `write`, or None when a condition fails."""
    if write.kind.data != "cache_write" or len(write.operands) != 3:
        return None
    cache, new, index = write.operands
    dim_attr = write.attributes.get("dim")
    if not isinstance(dim_attr, IntegerAttr) or donated_arg(cache) is None:
        return None
    dim = dim_attr.value.data
    producer = new.owner
    if not isinstance(producer, GraphDefOp) or math.prod(shape_of(index)) != 1:
        return None
    if len(list(new.uses)) != 1 or _later_uses(cache, producer, write):
        return None
    k = producer.res.index(new)
    outs = [o for o in producer.output_ops() if o.result_index() == k]
    if len(outs) != 1 or outs[0].over() is not None:
        return None
    want = list(shape_of(cache))
    if len(want) != len(shape_of(new)) or not 0 <= dim < len(want):
        return None  # a slab read through a reshape
    want[dim] = shape_of(new)[dim]
    if (
        tuple(want) != shape_of(new)
        or tensor_type(new).element_type != tensor_type(cache).element_type
    ):
        return None
    return Append(write, producer, outs[0], k, dim)


def appended(a: Append) -> GraphDefOp:
    """The producer with its output of the rows written into the cache at the index."""
    producer, (cache, _, index) = a.producer, a.write.operands
    operands = [*producer.args, cache, index]
    results: list[Attribute] = [r.type for r in producer.res]
    results[a.index] = cache.type
    block = Block(arg_types=[v.type for v in operands] + results)
    remap: dict[SSAValue, SSAValue] = {}
    olds = (*producer.input_args(), *producer.result_args())
    news = (*block.args[: len(producer.args)], *block.args[len(operands) :])
    for old, arg in zip(olds, news, strict=True):
        remap[old] = arg
        arg.name_hint = old.name_hint
    cache_arg, index_arg = block.args[len(producer.args) : len(operands)]
    cache_arg.name_hint = f"{cache.name_hint or 'cache'}_a"
    index_arg.name_hint = f"{index.name_hint or 'at'}_a"
    out = a.out
    for op in producer.body.block.ops:
        if op is not out:
            block.add_op(op.clone(value_mapper=remap))
            continue
        pos = InputOp(index_arg, (-1, -1, -1), -1, index.type)
        pos.tile.name_hint = f"{a.write.results[0].name_hint or 'c'}_at"
        block.add_op(pos)
        placed = (pos.tile, a.dim, cache_arg)
        block.add_op(OutputOp(remap[out.tile], remap[out.dest], out.omap_dims(), placed))
    made = GraphDefOp(
        operands, results, producer.grid_shape(), producer.thread_count(),
        producer.forloop_range(), Region(block),
    )  # fmt: skip
    label = producer.attributes.get(FUSED_ATTR)
    made.attributes[FUSED_ATTR] = StringAttr(
        f"{label.data if isinstance(label, StringAttr) else 'graph'}+cache_write"
    )
    for n, (new, old) in enumerate(zip(made.res, producer.res, strict=True)):
        new.name_hint = a.write.results[0].name_hint if n == a.index else old.name_hint
    made.location = producer.location
    return made


def append_writes(module: ModuleOp) -> int:
    """Applies every append in `module`; returns how many."""
    count = 0
    for write in [op for op in module.walk() if isinstance(op, KernelOp)]:
        a = match_append(write)
        if a is None:
            continue
        made = appended(a)
        block = a.producer.parent_block()
        assert block is not None
        block.insert_op_before(made, a.producer)
        for n, (old, new) in enumerate(zip(a.producer.res, made.res, strict=True)):
            if n != a.index:
                old.replace_all_uses_with(new)
        a.write.results[0].replace_all_uses_with(made.res[a.index])
        block.erase_op(a.write)
        block.erase_op(a.producer)
        count += 1
    return count


@dataclass(frozen=True)
class MugraphAppendWritesPass(ModulePass):
    """`mugraph-append-writes{append-writes=1}`: 0 leaves every cache write its own kernel."""

    name = "mugraph-append-writes"

    append_writes: int = 1

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.append_writes not in (0, 1):
            raise MkError("mugraph-append-writes: append-writes must be 0 or 1")
        if self.append_writes:
            append_writes(op)
