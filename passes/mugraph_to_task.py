"""The mugraph-to-task pass: each kernel graph becomes a task graph with exact tile dependencies.

`mugraph-to-task{align=256 iterations=1 merge-events=true}` replaces every function whose body
is a mugraph kernel graph by a `task.graph` of the same name:

- **Buffers.** Argument k becomes `weight k` when it is only read as a linear/matmul weight or
  a norm weight (embedding tables too), else `input k`; the value returned as result k becomes
  `output k`; every other kernel value an `activation`, or a `workspace` for split partials,
  placed in one arena by a first-fit planner over live ranges (`mugraph_to_task_buffers`).
  Weights are never copied. A result that is an argument, or a value returned twice, is
  written by an explicit copy task (a grid [1] running a `mugraph.kernel "reshape"` to the
  same type) from the argument or the first output.
- **Grids.** Each kernel becomes one `task.grid`: a graph_def's grid (x, y, z) with trailing
  extents of 1 dropped, task coordinates = block coordinates; a library kernel is a grid [1].
  Footprints are affine maps of the task coordinates: per operand, the rectangle a block reads
  over the whole for-loop (`InputOp.block_slices`; the bounding box when several inputs read
  one operand), per result the tile it writes (`OutputOp.tile_slices`); library kernels read
  and write whole buffers. The body takes the whole buffers (reads, then writes), holds a
  clone of the kernel applied to them and yields its results. `cost` is the kernel's cost
  model share per block (rounded up); `prefetch` lists the weights the grid reads.
- **Events.** From the footprints, see `mugraph_to_task_events`.
- **Size.** A program of more than MAX_PROGRAM_TASKS tasks is refused, located at its largest
  kernel's nn op; a function that returns only its arguments is lowered too (its copy tasks).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, TensorType
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Block, Operation, OpResult, Region, SSAValue
from xdsl.passes import ModulePass

from mk.diagnostics import MkError, op_location
from mk.dialects.mugraph import GraphDefOp, InputOp, KernelOp, OutputOp
from mk.dialects.nn_decode import STEPS, decode_steps, donated_args, donated_write
from mk.dialects.task import ARENA_ALIGNMENT, BufferOp, EventOp, GraphOp, GridOp, YieldOp
from mk.dialects.task_maps import FootprintAttr, eval_map, grid_points, parse_map
from mk.passes.cost_model import kernel_cost
from mk.passes.mugraph_to_task_buffers import (
    BufferPlan,
    SymbolNames,
    is_split_partial,
    is_weight,
    plan_arena,
    raw_ancestors,
)
from mk.passes.mugraph_to_task_events import Access, EventPlan, GridInfo, build_events
from mk.passes.mugraph_to_task_flags import flag_buffers, is_weight_value

Kernel = GraphDefOp | KernelOp
# Per tensor dim: the grid axis partitioning it (None: read whole) and the chunk size.
Partition = Sequence[tuple[int | None, int]]


@dataclass
class _GridPlan:
    """One task.grid to build: the kernel it runs, its footprints and its name."""

    info: GridInfo
    kernel: Kernel
    reads: list[FootprintAttr]
    writes: list[FootprintAttr]
    read_values: list[SSAValue]


# --------------------------------------------------------------------------- footprints


def task_shape(kernel: Kernel) -> tuple[int, ...]:
    """A graph_def's grid without trailing extents of 1 (a library kernel: [1])."""
    if isinstance(kernel, KernelOp):
        return (1,)
    grid = list(kernel.grid_shape())
    while len(grid) > 1 and grid[-1] == 1:
        grid.pop()
    return tuple(grid)


