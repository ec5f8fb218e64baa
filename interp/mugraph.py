"""The mugraph interpreter: runs kernel graphs on NumPy arrays, graph-defined kernels tile by tile.

A `mugraph.graph_def` runs block by block and, in each block, for-loop iteration by iteration:
every `mugraph.input` reads only its tile (`InputOp.tile_slices(block, iteration)`), tile ops
compute in f32 and round to their result element type, accumulators carry f32 state across the
iterations, the epilogue runs once, and every `mugraph.output` writes its tile into the result at
`OutputOp.tile_slices(block)`. Results start as NaN and every element must be written by exactly
one block, so a wrong imap, fmap, omap or accumulator shows up as wrong numbers or as an error
(an accumulating output's result starts as its operand and every block adds its tile).
Library kernels (`mugraph.kernel`) and leftover nn ops run the nn reference kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.dialects.builtin import DenseArrayBase, FloatAttr, IntegerAttr, TensorType, i1
from xdsl.dialects.func import CallOp, FuncOp, ReturnOp
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls
from xdsl.ir import Attribute, Operation, OpResult, SSAValue
from xdsl.irdl import IRDLOperation

from mk.diagnostics import MkError, op_location
from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph import GraphDefOp, InputOp, KernelOp, OutputOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import AccumOp, AccumSoftmaxOp, ThreadMapOp, YieldOp
from mk.inputs import numpy_dtype
from mk.interp.mugraph_tiles import (
    SCALAR_KERNELS,
    TILE_KERNELS,
    BlockCoord,
    element_dtype,
    is_float_dtype,
    make_accumulator,
)
from mk.interp.nn import reachable_functions, run_interpreted
from mk.interp.nn_ops import KERNELS, KernelError, check_ids
from mk.source import Source

__all__ = ["MugraphRunError", "run_graph_def", "run_kernel", "run_mugraph"]


ACCUMULATORS = AccumOp | AccumSoftmaxOp


class MugraphRunError(MkError):
    """A kernel graph that runs but is wrong: an element written by two blocks or by none."""


def _name(value: OpResult) -> str:
    return f"%{value.name_hint}" if value.name_hint else f"#{value.index}"


# ------------------------------------------------------------------------------------------------
# Library kernels: the nn reference kernels under the kernel's kind
# ------------------------------------------------------------------------------------------------


def _plain(attr: Attribute) -> Any:
    """An attribute as the plain value the nn kernels take (i1 integers are booleans)."""
    if isinstance(attr, FloatAttr):
        return float(attr.value.data)
    if isinstance(attr, IntegerAttr):
        return bool(attr.value.data) if attr.type == i1 else int(attr.value.data)
    if isinstance(attr, DenseArrayBase):
        return tuple(int(v) for v in attr.get_values())
    raise TypeError(f"no plain value for attribute {attr}")


@functools.cache
def _nn_defaults(kind: str) -> dict[str, Attribute | None]:
    """The nn op's properties and their defaults: a library kernel's attributes mean the same."""
    from mk.dialects.nn import NN

    cls = next(c for c in NN.operations if c.name == f"nn.{kind}")
    assert issubclass(cls, IRDLOperation)
    return {n: d.default_value for n, d in cls.get_irdl_definition().properties.items()}


def run_kernel(op: KernelOp, args: Sequence[np.ndarray]) -> np.ndarray:
    """One library kernel on whole tensors: the nn op of the same name, rounded to the result."""
    kind = op.kind.data
    attrs: dict[str, Any] = {}
    for name, default in _nn_defaults(kind).items():
        attr = op.attributes.get(name, default)
        if attr is not None:
            attrs[name] = _plain(attr)
    result = op.res[0].type
    assert isinstance(result, TensorType)
    try:
        if kind == "embedding" and len(args) == 3:  # table[ids[at]]: the ids picked first
            args = [args[0], args[1][check_ids(args[2], args[1].shape[0])]]
        out = np.asarray(KERNELS[f"nn.{kind}"](args, attrs, tuple(result.get_shape())))
    except KernelError as e:
        loc = op_location(op)
        raise ValueError(
            f"{loc + ': ' if loc else ''}error: 'mugraph.kernel' \"{kind}\" {e}"
        ) from None
    if kind == "embedding":  # its rows may go straight into a reshape of the nn op's result
        out = out.reshape(tuple(result.get_shape()))
    return out.astype(numpy_dtype(result.element_type), copy=False)


# ------------------------------------------------------------------------------------------------
# Graph-defined kernels
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    """One block-graph op with what running it needs, read from the IR once per kernel."""

    op: Operation
    operands: tuple[SSAValue, ...]
    results: tuple[SSAValue, ...]
    shapes: tuple[tuple[int, ...], ...]  # of the results, to check each kernel's output
    dtypes: tuple[np.dtype, ...]  # of the results: tile ops round to them


@dataclass(frozen=True)
class _Read:
    """A mugraph.input: which operand it reads and the arguments of `maps.input_tile_slices`."""

    tile: SSAValue
    source: int
    maps_args: tuple[tuple[int, ...], tuple[int, int, int], tuple[int, ...], int, int]

    def slices(self, block: BlockCoord, iteration: int) -> tuple[slice, ...]:
        # What InputOp.tile_slices computes, without re-reading the IR every iteration.
        return maps.input_tile_slices(*self.maps_args, block, iteration)


def _read(op: InputOp) -> _Read:
    graph = op.parent_graph()
    src = op.source.type
    assert isinstance(src, TensorType)
    args = (tuple(src.get_shape()), graph.grid_shape(), op.imap_dims(), op.fmap_dim())
    return _Read(op.tile, op.source_index(), (*args, graph.forloop_range()))


def _step(op: Operation) -> _Step:
    shapes, dtypes = [], []
    for r in op.results:
        assert isinstance(r.type, TensorType)
        shapes.append(tuple(r.type.get_shape()))
        dtypes.append(element_dtype(r))
    return _Step(op, tuple(op.operands), tuple(op.results), tuple(shapes), tuple(dtypes))


@dataclass
class _Plan:
    """What one graph_def runs, split by the loop/epilogue rule."""

    loop: list[_Step | _Read]
    epilogue: list[_Step]  # tile ops only; the caller writes the outputs
    accumulators: list[Operation]


def _plan(op: GraphDefOp) -> _Plan:
    loop = [_read(o) if isinstance(o, InputOp) else _step(o) for o in op.loop_ops()]
    epilogue = [_step(o) for o in op.epilogue_ops() if not isinstance(o, OutputOp)]
    accs: list[Operation] = [o for o in op.loop_ops() if isinstance(o, ACCUMULATORS)]
    return _Plan(loop, epilogue, accs)


class _Results:
    """The results of one graph_def run, with which block wrote each element."""

    def __init__(self, op: GraphDefOp, args: Sequence[np.ndarray]) -> None:
        """An in-place or accumulating output's result starts as its operand; other results'
        unwritten elements show as NaN (integers: their minimum)."""
        self.op = op
        self.values: list[np.ndarray] = []
        self.writer: list[np.ndarray] = []
        self.in_place: set[int] = set()
        over = {o.result_index(): a.index for o in op.output_ops() if (a := o.over())}
        for i, r in enumerate(op.res):
            ty = r.type
            assert isinstance(ty, TensorType)
            dtype, shape = numpy_dtype(ty.element_type), tuple(ty.get_shape())
            # NaN shows an unwritten float element; integers get an implausible value.
            fill = np.nan if is_float_dtype(dtype) else np.iinfo(dtype).min
            if i in over:
                self.values.append(np.array(args[over[i]], dtype=dtype).reshape(shape))
                self.in_place.add(i)
            else:
                self.values.append(np.full(shape, fill, dtype=dtype))
            self.writer.append(np.full(shape, -1, dtype=np.int64))

    def write(
        self, out: OutputOp, env: dict[SSAValue, np.ndarray], block: BlockCoord, index: int
    ) -> None:
        i, tile = out.result_index(), env[out.tile]
        start = 0  # an in-place output's run-time position
        if (at := out.position()) is not None:
            start = int(np.asarray(env[at[0]]).reshape(-1)[0])
            n, extent = shape_of(out.tile)[at[1]], shape_of(out.dest)[at[1]]
            if start < 0 or start + n > extent:
                self._fail(
                    f"block {block} writes positions [{start}, {start + n}) outside "
                    f"[0, {extent}) of dim {at[1]} of result #{i}"
                )
        where = out.tile_slices(block, start)
        if out.accumulate is not None:  # every block adds its tile, in f32
            self.values[i][where] += tile.astype(self.values[i].dtype, copy=False)
            return
        owners = self.writer[i][where]
        if (owners >= 0).any():
            pos = np.argwhere(owners >= 0)[0]
            element = tuple(int(s.start + p) for s, p in zip(where, pos, strict=True))
            other = self._block_at(int(owners[tuple(pos)]))
            self._fail(
                f"block {block} writes element {element} of result #{i}, "
                f"already written by block {other}: the omap makes blocks overlap"
            )
        self.writer[i][where] = index  # owners is a copy, not a view, for a rank-0 result
        self.values[i][where] = tile.astype(self.values[i].dtype, copy=False)

    def check_complete(self) -> None:
        for i, owners in enumerate(self.writer):
            if i in self.in_place:  # its operand's elements stay where no block writes
                continue
            missing = np.argwhere(owners < 0)
            if len(missing):
                element = tuple(int(p) for p in missing[0])
                self._fail(
                    f"no block writes element {element} of result #{i} "
                    f"({len(missing)} of {owners.size} elements unwritten)"
                )

    def _block_at(self, index: int) -> BlockCoord:
        return list(self.op.blocks())[index]

    def _fail(self, message: str) -> None:
        names = ", ".join(_name(r) for r in self.op.res)
        raise MugraphRunError(f"'mugraph.graph_def' ({names}) {message}", op_location(self.op))


def _run_tile_op(step: _Step, env: dict[SSAValue, np.ndarray], block: BlockCoord, it: int) -> None:
    op = step.op
    outs = TILE_KERNELS[type(op)](op, [env[v] for v in step.operands], block, it)
    for r, out, shape, dtype in zip(step.results, outs, step.shapes, step.dtypes, strict=True):
        if out.shape != shape:
            raise AssertionError(f"'{op.name}' computed {out.shape}, its type says {shape}")
        env[r] = out.astype(dtype, copy=False)


def _run_block(
    plan: _Plan, args: Sequence[np.ndarray], block: BlockCoord, forloop: int
) -> dict[SSAValue, np.ndarray]:
    """One block: the loop ops every iteration, then the epilogue's tile ops; returns its tiles."""
    accs = {a: make_accumulator(a, forloop) for a in plan.accumulators}
    env: dict[SSAValue, np.ndarray] = {}
    for it in range(forloop):
        for step in plan.loop:
            if isinstance(step, _Read):
                env[step.tile] = args[step.source][step.slices(block, it)]
            elif step.op in accs:
                accs[step.op].update([env[v] for v in step.operands])
            else:
                _run_tile_op(step, env, block, it)
    for acc, state in accs.items():
        env.update(zip(acc.results, state.results(), strict=True))
    for step in plan.epilogue:
        _run_tile_op(step, env, block, forloop - 1)
    return env


