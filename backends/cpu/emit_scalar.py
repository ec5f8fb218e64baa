"""C++ for element types and for the scalar arith/math bodies of `mugraph.thread_map`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    TensorType,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue

from mk.diagnostics import MkError, op_location

_FLOAT_DTYPES: dict[type[Attribute], str] = {
    Float32Type: "mk::DTYPE_F32",
    Float16Type: "mk::DTYPE_F16",
    BFloat16Type: "mk::DTYPE_BF16",
    Float64Type: "mk::DTYPE_F64",
}
_INT_DTYPES = {1: "mk::DTYPE_U8", 8: "mk::DTYPE_I8", 32: "mk::DTYPE_I32", 64: "mk::DTYPE_I64"}


def element_of(ty: Attribute) -> Attribute:
    return ty.element_type if isinstance(ty, TensorType) else ty


def dtype_code(ty: Attribute, where: Operation | None = None) -> str:
    """The `mk::DType` constant that stores an element (or tensor) type."""
    elem = element_of(ty)
    if type(elem) in _FLOAT_DTYPES:
        return _FLOAT_DTYPES[type(elem)]
    if isinstance(elem, IndexType):
        return "mk::DTYPE_I64"
    if isinstance(elem, IntegerType) and elem.width.data in _INT_DTYPES:
        return _INT_DTYPES[elem.width.data]
    loc = op_location(where) if where is not None else None
    raise MkError(f"the CPU backend cannot store elements of type {elem}", loc)


def is_float(ty: Attribute) -> bool:
    return type(element_of(ty)) in _FLOAT_DTYPES


def tile_ctype(ty: Attribute) -> str:
    """Tiles hold floats (bf16/f16 values already rounded) or 64-bit integers."""
    return "float" if is_float(ty) else "int64_t"


def dims(shape: Sequence[int]) -> str:
    return "mk::cpu::Dims{" + ", ".join(str(int(d)) for d in shape) + "}"


def float_literal(value: float, double: bool = False) -> str:
    """A C++ literal that parses to exactly this float32 (or double) value."""
    v = float(value) if double else float(np.float32(value))
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    # The shortest text that round-trips in the literal's own precision.
    text = repr(v) if double else str(np.float32(v))
    if not any(c in text for c in ".en"):
        text += ".0"
    return text if double else text + "f"


# ------------------------------------------------------------------------------------------------
# Scalar ops
# ------------------------------------------------------------------------------------------------


def scalar_ctype(ty: Attribute) -> str:
    if isinstance(ty, Float64Type):
        return "double"
    if is_float(ty):
        return "float"
    if isinstance(ty, IntegerType) and ty.width.data == 1:
        return "bool"
    return "int64_t"


_BIN = {"addf": "+", "subf": "-", "mulf": "*", "divf": "/", "addi": "+", "subi": "-"}
_BIN |= {"muli": "*", "andi": "&", "ori": "|", "xori": "^"}
_CALL2 = {
    "arith.maximumf": "mk::cpu::nan_max",
    "arith.minimumf": "mk::cpu::nan_min",
    "arith.maxnumf": "std::fmax",
    "arith.minnumf": "std::fmin",
    "arith.maxsi": "std::max",
    "arith.minsi": "std::min",
    "math.atan2": "std::atan2",
    "math.copysign": "std::copysign",
    "math.powf": "std::pow",
}
_MATH1 = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "tanh", "sin", "cos",
    "tan", "sinh", "cosh", "asin", "acos", "atan", "ceil", "floor", "trunc",
)  # fmt: skip
_CMPF = {
    0: "false", 1: "{a} == {b}", 2: "{a} > {b}", 3: "{a} >= {b}", 4: "{a} < {b}", 5: "{a} <= {b}",
    6: "({a} != {b} && {a} == {a} && {b} == {b})", 7: "({a} == {a} && {b} == {b})",
    8: "({a} == {b} || {a} != {a} || {b} != {b})", 9: "!({a} <= {b})", 10: "!({a} < {b})",
    11: "!({a} >= {b})", 12: "!({a} > {b})", 13: "{a} != {b}", 14: "({a} != {a} || {b} != {b})",
    15: "true",
}  # fmt: skip
_CMPI = ["==", "!=", "<", "<=", ">", ">=", "<", "<=", ">", ">="]


def _predicate(op: Operation) -> int:
    attr = op.properties["predicate"]
    assert isinstance(attr, IntegerAttr)
    return int(attr.value.data)


def _constant(op: Operation, _a: list[str]) -> str:
    value = op.properties["value"]
    ty = op.results[0].type
    if isinstance(value, FloatAttr):
        return float_literal(float(value.value.data), isinstance(ty, Float64Type))
    if isinstance(value, IntegerAttr):
        v = int(value.value.data)
        return ("true" if v else "false") if scalar_ctype(ty) == "bool" else f"INT64_C({v})"
    raise MkError(f"the CPU backend cannot emit the constant {value}", op_location(op))


def _cmpi(op: Operation, a: list[str]) -> str:
    p = _predicate(op)
    if p >= 6:
        return f"static_cast<uint64_t>({a[0]}) {_CMPI[p]} static_cast<uint64_t>({a[1]})"
    return f"{a[0]} {_CMPI[p]} {a[1]}"


def _convert(op: Operation, a: list[str]) -> str:
    ty = op.results[0].type
    if isinstance(ty, Float16Type | BFloat16Type):
        return f"mk::cpu::round_to(static_cast<float>({a[0]}), {dtype_code(ty)})"
    if isinstance(ty, IntegerType) and ty.width.data == 32:
        return f"static_cast<int64_t>(static_cast<int32_t>({a[0]}))"
    if name_of(op) == "arith.fptosi":
        return f"static_cast<int64_t>(std::trunc({a[0]}))"
    return f"static_cast<{scalar_ctype(ty)}>({a[0]})"


def name_of(op: Operation) -> str:
    return op.name


_SPECIAL: dict[str, Callable[[Operation, list[str]], str]] = {
    "arith.constant": _constant,
    "arith.negf": lambda _o, a: f"-{a[0]}",
    "arith.divsi": lambda _o, a: f"({a[1]} == 0 ? 0 : {a[0]} / {a[1]})",
    "arith.remsi": lambda _o, a: f"({a[1]} == 0 ? 0 : {a[0]} % {a[1]})",
    "arith.cmpf": lambda o, a: _CMPF[_predicate(o)].format(a=a[0], b=a[1]),
    "arith.cmpi": _cmpi,
    "arith.select": lambda _o, a: f"({a[0]} ? {a[1]} : {a[2]})",
    "math.rsqrt": lambda _o, a: f"1.0f / std::sqrt({a[0]})",
    "math.erf": lambda _o, a: f"static_cast<float>(std::erf(static_cast<double>({a[0]})))",
    "math.absf": lambda _o, a: f"std::fabs({a[0]})",
    "math.absi": lambda _o, a: f"std::llabs({a[0]})",
    "math.round": lambda _o, a: f"std::round({a[0]})",
    "math.roundeven": lambda _o, a: f"std::nearbyint({a[0]})",
    "math.fpowi": lambda _o, a: f"std::pow({a[0]}, static_cast<float>({a[1]}))",
    "math.fma": lambda _o, a: f"{a[0]} * {a[1]} + {a[2]}",
}
for _n in ("sitofp", "fptosi", "extf", "truncf", "extsi", "trunci", "index_cast"):
    _SPECIAL[f"arith.{_n}"] = _convert


def scalar_expr(op: Operation, args: list[str]) -> str:
    """The C++ expression of one scalar op; a located MkError for one the backend lacks."""
    short = op.name.split(".", 1)[1]
    if op.name in _SPECIAL:
        return _SPECIAL[op.name](op, args)
    if op.name.startswith("arith.") and short in _BIN:
        expr = f"{args[0]} {_BIN[short]} {args[1]}"
        return f"static_cast<bool>({expr})" if scalar_ctype(op.results[0].type) == "bool" else expr
    if op.name in _CALL2:
        return f"{_CALL2[op.name]}({args[0]}, {args[1]})"
    if op.name.startswith("math.") and short in _MATH1:
        return f"std::{short}({args[0]})"
    raise MkError(f"'{op.name}' is not supported by the CPU backend", op_location(op))


def scalar_body(
    block: Block, inputs: list[str], names: Callable[[], str]
) -> tuple[list[str], list[str]]:
    """Statements computing a thread_map body per element, and the yielded expressions."""
    env: dict[SSAValue, str] = dict(zip(block.args, inputs, strict=True))
    lines: list[str] = []
    for op in block.ops:
        if op.name == "mugraph.yield":
            return lines, [env[v] for v in op.operands]
        name = names()
        ctype = scalar_ctype(op.results[0].type)
        lines.append(f"const {ctype} {name} = {scalar_expr(op, [env[v] for v in op.operands])};")
        env[op.results[0]] = name
    parent = block.parent_op()
    raise MkError(
        "a thread_map body must end with mugraph.yield", op_location(parent) if parent else None
    )
