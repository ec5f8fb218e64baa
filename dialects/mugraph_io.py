"""mugraph.input and mugraph.output: the tiles a block reads from the kernel's operands and
writes into its results (the maps in `mugraph_maps`; the dialect in `mugraph`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    Float32Type,
    IntegerAttr,
    IntegerType,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, BlockArgument, SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    var_operand_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph_base import (
    BlockGraphOp,
    Phase,
    Phases,
    in_graph,
    int_values,
    is_float_tile,
    require,
    shape_of,
    tensor_type,
    value_name,
)
from mk.dialects.mugraph_maps import MapError, shape_str

if TYPE_CHECKING:
    from mk.dialects.mugraph import GraphDefOp


def print_ints(printer: Printer, values: Sequence[int]) -> None:
    with printer.in_square_brackets():
        printer.print_list(values, lambda v: printer.print_string(str(v)))


def parse_ints(parser: Parser) -> list[int]:
    return parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_integer)


@irdl_op_definition
class InputOp(BlockGraphOp):
    """`%t = mugraph.input %xa imap [0, -1, -1] fmap 1 : tensor<6144x4096xbf16> -> tensor<128x64xbf16>`."""

    name = "mugraph.input"
    source = operand_def(TensorType)
    tile = result_def(TensorType)
    imap = prop_def(DenseArrayBase.constr(i64))
    fmap = prop_def(IntegerAttr[I64])
    traits = in_graph()

    def __init__(
        self, source: SSAValue, imap: Sequence[int], fmap: int, tile_type: Attribute
    ) -> None:
        props = {"imap": DenseArrayBase.from_list(i64, list(imap)), "fmap": IntegerAttr(fmap, i64)}
        super().__init__(operands=[source], result_types=[tile_type], properties=props)

    def whole_tensor_operands(self) -> tuple[int, ...]:
        return (0,)

    def phase_from(self, operand_phases: Sequence[Phase]) -> Phase:
        return Phase.INVARIANT if self.fmap_dim() < 0 else Phase.LOOP

    def imap_dims(self) -> tuple[int, ...]:
        return int_values(self.imap)

    def fmap_dim(self) -> int:
        return self.fmap.value.data

    def source_index(self) -> int:
        """Which kernel operand this input reads."""
        src = self.source
        assert isinstance(src, BlockArgument)
        return src.index

    def tile_shape(self) -> tuple[int, ...]:
        g = self.parent_graph()
        return maps.input_tile_shape(
            shape_of(self.source),
            g.grid_shape(),
            self.imap_dims(),
            self.fmap_dim(),
            g.forloop_range(),
        )

    def tile_slices(self, block: Sequence[int], iteration: int) -> tuple[slice, ...]:
        """The part of the full operand tensor this tile covers for `block` in `iteration`."""
        g = self.parent_graph()
        return maps.input_tile_slices(
            shape_of(self.source), g.grid_shape(), self.imap_dims(), self.fmap_dim(),
            g.forloop_range(), block, iteration,
        )  # fmt: skip

    def block_slices(self, block: Sequence[int]) -> tuple[slice, ...]:
        """The part of the operand `block` reads over the whole for-loop (its read footprint)."""
        grid = self.parent_graph().grid_shape()
        return maps.input_block_slices(shape_of(self.source), grid, self.imap_dims(), block)

    def verify_block_op(self, parent: GraphDefOp) -> None:
        src = self.source
        require(
            isinstance(src, BlockArgument) and src.index < len(parent.args),
            lambda: f"reads {value_name(src)}, a result of the kernel, not an operand",
        )
        try:
            shape = self.tile_shape()
        except MapError as e:
            raise VerifyException(str(e)) from None
        want = TensorType(tensor_type(src).element_type, shape)
        require(
            self.tile.type == want,
            lambda: f"tile type is {self.tile.type}, but the maps give {want}",
        )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.source)
        printer.print_string(" imap ")
        print_ints(printer, self.imap_dims())
        printer.print_string(f" fmap {self.fmap_dim()}")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.source.type)
        printer.print_string(" -> ")
        printer.print_attribute(self.tile.type)

    @classmethod
    def parse(cls, parser: Parser) -> InputOp:
        src = parser.parse_unresolved_operand()
        parser.parse_keyword("imap")
        imap = parse_ints(parser)
        parser.parse_keyword("fmap")
        fmap = parser.parse_integer(allow_boolean=False)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        src_type = parser.parse_type()
        parser.parse_punctuation("->")
        op = cls(parser.resolve_operand(src, src_type), imap, fmap, parser.parse_type())
        op.attributes |= attrs
        return op


@irdl_op_definition
class OutputOp(BlockGraphOp):
    """`mugraph.output %acc to %ya omap [1, -1, -1] : tensor<8x128xf32> -> tensor<8x6144xbf16>`.

    Writes the block's tile into a kernel result (rounded to its element type) after the loop.
    An in-place output (`... at %p dim 2 over %cache : tile, tensor<1xi32> -> dest`) writes its
    tile at run-time position %p (a one-element integer tile) along `dim`, plus the block's
    offset where a grid axis splits that dim (the blocks' tiles side by side from %p); every
    other element of the result is that of kernel operand %cache (a KV-cache append: the result
    takes the operand's buffer when it is a donated argument).

    An accumulating output (`... omap [-1, -1, -1] accumulate over %acc : tile -> dest`) adds
    its tile into the result instead: the result is f32 operand %acc plus every block's tile, so
    grid axes the omap leaves out sum their blocks (split-K without a partial buffer). The
    result takes the operand's buffer; blocks add in any order.
    """

    name = "mugraph.output"
    tile = operand_def(TensorType)
    dest = operand_def(TensorType)
    dynamic = var_operand_def(TensorType)  # none, (at, over), or (over,) when accumulating
    omap = prop_def(DenseArrayBase.constr(i64))
    at_dim = opt_prop_def(IntegerAttr[I64])
    accumulate = opt_prop_def(UnitAttr)
    traits = in_graph(pure=False)

    def __init__(
        self,
        tile: SSAValue,
        dest: SSAValue,
        omap: Sequence[int],
        at: tuple[SSAValue, int, SSAValue] | None = None,
        accumulate_over: SSAValue | None = None,
    ) -> None:
        props: dict[str, Attribute] = {"omap": DenseArrayBase.from_list(i64, list(omap))}
        dynamic: list[SSAValue] = []
        if at is not None:
            dynamic = [at[0], at[2]]
            props["at_dim"] = IntegerAttr(at[1], i64)
        elif accumulate_over is not None:
            dynamic = [accumulate_over]
            props["accumulate"] = UnitAttr()
        super().__init__(operands=[tile, dest, dynamic], properties=props)

    def whole_tensor_operands(self) -> tuple[int, ...]:
        return (1, 1 + len(self.dynamic)) if self.dynamic else (1,)

    def phase_from(self, operand_phases: Sequence[Phase]) -> Phase:
        return Phase.EPILOGUE

    def verify_phase(self, parent: GraphDefOp, phases: Phases) -> None:
        forloop = parent.forloop_range()
        require(
            phases.of(self.tile) != Phase.LOOP or forloop == 1,
            lambda: (
                f"writes {value_name(self.tile)}, a tile that changes every for-loop iteration "
                f"(forloop {forloop}); write an accumulator result or a value computed from one"
            ),
        )

    def omap_dims(self) -> tuple[int, ...]:
        return int_values(self.omap)

    def position(self) -> tuple[SSAValue, int, BlockArgument] | None:
        """(position tile, dim, operand block argument) of an in-place output, else None."""
        if not self.dynamic or self.at_dim is None:
            return None
        over = self.dynamic[1]
        assert isinstance(over, BlockArgument)
        return self.dynamic[0], self.at_dim.value.data, over

    def is_plain(self) -> bool:
        """Whether it writes its tile where the omap puts it: no position, no accumulation."""
        return not self.dynamic

    def accumulated(self) -> BlockArgument | None:
        """The operand an accumulating output adds to, else None."""
        if self.accumulate is None or len(self.dynamic) != 1:
            return None
        over = self.dynamic[0]
        assert isinstance(over, BlockArgument)
        return over

    def over(self) -> BlockArgument | None:
        """The operand whose buffer the result takes: in-place or accumulating outputs."""
        if (at := self.position()) is not None:
            return at[2]
        return self.accumulated()

    def result_index(self) -> int:
        dest = self.dest
        assert isinstance(dest, BlockArgument)
        return dest.index - len(self.parent_graph().args)

    def placed_shape(self) -> tuple[int, ...]:
        """The result's shape as the omap sees it: an in-place output's dim is its blocks'
        tiles side by side."""
        shape = list(shape_of(self.dest))
        if (at := self.position()) is not None:
            grid = self.parent_graph().grid_shape()
            split = math.prod(g for g, d in zip(grid, self.omap_dims(), strict=True) if d == at[1])
            shape[at[1]] = shape_of(self.tile)[at[1]] * split
        return tuple(shape)

    def tile_slices(self, block: Sequence[int], pos: int = 0) -> tuple[slice, ...]:
        """The part of the full result this block's tile covers (at run-time position `pos`
        along an in-place output's dim)."""
        grid = self.parent_graph().grid_shape()
        summed = self.accumulate is not None
        where = list(
            maps.output_tile_slices(self.placed_shape(), grid, self.omap_dims(), block, summed)
        )
        if (at := self.position()) is not None:
            d = at[1]
            where[d] = slice(pos + where[d].start, pos + where[d].stop)
        return tuple(where)

    def verify_block_op(self, parent: GraphDefOp) -> None:
        tile, dest = self.tile, self.dest
        require(
            self.result_index() >= 0,
            lambda: f"writes to {value_name(dest)}, an operand of the kernel, not a result",
        )
        writers = [u.operation for u in dest.uses if isinstance(u.operation, OutputOp)]
        block = parent.body.block
        first = min(writers, key=block.get_operation_index)
        require(
            first is self,
            lambda: (
                f"result #{self.result_index()} ({value_name(dest)}) is already written by an earlier mugraph.output"
            ),
        )
        self._verify_position(parent)
        try:
            shape = maps.output_tile_shape(
                self.placed_shape(), parent.grid_shape(), self.omap_dims(),
                self.accumulate is not None,
            )  # fmt: skip
        except MapError as e:
            raise VerifyException(str(e)) from None
        require(
            shape_of(tile) == shape,
            lambda: (
                f"tile is {shape_str(shape_of(tile))}, but omap {list(self.omap_dims())} over grid "
                f"{list(parent.grid_shape())} gives {shape_str(shape)} tiles of the "
                f"{shape_str(shape_of(dest))} result"
            ),
        )
        te, de = tensor_type(tile).element_type, tensor_type(dest).element_type
        require(
            te == de or (is_float_tile(tile) and is_float_tile(dest)),
            lambda: f"cannot store a {te} tile into a {de} result",
        )

    def _verify_accumulate(self, parent: GraphDefOp) -> None:
        over = self.dynamic[0] if len(self.dynamic) == 1 else None
        require(
            self.at_dim is None and isinstance(over, BlockArgument),
            "an accumulating output takes one operand to add to, and no position",
        )
        assert isinstance(over, BlockArgument)
        require(
            over.owner is parent.body.block and over.index < len(parent.args),
            lambda: f"{value_name(over)} must be an operand of the kernel",
        )
        require(over.type == self.dest.type, "the operand added to must have the result's type")
        require(
            isinstance(tensor_type(self.dest).element_type, Float32Type),
            lambda: (
                f"an accumulating output adds in f32, not {tensor_type(self.dest).element_type}"
            ),
        )

    def _verify_position(self, parent: GraphDefOp) -> None:
        if self.accumulate is not None:
            self._verify_accumulate(parent)
            return
        require(
            len(self.dynamic) in (0, 2) and (self.at_dim is None) == (not self.dynamic),
            "an in-place output takes a position tile, a dim and an operand",
        )
        if (at := self.position()) is None:
            return
        pos, d, over = at
        rank = len(shape_of(self.dest))
        require(0 <= d < rank, lambda: f"dim {d} is outside the {rank}-d result")
        require(
            isinstance(tensor_type(pos).element_type, IntegerType)
            and tensor_type(pos).element_count() == 1,
            lambda: f"the position {value_name(pos)} must be a one-element integer tile",
        )
        require(
            over.owner is parent.body.block and over.index < len(parent.args),
            lambda: f"{value_name(over)} must be an operand of the kernel",
        )
        require(
            over.type == self.dest.type, "the operand written in place must have the result's type"
        )
        placed, extent = self.placed_shape()[d], shape_of(self.dest)[d]
        require(
            placed <= extent,
            lambda: f"the blocks' tiles take {placed} positions of dim {d}, which has {extent}",
        )
        require(
            shape_of(self.tile)[d] <= shape_of(self.dest)[d],
            lambda: (
                f"the tile's {shape_of(self.tile)[d]} positions along dim {d} exceed the result's"
            ),
        )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.tile)
        printer.print_string(" to ")
        printer.print_operand(self.dest)
        printer.print_string(" omap ")
        print_ints(printer, self.omap_dims())
        if (at := self.position()) is not None:
            printer.print_string(" at ")
            printer.print_operand(at[0])
            printer.print_string(f" dim {at[1]} over ")
            printer.print_operand(at[2])
        elif (acc := self.accumulated()) is not None:
            printer.print_string(" accumulate over ")
            printer.print_operand(acc)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.tile.type)
        if at is not None:
            printer.print_string(", ")
            printer.print_attribute(at[0].type)
        printer.print_string(" -> ")
        printer.print_attribute(self.dest.type)

    @classmethod
    def parse(cls, parser: Parser) -> OutputOp:
        tile = parser.parse_unresolved_operand()
        parser.parse_keyword("to")
        dest = parser.parse_unresolved_operand()
        parser.parse_keyword("omap")
        omap = parse_ints(parser)
        at = None
        if parser.parse_optional_keyword("at") is not None:
            pos = parser.parse_unresolved_operand()
            parser.parse_keyword("dim")
            dim = parser.parse_integer(allow_boolean=False)
            parser.parse_keyword("over")
            at = (pos, dim, parser.parse_unresolved_operand())
        acc = None
        if at is None and parser.parse_optional_keyword("accumulate") is not None:
            parser.parse_keyword("over")
            acc = parser.parse_unresolved_operand()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        tile_type = parser.parse_type()
        pos_type = None
        if at is not None:
            parser.parse_punctuation(",")
            pos_type = parser.parse_type()
        parser.parse_punctuation("->")
        dest_type = parser.parse_type()
        placed = None
        if at is not None and pos_type is not None:
            placed = (
                parser.resolve_operand(at[0], pos_type),
                at[1],
                parser.resolve_operand(at[2], dest_type),
            )
        op = cls(
            parser.resolve_operand(tile, tile_type),
            parser.resolve_operand(dest, dest_type),
            omap,
            placed,
            None if acc is None else parser.resolve_operand(acc, dest_type),
        )
        op.attributes |= attrs
        return op