def run_graph_def(
    op: GraphDefOp, args: Sequence[np.ndarray], blocks: Sequence[BlockCoord] | None = None
) -> tuple[np.ndarray, ...]:
    """Run a graph-defined kernel on whole tensors, block by block and iteration by iteration.

    With `blocks`, only those blocks run (one task of a task grid runs one block): elements no
    given block writes stay NaN (integers: their minimum; an in-place output's, its operand's),
    and completeness is not checked.
    """
    plan = _plan(op)
    results = _Results(op, args)
    outputs = op.output_ops()
    forloop = op.forloop_range()
    if blocks is None:
        chosen = list(enumerate(op.blocks()))
    else:
        order = {b: i for i, b in enumerate(op.blocks())}
        chosen = [(order[b], b) for b in blocks]  # KeyError: a block outside the grid
    for index, block in chosen:
        env = _run_block(plan, args, block, forloop)
        for out in outputs:
            results.write(out, env, block, index)
    if blocks is None:
        results.check_complete()
    return tuple(results.values)


# ------------------------------------------------------------------------------------------------
# Function level
# ------------------------------------------------------------------------------------------------


@register_impls
class MugraphFunctions(InterpreterFunctions):
    """xDSL interpreter implementations of the kernel-level mugraph ops."""

    @impl(KernelOp)
    def run_kernel_op(self, _interp: Interpreter, op: KernelOp, args: PythonValues) -> PythonValues:
        return (run_kernel(op, args),)

    @impl(GraphDefOp)
    def run_graph_def_op(
        self, _interp: Interpreter, op: GraphDefOp, args: PythonValues
    ) -> PythonValues:
        return run_graph_def(op, args)


