"""The decode-function contract of nn programs: `{nn.donated}` arguments written in place by one
`nn.cache_write`, and `nn.steps`, the body's runs per call (DESIGN.md)."""

from __future__ import annotations

from typing import Any, cast

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntegerAttr, StringAttr, UnitAttr
from xdsl.dialects.func import FuncOp
from xdsl.ir import Attribute, BlockArgument, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from .nn_base import as_int

DONATED = "nn.donated"
STEPS = "nn.steps"


def decode_steps(func: Operation) -> int:
    """The `nn.steps` of a function: how many times one call runs its body (1 without it)."""
    attr = func.attributes.get(STEPS)
    return 1 if attr is None else as_int(_plain_int(attr))


def _plain_int(attr: Attribute) -> int:
    if not isinstance(attr, IntegerAttr):
        raise VerifyException(f"'{STEPS}' must be an integer, got {attr}")
    return int(attr.value.data)


def donated_args(func: FuncOp) -> list[int]:
    """Indices of the arguments marked `{nn.donated}`."""
    attrs = func.arg_attrs
    if attrs is None:
        return []
    return [i for i, d in enumerate(attrs) if isinstance(d, DictionaryAttr) and DONATED in d.data]


def donated_arg(value: SSAValue) -> tuple[FuncOp, int] | None:
    """(function, argument index) when `value` is a donated argument, else None."""
    if not isinstance(value, BlockArgument):
        return None
    func = value.owner.parent_op()
    if not isinstance(func, FuncOp) or value.owner is not func.body.block:
        return None
    return (func, value.index) if value.index in donated_args(func) else None


def is_cache_write(op: Operation) -> bool:
    """An nn.cache_write, or the library kernel it became."""
    kind = getattr(op, "kind", None)
    return op.name == "nn.cache_write" or (
        op.name == "mugraph.kernel" and isinstance(kind, StringAttr) and kind.data == "cache_write"
    )


def in_place_result(op: Operation, operand: int) -> SSAValue | None:
    """The result of `op` that is its operand #`operand` written in place: a cache write's
    (operand 0), or a graph_def's in-place output over that operand."""
    if is_cache_write(op):
        return op.results[0] if operand == 0 else None
    over = getattr(op, "in_place_result", None)
    made = over(operand) if callable(over) else None
    return made if isinstance(made, SSAValue) else None


def donated_write(func: FuncOp, index: int) -> SSAValue:
    """The value a donated argument holds after one run of the body: its cache write's result."""
    arg = func.args[index]
    writes = [r for u in arg.uses if (r := in_place_result(u.operation, u.index)) is not None]
    if len(writes) != 1:
        raise VerifyException(
            f"donated argument #{index} must be the cache of exactly one cache write, "
            f"found {len(writes)}"
        )
    return writes[0]


def verify_decode_function(func: FuncOp) -> None:
    """`nn.steps` >= 1; a donated argument is a tensor the body writes with one nn.cache_write,
    and every other use of it comes before that write (it reads the value before the write, and
    in place the bytes change at the write)."""
    steps = decode_steps(func)
    if steps < 1:
        raise VerifyException(f"'{STEPS}' must be >= 1, got {steps}")
    block = func.body.block
    for i in donated_args(func):
        attr = cast(DictionaryAttr, cast(ArrayAttr[Any], func.arg_attrs).data[i]).data[DONATED]
        if not isinstance(attr, UnitAttr):
            raise VerifyException(f"'{DONATED}' on argument #{i} must be a unit attribute")
        write = donated_write(func, i).owner
        assert isinstance(write, Operation)
        at = block.get_operation_index(write)
        for use in func.args[i].uses:
            op = use.operation
            if op is not write and (op.parent is not block or block.get_operation_index(op) > at):
                raise VerifyException(
                    f"donated argument #{i} is used by '{op.name}' after its in-place write; "
                    "use the write's result instead"
                )
