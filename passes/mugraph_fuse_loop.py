"""mugraph-fuse-loop: a producer graph_def's blocks become the for-loop iterations of its consumer.

A consumer that walks a tensor along one dim in F for-loop chunks, every block reading all of
it (imap all -1), while that tensor's producer writes it in F blocks along the same dim, can
compute the chunk itself: iteration i runs block i's graph. The producer's kernel, its event and
the hop between the two disappear from the task graph; each consumer block recomputes the whole
producer instead (`mugraph-fuse-loop{fold-bytes=N}` bounds what that reads per consumer block).
Where `mugraph-split-loop` will then give each block M of the loop's L iterations
(`split-loop=M`, that pass's option), a block reads M / L of the producer's operands, and the
bound is on that share.

This is the split-KV attention merge folded into the o-projection of a decode step: the merge
(one block per KV head) is cheap, and the linear group that reads its result walks K in the
merge's blocks (`nn-to-mugraph` picks that chunk when it sees such a pair).

Conditions, each checked: the producer has one result, one writer of it, a for-loop of 1,
exactly one grid dim of more than one block (its extent the consumer's loop), only element,
reduction and reshape ops (no matmul worth not repeating), and an output tile exactly the
consumer's chunk, in the same dtype; the consumer is its result's only user, through one input
op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, TensorType
from xdsl.ir import Block, Region, SSAValue
from xdsl.passes import ModulePass

from mk.diagnostics import MkError
from mk.dialects.mugraph import FUSED_ATTR, GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import tensor_type
from mk.passes.mugraph_split_loop import match as split_match

FOLDABLE = frozenset(
    {"mugraph.input", "mugraph.output", "mugraph.reshape", "mugraph.thread_map",
     "mugraph.binary", "mugraph.unary", "mugraph.reduce"}
)  # fmt: skip


@dataclass(frozen=True)
class LoopFold:
    """A producer whose grid dim `dim` becomes `consumer`'s for-loop, feeding input `read`."""

    producer: GraphDefOp
    consumer: GraphDefOp
    read: InputOp
    dim: int


