"""Shared machinery of the nn dialect: attributes, shape rules, checks and the op base classes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeAlias

from xdsl.dialects.builtin import (
    I64,
    BoolAttr,
    DenseArrayBase,
    Float32Type,
    FloatAttr,
    IntegerAttr,
    TensorType,
    bf16,
    f16,
    f32,
    i1,
    i32,
    i64,
)
from xdsl.ir import Attribute, AttributeCovT, Operation, SSAValue
from xdsl.irdl import (
    AttrConstraint,
    IntConstraint,
    IRDLOperation,
    OptionalDef,
    ParsePropInAttrDict,
    VarOperandDef,
    VerificationContext,
    irdl_to_attr_constraint,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

if TYPE_CHECKING:
    from typing_extensions import TypeVar  # the kind xDSL's constraint API is typed with

AttrValue: TypeAlias = int | float | bool | tuple[int, ...]
Shape: TypeAlias = tuple[int, ...]
Operand: TypeAlias = SSAValue | Operation
Named: TypeAlias = Sequence[tuple[str, TensorType]]

DATA_TYPES: tuple[Attribute, ...] = (f32, f16, bf16)
INDEX_TYPES: tuple[Attribute, ...] = (i32, i64)
ANY_TYPES = DATA_TYPES + INDEX_TYPES


# ----------------------------------------------------------------------------- attributes


def f32_attr(value: float) -> FloatAttr:
    return FloatAttr(value, f32)


def i64_attr(value: int) -> IntegerAttr:
    return IntegerAttr(value, i64)


def bool_attr(value: bool) -> IntegerAttr:
    return IntegerAttr.from_bool(value)


def i64_array_attr(values: Sequence[int]) -> DenseArrayBase:
    return DenseArrayBase.from_list(i64, [int(v) for v in values])


@dataclass(frozen=True)
class _Described(AttrConstraint[AttributeCovT], Generic[AttributeCovT]):
    """A constraint whose failure names the property or operand and the expected spelling.

    xDSL's own message (`f64 should be of base attribute f32`) does not say which
    attribute or operand of the op is wrong, nor how to write it.
    """

    inner: AttrConstraint[AttributeCovT]
    expected: str

    def verify(self, attr: Attribute, constraint_context: VerificationContext) -> None:
        try:
            self.inner.verify(attr, constraint_context)
        except VerifyException:
            raise VerifyException(f"{self.expected}, got {attr}") from None

    def get_bases(self) -> set[type[Attribute]] | None:
        return self.inner.get_bases()

    def mapping_type_vars(
        self, type_var_mapping: Mapping[TypeVar, AttrConstraint | IntConstraint]
    ) -> _Described[AttributeCovT]:
        return _Described(self.inner.mapping_type_vars(type_var_mapping), self.expected)


def f32_prop(name: str, default: float | None = None) -> FloatAttr[Float32Type]:
    constr = irdl_to_attr_constraint(FloatAttr[Float32Type])
    described = _Described(constr, f"attribute '{name}' must be an f32 float like `1.0 : f32`")
    return prop_def(described, default_value=None if default is None else f32_attr(default))


def i64_prop(name: str, default: int | None = None) -> IntegerAttr[I64]:
    constr = irdl_to_attr_constraint(IntegerAttr[I64])
    described = _Described(constr, f"attribute '{name}' must be an i64 integer like `1 : i64`")
    return prop_def(described, default_value=None if default is None else i64_attr(default))


def bool_prop(name: str) -> BoolAttr:
    described = _Described(
        irdl_to_attr_constraint(BoolAttr), f"attribute '{name}' must be true or false"
    )
    return prop_def(described, default_value=bool_attr(False))


def i64_array_prop(name: str) -> DenseArrayBase:
    constr = DenseArrayBase.constr(i64)
    return prop_def(
        _Described(constr, f"attribute '{name}' must be an i64 array like `array<i64: 0, 1>`")
    )


def tensor_constr(name: str) -> _Described[TensorType]:
    return _Described(irdl_to_attr_constraint(TensorType), f"{name} must be a ranked tensor")


def _plain(attr: Attribute) -> AttrValue:
    """A property as a plain Python value (i1 integers are booleans)."""
    if isinstance(attr, FloatAttr):
        return float(attr.value.data)
    if isinstance(attr, IntegerAttr):
        value = int(attr.value.data)
        return bool(value) if attr.type == i1 else value
    if isinstance(attr, DenseArrayBase):
        return tuple(int(v) for v in attr.get_values())
    raise TypeError(f"no plain value for attribute {attr}")


def _plain_properties(
    cls: type[IRDLOperation], props: Mapping[str, Attribute]
) -> dict[str, AttrValue]:
    values: dict[str, AttrValue] = {}
    for name, definition in cls.get_irdl_definition().properties.items():
        attr = props.get(name, definition.default_value)
        if attr is not None:
            values[name] = _plain(attr)
    return values


def attribute_values(op: Operation) -> dict[str, AttrValue]:
    """Every property of an nn op as plain Python values, defaults filled in."""
    if not isinstance(op, NNOp):
        raise TypeError(f"'{op.name}' is not an nn op")
    return _plain_properties(type(op), op.properties)


# ----------------------------------------------------------------------------- shapes


def as_int(value: AttrValue) -> int:
    """An integer attribute value (booleans are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer attribute value, got {value!r}")
    return value


def as_ints(value: AttrValue) -> tuple[int, ...]:
    if not isinstance(value, tuple):
        raise TypeError(f"expected an integer array attribute value, got {value!r}")
    return value


def fmt_shape(shape: Sequence[int]) -> str:
    """`8x4096` (`?` for a dynamic dim, `scalar` for rank 0), as in the messages."""
    return "x".join("?" if d < 0 else str(d) for d in shape) if shape else "scalar"


def fmt_dims(t: TensorType) -> str:
    return fmt_shape(t.get_shape())


def broadcast_shapes(a: Sequence[int], b: Sequence[int]) -> Shape | None:
    """NumPy broadcasting of two shapes; None when they do not broadcast."""
    rank = max(len(a), len(b))
    pa = (1,) * (rank - len(a)) + tuple(a)
    pb = (1,) * (rank - len(b)) + tuple(b)
    out: list[int] = []
    for x, y in zip(pa, pb, strict=True):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


def normalize_dim(dim: int, rank: int) -> int:
    """`dim` in [0, rank), counting negative dims from the end; VerifyException if out of range."""
    if not -rank <= dim < rank:
        raise VerifyException(
            f"dim {dim} is out of range for rank {rank} (expected {-rank} <= dim < {rank})"
        )
    return dim % rank


# ----------------------------------------------------------------------------- checks


def element_type(named: Named, allowed: tuple[Attribute, ...] = DATA_TYPES) -> Attribute:
    """The element type all `named` tensors share; it must be one of `allowed`."""
    first_name, first = named[0]
    for name, t in named:
        if t.element_type not in allowed:
            *rest, last = map(str, allowed)
            kinds = f"{', '.join(rest)} or {last}" if rest else last
            raise VerifyException(f"{name} must have element type {kinds}, got {t.element_type}")
    for name, t in named[1:]:
        if t.element_type != first.element_type:
            raise VerifyException(
                f"element types differ: {first_name} is {first.element_type}, "
                f"{name} is {t.element_type}"
            )
    return first.element_type


def require_rank_at_least(name: str, t: TensorType, rank: int) -> None:
    if t.get_num_dims() < rank:
        raise VerifyException(
            f"{name} must have rank >= {rank}, got rank {t.get_num_dims()} ({fmt_dims(t)})"
        )


def require_rank(name: str, t: TensorType, rank: int, layout: str) -> None:
    if t.get_num_dims() != rank:
        raise VerifyException(
            f"{name} must have rank {rank} ({layout}), got rank {t.get_num_dims()} ({fmt_dims(t)})"
        )


def _operand_names(cls: type[IRDLOperation], count: int) -> list[str]:
    defs = cls.get_irdl_definition().operands
    if len(defs) == 1 and isinstance(defs[0][1], VarOperandDef):
        if not isinstance(defs[0][1], OptionalDef):
            return [f"{defs[0][0]}[{i}]" for i in range(count)]
    return [name for name, _ in defs][:count]


def require_static(name: str, t: TensorType) -> None:
    if any(d < 0 for d in t.get_shape()):
        raise VerifyException(f"{name} has a dynamic shape {fmt_dims(t)}; nn needs static shapes")
    # The lowering tiles every dimension it maps, and an empty one has no tile.
    if 0 in t.get_shape():
        raise VerifyException(f"{name} is empty ({fmt_dims(t)}); nn takes no zero-size dimension")


def static_tensors(cls: type[IRDLOperation], types: Sequence[Attribute]) -> list[TensorType]:
    """The operand types as static ranked tensors, or a VerifyException naming the operand."""
    tensors: list[TensorType] = []
    for name, t in zip(_operand_names(cls, len(types)), types, strict=False):
        if not isinstance(t, TensorType):
            raise VerifyException(f"{name} must be a ranked tensor, got {t}")
        require_static(name, t)
        tensors.append(t)
    return tensors


def check_result(actual: Attribute, expected: TensorType) -> None:
    if not isinstance(actual, TensorType):
        raise VerifyException(f"result must be a ranked tensor, got {actual}")
    if actual.get_shape() != expected.get_shape():
        raise VerifyException(f"result shape is {fmt_dims(actual)}, expected {fmt_dims(expected)}")
    if actual.element_type != expected.element_type:
        raise VerifyException(
            f"result element type is {actual.element_type}, expected {expected.element_type}"
        )
    if actual != expected:
        raise VerifyException(f"result type is {actual}, expected {expected}")


def _flatten(operands: Sequence[Operand | Sequence[Operand] | None]) -> list[SSAValue]:
    flat: list[SSAValue] = []
    for group in operands:
        if group is None:
            continue
        items = group if isinstance(group, Sequence) else [group]
        flat.extend(SSAValue.get(v) for v in items)
    return flat


# ----------------------------------------------------------------------------- base classes


class NNOp(IRDLOperation):
    """An nn op: one tensor result, properties in the attr-dict, functional-type syntax.

    Each subclass gives one shape function, `_infer`, used both by its builder and by
    `verify_`, so the result type a builder picks is exactly what the verifier accepts.
    """

    result = result_def(tensor_constr("result"))
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())
    assembly_format = "operands attr-dict `:` functional-type(operands, results)"

    @classmethod
    def infer_result_type(
        cls, operand_types: Sequence[Attribute], attrs: Mapping[str, AttrValue] | None = None
    ) -> TensorType:
        """The result type for these operands and attributes (defaults filled in).

        Raises VerifyException, naming the mismatch, when they are invalid.
        """
        values = _plain_properties(cls, {}) | dict(attrs or {})
        for name, definition in cls.get_irdl_definition().properties.items():
            if name not in values and not isinstance(definition, OptionalDef):
                raise VerifyException(f"missing attribute '{name}'")
        return cls._infer(static_tensors(cls, operand_types), values)

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        raise NotImplementedError(cls.__name__)

    def _create(
        self,
        operands: Sequence[Operand | Sequence[Operand] | None],
        props: Mapping[str, Attribute] | None = None,
    ) -> None:
        props = dict(props or {})
        types = [v.type for v in _flatten(operands)]
        result = self.infer_result_type(types, _plain_properties(type(self), props))
        super().__init__(operands=operands, result_types=[result], properties=props)

    def verify_(self) -> None:
        expected = self.infer_result_type(self.operand_types, attribute_values(self))
        check_result(self.result.type, expected)


