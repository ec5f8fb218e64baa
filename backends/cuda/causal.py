"""The keys no query row of a task can see: a block attention's causal bound, a decode one's length.

nn-to-mugraph masks a prefill's scores as `select(key < len && key <= len - S + query, score,
MASKED)`. Past min(len, len - S + the block's last query + 1) every row's keys are masked, so
block_attention need not walk them. Where every row also sees the first key, each row's running
max is a real score by the end and the masked keys' weights are exactly zero (e^(MASKED - max)
underflows), so the accumulator's final state is the same without them; otherwise the task walks
every key as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects.builtin import FloatAttr
from xdsl.ir import SSAValue

from mk.dialects.mugraph import InputOp
from mk.dialects.mugraph_tiles import ThreadMapOp, UnaryOp

# A masked score's constant is at most this (nn-to-mugraph's MASKED is -1e30).
_MASKED_AT_MOST = -1.0e29
_OLT, _OLE = 4, 5  # arith.cmpf predicates


@dataclass(frozen=True)
class CausalBound:
    """The mask's kv length (a one-element integer input) and the queries' span S."""

    length: InputOp
    span: int


def causal_bound(
    transform: UnaryOp | ThreadMapOp | None, args: Sequence[str | InputOp]
) -> CausalBound | None:
    """The bound of a score transform `select(key < len && key <= len - S + query, v, c)` with
    a constant c <= -1e29 (either order of the two tests), whose operands are fed as `args` says
    ("s", "key", "query" or a scalar input); None for any other transform."""
    found = _masked_select(transform, args)
    if found is None:
        return None
    select, role = found
    both = select.cond.owner
    if not isinstance(both, arith.AndIOp):
        return None
    lengths: set[InputOp] = set()
    spans: set[tuple[InputOp, int]] = set()
    for test in (both.lhs.owner, both.rhs.owner):
        if not isinstance(test, arith.CmpfOp) or role.get(test.lhs) != "key":
            return None
        predicate = test.predicate.value.data
        if predicate == _OLT and (length := _length(test.rhs, role)) is not None:
            lengths.add(length)
        elif predicate == _OLE and (span := _span(test.rhs, role)) is not None:
            spans.add(span)
        else:
            return None
    if len(lengths) != 1 or len(spans) != 1 or next(iter(spans))[0] not in lengths:
        return None
    length, span = next(iter(spans))
    return CausalBound(length, span)


def length_bound(
    transform: UnaryOp | ThreadMapOp | None, args: Sequence[str | InputOp]
) -> InputOp | None:
    """The kv length of a score transform `select(key < len, v, c)` with a constant c <= -1e29
    (a decode step's mask), whose operands are fed as `args` says; None for any other. A task
    of keys at or past it gives every row the state (o 0, m -inf, l 0), which weighs exactly
    nothing where the splits merge, as the masked keys did (e^(MASKED - max) underflows)."""
    found = _masked_select(transform, args)
    if found is None:
        return None
    select, role = found
    test = select.cond.owner
    if not isinstance(test, arith.CmpfOp) or role.get(test.lhs) != "key":
        return None
    return _length(test.rhs, role) if test.predicate.value.data == _OLT else None


def _masked_select(
    transform: UnaryOp | ThreadMapOp | None, args: Sequence[str | InputOp]
) -> tuple[arith.SelectOp, dict[SSAValue, str | InputOp]] | None:
    """The transform's result `select(cond, v, c)` with c <= -1e29, and each block argument's
    role; None for any other transform."""
    if not isinstance(transform, ThreadMapOp):
        return None
    role: dict[SSAValue, str | InputOp] = dict(zip(transform.body.block.args, args, strict=True))
    (result,) = list(transform.body.block.ops)[-1].operands
    select = result.owner
    masked = _constant(select.rhs) if isinstance(select, arith.SelectOp) else None
    if not isinstance(select, arith.SelectOp) or masked is None or masked > _MASKED_AT_MOST:
        return None
    return select, role


def _constant(value: SSAValue) -> float | None:
    op = value.owner
    if isinstance(op, arith.ConstantOp) and isinstance(op.value, FloatAttr):
        return float(op.value.value.data)
    return None


def _length(value: SSAValue, role: dict[SSAValue, str | InputOp]) -> InputOp | None:
    """The scalar input behind `sitofp(len)`."""
    op = value.owner
    if not isinstance(op, arith.SIToFPOp):
        return None
    found = role.get(op.input)
    return found if isinstance(found, InputOp) else None


def _span(value: SSAValue, role: dict[SSAValue, str | InputOp]) -> tuple[InputOp, int] | None:
    """(len, S) of `(len - S) + query` (the add either way round), S a whole constant."""
    add = value.owner
    if not isinstance(add, arith.AddfOp):
        return None
    for left, right in ((add.lhs, add.rhs), (add.rhs, add.lhs)):
        sub = left.owner
        if role.get(right) != "query" or not isinstance(sub, arith.SubfOp):
            continue
        length, span = _length(sub.lhs, role), _constant(sub.rhs)
        if length is not None and span is not None and span.is_integer():
            return length, int(span)
    return None