def _nbytes(t: TensorType) -> int:
    bits = getattr(t.element_type, "bitwidth", 32)
    return math.prod(t.get_shape()) * max(1, int(bits) // 8)


def _sole_reader(producer: GraphDefOp) -> tuple[GraphDefOp, InputOp] | None:
    """The graph_def reading the producer's one result, and its one input op reading it."""
    uses = list(producer.res[0].uses)
    if len(uses) != 1 or not isinstance(consumer := uses[0].operation, GraphDefOp):
        return None
    reads = [u.operation for u in consumer.input_args()[uses[0].index].uses]
    if len(reads) != 1 or not isinstance(read := reads[0], InputOp):
        return None
    return consumer, read


def _loop_dim(producer: GraphDefOp, forloop: int) -> int | None:
    grid = producer.grid_shape()
    wide = [a for a, n in enumerate(grid) if n > 1]
    return wide[0] if len(wide) == 1 and grid[wide[0]] == forloop else None


def match_fold(producer: GraphDefOp, fold_bytes: int | None) -> LoopFold | None:
    """The fold of `producer` into its consumer's loop, or None when a condition fails (None
    for `fold_bytes`: whatever the producer reads)."""
    if len(producer.res) != 1 or producer.forloop_range() != 1:
        return None
    if any(op.name not in FOLDABLE for op in producer.body.block.ops):
        return None
    found = _sole_reader(producer)
    if found is None:
        return None
    consumer, read = found
    dim = _loop_dim(producer, consumer.forloop_range())
    if dim is None or any(d >= 0 for d in read.imap_dims()) or read.fmap_dim() < 0:
        return None
    (out,) = producer.output_ops()
    if out.omap_dims()[dim] != read.fmap_dim() or out.tile.type != read.tile.type:
        return None
    if any(op.fmap_dim() >= 0 for op in producer.input_ops()):
        return None
    if fold_bytes is not None and reads(producer) > fold_bytes:
        return None
    return LoopFold(producer, consumer, read, dim)


def reads(producer: GraphDefOp) -> int:
    """What a consumer block reads to recompute the whole producer: all of its operands."""
    return sum(_nbytes(tensor_type(v)) for v in producer.args)


def _operands(fold: LoopFold) -> list[SSAValue]:
    """The fused kernel's operands: the consumer's (less the folded result), then the
    producer's it does not already read."""
    kept = [v for v in fold.consumer.args if v is not fold.producer.res[0]]
    return kept + [v for v in dict.fromkeys(fold.producer.args) if v not in kept]


def fuse(fold: LoopFold) -> GraphDefOp:
    """The consumer with the producer's graph in its loop, in the consumer's place."""
    producer, consumer = fold.producer, fold.consumer
    operands = _operands(fold)
    block = Block(arg_types=[v.type for v in operands] + [r.type for r in consumer.res])
    names = {
        v: a.name_hint
        for g in (producer, consumer)
        for a, v in zip(g.input_args(), g.args, strict=True)
    }
    for new, v in zip(block.args, operands, strict=False):
        new.name_hint = names.get(v)
    arg_of: dict[SSAValue, SSAValue] = dict(zip(operands, block.args, strict=False))
    remap: dict[SSAValue, SSAValue] = {}
    for a, v in zip(consumer.input_args(), consumer.args, strict=True):
        if v is not producer.res[0]:
            remap[a] = arg_of[v]
    for a, r in zip(consumer.result_args(), block.args[len(operands) :], strict=True):
        remap[a] = r
        r.name_hint = a.name_hint
    for op in consumer.body.block.ops:
        if op is fold.read:
            remap[fold.read.tile] = _inline_producer(fold, block, arg_of)
            continue
        block.add_op(op.clone(value_mapper=remap))
    fused = GraphDefOp(
        operands, [r.type for r in consumer.res], consumer.grid_shape(),
        consumer.thread_count(), consumer.forloop_range(), Region(block),
    )  # fmt: skip
    label = consumer.attributes.get(FUSED_ATTR)
    kept = label.data if isinstance(label, StringAttr) else "graph"
    fused.attributes[FUSED_ATTR] = StringAttr(f"loop+{kept}")
    for new, old in zip(fused.res, consumer.res, strict=True):
        new.name_hint = old.name_hint
    return fused


def _inline_producer(fold: LoopFold, block: Block, arg_of: dict[SSAValue, SSAValue]) -> SSAValue:
    """The producer's graph for iteration i (its block i along the loop dim); the tile it
    writes, which stands for the consumer's read."""
    producer = fold.producer
    remap: dict[SSAValue, SSAValue] = dict(
        (a, arg_of[v]) for a, v in zip(producer.input_args(), producer.args, strict=True)
    )
    written: SSAValue | None = None
    for op in producer.body.block.ops:
        if isinstance(op, OutputOp):
            written = remap[op.tile]
        elif isinstance(op, InputOp):
            along = op.imap_dims()[fold.dim]
            new = InputOp(remap[op.source], (-1, -1, -1), along, op.tile.type)
            new.tile.name_hint = op.tile.name_hint
            block.add_op(new)
            remap[op.tile] = new.tile
        else:
            block.add_op(op.clone(value_mapper=remap))
    assert written is not None
    return written


def fuse_loops(module: ModuleOp, fold_bytes: int, split_loop: int = 0) -> int:
    """Applies every fold in `module`; returns how many. With `split_loop` = N > 0 a fold that
    reads more than `fold_bytes` is still made where mugraph-split-loop will give each block N
    of its L iterations, so that a block reads N / L of it, and that is within the bound."""
    count = 0
    for producer in [op for op in module.walk() if isinstance(op, GraphDefOp)]:
        if producer.parent is None:  # a consumer an earlier fold replaced
            continue
        fold = match_fold(producer, None if split_loop > 0 else fold_bytes)
        if fold is None:
            continue
        consumer = fold.consumer
        parent = consumer.parent_block()
        assert parent is not None
        fused = fuse(fold)
        _replace(consumer, fused)
        total = reads(producer)
        if total > fold_bytes and not _splits_within(fused, total, fold_bytes, split_loop):
            _replace(fused, consumer)
            parent.erase_op(fused)
            continue
        parent.erase_op(consumer)
        parent.erase_op(producer)
        count += 1
    return count


def _replace(old: GraphDefOp, new: GraphDefOp) -> None:
    """`new` in `old`'s place (inserted before it where it is not in the block yet)."""
    if new.parent is None:
        parent = old.parent_block()
        assert parent is not None
        parent.insert_op_before(new, old)
    for a, b in zip(old.res, new.res, strict=True):
        a.replace_all_uses_with(b)


def _splits_within(fused: GraphDefOp, total: int, fold_bytes: int, per_block: int) -> bool:
    """Whether mugraph-split-loop will split `fused` (its readers as they are now) into blocks
    of `per_block` iterations that each read at most `fold_bytes` of the `total`."""
    if per_block <= 0 or split_match(fused, per_block) is None:
        return False
    return total * per_block // fused.forloop_range() <= fold_bytes


# What each consumer block may read to recompute the producer: qwen3-0.6b's and llama-3.2-1b's
# merge inputs (16 splits of 2,048 floats) fit; an 8B model's take 8 splits to fit
# (nn-to-mugraph's kv-splits choice sizes them to this).
DEFAULT_FOLD_BYTES = 160 << 10


@dataclass(frozen=True)
class MugraphFuseLoopPass(ModulePass):
    """`mugraph-fuse-loop{fold-bytes=163840 split-loop=1}`: fold-bytes 0 folds nothing;
    split-loop (mugraph-split-loop's option, routed to both) bounds a block's share of a fold
    that pass will split instead of the whole fold; 0 bounds the whole."""

    name = "mugraph-fuse-loop"

    fold_bytes: int = DEFAULT_FOLD_BYTES
    split_loop: int = 1

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.fold_bytes < 0:
            raise MkError("mugraph-fuse-loop: fold-bytes must be >= 0")
        if self.split_loop < 0:
            raise MkError("mugraph-fuse-loop: split-loop must be >= 0")
        fuse_loops(op, self.fold_bytes, self.split_loop)
