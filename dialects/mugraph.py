"""The mugraph dialect: Mirage's μGraph as IR (kernel graph → block graph → thread graphs).

**Kernel graph.** The body of a `func.func` whose ops are kernels on builtin tensors:

    %y = mugraph.kernel "rms_norm" (%x, %g) {epsilon = 1.0e-06 : f32}
           : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> tensor<8x4096xbf16>
    %z = mugraph.graph_def grid [48, 1, 1] threads 128 forloop 64 (%x, %w)
           : (tensor<8x4096xbf16>, tensor<6144x4096xbf16>) -> tensor<8x6144xbf16> {
    ^bb0(%xa: tensor<8x4096xbf16>, %wa: tensor<6144x4096xbf16>, %za: tensor<8x6144xbf16>):
      %xt = mugraph.input %xa imap [-1, -1, -1] fmap 1 : tensor<8x4096xbf16> -> tensor<8x64xbf16>
      %wt = mugraph.input %wa imap [0, -1, -1] fmap 1 : tensor<6144x4096xbf16> -> tensor<128x64xbf16>
      %p = mugraph.matmul %xt, %wt transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>
      %acc = mugraph.accum "sum" %p : tensor<8x128xf32> -> tensor<8x128xf32>
      mugraph.output %acc to %za omap [1, -1, -1] : tensor<8x128xf32> -> tensor<8x6144xbf16>
    }

A `mugraph.kernel` is a library kernel (a pre-written tile program) named by a kind from
`LIBRARY_KINDS`. A `mugraph.graph_def` is a graph-defined kernel: a grid of blocks, each running
the **block graph** in its region. The region's entry block has one argument per kernel operand
(the whole tensor) followed by one per kernel result (the destination the block writes into).

**Block graph.** `mugraph.input` reads the tile one block sees in one for-loop iteration
(`imap`: grid axis → tensor dim or -1; `fmap`: the dim the for-loop walks or -1; see
`mugraph_maps`). Tile ops (matmul, unary, binary, reduce, rms_norm, concat, reshape, position,
argmax, thread_map) compute on tiles, which are builtin tensor types. Each tile op computes in
f32 and rounds to its result element type. `mugraph.accum` / `mugraph.accum_softmax` carry
f32 state across for-loop iterations. `mugraph.output` writes a tile into a result (`omap`).

**Loop/epilogue rule** (enforced by the verifier, used by `GraphDefOp.loop_ops()` /
`epilogue_ops()`): ops that depend (transitively) on no accumulator run in every for-loop
iteration; an accumulator's result is its value after the last iteration; ops that use an
accumulator result run once after the loop (the epilogue). An epilogue op may also use tiles
that depend only on inputs with fmap -1 (they are the same in every iteration), never other
per-iteration tiles. Accumulators cannot accumulate epilogue values. With forloop > 1 an output
must not write a per-iteration tile.

**Outputs.** Each result is written by exactly one `mugraph.output`, and each element by
exactly one block: every grid axis of extent > 1 must partition a result dim. Split-K/split-KV
partial results therefore carry an extra dim indexed by the splitting grid axis (e.g.
`tensor<4x...>` with `omap [.., 0, ..]` for a 4-way split on y), merged by a later kernel.
An in-place output (`at %pos dim D over %operand`) is the exception: its tile lands at a
run-time position along D, and every element no block writes is the operand's (a KV-cache
append, in the operand's own buffer when it is a donated argument).

**Thread graphs.** `mugraph.thread_map` applies a scalar arith/math region elementwise (with
broadcasting) to tiles: how elementwise epilogues fuse without materialising intermediates.

Tile ops live in `mugraph_tiles`, their bases and phase analysis in `mugraph_base`, map
arithmetic in `mugraph_maps`, inputs and outputs in `mugraph_io`, a Python builder in
`mugraph_builder`; this module holds the kernel-level ops, the position and argmax tile ops and
the dialect.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    f32,
    i32,
    i64,
)
from xdsl.ir import Attribute, BlockArgument, Dialect, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import IsolatedFromAbove, NoTerminator
from xdsl.utils.exceptions import VerifyException

from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph_base import (
    VERIFYING_PHASES,
    BlockGraphOp,
    Phase,
    Phases,
    expect_shape,
    in_graph,
    int_values,
    is_float_tile,
    require,
    shape_of,
    tensor_type,
    value_name,
)
from mk.dialects.mugraph_io import InputOp, OutputOp, parse_ints, print_ints
from mk.dialects.mugraph_maps import MapError, shape_str
from mk.dialects.mugraph_tiles import (
    AccumOp,
    AccumSoftmaxOp,
    BinaryOp,
    ConcatOp,
    MatmulOp,
    ReduceOp,
    ReshapeOp,
    RMSNormOp,
    RopeOp,
    ThreadMapOp,
    UnaryOp,
    YieldOp,
)

# kind -> (min operands, max operands or None for variadic, required attributes)
LIBRARY_KINDS: dict[str, tuple[int, int | None, tuple[str, ...]]] = {
    **{k: (1, 1, ()) for k in ("exp", "sqrt", "rsqrt", "square", "neg", "relu", "sigmoid")},
    **{k: (1, 1, ()) for k in ("silu", "gelu", "softmax", "argmax", "reshape")},
    **{k: (2, 2, ()) for k in ("add", "sub", "mul", "div", "maximum", "matmul", "linear")},
    **{k: (1, 1, ("dim",)) for k in ("reduce_sum", "reduce_max", "reduce_mean")},
    "scale": (1, 1, ("factor",)),
    "rms_norm": (2, 2, ()),
    "rope": (3, 3, ()),
    "embedding": (2, 3, ()),  # (table, ids) or (table, ids, at): table[ids[at]]
    "attention": (3, 4, ("scale",)),
    "transpose": (1, 1, ("perm",)),
    "slice": (1, 1, ("offsets", "sizes")),
    "concat": (1, None, ("dim",)),
    "step": (1, 1, ()),
    "cache_write": (3, 3, ("dim",)),
}


# ------------------------------------------------------------------------------------------------
# Kernel graph
# ------------------------------------------------------------------------------------------------


@irdl_op_definition
class KernelOp(IRDLOperation):
    """A library kernel: `%y = mugraph.kernel "silu" (%x) : (tensor<8x6144xbf16>) -> tensor<8x6144xbf16>`.

    Its attributes are the nn op's (`factor`, `dim`, `epsilon`, ...), kept as free attributes.
    """

    name = "mugraph.kernel"
    kind = prop_def(StringAttr)
    args = var_operand_def(TensorType)
    res = var_result_def(TensorType)
    assembly_format = "$kind ` ` `(` $args `)` attr-dict `:` functional-type($args, $res)"

    def __init__(
        self,
        kind: str,
        args: Sequence[SSAValue],
        result_types: Sequence[Attribute],
        attributes: dict[str, Attribute] | None = None,
    ) -> None:
        super().__init__(
            operands=[args],
            result_types=[result_types],
            properties={"kind": StringAttr(kind)},
            attributes=attributes or {},
        )

    def verify_(self) -> None:
        kind = self.kind.data
        require(kind in LIBRARY_KINDS, lambda: f"unknown library kernel kind '{kind}'")
        lo, hi, required = LIBRARY_KINDS[kind]
        n = len(self.args)
        want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi else f"at least {lo}"
        require(
            lo <= n and (hi is None or n <= hi), lambda: f"'{kind}' takes {want} operands, got {n}"
        )
        require(len(self.res) == 1, lambda: f"'{kind}' has 1 result, got {len(self.res)}")
        for attr in required:
            require(attr in self.attributes, f"'{kind}' needs attribute '{attr}'")


@irdl_op_definition
class GraphDefOp(IRDLOperation):
    """A graph-defined kernel; its region is the block graph every block of `grid` runs."""

    name = "mugraph.graph_def"
    args = var_operand_def(TensorType)
    res = var_result_def(TensorType)
    grid = prop_def(DenseArrayBase.constr(i64))
    threads = prop_def(IntegerAttr[I64])
    forloop = prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove(), NoTerminator())

    def __init__(
        self,
        args: Sequence[SSAValue],
        result_types: Sequence[Attribute],
        grid: Sequence[int],
        threads: int,
        forloop: int,
        body: Region,
    ) -> None:
        props: dict[str, Attribute] = {
            "grid": DenseArrayBase.from_list(i64, list(grid)),
            "threads": IntegerAttr(threads, i64),
            "forloop": IntegerAttr(forloop, i64),
        }
        super().__init__(
            operands=[args], result_types=[result_types], properties=props, regions=[body]
        )

    def grid_shape(self) -> tuple[int, int, int]:
        return maps.check_grid(int_values(self.grid))

    def thread_count(self) -> int:
        return self.threads.value.data

    def forloop_range(self) -> int:
        return self.forloop.value.data

    def blocks(self) -> Iterator[maps.BlockCoord]:
        """Every block coordinate (bx, by, bz), x fastest."""
        return maps.grid_blocks(self.grid_shape())

    def input_args(self) -> tuple[BlockArgument, ...]:
        return tuple(self.body.block.args[: len(self.args)])

    def result_args(self) -> tuple[BlockArgument, ...]:
        return tuple(self.body.block.args[len(self.args) :])

    def input_ops(self) -> list[InputOp]:
        return [op for op in self.body.block.ops if isinstance(op, InputOp)]

    def output_ops(self) -> list[OutputOp]:
        return [op for op in self.body.block.ops if isinstance(op, OutputOp)]

    def in_place_result(self, operand: int) -> SSAValue | None:
        """The result an in-place or accumulating output writes over operand #`operand`."""
        for out in self.output_ops():
            over = out.over()
            if over is not None and over.index == operand:
                return self.res[out.result_index()]
        return None

    def loop_ops(self) -> list[Operation]:
        """Ops run in every for-loop iteration (accumulator updates included), in order."""
        phases = Phases(self.body.block).ops
        return [op for op in self.body.block.ops if phases.get(op) != Phase.EPILOGUE]

    def epilogue_ops(self) -> list[Operation]:
        """Ops run once after the loop: users of accumulator results, then the outputs."""
        phases = Phases(self.body.block).ops
        return [op for op in self.body.block.ops if phases.get(op) == Phase.EPILOGUE]

    def verify(self, verify_nested_ops: bool = True) -> None:
        VERIFYING_PHASES[self] = Phases(self.body.block)
        try:
            super().verify(verify_nested_ops)
        finally:
            del VERIFYING_PHASES[self]

    def verify_(self) -> None:
        try:
            maps.check_grid(int_values(self.grid))
        except MapError as e:
            raise VerifyException(str(e)) from None
        t = self.thread_count()
        require(
            32 <= t <= 1024 and t % 32 == 0,
            lambda: f"threads must be a multiple of 32 in [32, 1024], got {t}",
        )
        require(
            self.forloop_range() >= 1, lambda: f"forloop must be >= 1, got {self.forloop_range()}"
        )
        block = self.body.block
        want = [v.type for v in self.args] + [r.type for r in self.res]
        got = [a.type for a in block.args]
        require(
            got == want,
            lambda: (
                "block arguments must be the operand types then the result types "
                f"({', '.join(map(str, want))}), got ({', '.join(map(str, got))})"
            ),
        )
        for op in block.ops:
            require(
                isinstance(op, BLOCK_OPS),
                f"a block graph holds only mugraph block ops, found '{op.name}'",
            )
        for i, arg in enumerate(self.result_args()):
            require(
                any(isinstance(u.operation, OutputOp) for u in arg.uses),
                f"result #{i} is never written: no mugraph.output targets {value_name(arg)}",
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" grid ")
        print_ints(printer, int_values(self.grid))
        printer.print_string(f" threads {self.thread_count()} forloop {self.forloop_range()} ")
        printer.print_operands(self.args)
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" : ")
        printer.print_function_type([a.type for a in self.args], [r.type for r in self.res])
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=True)

    @classmethod
    def parse(cls, parser: Parser) -> GraphDefOp:
        parser.parse_keyword("grid")
        grid = parse_ints(parser)
        parser.parse_keyword("threads")
        threads = parser.parse_integer(allow_boolean=False)
        parser.parse_keyword("forloop")
        forloop = parser.parse_integer(allow_boolean=False)
        start = parser.pos
        names = parser.parse_comma_separated_list(
            parser.Delimiter.PAREN, parser.parse_unresolved_operand
        )
        attrs = parser.parse_optional_attr_dict_with_keyword()
        parser.parse_punctuation(":")
        ftype = parser.parse_function_type()
        if len(ftype.inputs) != len(names):
            parser.raise_error(
                f"{len(names)} operands but {len(ftype.inputs)} operand types", start, parser.pos
            )
        operands = [parser.resolve_operand(n, t) for n, t in zip(names, ftype.inputs, strict=True)]
        body = parser.parse_region()
        op = cls(operands, ftype.outputs.data, grid, threads, forloop, body)
        if attrs is not None:
            op.attributes |= attrs.data
        return op


