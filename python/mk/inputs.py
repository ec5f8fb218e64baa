"""NumPy values for a function's tensor arguments: dtype mapping, strict input checks, random inputs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    TensorType,
)
from xdsl.dialects.func import CallOp, FuncOp
from xdsl.ir import Attribute, BlockArgument, Operation, SSAValue
from xdsl.traits import SymbolTable

from mk.diagnostics import MkError, op_location

_FLOATS: dict[type[Attribute], np.dtype] = {
    Float32Type: np.dtype(np.float32),
    Float16Type: np.dtype(np.float16),
    BFloat16Type: np.dtype(ml_dtypes.bfloat16),
    Float64Type: np.dtype(np.float64),
}
_INTS: dict[int, np.dtype] = {
    1: np.dtype(np.bool_),
    8: np.dtype(np.int8),
    16: np.dtype(np.int16),
    32: np.dtype(np.int32),
    64: np.dtype(np.int64),
}


def numpy_dtype(element_type: Attribute) -> np.dtype:
    """The NumPy dtype that stores an element type (bf16 -> ml_dtypes.bfloat16)."""
    if type(element_type) in _FLOATS:
        return _FLOATS[type(element_type)]
    if isinstance(element_type, IntegerType) and element_type.width.data in _INTS:
        return _INTS[element_type.width.data]
    raise MkError(f"element type {element_type} has no NumPy equivalent")


def tensor_type(value: SSAValue) -> TensorType:
    """The tensor type of a value; anything else is a user error."""
    if not isinstance(value.type, TensorType):
        raise MkError(f"expected a tensor, got {value.type}", _value_location(value))
    return value.type


def _value_location(value: SSAValue) -> str | None:
    owner = value.owner
    op = owner if isinstance(owner, Operation) else owner.parent_op()
    return op_location(op) if op is not None else None


def argument_label(index: int, arg: SSAValue) -> str:
    """`argument 1 ('%w')`, or `argument 1` when the argument has no name."""
    return f"argument {index} ('%{arg.name_hint}')" if arg.name_hint else f"argument {index}"


def _shape_text(shape: Sequence[int]) -> str:
    return str(tuple(int(d) for d in shape))


def check_inputs(func: FuncOp, inputs: Sequence[object]) -> list[np.ndarray]:
    """Check count, kind, dtype and shape of each input; ValueError names the argument."""
    args = func.body.block.args
    if len(inputs) != len(args):
        names = ", ".join(f"%{a.name_hint}" if a.name_hint else f"#{i}" for i, a in enumerate(args))
        raise ValueError(
            f"@{func.sym_name.data} expects {len(args)} inputs ({names}), got {len(inputs)}"
        )
    return [
        _check_one(i, arg, value) for i, (arg, value) in enumerate(zip(args, inputs, strict=True))
    ]


def check_donated(func: FuncOp, arrays: Sequence[np.ndarray]) -> None:
    """Donated arguments are written in place: each must be a writable C-contiguous array."""
    from mk.dialects.nn_decode import donated_args

    for i in donated_args(func):
        if not (arrays[i].flags.writeable and arrays[i].flags.c_contiguous):
            label = argument_label(i, func.body.block.args[i])
            raise ValueError(f"{label}: a donated array must be writable and C-contiguous")


def _check_one(index: int, arg: BlockArgument, value: object) -> np.ndarray:
    label = argument_label(index, arg)
    ty = tensor_type(arg)
    if not isinstance(value, np.ndarray):
        raise ValueError(f"{label}: expected a numpy array for {ty}, got {type(value).__name__}")
    want = numpy_dtype(ty.element_type)
    if value.dtype != want:
        raise ValueError(f"{label}: expected dtype {want.name} for {ty}, got {value.dtype.name}")
    shape = tuple(ty.get_shape())
    if value.shape != shape:
        raise ValueError(
            f"{label}: expected shape {_shape_text(shape)}, got {_shape_text(value.shape)}"
        )
    return value


# --- random inputs -----------------------------------------------------------------------------

# Ops through which a value keeps its meaning (an id reshaped is still an id).
_PASS_THROUGH = {"nn.reshape", "nn.transpose", "nn.slice", "nn.concat"}


@dataclass
class _Role:
    """What the uses of an argument say about sensible values for it."""

    int_high: int | None = None  # ids: exclusive upper bound (embedding table rows)
    kv_len_max: int | None = None  # kv_len: values in [1, S]
    fan_in: int | None = None  # a weight contracted over this many elements
    trig: bool = False  # rope cos/sin


def _uses(value: SSAValue, depth: int = 0) -> Iterator[tuple[Operation, int]]:
    """(op, operand index) of every use, following calls and layout ops so that ids passed to a
    callee or reshaped still count as ids."""
    if depth > 16:
        return
    for use in value.uses:
        op = use.operation
        if isinstance(op, CallOp):
            callee = SymbolTable.lookup_symbol(op, op.callee)
            if isinstance(callee, FuncOp) and not callee.is_declaration:
                yield from _uses(callee.body.block.args[use.index], depth + 1)
        elif op.name in _PASS_THROUGH and op.results:
            yield from _uses(op.results[0], depth + 1)
        else:
            yield op, use.index


def _role(arg: BlockArgument) -> _Role:
    role = _Role()
    for op, index in _uses(arg):
        match op.name, index:
            case "nn.embedding", 1:
                rows = tensor_type(op.operands[0]).get_shape()[0]
                role.int_high = rows if role.int_high is None else min(role.int_high, rows)
            case "nn.attention", 3:
                seq = tensor_type(op.operands[1]).get_shape()[2]
                role.kv_len_max = seq if role.kv_len_max is None else min(role.kv_len_max, seq)
            case "nn.matmul", 1:
                role.fan_in = _fan_in(op.operands[1], -2)
            case "nn.linear", 1:
                role.fan_in = _fan_in(op.operands[1], -1)
            case "nn.rope", 1 | 2:
                role.trig = True
            case "nn.step", 0:
                high = step_high(op)
                role.int_high = high if role.int_high is None else min(role.int_high, high)
            case "nn.cache_write", 2:  # a position given directly: every written slot in range
                high = _index_high(op, 2)
                role.int_high = high if role.int_high is None else min(role.int_high, high)
            case _:
                pass
    return role


def _index_high(op: Operation, index: int) -> int:
    """Exclusive bound of an integer operand that indexes: ids, kv_len, cache write positions."""
    match op.name, index:
        case "nn.embedding", 1:
            return tensor_type(op.operands[0]).get_shape()[0]
        case "nn.attention", 3:
            return tensor_type(op.operands[1]).get_shape()[2] + 1
        case "nn.cache_write", 2:
            from mk.dialects.nn_base import as_int, attribute_values

            cache, new = (tensor_type(v).get_shape() for v in op.operands[:2])
            d = as_int(attribute_values(op)["dim"]) % len(cache)
            return cache[d] - new[d] + 1
        case _:
            return 16


def step_high(step: Operation) -> int:
    """Exclusive bound of a step's base: every step's value (base + offset + t) stays valid."""
    from mk.dialects.nn_base import as_int, attribute_values
    from mk.dialects.nn_decode import decode_steps

    func = step.parent_op()
    steps = decode_steps(func) if func is not None else 1
    add = as_int(attribute_values(step)["offset"]) + steps - 1
    limits = [_index_high(op, i) for op, i in _uses(step.results[0])] or [16]
    return max(min(limits) - add, 1)


def _fan_in(value: SSAValue, axis: int) -> int | None:
    shape = tensor_type(value).get_shape()
    return shape[axis] if len(shape) >= -axis else None


def _random_value(rng: np.random.Generator, ty: TensorType, role: _Role) -> np.ndarray:
    shape = tuple(ty.get_shape())
    dtype = numpy_dtype(ty.element_type)
    if dtype.kind in "iub":
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape).astype(dtype)
        if role.kv_len_max is not None:
            return rng.integers(1, role.kv_len_max + 1, size=shape).astype(dtype)
        high = role.int_high if role.int_high is not None else 16
        return rng.integers(0, max(high, 1), size=shape).astype(dtype)
    if role.trig:
        values = np.cos(rng.uniform(-np.pi, np.pi, size=shape))
    else:
        values = rng.standard_normal(size=shape)
        if role.fan_in:
            # Keeps a product's outputs near unit variance whatever the contraction length.
            values /= np.sqrt(role.fan_in)
    return values.astype(dtype)


def random_inputs(func: FuncOp, seed: int = 0) -> list[np.ndarray]:
    """Deterministic random inputs for `func`: floats ~N(0, 1) (weights scaled by 1/sqrt(fan-in),
    rope tables in [-1, 1]); embedding ids within the table's rows; kv_len within [1, S]."""
    rng = np.random.default_rng(seed)
    return [_random_value(rng, tensor_type(arg), _role(arg)) for arg in func.body.block.args]
