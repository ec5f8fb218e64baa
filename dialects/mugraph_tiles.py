"""The block-graph tile ops of mugraph (compute, reductions, thread maps, accumulators).

`mk.dialects.mugraph` holds the kernel-level ops, `mugraph.input` / `mugraph.output` and the
semantics (loop/epilogue rule, maps); this module holds what a block computes on its tiles.
The op bases, tile helpers and the phase analysis all block-graph ops share are in `mugraph_base`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import (
    I64,
    Float32Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    UnitAttr,
    f32,
    i64,
)
from xdsl.ir import Attribute, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import HasParent, IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph_base import (
    FLOATS,
    AccumulatorOp,
    BlockGraphOp,
    expect_shape,
    floats_only,
    in_graph,
    is_float_tile,
    require,
    shape_of,
    tensor_type,
)
from mk.dialects.mugraph_maps import (
    ACCUM_KINDS,
    BINARY_KINDS,
    REDUCE_KINDS,
    UNARY_KINDS,
    MapError,
    shape_str,
)

if TYPE_CHECKING:
    from mk.dialects.mugraph import GraphDefOp

_SCALARS = (*FLOATS, IntegerType, IndexType)


# ------------------------------------------------------------------------------------------------
# Tile ops
# ------------------------------------------------------------------------------------------------


def _tile_type(shape: Sequence[int], elem: Attribute = f32) -> TensorType:
    return TensorType(elem, shape)


@irdl_op_definition
class MatmulOp(BlockGraphOp):
    """`%c = mugraph.matmul %a, %w transpose_b : (tensor<8x64xbf16>, tensor<128x64xbf16>) -> tensor<8x128xf32>`.

    a[..., m, k] x b[..., k, n] (b[..., n, k] with `transpose_b`, PyTorch's weight layout);
    batch dims broadcast.
    """

    name = "mugraph.matmul"
    a = operand_def(TensorType)
    b = operand_def(TensorType)
    res = result_def(TensorType)
    transpose_b = opt_prop_def(UnitAttr)
    traits = in_graph()
    assembly_format = (
        "$a `,` $b (`transpose_b` $transpose_b^)? attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, a: SSAValue, b: SSAValue, transpose_b: bool = False, elem: Attribute = f32):
        shape = maps.matmul_shape(shape_of(a), shape_of(b), transpose_b)
        props = {"transpose_b": UnitAttr()} if transpose_b else {}
        super().__init__(operands=[a, b], result_types=[_tile_type(shape, elem)], properties=props)

    def verify_block_op(self, parent: GraphDefOp) -> None:
        floats_only(self)
        try:
            shape = maps.matmul_shape(
                shape_of(self.a), shape_of(self.b), self.transpose_b is not None
            )
        except MapError as e:
            raise VerifyException(str(e)) from None
        expect_shape(self.res, shape)


@irdl_op_definition
class UnaryOp(BlockGraphOp):
    """`%s = mugraph.unary "silu" %t : tensor<8x128xf32> -> tensor<8x128xbf16>`; kinds: UNARY_KINDS.

    `scale` takes `{factor = 0.5 : f32}`; `cast` only rounds to the result element type.
    """

    name = "mugraph.unary"
    kind = prop_def(StringAttr)
    x = operand_def(TensorType)
    res = result_def(TensorType)
    factor = opt_prop_def(FloatAttr[Float32Type])
    traits = in_graph()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$kind $x attr-dict `:` type($x) `->` type($res)"

    def __init__(self, kind: str, x: SSAValue, elem: Attribute = f32, factor: float | None = None):
        props: dict[str, Attribute] = {"kind": StringAttr(kind)}
        if factor is not None:
            props["factor"] = FloatAttr(factor, f32)
        super().__init__(
            operands=[x], result_types=[_tile_type(shape_of(x), elem)], properties=props
        )

    def verify_block_op(self, parent: GraphDefOp) -> None:
        kind = self.kind.data
        require(kind in UNARY_KINDS, lambda: f"unknown unary kind '{kind}'")
        require(
            (kind == "scale") == (self.factor is not None),
            "'factor' is required by scale and only by it",
        )
        floats_only(self)
        expect_shape(self.res, shape_of(self.x))


@irdl_op_definition
class BinaryOp(BlockGraphOp):
    """`%c = mugraph.binary "mul" %a, %r : (tensor<8x128xf32>, tensor<8x1xf32>) -> tensor<8x128xf32>`.

    Kinds: BINARY_KINDS; operands broadcast like NumPy.
    """

    name = "mugraph.binary"
    kind = prop_def(StringAttr)
    a = operand_def(TensorType)
    b = operand_def(TensorType)
    res = result_def(TensorType)
    traits = in_graph()
    assembly_format = "$kind $a `,` $b attr-dict `:` functional-type(operands, results)"

    def __init__(self, kind: str, a: SSAValue, b: SSAValue, elem: Attribute = f32):
        shape = maps.broadcast_shapes(shape_of(a), shape_of(b))
        assert shape is not None, "operands do not broadcast"
        props = {"kind": StringAttr(kind)}
        super().__init__(operands=[a, b], result_types=[_tile_type(shape, elem)], properties=props)

    def verify_block_op(self, parent: GraphDefOp) -> None:
        require(self.kind.data in BINARY_KINDS, lambda: f"unknown binary kind '{self.kind.data}'")
        floats_only(self)
        a, b = shape_of(self.a), shape_of(self.b)
        shape = maps.broadcast_shapes(a, b)
        require(
            shape is not None,
            lambda: f"operands do not broadcast: {shape_str(a)} and {shape_str(b)}",
        )
        assert shape is not None
        expect_shape(self.res, shape)


@irdl_op_definition
class ReduceOp(BlockGraphOp):
    """`%r = mugraph.reduce "sum" %t dim 1 keepdim : tensor<8x128xf32> -> tensor<8x1xf32>` (sum/max/mean)."""

    name = "mugraph.reduce"
    kind = prop_def(StringAttr)
    x = operand_def(TensorType)
    res = result_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    keepdim = opt_prop_def(UnitAttr)
    traits = in_graph()
    assembly_format = (
        "$kind $x `dim` $dim (`keepdim` $keepdim^)? attr-dict `:` type($x) `->` type($res)"
    )

    def __init__(
        self, kind: str, x: SSAValue, dim: int, keepdim: bool = False, elem: Attribute = f32
    ):
        shape = maps.reduce_shape(shape_of(x), dim, keepdim)
        props: dict[str, Attribute] = {"kind": StringAttr(kind), "dim": IntegerAttr(dim, i64)}
        if keepdim:
            props["keepdim"] = UnitAttr()
        super().__init__(operands=[x], result_types=[_tile_type(shape, elem)], properties=props)

    def verify_block_op(self, parent: GraphDefOp) -> None:
        require(
            self.kind.data in REDUCE_KINDS, lambda: f"unknown reduction kind '{self.kind.data}'"
        )
        floats_only(self)
        try:
            shape = maps.reduce_shape(
                shape_of(self.x), self.dim.value.data, self.keepdim is not None
            )
        except MapError as e:
            raise VerifyException(str(e)) from None
        expect_shape(self.res, shape)


@irdl_op_definition
class RMSNormOp(BlockGraphOp):
    """`%n = mugraph.rms_norm %x, %g {epsilon = 1.0e-06 : f32} : (tensor<8x4096xbf16>, tensor<4096xbf16>) -> tensor<8x4096xf32>`.

    x / sqrt(mean(x², last dim of the tile) + ε) · g.
    """

    name = "mugraph.rms_norm"
    x = operand_def(TensorType)
    g = operand_def(TensorType)
    res = result_def(TensorType)
    epsilon = prop_def(FloatAttr[Float32Type], default_value=FloatAttr(1e-6, f32))
    traits = in_graph()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$x `,` $g attr-dict `:` functional-type(operands, results)"

    def __init__(self, x: SSAValue, g: SSAValue, epsilon: float = 1e-6, elem: Attribute = f32):
        props = {"epsilon": FloatAttr(epsilon, f32)}
        super().__init__(
            operands=[x, g], result_types=[_tile_type(shape_of(x), elem)], properties=props
        )

    def verify_block_op(self, parent: GraphDefOp) -> None:
        floats_only(self)
        x, g = shape_of(self.x), shape_of(self.g)
        require(
            len(x) >= 1 and g == x[-1:],
            lambda: f"weight must be [{x[-1] if x else '?'}], got {shape_str(g)}",
        )
        expect_shape(self.res, x)


@irdl_op_definition
class RopeOp(BlockGraphOp):
    """`%r = mugraph.rope %x, %cos, %sin : (tensor<1x64xf32>, tensor<1x32xf32>, tensor<1x32xf32>) -> tensor<1x64xf32>`.

    nn.rope on a tile: cat(x₁·cos − x₂·sin, x₂·cos + x₁·sin) over the last dim's halves, cos and
    sin [..., D/2] broadcast against x's leading dims.
    """

    name = "mugraph.rope"
    x = operand_def(TensorType)
    cos = operand_def(TensorType)
    sin = operand_def(TensorType)
    res = result_def(TensorType)
    traits = in_graph()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$x `,` $cos `,` $sin attr-dict `:` functional-type(operands, results)"

    def __init__(self, x: SSAValue, cos: SSAValue, sin: SSAValue, elem: Attribute = f32):
        super().__init__(operands=[x, cos, sin], result_types=[_tile_type(shape_of(x), elem)])

    def verify_block_op(self, parent: GraphDefOp) -> None:
        floats_only(self)
        x = shape_of(self.x)
        width = x[-1] if x else 1
        require(width % 2 == 0, lambda: f"x's last dim must be even, got {shape_str(x)}")
        for name, table in (("cos", shape_of(self.cos)), ("sin", shape_of(self.sin))):
            lead, x_lead = table[:-1], x[:-1]
            half = table[-1] if table else 0
            require(
                half * 2 == width
                and len(lead) <= len(x_lead)
                and all(
                    a in (1, b) for a, b in zip(reversed(lead), reversed(x_lead), strict=False)
                ),
                f"{name} {shape_str(table)} does not fit x {shape_str(x)} (needs [..., D/2])",
            )
        expect_shape(self.res, x)


@irdl_op_definition
class ConcatOp(BlockGraphOp):
    """`%c = mugraph.concat %a, %b dim 1 : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x128xf32>`."""

    name = "mugraph.concat"
    inputs = var_operand_def(TensorType)
    res = result_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    traits = in_graph()
    assembly_format = "$inputs `dim` $dim attr-dict `:` functional-type($inputs, $res)"

    def __init__(self, inputs: Sequence[SSAValue], dim: int, elem: Attribute = f32) -> None:
        shape = list(shape_of(inputs[0]))
        shape[dim] = sum(shape_of(v)[dim] for v in inputs)
        props = {"dim": IntegerAttr(dim, i64)}
        super().__init__(
            operands=[inputs], result_types=[_tile_type(shape, elem)], properties=props
        )

    def verify_block_op(self, parent: GraphDefOp) -> None:
        shapes = [shape_of(v) for v in self.inputs]
        d = self.dim.value.data
        require(len(shapes) >= 1, "needs at least one operand")
        require(
            0 <= d < len(shapes[0]), lambda: f"dim {d} is out of range for rank {len(shapes[0])}"
        )
        for s in shapes:
            same = len(s) == len(shapes[0]) and all(
                a == b for i, (a, b) in enumerate(zip(s, shapes[0], strict=True)) if i != d
            )
            require(
                same, f"operands {shape_str(shapes[0])} and {shape_str(s)} differ outside dim {d}"
            )
        want = list(shapes[0])
        want[d] = sum(s[d] for s in shapes)
        expect_shape(self.res, want)
        values = (*self.inputs, self.res)
        kinds = {"float" if is_float_tile(v) else tensor_type(v).element_type for v in values}
        require(
            len(kinds) == 1, "operands and result must all be float tiles or share one integer type"
        )


@irdl_op_definition
class ReshapeOp(BlockGraphOp):
    """`%r = mugraph.reshape %t : tensor<1x4x1x128xf32> -> tensor<4x128xf32>` (a view: same elements)."""

    name = "mugraph.reshape"
    x = operand_def(TensorType)
    res = result_def(TensorType)
    traits = in_graph()
    assembly_format = "$x attr-dict `:` type($x) `->` type($res)"

    def __init__(self, x: SSAValue, shape: Sequence[int]) -> None:
        super().__init__(
            operands=[x], result_types=[_tile_type(shape, tensor_type(x).element_type)]
        )

    def verify_block_op(self, parent: GraphDefOp) -> None:
        a, b = tensor_type(self.x), tensor_type(self.res)
        require(
            a.element_count() == b.element_count(),
            lambda: (
                f"element counts differ: {shape_str(a.get_shape())} has {a.element_count()}, {shape_str(b.get_shape())} has {b.element_count()}"
            ),
        )
        require(
            a.element_type == b.element_type,
            lambda: f"element types differ: {a.element_type} and {b.element_type}",
        )


def scalar_type(tile: Attribute) -> Attribute:
    """The type a thread computes a tile element in: f32 for floats, the integer type itself."""
    assert isinstance(tile, TensorType)
    return f32 if isinstance(tile.element_type, FLOATS) else tile.element_type


@irdl_op_definition
class ThreadMapOp(BlockGraphOp):
    """A thread-level fused chain, applied elementwise with broadcasting:

        %y = mugraph.thread_map %a, %b : (tensor<8x128xf32>, tensor<8x128xf32>) -> tensor<8x128xbf16> {
        ^bb0(%p: f32, %q: f32):
          %s = arith.mulf %p, %q : f32
          mugraph.yield %s : f32
        }

    Region arguments are f32 for float tiles (the integer type for integer tiles); the body holds
    only arith/math scalar ops and yields one scalar per result.
    """

    name = "mugraph.thread_map"
    args = var_operand_def(TensorType)
    res = var_result_def(TensorType)
    body = region_def("single_block")
    traits = in_graph()
    assembly_format = "$args attr-dict-with-keyword `:` functional-type($args, $res) $body"

    def __init__(self, args: Sequence[SSAValue], result_types: Sequence[Attribute], body: Region):
        super().__init__(operands=[args], result_types=[result_types], regions=[body])

    def verify_block_op(self, parent: GraphDefOp) -> None:
        block = self.body.block
        require(
            len(block.args) == len(self.args),
            lambda: (
                f"region has {len(block.args)} arguments, but there are {len(self.args)} operands"
            ),
        )
        for i, (arg, v) in enumerate(zip(block.args, self.args, strict=True)):
            want = scalar_type(v.type)
            if arg.type != want:
                raise VerifyException(
                    f"region argument #{i} is {arg.type}, expected {want} for {v.type}"
                )
        shape = maps.broadcast_shapes(*(shape_of(v) for v in self.args))
        require(
            shape is not None,
            lambda: (
                "operands do not broadcast: " + ", ".join(shape_str(shape_of(v)) for v in self.args)
            ),
        )
        assert shape is not None
        for r in self.res:
            expect_shape(r, shape)
        for op in block.ops:
            scalar_op = op.dialect_name() in ("arith", "math") and not op.regions
            require(
                scalar_op or isinstance(op, YieldOp),
                f"body may hold only arith/math scalar ops, found '{op.name}'",
            )
            for v in (*op.operands, *op.results):
                if not isinstance(v.type, _SCALARS):
                    raise VerifyException(
                        f"body ops work on scalars, but '{op.name}' has a {v.type} value"
                    )
        last = block.last_op
        require(isinstance(last, YieldOp), "body must end with mugraph.yield")
        assert isinstance(last, YieldOp)
        got, want = [v.type for v in last.values], [scalar_type(r.type) for r in self.res]
        require(
            got == want,
            lambda: f"yields ({', '.join(map(str, got))}), expected ({', '.join(map(str, want))})",
        )


@irdl_op_definition
class YieldOp(IRDLOperation):
    """`mugraph.yield %r : f32` ends a thread_map body."""

    name = "mugraph.yield"
    values = var_operand_def()
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(ThreadMapOp), Pure()))
    assembly_format = "attr-dict ($values^ `:` type($values))?"

    def __init__(self, *values: SSAValue) -> None:
        super().__init__(operands=[values])


@irdl_op_definition
class AccumOp(AccumulatorOp):
    """`%acc = mugraph.accum "sum" %p : tensor<8x128xf32> -> tensor<8x128xf32>`; kinds: ACCUM_KINDS.

    sum/max: elementwise over iterations. *_last kinds reduce the tile's last dim to 1 first:
    sum_last, max_last, sum_sq_last (Σx²), mean_last and mean_sq_last (divided by the extent the
    loop walks: last dim × forloop). The result (f32) is the value after the last iteration.
    """

    name = "mugraph.accum"
    kind = prop_def(StringAttr)
    x = operand_def(TensorType)
    res = result_def(TensorType)
    traits = in_graph()
    assembly_format = "$kind $x attr-dict `:` type($x) `->` type($res)"

    def __init__(self, kind: str, x: SSAValue) -> None:
        shape = list(shape_of(x))
        if ACCUM_KINDS[kind].reduce_last:
            shape[-1] = 1
        super().__init__(
            operands=[x], result_types=[_tile_type(shape)], properties={"kind": StringAttr(kind)}
        )

    def verify_block_op(self, parent: GraphDefOp) -> None:
        kind = self.kind.data
        require(kind in ACCUM_KINDS, lambda: f"unknown accumulator kind '{kind}'")
        floats_only(self)
        require(
            tensor_type(self.res).element_type == f32,
            lambda: f"accumulators are f32, got {self.res.type}",
        )
        shape = list(shape_of(self.x))
        if ACCUM_KINDS[kind].reduce_last:
            require(len(shape) >= 1, lambda: f"'{kind}' needs a tile of rank >= 1")
            shape[-1] = 1
        expect_shape(self.res, shape)


@irdl_op_definition
class AccumSoftmaxOp(AccumulatorOp):
    """Online-softmax accumulator (flash-decoding):

        %o, %m, %l = mugraph.accum_softmax %s, %v : (tensor<4x64xf32>, tensor<64x128xbf16>)
                       -> (tensor<4x128xf32>, tensor<4x1xf32>, tensor<4x1xf32>)

    Scores s[..., r, t] and values v[..., t, d] of one iteration update, from m = -inf, l = o = 0:
    m' = max(m, rowmax s); p = e^(s - m'); l ← l·e^(m - m') + rowsum p; o ← o·e^(m - m') + p·v.
    Results: the unnormalised output o, the running max m and the running sum l (all f32).
    """

    name = "mugraph.accum_softmax"
    scores = operand_def(TensorType)
    v = operand_def(TensorType)
    o = result_def(TensorType)
    m = result_def(TensorType)
    l = result_def(TensorType)  # noqa: E741
    traits = in_graph()
    assembly_format = "$scores `,` $v attr-dict `:` functional-type(operands, results)"

    def __init__(self, scores: SSAValue, v: SSAValue) -> None:
        o = maps.matmul_shape(shape_of(scores), shape_of(v), transpose_b=False)
        rows = _tile_type((*o[:-1], 1))
        super().__init__(operands=[scores, v], result_types=[_tile_type(o), rows, rows])

    def verify_block_op(self, parent: GraphDefOp) -> None:
        floats_only(self)
        s, v = shape_of(self.scores), shape_of(self.v)
        try:
            o = maps.matmul_shape(s, v, transpose_b=False)
        except MapError as e:
            raise VerifyException(f"scores·v: {e}") from None
        expect_shape(self.o, o, "o")
        expect_shape(self.m, (*o[:-1], 1), "m")
        expect_shape(self.l, (*o[:-1], 1), "l")
        for r in self.results:
            if tensor_type(r).element_type != f32:
                raise VerifyException(f"accumulators are f32, got {r.type}")
