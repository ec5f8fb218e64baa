"""mugraph-fuse-epilogue: a kernel whose every block reads the tile one block of its producer
writes runs in that block, after the producer's graph.

A graph_def C whose block b reads exactly the tile that block b of graph_def P writes costs a
phase of its own: a task per block that loads what P's block had in hand, its event and a hop.
In a decode step that is the partial argmax over the lm_head's logits, each block taking the
vocabulary rows one lm_head block computed. Here P's blocks run C's graph on the tile they
write, and C's results become results of P (after P's own); P still writes its result.

Conditions, each checked: C has one operand, a result of P, which one input op reads with no
for-loop chunk; C's grid is P's and its for-loop 1; P writes that result with one plain output
(no position, no accumulation) of a tile of the result's element type, C's tile type, whose
omap is C's imap; C holds only element, reduction, reshape, position and argmax ops and plain
outputs, each of a tile smaller than the one it reads: C reduces P's tile. (An element-wise C
would make P write its result and C's beside it; fusing those is nn-to-mugraph's part.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Block, Region, SSAValue
from xdsl.passes import ModulePass

from mk.dialects.mugraph import FUSED_ATTR, GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of, tensor_type

# C's ops that recompute nothing costly and read no other operand.
EPILOGUE_OPS = frozenset(
    {"mugraph.input", "mugraph.output", "mugraph.reshape", "mugraph.thread_map",
     "mugraph.binary", "mugraph.unary", "mugraph.reduce", "mugraph.position", "mugraph.argmax"}
)  # fmt: skip


@dataclass(frozen=True)
class Epilogue:
    """`consumer`, whose input op `read` takes the tile `written` stores of `producer`."""

    producer: GraphDefOp
    consumer: GraphDefOp
    read: InputOp
    written: OutputOp


def plain_writer(producer: GraphDefOp, index: int) -> OutputOp | None:
    """The one plain output that writes the producer's result `index`, of a tile of the
    result's element type (what a reader of the result loads is that tile)."""
    arg = producer.result_args()[index]
    outs = [u.operation for u in arg.uses if isinstance(u.operation, OutputOp)]
    if len(outs) != 1 or not outs[0].is_plain():
        return None
    value = producer.res[index]
    if tensor_type(outs[0].tile).element_type != tensor_type(value).element_type:
        return None
    return outs[0]


def match_epilogue(consumer: GraphDefOp) -> Epilogue | None:
    """The producer block `consumer` can run in, or None when a condition fails."""
    if len(consumer.args) != 1 or consumer.forloop_range() != 1:
        return None
    if any(op.name not in EPILOGUE_OPS for op in consumer.body.block.ops):
        return None
    reads = [u.operation for u in consumer.input_args()[0].uses]
    if len(reads) != 1 or not isinstance(read := reads[0], InputOp) or read.fmap_dim() >= 0:
        return None
    size = math.prod(shape_of(read.tile))
    for out in consumer.output_ops():
        if not out.is_plain() or math.prod(shape_of(out.tile)) >= size:
            return None
    value = consumer.args[0]
    producer = value.owner
    if not isinstance(producer, GraphDefOp) or producer.grid_shape() != consumer.grid_shape():
        return None
    written = plain_writer(producer, producer.res.index(value))
    if written is None or written.omap_dims() != read.imap_dims():
        return None
    if written.tile.type != read.tile.type:
        return None
    return Epilogue(producer, consumer, read, written)


def fuse(e: Epilogue) -> GraphDefOp:
    """The producer with the consumer's graph after its own and the consumer's results after
    its results."""
    producer, consumer = e.producer, e.consumer
    types = [r.type for r in (*producer.res, *consumer.res)]
    block = Block(arg_types=[v.type for v in producer.args] + types)
    old_args = (*producer.input_args(), *producer.result_args(), *consumer.result_args())
    remap: dict[SSAValue, SSAValue] = {}
    for new, old in zip(block.args, old_args, strict=True):
        new.name_hint = old.name_hint
        remap[old] = new
    for op in producer.body.block.ops:
        block.add_op(op.clone(value_mapper=remap))
    remap[e.read.tile] = remap[e.written.tile]
    for op in consumer.body.block.ops:
        if op is not e.read:
            block.add_op(op.clone(value_mapper=remap))
    fused = GraphDefOp(
        list(producer.args), types, producer.grid_shape(), producer.thread_count(),
        producer.forloop_range(), Region(block),
    )  # fmt: skip
    label = producer.attributes.get(FUSED_ATTR)
    kept = label.data if isinstance(label, StringAttr) else "graph"
    fused.attributes[FUSED_ATTR] = StringAttr(f"{kept}+epilogue")
    for new, old in zip(fused.res, (*producer.res, *consumer.res), strict=True):
        new.name_hint = old.name_hint
    return fused


def fuse_epilogues(module: ModuleOp) -> int:
    """Applies every epilogue fusion in `module`; returns how many."""
    count = 0
    for consumer in [op for op in module.walk() if isinstance(op, GraphDefOp)]:
        e = match_epilogue(consumer)
        if e is None:
            continue
        fused = fuse(e)
        parent = e.producer.parent_block()
        assert parent is not None
        parent.insert_op_before(fused, e.producer)
        for old, new in zip((*e.producer.res, *consumer.res), fused.res, strict=True):
            old.replace_all_uses_with(new)
        # The consumer's readers now read a result defined before them; erase it, then P.
        parent.erase_op(consumer)
        parent.erase_op(e.producer)
        count += 1
    return count


@dataclass(frozen=True)
class MugraphFuseEpiloguePass(ModulePass):
    """`mugraph-fuse-epilogue{epilogues=true}`: epilogues=false fuses nothing."""

    name = "mugraph-fuse-epilogue"

    epilogues: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.epilogues:
            fuse_epilogues(op)
