"""Buffers of mugraph-to-task: naming and classifying kernel-graph values, and the arena planner.

Every function argument becomes an `input k` or `weight k` buffer (k = argument position), every
returned kernel value an `output k` buffer (k = result position), and every other kernel value an
`activation` (or `workspace`, for split partials) placed in one arena. The planner is first fit
over live ranges in kernel order: a value is live from its producer kernel to its last consumer
kernel (both included), and two values share bytes only when their live ranges are disjoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import TensorType
from xdsl.ir import BlockArgument, SSAValue

from mk.dialects.mugraph import GraphDefOp, KernelOp
from mk.dialects.mugraph_tiles import MatmulOp
from mk.dialects.task import FLAGGED_ELEMENT_BYTES
from mk.dialects.task_maps import grid_size

# Library kernels and the operand position that holds a weight (PyTorch-like roles).
_LIBRARY_WEIGHT_OPERANDS = {"linear": 1, "matmul": 1, "rms_norm": 1, "embedding": 0}


@dataclass
class BufferPlan:
    """One task.buffer to declare, with who writes and reads it (kernel positions)."""

    name: str
    type: TensorType
    kind: str
    index: int | None = None
    offset: int | None = None
    writer: int | None = None
    readers: list[int] = field(default_factory=list)
    flagged: bool = False  # each element stored with its iteration's flag (mugraph_to_task_flags)

    @property
    def element_bytes(self) -> int:
        if self.flagged:
            return FLAGGED_ELEMENT_BYTES
        bits = getattr(self.type.get_element_type(), "bitwidth", 0)
        return max(bits // 8, 1)

    @property
    def nbytes(self) -> int:
        return grid_size(tuple(self.type.get_shape())) * self.element_bytes

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.type.get_shape())

    @property
    def in_arena(self) -> bool:
        return self.kind in ("activation", "workspace")

    def live_range(self) -> tuple[int, int]:
        assert self.writer is not None
        return self.writer, max([self.writer, *self.readers])


class SymbolNames:
    """Unique, valid symbol names for one task.graph (buffers, events and grids share a table)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def take(self, wanted: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in wanted) or "v"
        if base[0].isdigit():
            base = "v" + base
        name, n = base, 1
        while name in self.used:
            name, n = f"{base}_{n}", n + 1
        self.used.add(name)
        return name


# --------------------------------------------------------------------------- classification


def _weight_use_in_graph(graph: GraphDefOp, operand: int, rank: int) -> bool:
    """Whether every tile read from a graph_def operand is a matmul's B or a norm-weight vector."""
    inputs = [i for i in graph.input_ops() if i.source_index() == operand]
    if not inputs:
        return False
    for op in inputs:
        for use in op.tile.uses:
            user = use.operation
            matmul_b = isinstance(user, MatmulOp) and use.index == 1 and rank == 2
            # A rank-1 vector scaling rows: RMSNorm's weight, folded into a multiply.
            norm_weight = rank == 1 and user.name in ("mugraph.binary", "mugraph.rms_norm")
            if not (matmul_b or norm_weight):
                return False
    return True


def is_weight(arg: BlockArgument) -> bool:
    """An argument only ever read as a linear/matmul weight or a norm weight (or embedding table).

    Decided on the kernel graph: a library kernel's weight operand, or a graph_def operand whose
    tiles feed only a tile matmul's B operand directly (rank-2 tensors) or a row-scaling
    multiply / norm (rank-1 tensors). A KV cache, read by attention through reshapes, stays an
    input.
    """
    rank = len(arg.type.get_shape()) if isinstance(arg.type, TensorType) else -1
    if not arg.uses or rank not in (1, 2):
        return False
    for use in arg.uses:
        op = use.operation
        if isinstance(op, KernelOp):
            if _LIBRARY_WEIGHT_OPERANDS.get(op.kind.data) != use.index:
                return False
        elif not (isinstance(op, GraphDefOp) and _weight_use_in_graph(op, use.index, rank)):
            return False
    return True


def is_split_partial(value: SSAValue) -> bool:
    """A graph_def result with one slice per block along a split axis, reduced by its consumers.

    Split-K / split-KV partials have a dim indexed by the splitting grid axis (extent > 1, one
    element per block) that every consumer, always a graph_def, reads whole.
    """
    owner = value.owner
    if not isinstance(owner, GraphDefOp) or not value.uses:
        return False
    index = owner.results.index(value)
    dest = owner.result_args()[index]
    grid = owner.grid_shape()
    assert isinstance(value.type, TensorType)
    shape = tuple(value.type.get_shape())
    split_dims = {
        d
        for out in owner.output_ops()
        if out.dest is dest
        for axis, d in enumerate(out.omap_dims())
        if d >= 0 and grid[axis] > 1 and shape[d] == grid[axis]
    }
    if not split_dims:
        return False
    for use in value.uses:
        consumer = use.operation
        if not isinstance(consumer, GraphDefOp):
            return False
        for inp in consumer.input_ops():
            if inp.source_index() == use.index and split_dims & set(inp.imap_dims()):
                return False
    return True


# --------------------------------------------------------------------------- arena planning


def align_up(value: int, align: int) -> int:
    return -(-value // align) * align


def raw_ancestors(buffers: Sequence[BufferPlan], kernels: int) -> list[set[int]]:
    """Per kernel position, the kernels it depends on through read-after-write (transitively)."""
    preds: list[set[int]] = [set() for _ in range(kernels)]
    for buf in buffers:
        for reader in buf.readers:
            # A reader before the writer reads a donated argument's value before its in-place write.
            if buf.writer is not None and buf.writer < reader:
                preds[reader].add(buf.writer)
    ancestors: list[set[int]] = []
    for pos in range(kernels):  # kernel order is a topological order
        ancestors.append(set().union(*(ancestors[p] | {p} for p in preds[pos])))
    return ancestors


def plan_arena(buffers: Sequence[BufferPlan], align: int, ancestors: Sequence[set[int]]) -> int:
    """Assign arena offsets by first fit; returns the arena size.

    A buffer may take the bytes of an earlier one only when their live ranges are disjoint and
    every kernel that touched the earlier one is already a read-after-write ancestor of the new
    buffer's writer: reuse then adds no write-after-read wait that could cost parallelism.
    """
    placed: list[tuple[int, int, BufferPlan]] = []
    order = sorted(
        (b for b in buffers if b.in_arena), key=lambda b: (b.live_range()[0], -b.nbytes, b.name)
    )
    for buf in order:
        busy = sorted((off, end) for off, end, other in placed if _conflict(buf, other, ancestors))
        offset = 0
        for off, end in busy:
            if offset + buf.nbytes <= off:
                break
            offset = max(offset, align_up(end, align))
        buf.offset = offset
        placed.append((offset, offset + buf.nbytes, buf))
    return align_up(max((end for _, end, _ in placed), default=0), align)


def _conflict(new: BufferPlan, old: BufferPlan, ancestors: Sequence[set[int]]) -> bool:
    if new.flagged or old.flagged:  # stale bytes of another buffer could pass for a flag
        return True
    first, last = new.live_range()
    old_first, old_last = old.live_range()
    if not (old_last < first or last < old_first):
        return True
    earlier, later = (old, new) if old_last < first else (new, old)
    assert later.writer is not None
    touched = {earlier.writer, *earlier.readers}
    return not touched <= ancestors[later.writer]
