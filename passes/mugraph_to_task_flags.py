"""Flagged buffers of mugraph-to-task: activations whose readers wait on the values themselves.

With `flag-values`, an activation written by one graph_def and read only by graph_defs that
load it plainly (a streamed linear's activation side, or an element-wise load: no attention,
no merge of split partials, no library kernel, no output copy) becomes `flagged`: each element
is stored with the flag of the iteration that wrote it, so a reader's load is its wait. The
read-after-write dependences through such buffers become `flagged` events
(mugraph_to_task_events), which a backend may realise by the flags alone; every other
dependence keeps its counter.

With `flag-rows`, a decode attention's head rows can wait on their flags too: the query rows and
the new K and V rows it reads in place (an input taken whole, through reshapes and an optional
RMSNorm and RoPE, into the scores' left side or a row select's new row), and a `cache_write`
kernel's new rows. A buffer is then flagged when an attention reads it so and its every reader
can wait on the flags: the hop from a layer's q/k/v projection to its attention takes no fence,
counter or poll of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type
from xdsl.ir import BlockArgument, SSAValue

from mk.dialects.mugraph import GraphDefOp, InputOp, KernelOp
from mk.dialects.mugraph_base import shape_of
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
# Head rows the attention takes whole: at most 8 query rows (more are a prefill's block) of a
# head dim up to 256.
_MAX_ROWS = 8
_MAX_ROW_ELEMENTS = _MAX_ROWS * 256


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


def _row_end(value: SSAValue) -> bool:
    """Whether `value` reaches an attention's query side or a row select's new row through
    reshapes and an optional RMSNorm and RoPE (each the row's own, one use each)."""
    while True:
        uses = list(value.uses)
        if len(uses) != 1:
            return False
        use = uses[0]
        op = use.operation
        if isinstance(op, ReshapeOp) or (isinstance(op, RMSNormOp | RopeOp) and use.index == 0):
            value = op.results[0]
        elif isinstance(op, MatmulOp):
            rows = shape_of(op.operands[0])[0]
            return use.index == 0 and op.transpose_b is not None and rows <= _MAX_ROWS
        else:
            return isinstance(op, ThreadMapOp) and len(op.args) == 4 and use.index == 2


def head_row_inputs(kernel: GraphDefOp) -> set[InputOp]:
    """The inputs a decode attention reads as head rows (see the module docstring): taken whole
    (not walked by the loop), at most 8 rows of 256 elements."""
    ops = list(kernel.body.block.ops)
    if not any(isinstance(op, AccumSoftmaxOp) for op in ops):
        return set()
    return {
        op
        for op in ops
        if isinstance(op, InputOp)
        and op.fmap_dim() < 0
        and math.prod(op.tile_shape()) <= _MAX_ROW_ELEMENTS
        and _row_end(op.tile)
    }


def reads_plainly(
    kernel: Kernel,
    value: SSAValue,
    is_weight: Callable[[SSAValue], bool],
    rows: bool = False,
) -> bool:
    """Whether `kernel` reads `value` only in ways that can wait on its flags (with `rows`, a
    decode attention's head rows and a cache write's new rows too)."""
    if isinstance(kernel, KernelOp):
        return rows and kernel.kind.data == "cache_write" and kernel.operands[1] is value
    ops = list(kernel.body.block.ops)
    attention = any(isinstance(op, AccumSoftmaxOp) for op in ops)
    if attention and not rows:
        return False  # attention reads its q (and new k/v rows) in place
    if any(isinstance(op, ReduceOp) and op.dim.value.data == 0 for op in ops):
        # A reduction over the leading (split) dim merges split partials, which a backend may
        # do with one call that reads them in place (the CUDA merge).
        return False
    head_rows = head_row_inputs(kernel) if attention else set()
    args = [a for i, a in enumerate(kernel.input_args()) if kernel.operands[i] is value]
    for arg in args:
        for use in arg.uses:
            op = use.operation
            if not isinstance(op, InputOp):
                return False
            if op not in head_rows and (attention or not _plain_use(op.tile, kernel, is_weight)):
                return False
    return True


def _read_as_head_rows(kernel: Kernel, value: SSAValue) -> bool:
    """Whether an attention kernel reads `value` as head rows."""
    if not isinstance(kernel, GraphDefOp):
        return False
    rows = head_row_inputs(kernel)
    return any(kernel.operands[op.source_index()] is value for op in rows)


def flag_buffers(
    buffers: Sequence[BufferPlan],
    kernels: Sequence[Kernel],
    value_of: dict[str, SSAValue],
    is_weight: Callable[[SSAValue], bool],
    values: bool = True,
    rows: bool = False,
) -> None:
    """Marks every activation that can be flagged (see the module docstring): with `values`,
    those that only plain loads read; with `rows`, those an attention reads as head rows."""
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
        if not all(reads_plainly(kernels[r], value, is_weight, rows) for r in readers):
            continue
        if values or any(_read_as_head_rows(kernels[r], value) for r in readers):
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