def _partition(shape: Sequence[int], grid: Sequence[int], dims: Sequence[int]) -> Partition:
    parts: list[tuple[int | None, int]] = [(None, size) for size in shape]
    for axis, d in enumerate(dims):
        if d >= 0 and grid[axis] > 1:
            parts[d] = (axis, shape[d] // grid[axis])
    return parts


def _bounding(parts: Sequence[Partition], shape: Sequence[int]) -> Partition:
    """Per dim, the common partition of several inputs, or the whole dim where they differ."""
    return [
        options[0] if all(o == options[0] for o in options) else (None, size)
        for size, options in zip(shape, zip(*parts, strict=True), strict=True)
    ]


def _footprint(buffer: str, parts: Partition, points: np.ndarray) -> tuple[FootprintAttr, Access]:
    """The footprint of a partition, and its start at every task (`points`, row-major)."""
    dims = ", ".join(f"d{i}" for i in range(points.shape[1]))
    starts = [
        "0" if axis is None else f"d{axis}" if chunk == 1 else f"d{axis} * {chunk}"
        for axis, chunk in parts
    ]
    start = parse_map(f"({dims}) -> ({', '.join(starts)})")
    sizes = tuple(chunk for _, chunk in parts)
    return FootprintAttr(buffer, start, sizes), Access(
        buffer, start, sizes, eval_map(start, points)
    )


def _shape(value: SSAValue) -> tuple[int, ...]:
    assert isinstance(value.type, TensorType)
    return tuple(value.type.get_shape())


def _read_partition(
    kernel: GraphDefOp, positions: Sequence[int], shape: tuple[int, ...]
) -> Partition:
    grid = kernel.grid_shape()
    inputs: list[InputOp] = [i for i in kernel.input_ops() if i.source_index() in positions]
    if not inputs:
        return [(None, size) for size in shape]
    return _bounding([_partition(shape, grid, i.imap_dims()) for i in inputs], shape)


def _write_partition(kernel: GraphDefOp, index: int, shape: tuple[int, ...]) -> Partition:
    out: OutputOp = next(o for o in kernel.output_ops() if o.result_index() == index)
    omap = out.omap_dims()
    if (at := out.position()) is not None:  # lands at a run-time position: all of that dim
        omap = tuple(-1 if d == at[1] else d for d in omap)
    return _partition(shape, kernel.grid_shape(), omap)


def _accumulator_start(kernel: Kernel, value: SSAValue) -> SSAValue | None:
    """The operand an accumulating output of `kernel` adds `value` onto, if any."""
    if not isinstance(kernel, GraphDefOp):
        return None
    index = kernel.results.index(value)
    for out in kernel.output_ops():
        if out.result_index() == index and (over := out.accumulated()) is not None:
            return kernel.args[over.index]
    return None


def _own_starts(func: FuncOp, returned: Sequence[SSAValue]) -> None:
    """An accumulating output adds into its start's buffer: a start anything else sees too (an
    argument, a returned value, a value with other readers) is copied for it first."""
    block = func.body.block
    for op in list(block.ops):
        if not isinstance(op, GraphDefOp):
            continue
        for out in op.output_ops():
            if (over := out.accumulated()) is None:
                continue
            start = op.args[over.index]
            if isinstance(start, OpResult) and len(list(start.uses)) == 1 and start not in returned:
                continue
            copy = KernelOp("reshape", [start], [start.type])
            block.insert_op_before(copy, op)
            op.operands[over.index] = copy.results[0]


# --------------------------------------------------------------------------- the lowering


class _Lowering:
    """Builds the task.graph of one kernel-graph function."""

    def __init__(self, func: FuncOp, options: MugraphToTaskPass) -> None:
        self.func = func
        self.options = options
        self.names = SymbolNames()
        self.buffers: dict[str, BufferPlan] = {}
        self.buffer_of: dict[SSAValue, str] = {}
        terminator = func.body.block.last_op
        if not isinstance(terminator, ReturnOp):
            raise MkError("a kernel graph must end in func.return", op_location(func))
        self.returned = list(terminator.operands)
        _own_starts(func, self.returned)
        self.kernels: list[Kernel] = []
        for op in func.body.block.ops:
            if isinstance(op, GraphDefOp | KernelOp):
                self.kernels.append(op)
            elif op is not terminator:
                raise MkError(
                    f"'{op.name}' is not a mugraph kernel: mugraph-to-task lowers kernel graphs only",
                    op_location(op),
                )
        self.copies: list[tuple[SSAValue, str]] = []  # (source value, output buffer)
        self.summed: set[str] = set()  # buffers that accumulating outputs add into
        self.start_values: set[SSAValue] = set()  # values that accumulating outputs add onto
        # A decode function's own step count wins over the pass option.
        self.iterations = decode_steps(func) if STEPS in func.attributes else options.iterations

    def _declare(
        self, name: str, value: SSAValue, kind: str, index: int | None, where: Operation
    ) -> str:
        """A buffer for `value` (bound to it unless it is an output copy), located on errors."""
        ty = value.type
        if not (isinstance(ty, TensorType) and ty.has_static_shape()):
            raise MkError(f"@{name} needs a statically shaped tensor, got {ty}", op_location(where))
        self.buffers[name] = BufferPlan(name, ty, kind, index)
        return name

    def plan_buffers(self) -> None:
        for i, arg in enumerate(self.func.args):
            kind = "weight" if is_weight(arg) else "input"
            name = self.names.take(arg.name_hint or f"arg{i}")
            self.buffer_of[arg] = self._declare(name, arg, kind, i, self.func)
        for i in donated_args(self.func):  # written in place: the write's result is the argument
            self.buffer_of[donated_write(self.func, i)] = self.buffer_of[self.func.args[i]]
        for k, value in enumerate(self.returned):
            if value in self.buffer_of:  # an argument, or returned before: copy it
                name = self._declare(self.names.take(f"result{k}"), value, "output", k, self.func)
                self.copies.append((value, name))
            else:
                name = self.names.take(value.name_hint or f"result{k}")
                self.buffer_of[value] = self._declare(name, value, "output", k, self.func)
        starts: dict[SSAValue, SSAValue] = {
            value: start
            for kernel in self.kernels
            for value in kernel.results
            if (start := _accumulator_start(kernel, value)) is not None
        }
        for value, start in starts.items():  # a returned sum: its start is made in the output
            if value in self.buffer_of:
                self.buffer_of[start] = self.buffer_of[value]
        for pos, kernel in enumerate(self.kernels):
            for value in kernel.results:
                if (start := starts.get(value)) is not None:
                    # Adds into the buffer its start's writer filled, which stays its writer.
                    self.buffer_of[value] = self.buffer_of[start]
                    continue
                if value not in self.buffer_of:
                    kind = "workspace" if is_split_partial(value) else "activation"
                    name = self.names.take(value.name_hint or f"v{pos}")
                    self.buffer_of[value] = self._declare(name, value, kind, None, kernel)
                self.buffers[self.buffer_of[value]].writer = pos
            for value in dict.fromkeys(kernel.operands):
                buf = self.buffers[self.buffer_of[value]]
                if value in self.func.args and buf.writer is not None and buf.writer != pos:
                    raise MkError(
                        f"@{buf.name}: a kernel reads the donated argument after its in-place "
                        "write (the kernel order must keep the nn program's order)",
                        op_location(kernel),
                    )
                buf.readers.append(pos)
        # Blocks add into these in any order: no element's flag could say it is complete.
        self.summed = {self.buffer_of[value] for value in starts}
        self.start_values = set(starts.values())
        for n, (value, name) in enumerate(self.copies):
            self.buffers[self.buffer_of[value]].readers.append(len(self.kernels) + n)
            self.buffers[name].writer = len(self.kernels) + n
        if self.options.flag_values or self.options.flag_rows:
            value_of = {name: value for value, name in self.buffer_of.items()}
            weight = is_weight_value(self.buffers, self.buffer_of)
            plain = [b for name, b in self.buffers.items() if name not in self.summed]
            flag_buffers(
                plain,
                self.kernels,
                value_of,
                weight,
                values=self.options.flag_values,
                rows=self.options.flag_rows,
            )

    def grid_plan(self, pos: int, kernel: Kernel) -> _GridPlan:
        shape = task_shape(kernel)
        points = grid_points(shape)
        label = self.buffer_of[kernel.results[0]] if kernel.results else "kernel"
        if kernel.results and kernel.results[0] in self.start_values:
            label += "_start"  # its buffer is named after the sum that other grids add into it
        name = self.names.take(f"k{pos}_{label}")
        read_values = list(dict.fromkeys(kernel.operands))
        reads, writes = [], []
        for value in read_values:
            vshape = _shape(value)
            if isinstance(kernel, GraphDefOp):
                positions = [i for i, a in enumerate(kernel.args) if a is value]
                made = [r for p in positions if (r := kernel.in_place_result(p)) is not None]
                if made:  # written in place: each block takes its own part only
                    parts = _write_partition(kernel, kernel.results.index(made[0]), vshape)
                else:
                    parts = _read_partition(kernel, positions, vshape)
            else:
                parts = [(None, s) for s in vshape]
            reads.append(_footprint(self.buffer_of[value], parts, points))
        for index, value in enumerate(kernel.results):
            vshape = _shape(value)
            if isinstance(kernel, GraphDefOp):
                parts = _write_partition(kernel, index, vshape)
            else:
                parts = [(None, s) for s in vshape]
            writes.append(_footprint(self.buffer_of[value], parts, points))
        info = GridInfo(name, shape, [a for _, a in reads], [a for _, a in writes])
        return _GridPlan(info, kernel, [f for f, _ in reads], [f for f, _ in writes], read_values)

    def copy_plan(self, pos: int, source: SSAValue, output: str) -> _GridPlan:
        name = self.names.take(f"k{pos}_copy_{output}")
        whole = [(None, s) for s in _shape(source)]
        points = grid_points((1,))
        rf, ra = _footprint(self.buffer_of[source], whole, points)
        wf, wa = _footprint(output, whole, points)
        kernel = KernelOp("reshape", [source], [source.type])
        return _GridPlan(GridInfo(name, (1,), [ra], [wa]), kernel, [rf], [wf], [source])

    def body(self, plan: _GridPlan) -> Region:
        types = [self.buffers[f.buffer_name].type for f in (*plan.reads, *plan.writes)]
        block = Block(arg_types=types)
        for arg, fp in zip(block.args, (*plan.reads, *plan.writes), strict=True):
            arg.name_hint = fp.buffer_name
        mapper: dict[SSAValue, SSAValue] = dict(zip(plan.read_values, block.args, strict=False))
        clone = plan.kernel.clone(value_mapper=mapper)
        block.add_op(clone)
        block.add_op(YieldOp(*clone.results))
        return Region(block)

    def grid_op(self, plan: _GridPlan, events: EventPlan) -> GridOp:
        body = self.body(plan)
        clone = body.block.first_op
        assert isinstance(clone, GraphDefOp | KernelOp)
        cost = kernel_cost(clone)
        tasks = plan.info.num_tasks
        per_task = {"bytes": -(-cost.dram_bytes // tasks), "flops": -(-cost.flops // tasks)}
        prefetch = [
            f.buffer_name for f in plan.reads if self.buffers[f.buffer_name].kind == "weight"
        ]
        name = plan.info.name
        grid = GridOp(
            name, plan.info.shape, body, plan.reads, plan.writes,
            events.waits.get(name, []), events.signals.get(name, []), prefetch, per_task,
        )  # fmt: skip
        grid.location = plan.kernel.location
        return grid

    def run(self) -> GraphOp:
        self.plan_buffers()
        buffers = list(self.buffers.values())
        total = len(self.kernels) + len(self.copies)
        arena = plan_arena(buffers, self.options.align, raw_ancestors(buffers, total))
        plans = [self.grid_plan(pos, k) for pos, k in enumerate(self.kernels)]
        _check_task_count(plans)
        base = len(self.kernels)
        plans += [self.copy_plan(base + n, v, out) for n, (v, out) in enumerate(self.copies)]
        events = build_events(
            [p.info for p in plans], self.buffers, self.names,
            self.iterations, self.options.merge_events,
        )  # fmt: skip
        graph = GraphOp(self.func.sym_name.data, self.iterations, arena)
        graph.location = self.func.location
        block = graph.body.block
        for buf in _declaration_order(self.buffers.values()):
            block.add_op(BufferOp(buf.name, buf.type, buf.kind, buf.index, buf.offset, buf.flagged))
        for event in events.events:
            op = EventOp(event.name, event.shape, event.count, event.flagged)
            if event.coarse is not None:
                op.attributes["mk.coarse"] = StringAttr(event.coarse)
            block.add_op(op)
        for plan in plans:
            block.add_op(self.grid_op(plan, events))
        return graph


# Tasks one program may lower to. The scheduler and the tables take about 25 us a task on the
# CPU (a 65,536-task linear compiles in 4 s), so a program of millions of tiles (a linear of
# 100,000 x 100,000, tiled for decode) would take minutes and gigabytes before any error.
MAX_PROGRAM_TASKS = 1 << 20


def _check_task_count(plans: Sequence[_GridPlan]) -> None:
    """Refuses a program of more than MAX_PROGRAM_TASKS tasks, at its largest kernel."""
    sizes = [int(np.prod(p.info.shape)) for p in plans]
    if sum(sizes) <= MAX_PROGRAM_TASKS:
        return
    largest = plans[sizes.index(max(sizes))]
    raise MkError(
        f"the program lowers to {sum(sizes):,} tasks, more than the {MAX_PROGRAM_TASKS:,} mk "
        f"schedules; this kernel alone is {max(sizes):,} (grid {list(largest.info.shape)})",
        op_location(largest.kernel),
    )


def _declaration_order(buffers: Iterable[BufferPlan]) -> list[BufferPlan]:
    """Arguments by position, then results by position, then the arena in kernel order."""
    group = {"input": 0, "weight": 0, "output": 1}

    def key(b: BufferPlan) -> tuple[int, int]:
        return group.get(b.kind, 2), b.index if b.index is not None else b.writer or 0

    return sorted(buffers, key=key)


@dataclass(frozen=True)
class MugraphToTaskPass(ModulePass):
    """`mugraph-to-task{align=256 iterations=1 merge-events=true flag-values=false
    flag-rows=false}`."""

    name = "mugraph-to-task"

    align: int = 256  # arena alignment in bytes (a multiple of the task dialect's 128)
    iterations: int = 1  # decode-loop iterations run inside the megakernel
    merge_events: bool = True  # one event per producer grouping, shared by its consumers
    # Activations that only plain loads read carry each element's flag (mugraph_to_task_flags).
    flag_values: bool = False
    # A decode attention's head rows (q, the new K/V rows) carry their flags too.
    flag_rows: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.align < 1 or self.align % ARENA_ALIGNMENT:
            raise MkError(f"mugraph-to-task: align must be a multiple of {ARENA_ALIGNMENT}")
        if self.iterations < 1:
            raise MkError("mugraph-to-task: iterations must be >= 1")
        for func in list(op.ops):
            if not isinstance(func, FuncOp) or func.is_declaration:
                continue
            kernels = any(isinstance(o, GraphDefOp | KernelOp) for o in func.body.block.ops)
            if not kernels and not func.function_type.outputs.data:
                continue
            graph = _Lowering(func, self).run()
            op.body.block.insert_op_before(graph, func)
            func.detach()
            func.erase()
