"""A failed task's detail code in the words of the CPU executor's message for the same op."""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import IntegerAttr, TensorType
from xdsl.ir import Operation

from mk.diagnostics import op_location
from mk.dialects.mugraph import KernelOp

# A cache write fails its task with the bad start itself (never 0: a write of n positions fits a
# dim of at least n), clamped into ±START_LIMIT: a detail code stays clear of the dispatcher's
# own (mk::kTailOverflow and the staging's lost copy, near 2^31). mk::gpu::cache_write_code.
START_LIMIT = 1 << 30
# A gather of gathers, table[ids[at]], fails with the index into `at` from here up when a
# position is out of the ids table, below it with the index into the picked ids.
PICK_CODE = 1 << 30


def _shape(op: Operation, i: int) -> tuple[int, ...]:
    t = op.operands[i].type
    assert isinstance(t, TensorType)
    return tuple(t.get_shape())


def _cache_write(op: KernelOp, detail: int) -> str:
    """The bad start is the task's return value (detail + 1, an int32)."""
    code = (detail + 1 + (1 << 31)) % (1 << 32) - (1 << 31)
    dim_attr = op.attributes["dim"]
    assert isinstance(dim_attr, IntegerAttr)
    cache, new = _shape(op, 0), _shape(op, 1)
    dim = dim_attr.value.data % len(cache)
    n, extent = new[dim], cache[dim]
    at = f"{code}" if abs(code) < START_LIMIT else f"{'≥ ' if code > 0 else '≤ '}{code}"
    end = f"{code + n}" if abs(code) < START_LIMIT else "…"
    return (
        f"error: 'mugraph.kernel' \"cache_write\" index {at} writes positions [{at}, {end}) "
        f"outside [0, {extent}) of dim {dim}"
    )


def _embedding(op: KernelOp, flat: int) -> str:
    """An id out of range from its flat index in the ids (the id itself is not returned); with
    (table, ids, at) from PICK_CODE up, a position in `at` out of the ids table's rows, else an
    index into the picked ids, ids[at]."""
    rows, ids = _shape(op, 0)[0], _shape(op, 1)
    if len(op.operands) == 3:
        at = _shape(op, 2)
        if flat >= PICK_CODE:
            rows, ids, flat = ids[0], at, flat - PICK_CODE
        else:
            ids = (*at, *ids[1:])
    index = tuple(int(i) for i in np.unravel_index(flat, ids))
    return (
        f"error: 'mugraph.kernel' \"embedding\" id at index {index} is out of range for a "
        f"table of {rows} rows"
    )


def kernel_failure(body: Operation, detail: int) -> str | None:
    """What went wrong in a task whose body is `body` (a task.grid) and whose run status holds
    `detail` (its return value less one, as a uint32), or None for a body without one op that
    can fail."""
    failing = [op for op in body.walk() if isinstance(op, KernelOp) and op.kind.data in _FAILURES]
    if len(failing) != 1:
        return None
    op = failing[0]
    text = _FAILURES[op.kind.data](op, detail)
    loc = op_location(op)
    return f"{loc}: {text}" if loc else text


_FAILURES = {"cache_write": _cache_write, "embedding": _embedding}