@irdl_op_definition
class PositionOp(BlockGraphOp):
    """`%p = mugraph.position %lt dim 1 : tensor<8x2048xbf16> -> tensor<8x2048xi32>`.

    The index along `dim` of the full tensor of each element of an input tile, or of a tile
    the graph writes with a plain `mugraph.output` (so argmax can report global indices, also
    where it runs as the epilogue of the kernel that computes its values).
    """

    name = "mugraph.position"
    x = operand_def(TensorType)
    res = result_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    traits = in_graph()
    assembly_format = "$x `dim` $dim attr-dict `:` type($x) `->` type($res)"

    def __init__(self, x: SSAValue, dim: int, elem: Attribute = i32) -> None:
        props = {"dim": IntegerAttr(dim, i64)}
        super().__init__(
            operands=[x], result_types=[TensorType(elem, shape_of(x))], properties=props
        )

    def input_op(self) -> InputOp:
        assert isinstance(self.x.owner, InputOp)
        return self.x.owner

    def source(self) -> InputOp | OutputOp | None:
        """The input op that reads x, or else the plain output that writes it: what places x
        in the full tensor."""
        if isinstance(self.x.owner, InputOp):
            return self.x.owner
        uses = ((u.operation, u.index) for u in self.x.uses)
        return next(
            (op for op, i in uses if isinstance(op, OutputOp) and i == 0 and op.is_plain()), None
        )

    def positions(self, block: Sequence[int], iteration: int) -> range:
        """The positions along `dim` this tile covers for `block` in `iteration`."""
        src = self.source()
        assert src is not None
        where = (
            src.tile_slices(block, iteration)
            if isinstance(src, InputOp)
            else src.tile_slices(block)
        )
        s = where[self.dim.value.data]
        return range(s.start, s.stop)

    def verify_block_op(self, parent: GraphDefOp) -> None:
        require(
            self.source() is not None,
            lambda: (
                f"{value_name(self.x)} must be a mugraph.input tile or one a plain mugraph.output writes"
            ),
        )
        d, rank = self.dim.value.data, len(shape_of(self.x))
        require(0 <= d < rank, lambda: f"dim {d} is out of range for rank {rank}")
        expect_shape(self.res, shape_of(self.x))
        require(
            isinstance(tensor_type(self.res).element_type, IntegerType),
            "result must be an integer tile",
        )


