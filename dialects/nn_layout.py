"""The layout ops of the nn dialect: reshape, transpose, concat and slice (element moves only)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, var_operand_def
from xdsl.utils.exceptions import VerifyException

from .nn_base import (
    ANY_TYPES,
    AttrValue,
    NNOp,
    Operand,
    as_int,
    as_ints,
    element_type,
    fmt_dims,
    i64_array_attr,
    i64_array_prop,
    i64_attr,
    i64_prop,
    normalize_dim,
    require_static,
    static_tensors,
    tensor_constr,
)


@irdl_op_definition
class ReshapeOp(NNOp):
    """`nn.reshape`: same elements, new static shape (given by the result type)."""

    name = "nn.reshape"
    x = operand_def(tensor_constr("x"))

    def __init__(self, x: Operand, shape: Sequence[int]) -> None:
        value = SSAValue.get(x)
        (xt,) = static_tensors(type(self), [value.type])
        result = TensorType(xt.element_type, shape)
        check_reshape(xt, result)
        super().__init__(operands=[value], result_types=[result])

    def verify_(self) -> None:
        (x,) = static_tensors(type(self), self.operand_types)
        check_reshape(x, self.result.type)


def check_reshape(x: TensorType, result: Attribute) -> None:
    """A reshape of x to `result` keeps the element type and the element count."""
    element_type([("x", x)], ANY_TYPES)
    if not isinstance(result, TensorType):
        raise VerifyException(f"result must be a ranked tensor, got {result}")
    require_static("result", result)
    if result.element_type != x.element_type:
        raise VerifyException(
            f"result element type is {result.element_type}, expected {x.element_type}"
        )
    nx, nr = math.prod(x.get_shape()), math.prod(result.get_shape())
    if nx != nr:
        raise VerifyException(
            f"element counts differ: x is {fmt_dims(x)} ({nx} elements), "
            f"result is {fmt_dims(result)} ({nr} elements)"
        )


@irdl_op_definition
class TransposeOp(NNOp):
    """`nn.transpose {perm}`: result dim i is x dim perm[i]."""

    name = "nn.transpose"
    x = operand_def(tensor_constr("x"))
    perm = i64_array_prop("perm")

    def __init__(self, x: Operand, perm: Sequence[int]) -> None:
        self._create([x], {"perm": i64_array_attr(perm)})

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        (x,) = types
        dtype = element_type([("x", x)], ANY_TYPES)
        perm = as_ints(attrs["perm"])
        rank = x.get_num_dims()
        if len(perm) != rank:
            raise VerifyException(f"perm has {len(perm)} entries but x has rank {rank}")
        if sorted(perm) != list(range(rank)):
            raise VerifyException(
                f"perm [{', '.join(map(str, perm))}] is not a permutation of 0..{rank - 1}"
            )
        return TensorType(dtype, [x.get_shape()[p] for p in perm])


@irdl_op_definition
class ConcatOp(NNOp):
    """`nn.concat {dim}`: inputs joined along `dim`; all other dims equal."""

    name = "nn.concat"
    inputs = var_operand_def(tensor_constr("inputs"))
    dim = i64_prop("dim")

    def __init__(self, inputs: Sequence[Operand], dim: int) -> None:
        self._create([list(inputs)], {"dim": i64_attr(dim)})

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        if not types:
            raise VerifyException("needs at least one input")
        named = [(f"inputs[{i}]", t) for i, t in enumerate(types)]
        dtype = element_type(named, ANY_TYPES)
        first = types[0]
        dim = normalize_dim(as_int(attrs["dim"]), first.get_num_dims())
        for name, t in named[1:]:
            _check_concat_part(first, name, t, dim)
        shape = list(first.get_shape())
        shape[dim] = sum(t.get_shape()[dim] for t in types)
        return TensorType(dtype, shape)


def _check_concat_part(first: TensorType, name: str, t: TensorType, dim: int) -> None:
    """Input `name` has the rank of inputs[0] and the same size in every dim but `dim`."""
    if t.get_num_dims() != first.get_num_dims():
        raise VerifyException(
            f"ranks differ: inputs[0] is {fmt_dims(first)}, {name} is {fmt_dims(t)}"
        )
    pairs = enumerate(zip(first.get_shape(), t.get_shape(), strict=True))
    if any(i != dim and m != n for i, (m, n) in pairs):
        raise VerifyException(
            f"dims other than {dim} differ: inputs[0] is {fmt_dims(first)}, {name} is {fmt_dims(t)}"
        )


@irdl_op_definition
class SliceOp(NNOp):
    """`nn.slice {offsets, sizes}`: the box [offsets, offsets + sizes) of x."""

    name = "nn.slice"
    x = operand_def(tensor_constr("x"))
    offsets = i64_array_prop("offsets")
    sizes = i64_array_prop("sizes")

    def __init__(self, x: Operand, offsets: Sequence[int], sizes: Sequence[int]) -> None:
        self._create([x], {"offsets": i64_array_attr(offsets), "sizes": i64_array_attr(sizes)})

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        (x,) = types
        dtype = element_type([("x", x)], ANY_TYPES)
        offsets, sizes = as_ints(attrs["offsets"]), as_ints(attrs["sizes"])
        rank = x.get_num_dims()
        for name, values in (("offsets", offsets), ("sizes", sizes)):
            if len(values) != rank:
                raise VerifyException(f"{name} has {len(values)} entries but x has rank {rank}")
        for i, (off, size, extent) in enumerate(zip(offsets, sizes, x.get_shape(), strict=True)):
            if off < 0 or size < 0 or off + size > extent:
                raise VerifyException(
                    f"slice [{off}, {off + size}) of dim {i} is out of bounds for x ({fmt_dims(x)})"
                )
        return TensorType(dtype, sizes)
