"""The base of mugraph's block-graph ops: tile helpers, loop/epilogue phases and their analysis."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, cast

from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseArrayBase,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    TensorType,
)
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.irdl import IRDLOperation, OpTraits, lazy_traits_def
from xdsl.traits import HasParent, Pure
from xdsl.utils.exceptions import VerifyException

from mk.dialects.mugraph_maps import shape_str

if TYPE_CHECKING:
    from mk.dialects.mugraph import GraphDefOp

FLOATS = (Float16Type, BFloat16Type, Float32Type, Float64Type)


def tensor_type(value: SSAValue) -> TensorType:
    assert isinstance(value.type, TensorType)
    return value.type


def shape_of(value: SSAValue) -> tuple[int, ...]:
    return tuple(tensor_type(value).get_shape())


def is_float_tile(value: SSAValue) -> bool:
    return isinstance(tensor_type(value).element_type, FLOATS)


def value_name(value: SSAValue) -> str:
    """How a message names a value: its SSA name, else what defines it."""
    if value.name_hint:
        return f"%{value.name_hint}"
    owner = value.owner
    return f"the {owner.name} result" if isinstance(owner, Operation) else "a block argument"


def int_values(attr: DenseArrayBase[IntegerType]) -> tuple[int, ...]:
    return attr.get_values()


def require(ok: bool, message: str | Callable[[], str]) -> None:
    """A verifier's check. A message that prints types is better a lambda, built only on failure:
    formatted eagerly, such messages took a third of a whole model's verification."""
    if not ok:
        raise VerifyException(message() if callable(message) else message)


def expect_shape(value: SSAValue, shape: Sequence[int], what: str = "result") -> None:
    got = shape_of(value)
    require(got == tuple(shape), lambda: f"{what} is {shape_str(got)}, expected {shape_str(shape)}")


def floats_only(op: Operation) -> None:
    for what, values in (("operand", op.operands), ("result", op.results)):
        for i, v in enumerate(values):
            if not is_float_tile(v):
                raise VerifyException(f"{what} #{i} must be a float tile, got {v.type}")


# ------------------------------------------------------------------------------------------------
# Loop / epilogue phases and the base of block-graph ops
# ------------------------------------------------------------------------------------------------


class Phase(IntEnum):
    """When a block-graph value is computed, relative to the for-loop."""

    INVARIANT = 0  # the same in every iteration: depends only on inputs with fmap -1
    LOOP = 1  # changes every iteration
    EPILOGUE = 2  # computed once after the loop, from accumulator results


class Phases:
    """The phase of the ops and tiles of a block graph, each computed when first asked for (an
    op's verifier asks for its operands' only: building every phase for every op of a block was
    quadratic in the block); `ops` has every op's."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self._ops: dict[Operation, Phase] = {}

    @property
    def ops(self) -> dict[Operation, Phase]:
        for op in self.block.ops:
            if isinstance(op, BlockGraphOp):
                self.op_phase(op)
        return self._ops

    def op_phase(self, op: BlockGraphOp) -> Phase:
        """When `op` runs; its producers first, without recursion (chains can be long)."""
        stack = [op]
        while stack:
            top = stack[-1]
            if top in self._ops:
                stack.pop()
                continue
            pending = [
                o
                for v in top.tile_operands()
                if isinstance(o := v.owner, BlockGraphOp) and o not in self._ops
            ]
            if pending:
                stack.extend(pending)
                continue
            self._ops[top] = top.phase_from([self.of(v) for v in top.tile_operands()])
            stack.pop()
        return self._ops[op]

    def of(self, value: SSAValue) -> Phase:
        """A tile's phase; whole-tensor block arguments count as loop-invariant."""
        op = value.owner
        if not isinstance(op, BlockGraphOp) or op.parent is not self.block:
            return Phase.INVARIANT
        return op.result_phase(self.op_phase(op))


# The phases of a graph_def's block while the graph_def verifies itself and its ops (set and
# cleared by GraphDefOp.verify): every op's check then shares one analysis of the block instead
# of walking its producers afresh (a whole model's verification spent ~0.3 s on those walks).
VERIFYING_PHASES: dict[Operation, Phases] = {}


def _graph_def_op() -> type[Operation]:
    from mk.dialects.mugraph import GraphDefOp  # that module imports this one

    return GraphDefOp


def in_graph(pure: bool = True) -> OpTraits:
    """Traits of a block-graph op: it lives directly in a mugraph.graph_def."""
    return lazy_traits_def(lambda: (HasParent(_graph_def_op()), *((Pure(),) if pure else ())))


class BlockGraphOp(IRDLOperation):
    """Base of the ops of a block graph: operands are tiles, never the whole-tensor arguments."""

    def parent_graph(self) -> GraphDefOp:
        parent = self.parent_op()
        assert parent is not None and parent.name == "mugraph.graph_def"
        return cast("GraphDefOp", parent)

    def whole_tensor_operands(self) -> tuple[int, ...]:
        """Operand positions that must be the graph_def's whole-tensor block arguments."""
        return ()

    def tile_operands(self) -> list[SSAValue]:
        whole = self.whole_tensor_operands()
        return [v for i, v in enumerate(self.operands) if i not in whole]

    def phase_from(self, operand_phases: Sequence[Phase]) -> Phase:
        """When the op runs, given its tiles' phases (accumulator updates run in the loop)."""
        return max(operand_phases, default=Phase.INVARIANT)

    def result_phase(self, op_phase: Phase) -> Phase:
        return op_phase

    def verify_phase(self, parent: GraphDefOp, phases: Phases) -> None:
        tiles = self.tile_operands()
        seen = [phases.of(v) for v in tiles]
        if Phase.LOOP in seen and Phase.EPILOGUE in seen:
            loop = tiles[seen.index(Phase.LOOP)]
            acc = tiles[seen.index(Phase.EPILOGUE)]
            raise VerifyException(
                f"uses accumulator result {value_name(acc)} and per-iteration tile {value_name(loop)}; "
                "after the loop only accumulator results and tiles of fmap -1 inputs exist"
            )

    def verify_(self) -> None:
        parent = self.parent_graph()
        whole = self.whole_tensor_operands()
        for i, v in enumerate(self.operands):
            is_arg = isinstance(v, BlockArgument) and v.block is parent.body.block
            require(
                is_arg or i not in whole,
                f"operand #{i} must be an argument of the enclosing mugraph.graph_def",
            )
            require(
                not is_arg or i in whole,
                f"operand #{i} ({value_name(v)}) is a whole tensor; read a tile through mugraph.input",
            )
        self.verify_block_op(parent)
        self.verify_phase(parent, VERIFYING_PHASES.get(parent) or Phases(parent.body.block))

    def verify_block_op(self, parent: GraphDefOp) -> None:
        pass


class AccumulatorOp(BlockGraphOp):
    """Base of accumulators: updated in the loop, results available after it."""

    def phase_from(self, operand_phases: Sequence[Phase]) -> Phase:
        return min(super().phase_from(operand_phases), Phase.LOOP)

    def result_phase(self, op_phase: Phase) -> Phase:
        return Phase.EPILOGUE

    def verify_phase(self, parent: GraphDefOp, phases: Phases) -> None:
        for v in self.tile_operands():
            require(
                phases.of(v) != Phase.EPILOGUE,
                f"accumulates {value_name(v)}, which depends on an accumulator result; "
                "accumulators cannot nest",
            )