class UnaryOp(NNOp):
    """Elementwise x -> same shape and type."""

    x = operand_def(tensor_constr("x"))

    def __init__(self, x: Operand) -> None:
        self._create([x])

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        element_type([("x", types[0])])
        return types[0]


class BinaryOp(NNOp):
    """Elementwise a, b -> NumPy-broadcast shape."""

    a = operand_def(tensor_constr("a"))
    b = operand_def(tensor_constr("b"))

    def __init__(self, a: Operand, b: Operand) -> None:
        self._create([a, b])

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        a, b = types
        dtype = element_type([("a", a), ("b", b)])
        shape = broadcast_shapes(a.get_shape(), b.get_shape())
        if shape is None:
            raise VerifyException(
                f"operands do not broadcast: a is {fmt_dims(a)}, b is {fmt_dims(b)}"
            )
        return TensorType(dtype, shape)


class ReduceOp(NNOp):
    """x -> x with `dim` removed (or kept as 1 with keepdim)."""

    x = operand_def(tensor_constr("x"))
    dim = i64_prop("dim")
    keepdim = bool_prop("keepdim")

    def __init__(self, x: Operand, dim: int, keepdim: bool = False) -> None:
        self._create([x], {"dim": i64_attr(dim), "keepdim": bool_attr(keepdim)})

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        (x,) = types
        dtype = element_type([("x", x)])
        dim = normalize_dim(as_int(attrs["dim"]), x.get_num_dims())
        shape = list(x.get_shape())
        if attrs["keepdim"]:
            shape[dim] = 1
        else:
            del shape[dim]
        return TensorType(dtype, shape)
