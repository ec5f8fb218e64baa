"""Flagged buffers of mugraph-to-task: activations whose readers wait on the values themselves.

With `flag-values`, an activation written by one graph_def and read only by graph_defs that
load it plainly (a streamed linear's activation side, or an element-wise load: no attention,
no merge of split partials, no library kernel, no output copy) becomes `flagged`: each element
is stored with the flag of the iteration that wrote it, so a reader's load is its wait. The
read-after-write dependences through such buffers become `flagged` events
(mugraph_to_task_events), which a backend may realise by the flags alone; every other
dependence keeps its counter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type
from xdsl.ir import BlockArgument, SSAValue

from mk.dialects.mugraph import GraphDefOp, InputOp, KernelOp
from mk.dialects.mugraph_tiles import (
    AccumOp,
    AccumSoftmaxOp,
    BinaryOp,
    MatmulOp,
    ReduceOp,
    ReshapeOp,
    RMSNormOp,
    RopeOp,
    ThreadMapOp,
    UnaryOp,
)
from mk.passes.mugraph_to_task_buffers import BufferPlan

Kernel = GraphDefOp | KernelOp
# Tile ops whose operands the emitters load element-wise (load_runs), never in place.
_LOADED = (ThreadMapOp, BinaryOp, UnaryOp, ReduceOp, RMSNormOp, RopeOp)
_FLAG_TYPES = (BFloat16Type, Float16Type, Float32Type)


def _weight_tile(
    value: SSAValue, kernel: GraphDefOp, is_weight: Callable[[SSAValue], bool]
) -> bool:
    """Whether a tile is read straight from a weight operand of the kernel."""
    op = value.owner
    return isinstance(op, InputOp) and is_weight(kernel.operands[op.source_index()])


def _plain_use(tile: SSAValue, kernel: GraphDefOp, is_weight: Callable[[SSAValue], bool]) -> bool:
    """Whether every use of a tile read from a flagged buffer has a flagged read: a streamed
    linear's activation (the matmul's left side against a weight, its Σx²) or a load."""
    for use in tile.uses:
        op = use.operation
        if isinstance(op, ReshapeOp):
            if not _plain_use(op.res, kernel, is_weight):
                return False
        elif isinstance(op, MatmulOp):
            if use.index != 0 or not _weight_tile(op.operands[1], kernel, is_weight):
                return False
        elif not isinstance(op, (AccumOp, *_LOADED)):
            return False
    return True


def reads_plainly(kernel: Kernel, value: SSAValue, is_weight: Callable[[SSAValue], bool]) -> bool:
    """Whether `kernel` reads `value` only in ways that can wait on its flags."""
    if not isinstance(kernel, GraphDefOp):
        return False
    ops = list(kernel.body.block.ops)
    if any(isinstance(op, AccumSoftmaxOp) for op in ops):
        return False  # attention reads its q (and new k/v rows) in place
    if any(isinstance(op, ReduceOp) and op.dim.value.data == 0 for op in ops):
        # A reduction over the leading (split) dim merges split partials, which a backend may
        # do with one call that reads them in place (the CUDA merge).
        return False
    args = [a for i, a in enumerate(kernel.input_args()) if kernel.operands[i] is value]
    for arg in args:
        for use in arg.uses:
            op = use.operation
            if not isinstance(op, InputOp) or not _plain_use(op.tile, kernel, is_weight):
                return False
    return True


def flag_buffers(
    buffers: Sequence[BufferPlan],
    kernels: Sequence[Kernel],
    value_of: dict[str, SSAValue],
    is_weight: Callable[[SSAValue], bool],
) -> None:
    """Marks every activation that can be flagged (see the module docstring)."""
    for buf in buffers:
        value = value_of.get(buf.name)
        if buf.kind != "activation" or value is None or buf.writer is None:
            continue
        if not isinstance(buf.type.get_element_type(), _FLAG_TYPES):
            continue
        if buf.writer >= len(kernels) or not isinstance(kernels[buf.writer], GraphDefOp):
            continue
        readers = set(buf.readers)
        if not readers or any(r >= len(kernels) or r <= buf.writer for r in readers):
            continue
        if all(reads_plainly(kernels[r], value, is_weight) for r in readers):
            buf.flagged = True


def is_weight_value(
    buffers: dict[str, BufferPlan], buffer_of: dict[SSAValue, str]
) -> Callable[[SSAValue], bool]:
    """A predicate on kernel operands: whether the value is a weight buffer."""

    def weight(value: SSAValue) -> bool:
        name = buffer_of.get(value)
        return (
            isinstance(value, BlockArgument) and name is not None and buffers[name].kind == "weight"
        )

    return weight