@irdl_op_definition
class ArgmaxOp(BlockGraphOp):
    """`%m, %i = mugraph.argmax %v, %p dim 1 : (tensor<8x2048xbf16>, tensor<8x2048xi32>) -> (tensor<8x1xf32>, tensor<8x1xi32>)`.

    The maximum along `dim` (kept as size 1) and the payload at its first occurrence.
    """

    name = "mugraph.argmax"
    values = operand_def(TensorType)
    payload = operand_def(TensorType)
    max = result_def(TensorType)
    arg = result_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    traits = in_graph()
    assembly_format = (
        "$values `,` $payload `dim` $dim attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, values: SSAValue, payload: SSAValue, dim: int) -> None:
        shape = maps.reduce_shape(shape_of(values), dim, keepdim=True)
        types = [TensorType(f32, shape), TensorType(tensor_type(payload).element_type, shape)]
        props = {"dim": IntegerAttr(dim, i64)}
        super().__init__(operands=[values, payload], result_types=types, properties=props)

    def verify_block_op(self, parent: GraphDefOp) -> None:
        v, p = shape_of(self.values), shape_of(self.payload)
        require(
            is_float_tile(self.values) and is_float_tile(self.max),
            "values and max must be float tiles",
        )
        require(v == p, lambda: f"payload is {shape_str(p)}, values are {shape_str(v)}")
        try:
            shape = maps.reduce_shape(v, self.dim.value.data, keepdim=True)
        except MapError as e:
            raise VerifyException(str(e)) from None
        expect_shape(self.max, shape, "max")
        expect_shape(self.arg, shape, "arg")
        pe, ae = tensor_type(self.payload).element_type, tensor_type(self.arg).element_type
        require(pe == ae, lambda: f"arg element type {ae} differs from the payload's {pe}")


# The label a fusing pass leaves on the graph_def it makes (`linear+silu+mul`, `loop+...`,
# `split+...`): what later passes match on and what the task graph names its kinds after.
FUSED_ATTR = "mk.fused"

BLOCK_OPS = (
    InputOp, OutputOp, MatmulOp, UnaryOp, BinaryOp, ReduceOp, RMSNormOp, RopeOp, ConcatOp,
    ReshapeOp, PositionOp, ArgmaxOp, ThreadMapOp, AccumOp, AccumSoftmaxOp,
)  # fmt: skip

MuGraph = Dialect("mugraph", [KernelOp, GraphDefOp, *BLOCK_OPS, YieldOp], [])