def _unsupported_in_graph(graph: GraphDefOp) -> Operation | None:
    for op in graph.body.block.ops:
        if isinstance(op, ThreadMapOp):
            for scalar in op.body.block.ops:
                if not isinstance(scalar, YieldOp) and scalar.name not in SCALAR_KERNELS:
                    return scalar
        elif not isinstance(op, InputOp | OutputOp | ACCUMULATORS) and type(op) not in TILE_KERNELS:
            return op
    return None


def _check_supported(entry: FuncOp) -> None:
    """Fail before running, at the op's location, on anything the interpreter cannot run."""
    for func in reachable_functions(entry):
        for op in func.body.ops:
            bad: Operation | None = None
            if isinstance(op, GraphDefOp):
                bad = _unsupported_in_graph(op)
            elif not isinstance(op, CallOp | ReturnOp | KernelOp) and op.name not in KERNELS:
                bad = op
            if bad is not None:
                raise MkError(
                    f"'{bad.name}' is not supported by the mugraph interpreter", op_location(bad)
                )


def run_mugraph(source: Source, *inputs: Any, entry: str | None = None) -> tuple[np.ndarray, ...]:
    """Run the entry function of a mugraph program (leftover nn ops allowed) on NumPy arrays.

    Same contract as `mk.interp.nn.run_reference`: MkError for an invalid program (and
    MugraphRunError for a kernel that leaves an element unwritten or writes it twice), ValueError
    for inputs whose count, dtype or shape do not match the entry's arguments.
    """
    return run_interpreted(source, inputs, entry, _check_supported, [MugraphFunctions()])
