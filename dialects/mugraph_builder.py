"""A Python builder for mugraph block graphs: inputs with inferred tiles, tile ops, outputs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from xdsl.builder import ImplicitBuilder
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue

from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph import GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of, tensor_type
from mk.dialects.mugraph_tiles import ThreadMapOp, YieldOp, scalar_type

OpT = TypeVar("OpT", bound=Operation)

# xDSL's ImplicitBuilder replaces Operation.__post_init__ for the whole process while a thread's
# outermost builder is open: two threads opening one at once wrapped it twice, and an op was
# inserted twice ("already attached to a block"). One lock lets embedders compile in threads.
_IMPLICIT_BUILDER = threading.RLock()


class BlockGraphBuilder:
    """Builds one `mugraph.graph_def`, e.g. a linear layer:

    b = BlockGraphBuilder([x, w], [y_type], grid=(48, 1, 1), threads=128, forloop=64)
    xt = b.input(0, imap=(-1, -1, -1), fmap=1, name="xt")
    wt = b.input(1, imap=(0, -1, -1), fmap=1, name="wt")
    p = b.add(MatmulOp(xt, wt, transpose_b=True), "p").res
    acc = b.add(AccumOp("sum", p), "acc").res
    b.output(acc, 0, omap=(1, -1, -1))
    kernel = b.finish()  # insert it into the kernel graph (a func.func body)
    """

    def __init__(
        self,
        args: Sequence[SSAValue],
        result_types: Sequence[Attribute],
        grid: Sequence[int],
        threads: int,
        forloop: int,
        arg_names: Sequence[str] = (),
        result_names: Sequence[str] = (),
    ) -> None:
        self.args = list(args)
        self.result_types = list(result_types)
        self.grid = maps.check_grid(grid)
        self.threads = threads
        self.forloop = forloop
        self.block = Block(arg_types=[*(a.type for a in self.args), *self.result_types])
        for arg, name in zip(self.block.args, [*arg_names, *result_names], strict=False):
            arg.name_hint = name or None

    def operand_arg(self, index: int) -> BlockArgument:
        return self.block.args[index]

    def result_arg(self, index: int) -> BlockArgument:
        return self.block.args[len(self.args) + index]

    def add(self, op: OpT, *names: str) -> OpT:
        """Append a tile op, naming its results."""
        self.block.add_op(op)
        for result, name in zip(op.results, names, strict=False):
            result.name_hint = name or None  # "" is not a valid SSA name
        return op

    def input(self, index: int, imap: Sequence[int], fmap: int = -1, name: str = "") -> SSAValue:
        """The tile of kernel operand `index` under these maps (type inferred from them)."""
        src = self.operand_arg(index)
        shape = maps.input_tile_shape(shape_of(src), self.grid, imap, fmap, self.forloop)
        tile_type = TensorType(tensor_type(src).element_type, shape)
        return self.add(InputOp(src, imap, fmap, tile_type), name).tile

    def output(self, tile: SSAValue, index: int, omap: Sequence[int]) -> OutputOp:
        return self.add(OutputOp(tile, self.result_arg(index), omap))

    def thread_map(
        self,
        args: Sequence[SSAValue],
        result_types: Sequence[Attribute],
        body: Callable[..., Sequence[SSAValue]],
        *names: str,
    ) -> ThreadMapOp:
        """A thread_map whose scalar body `body(*scalars)` builds arith/math ops and returns results."""
        block = Block(arg_types=[scalar_type(a.type) for a in args])
        with _IMPLICIT_BUILDER, ImplicitBuilder(block) as scalars:
            YieldOp(*body(*scalars))
        return self.add(ThreadMapOp(args, result_types, Region(block)), *names)

    def finish(self) -> GraphDefOp:
        """The graph_def; call once, then insert it where its operands are defined."""
        return GraphDefOp(
            self.args, self.result_types, self.grid, self.threads, self.forloop, Region(self.block)
        )
