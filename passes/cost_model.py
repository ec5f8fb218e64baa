"""The mugraph cost model: global-memory bytes, shared-memory tile loads, FLOPs and a time estimate.

Plain functions over mugraph IR, for the `mugraph-stats` pass, the scheduler and the search:

- `kernel_cost(op, target)` -> `KernelCost` for one `mugraph.graph_def` or `mugraph.kernel`;
- `function_cost(func, target)` / `module_cost(module, target)` -> `ProgramCost`, the sum over
  the kernels of one function (the entry function for `module_cost`); `module_costs` gives
  every function's.

What is counted, per kernel:

- `dram_read_bytes`: per distinct operand, the bytes of the **union** of every tile any block
  reads in any iteration. A tile read by several blocks is served by L2 after the first read,
  so a tensor read whole counts its size once, however many blocks replicate it.
- `dram_write_bytes`: per result, the bytes of the union of the tiles the blocks write.
- `tile_load_bytes`: what shared memory loads from L2: the sum over blocks and for-loop
  iterations of each input's tile bytes; a loop-invariant input (fmap -1) loads once per block.
  Different tilings of the same op share DRAM bytes but not this, so it ranks tilings.
- `flops`: each block-graph op's count (below) times how often it runs: ops of the loop phase
  and accumulator updates run `forloop` times per block, loop-invariant ops (hoisted), epilogue
  ops and a mean accumulator's final division once per block. Matmuls count 2·m·n·k, a
  thread_map the sum of its scalar ops per element; the per-element constants are below.
- `blocks`: the grid size. A library kernel's launch is not in the IR: it gets one block per
  `LIBRARY_TILE_ELEMENTS` elements of its largest tensor, at most one per SM (library kernels
  are assumed to be persistent over the SMs).

Time on a target: `max(bytes / bandwidth, flops / peak) / utilisation + overhead` per kernel,
where utilisation is the fraction of SM slots the grid fills over its waves
(`blocks / (ceil(blocks / num_sms) · num_sms)`) and overhead is a fixed launch/sync cost; a
program's time is the sum over its kernels.
"""

from __future__ import annotations

import math as pymath
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects.builtin import FixedBitwidthType, IndexType, ModuleOp, TensorType
from xdsl.dialects.func import FuncOp
from xdsl.ir import Attribute, Operation, SSAValue

from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph import (
    ArgmaxOp,
    GraphDefOp,
    InputOp,
    KernelOp,
    OutputOp,
)
from mk.dialects.mugraph_base import AccumulatorOp, Phase, Phases, shape_of, tensor_type
from mk.dialects.mugraph_tiles import (
    AccumOp,
    AccumSoftmaxOp,
    BinaryOp,
    MatmulOp,
    ReduceOp,
    RMSNormOp,
    RopeOp,
    ThreadMapOp,
    UnaryOp,
)

# ------------------------------------------------------------------------------------------------
# FLOP constants (per element). A transcendental (exp, log, sqrt, rsqrt, erf, tanh) or a division
# costs TRANSCENDENTAL: on a GPU they are multi-instruction (SFU approximation plus a Newton step).
# ------------------------------------------------------------------------------------------------

TRANSCENDENTAL = 4
UNARY_FLOPS: dict[str, int] = {
    "neg": 1, "relu": 1, "square": 1, "scale": 1, "cast": 0,
    "exp": TRANSCENDENTAL, "sqrt": TRANSCENDENTAL, "rsqrt": TRANSCENDENTAL,
    "recip": TRANSCENDENTAL,
    "sigmoid": 2 + 2 * TRANSCENDENTAL,  # 1 / (1 + exp(-x)): neg, exp, add, div
    "silu": 3 + 2 * TRANSCENDENTAL,  # x · sigmoid(x)
    "gelu": 4 + TRANSCENDENTAL,  # 0.5 · x · (1 + erf(x / √2)): three muls, erf, add
}  # fmt: skip
BINARY_FLOPS: dict[str, int] = {
    "add": 1, "sub": 1, "mul": 1, "maximum": 1, "minimum": 1, "div": TRANSCENDENTAL,
}  # fmt: skip
# softmax per element: max, subtract, exp, sum, multiply by the row's reciprocal
SOFTMAX_FLOPS = 4 + TRANSCENDENTAL
# rms_norm per element: square, add to the sum, multiply by rsqrt, multiply by the weight;
# per row: the mean (a division) and the rsqrt of it plus ε
RMS_NORM_FLOPS, RMS_NORM_ROW_FLOPS = 4, 1 + 2 * TRANSCENDENTAL
ROPE_FLOPS = 3  # x1·cos − x2·sin: two muls and a sub per output element
# scalar ops of a thread_map body: arith ops 1 (constants and casts 0), math ops a
# transcendental, except the cheap ones below
_FREE_SCALAR_OPS = ("arith.constant", "arith.extf", "arith.truncf", "arith.bitcast")
_CHEAP_MATH_OPS = ("math.absf", "math.fma", "math.copysign")
_ARITH_DIVISIONS = ("arith.divf", "arith.remf")

LIBRARY_TILE_ELEMENTS = 4096


# ------------------------------------------------------------------------------------------------
# Target and results
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What the time estimate assumes about the GPU (defaults: H200, bf16 dense tensor cores)."""

    num_sms: int = 132
    bandwidth: float = 4.1e12  # bytes/s from global memory
    peak_flops: float = 7.4e14  # flop/s
    kernel_overhead_s: float = 1.0e-6  # launch or grid-wide sync between kernels

    def seconds(self, dram_bytes: int, flops: int, blocks: int) -> float:
        waves = max(1, pymath.ceil(blocks / self.num_sms))
        utilisation = max(blocks, 1) / (waves * self.num_sms)
        busy = max(dram_bytes / self.bandwidth, flops / self.peak_flops)
        return busy / utilisation + self.kernel_overhead_s


H200 = Target()


@dataclass(frozen=True)
class OperandRead:
    """How much of one kernel operand (a distinct SSA value) a kernel reads."""

    name: str  # the operand's SSA name, else "arg<i>"
    operand: int  # its first position among the kernel's operands
    bytes: int  # DRAM bytes: the union of the tiles read
    tensor_bytes: int  # the whole tensor's size
    tile_load_bytes: int  # shared-memory loads summed over blocks and iterations

    @property
    def fraction(self) -> float:
        """The fraction of the tensor read (1.0 for a tensor read whole, or an empty one)."""
        return self.bytes / self.tensor_bytes if self.tensor_bytes else 1.0


@dataclass(frozen=True)
class KernelCost:
    """The cost of one kernel; see the module docstring for what each count means."""

    kind: str  # "graph_def" or the library kernel's kind
    dram_read_bytes: int
    dram_write_bytes: int
    tile_load_bytes: int
    flops: int
    blocks: int
    reads: tuple[OperandRead, ...] = ()
    kernels: int = 1

    @property
    def dram_bytes(self) -> int:
        return self.dram_read_bytes + self.dram_write_bytes

    def read(self, name: str) -> OperandRead:
        """The read of the operand named `name` (KeyError if none)."""
        for r in self.reads:
            if r.name == name:
                return r
        raise KeyError(name)

    def est_seconds(self, target: Target = H200) -> float:
        return target.seconds(self.dram_bytes, self.flops, self.blocks)


@dataclass(frozen=True)
class ProgramCost:
    """The totals of one function's kernels and its estimated time on `target`."""

    function: str
    dram_read_bytes: int
    dram_write_bytes: int
    tile_load_bytes: int
    flops: int
    blocks: int
    kernels: int
    est_seconds: float
    per_kernel: tuple[KernelCost, ...] = field(default=(), repr=False)

    @property
    def dram_bytes(self) -> int:
        return self.dram_read_bytes + self.dram_write_bytes

    @property
    def est_us(self) -> float:
        return self.est_seconds * 1e6

    @staticmethod
    def total(function: str, costs: Sequence[KernelCost], target: Target = H200) -> ProgramCost:
        return ProgramCost(
            function=function,
            dram_read_bytes=sum(c.dram_read_bytes for c in costs),
            dram_write_bytes=sum(c.dram_write_bytes for c in costs),
            tile_load_bytes=sum(c.tile_load_bytes for c in costs),
            flops=sum(c.flops for c in costs),
            blocks=sum(c.blocks for c in costs),
            kernels=sum(c.kernels for c in costs),
            est_seconds=sum(c.est_seconds(target) for c in costs),
            per_kernel=tuple(costs),
        )


# ------------------------------------------------------------------------------------------------
# Sizes and unions of tiles
# ------------------------------------------------------------------------------------------------


def element_bytes(elem: Attribute) -> int:
    if isinstance(elem, IndexType):
        return 8
    assert isinstance(elem, FixedBitwidthType), f"no size for element type {elem}"
    return max(1, (elem.bitwidth + 7) // 8)


def tensor_bytes(t: Attribute) -> int:
    assert isinstance(t, TensorType)
    return t.element_count() * element_bytes(t.element_type)


Interval = tuple[int, int]  # [start, stop)
Cover = tuple[tuple[Interval, ...], ...]  # per dim, disjoint sorted intervals; a union of boxes


def progression_cover(
    outer_stride: int, outer_count: int, inner_stride: int, inner_count: int, width: int
) -> tuple[Interval, ...]:
    """The union of [o·outer_stride + i·inner_stride, + width) over o < outer_count, i < inner_count.

    Exact, merged, and O(1) when consecutive intervals touch (the case of every grid split and
    for-loop walk); otherwise one interval per gap-separated piece.
    """
    if width <= 0 or outer_count <= 0 or inner_count <= 0:
        return ()
    inner = _merge_progression(0, inner_stride, inner_count, width)
    span = inner[-1][1] - inner[0][0]
    if len(inner) == 1 and outer_stride <= span:
        return ((0, (outer_count - 1) * outer_stride + span),)
    pieces = (
        (o * outer_stride + a, o * outer_stride + b) for o in range(outer_count) for a, b in inner
    )
    return _merge(sorted(pieces))


def _merge_progression(start: int, stride: int, count: int, width: int) -> tuple[Interval, ...]:
    if stride <= width or count == 1:
        return ((start, start + (count - 1) * stride + width),)
    return tuple((start + i * stride, start + i * stride + width) for i in range(count))


def _merge(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    out: list[Interval] = []
    for a, b in intervals:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def union_elements(covers: Sequence[Cover]) -> int:
    """The number of elements in the union of covers of one tensor (same rank), exactly.

    Coordinate compression: per dim, the interval boundaries of all covers split the axis into
    segments; a segment cell is covered when some cover holds it in every dim.
    """
    if not covers:
        return 0
    rank = len(covers[0])
    if rank == 0:
        return 1
    cuts = [sorted({p for c in covers for iv in c[d] for p in iv}) for d in range(rank)]
    lengths = [np.diff(np.array(b, dtype=np.int64)) for b in cuts]
    covered = np.zeros(tuple(len(seg) for seg in lengths), dtype=bool)
    for cover in covers:
        masks = [_segment_mask(cuts[d], cover[d]) for d in range(rank)]
        covered |= _outer(masks)
    if not covered.size:
        return 0
    weights = _outer(lengths)
    return int(weights[covered].sum())


def _segment_mask(cuts: list[int], intervals: Sequence[Interval]) -> np.ndarray:
    mask = np.zeros(max(len(cuts) - 1, 0), dtype=bool)
    for a, b in intervals:
        mask[bisect_left(cuts, a) : bisect_left(cuts, b)] = True
    return mask


def _outer(vectors: Sequence[np.ndarray]) -> np.ndarray:
    out = vectors[0]
    for v in vectors[1:]:
        out = np.multiply.outer(out, v)
    return out


def input_cover(op: InputOp) -> Cover:
    """Every element the input's tiles touch over all blocks and iterations, per dim."""
    g = op.parent_graph()
    grid, forloop = g.grid_shape(), g.forloop_range()
    shape = shape_of(op.source)
    imap, fmap = op.imap_dims(), op.fmap_dim()
    tile = maps.input_tile_shape(shape, grid, imap, fmap, forloop)
    return tuple(
        progression_cover(
            *_grid_split(shape[d], grid, imap, d),
            inner_stride=tile[d],
            inner_count=forloop if d == fmap else 1,
            width=tile[d],
        )
        for d in range(len(shape))
    )


def output_cover(op: OutputOp) -> Cover:
    g = op.parent_graph()
    grid = g.grid_shape()
    shape = op.placed_shape()  # an in-place output writes its tile's rows only
    omap = op.omap_dims()
    tile = maps.output_tile_shape(shape, grid, omap, op.accumulate is not None)
    return tuple(
        progression_cover(*_grid_split(shape[d], grid, omap, d), tile[d], 1, tile[d])
        for d in range(len(shape))
    )


def _grid_split(size: int, grid: Sequence[int], dims: Sequence[int], d: int) -> tuple[int, int]:
    """(stride, count) of the blocks' chunks along dim d: one chunk when no grid axis splits it."""
    for extent, mapped in zip(grid, dims, strict=True):
        if mapped == d:
            return size // extent, extent
    return size, 1


# ------------------------------------------------------------------------------------------------
# Graph-defined kernels
# ------------------------------------------------------------------------------------------------


def _elements(v: SSAValue) -> int:
    return tensor_type(v).element_count()


def _elem_bytes(v: SSAValue) -> int:
    return element_bytes(tensor_type(v).element_type)


def _operand_name(v: SSAValue, index: int) -> str:
    return v.name_hint or f"arg{index}"


def _distinct_operands(values: Sequence[SSAValue]) -> dict[SSAValue, list[int]]:
    """Each distinct SSA value among a kernel's operands, with its positions (first seen first)."""
    positions: dict[SSAValue, list[int]] = {}
    for i, v in enumerate(values):
        positions.setdefault(v, []).append(i)
    return positions


def graph_def_cost(op: GraphDefOp) -> KernelCost:
    grid, forloop = op.grid_shape(), op.forloop_range()
    blocks = grid[0] * grid[1] * grid[2]
    inputs_by_pos: dict[int, list[InputOp]] = {}
    for inp in op.input_ops():
        inputs_by_pos.setdefault(inp.source_index(), []).append(inp)
    reads: list[OperandRead] = []
    for value, positions in _distinct_operands(list(op.args)).items():
        inputs = [i for p in positions for i in inputs_by_pos.get(p, [])]
        esize = _elem_bytes(value)
        loads = sum(
            blocks * (forloop if i.fmap_dim() >= 0 else 1) * pymath.prod(i.tile_shape()) * esize
            for i in inputs
        )
        union = union_elements([input_cover(i) for i in inputs]) * esize
        name = _operand_name(value, positions[0])
        reads.append(OperandRead(name, positions[0], union, tensor_bytes(value.type), loads))
    writes = sum(union_elements([output_cover(o)]) * _elem_bytes(o.dest) for o in op.output_ops())
    phases = Phases(op.body.block).ops
    flops = 0
    for inner in op.body.block.ops:
        runs = forloop if _runs_every_iteration(inner, phases.get(inner)) else 1
        flops += blocks * (runs * block_op_flops(inner) + final_flops(inner))
    return KernelCost(
        kind="graph_def",
        dram_read_bytes=sum(r.bytes for r in reads),
        dram_write_bytes=writes,
        tile_load_bytes=sum(r.tile_load_bytes for r in reads),
        flops=flops,
        blocks=blocks,
        reads=tuple(reads),
    )


def _runs_every_iteration(op: Operation, phase: Phase | None) -> bool:
    # accumulators update every iteration even on loop-invariant tiles; other invariant ops
    # are hoisted out of the loop
    return isinstance(op, AccumulatorOp) or phase == Phase.LOOP


def block_op_flops(op: Operation) -> int:
    """The FLOPs of one execution of a block-graph op on its tiles (one block, one iteration)."""
    if isinstance(op, MatmulOp):
        return 2 * _elements(op.res) * shape_of(op.a)[-1]
    if isinstance(op, UnaryOp):
        return UNARY_FLOPS.get(op.kind.data, 1) * _elements(op.res)
    if isinstance(op, BinaryOp):
        return BINARY_FLOPS.get(op.kind.data, 1) * _elements(op.res)
    if isinstance(op, ReduceOp):
        return _elements(op.x) + (_elements(op.res) if op.kind.data == "mean" else 0)
    if isinstance(op, RopeOp):
        return 3 * _elements(op.res)
    if isinstance(op, RMSNormOp):
        rows = _elements(op.x) // max(shape_of(op.x)[-1], 1)
        return RMS_NORM_FLOPS * _elements(op.x) + RMS_NORM_ROW_FLOPS * rows
    if isinstance(op, ArgmaxOp):
        return _elements(op.values)
    if isinstance(op, ThreadMapOp):
        per_element = sum(_scalar_flops(s) for s in op.body.block.ops)
        return per_element * _elements(op.res[0]) if op.res else 0
    if isinstance(op, AccumOp):
        return _accum_flops(op)
    if isinstance(op, AccumSoftmaxOp):
        return _accum_softmax_flops(op)
    return 0  # inputs, outputs, reshape, concat, position: data movement only


def _scalar_flops(op: Operation) -> int:
    if op.name in _FREE_SCALAR_OPS or op.name == "mugraph.yield":
        return 0
    if op.name in _ARITH_DIVISIONS:
        return TRANSCENDENTAL
    if op.dialect_name() == "math":
        return 1 if op.name in _CHEAP_MATH_OPS else TRANSCENDENTAL
    return 1


def _accum_flops(op: AccumOp) -> int:
    return _elements(op.x) * (2 if maps.ACCUM_KINDS[op.kind.data].square else 1)


def final_flops(op: Operation) -> int:
    """FLOPs an op spends once per block after the loop: a mean accumulator's division."""
    if isinstance(op, AccumOp) and maps.ACCUM_KINDS[op.kind.data].mean:
        return _elements(op.res)
    return 0


def _accum_softmax_flops(op: AccumSoftmaxOp) -> int:
    """One online-softmax update: rowmax, p = e^(s − m'), the rescale e^(m − m'), l and o updates."""
    s = shape_of(op.scores)
    rows, t = _elements(op.scores) // s[-1], s[-1]
    d = shape_of(op.o)[-1]
    scores = rows * t * (1 + 1 + TRANSCENDENTAL + 1)  # max, subtract, exp, rowsum
    rescale = rows * (1 + TRANSCENDENTAL + 2)  # subtract, exp, l·α + Σp
    return scores + rescale + rows * d * (2 * t + 2)  # p·v, o·α + (p·v)


# ------------------------------------------------------------------------------------------------
# Library kernels
# ------------------------------------------------------------------------------------------------


def library_cost(op: KernelOp, target: Target = H200) -> KernelCost:
    """Each distinct operand read once (an embedding reads only its gathered rows, a slice only
    its window), the result written once; FLOPs from the kind."""
    kind = op.kind.data
    reads = tuple(
        OperandRead(
            _operand_name(v, pos[0]),
            pos[0],
            _library_read_bytes(op, pos[0]),
            tensor_bytes(v.type),
            _library_read_bytes(op, pos[0]),
        )
        for v, pos in _distinct_operands(list(op.args)).items()
    )
    writes = sum(tensor_bytes(r.type) for r in op.res)
    if kind == "cache_write":
        writes = tensor_bytes(op.args[1].type)  # the slab: see _library_read_bytes
    # the elements read (not the table an embedding gathers from) size the launch
    read_elems = [r.bytes // _elem_bytes(op.args[r.operand]) for r in reads]
    largest = max(*read_elems, *(_elements(r) for r in op.res))
    blocks = max(1, min(target.num_sms, pymath.ceil(largest / LIBRARY_TILE_ELEMENTS)))
    read_bytes = sum(r.bytes for r in reads)
    return KernelCost(
        kind=kind,
        dram_read_bytes=read_bytes,
        dram_write_bytes=writes,
        tile_load_bytes=read_bytes,
        flops=library_flops(op),
        blocks=blocks,
        reads=reads,
    )


def _library_read_bytes(op: KernelOp, index: int) -> int:
    kind, v = op.kind.data, op.args[index]
    full = tensor_bytes(v.type)
    if kind == "embedding" and index < len(op.args) - 1:  # a table: the rows picked
        rows, row_elems = shape_of(v)[0], pymath.prod(shape_of(v)[1:])
        picked = _elements(op.args[-1])
        if index == 0 and len(op.args) == 3:  # table[ids[at]]: a row per picked id
            picked *= pymath.prod(shape_of(op.args[1])[1:])
        return min(rows, picked) * row_elems * _elem_bytes(v)
    if kind == "slice":
        return _elements(op.res[0]) * _elem_bytes(v)
    if kind == "cache_write" and index == 0:
        # Modelled in place, as a decode program's donated caches are: the write reads nothing
        # of the cache and writes only the new slab. Counting the whole cache made a list
        # schedule think one-row writes took 135 µs and starve SMs of later phases.
        return 0
    return full


def library_flops(op: KernelOp) -> int:
    kind = op.kind.data
    out = _elements(op.res[0])
    if kind in UNARY_FLOPS:
        return UNARY_FLOPS[kind] * out
    if kind in BINARY_FLOPS:
        return BINARY_FLOPS[kind] * out
    if kind in ("matmul", "linear"):
        k = shape_of(op.args[0])[-1]
        return 2 * out * k
    if kind in ("reduce_sum", "reduce_max", "reduce_mean"):
        return _elements(op.args[0]) + (out if kind == "reduce_mean" else 0)
    if kind == "softmax":
        return SOFTMAX_FLOPS * out
    if kind == "rms_norm":
        x = shape_of(op.args[0])
        return RMS_NORM_FLOPS * out + RMS_NORM_ROW_FLOPS * (out // max(x[-1], 1))
    if kind == "rope":
        return ROPE_FLOPS * out
    if kind == "argmax":
        return _elements(op.args[0])
    if kind == "attention":
        return _attention_flops(op)
    return 0  # embedding and layout kernels move data only


def _attention_flops(op: KernelOp) -> int:
    """q·kᵀ and p·v (2·S·D each per query row), the scale and the softmax per score."""
    q = shape_of(op.args[0])
    s = shape_of(op.args[1])[-2]
    query_rows, d = pymath.prod(q[:-1]), q[-1]
    return query_rows * s * (4 * d + 1 + SOFTMAX_FLOPS)


# ------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------

KERNEL_OPS = (GraphDefOp, KernelOp)


def kernel_cost(op: Operation, target: Target = H200) -> KernelCost:
    """The cost of a `mugraph.graph_def` or `mugraph.kernel` (TypeError for anything else)."""
    if isinstance(op, GraphDefOp):
        return graph_def_cost(op)
    if isinstance(op, KernelOp):
        return library_cost(op, target)
    raise TypeError(f"'{op.name}' is not a mugraph kernel")


def kernel_ops(func: FuncOp) -> list[Operation]:
    """The kernels of a kernel graph, in program order (nested block graphs are not kernels)."""
    return [op for op in func.body.walk() if isinstance(op, KERNEL_OPS)]


def function_cost(func: FuncOp, target: Target = H200) -> ProgramCost:
    costs = [kernel_cost(op, target) for op in kernel_ops(func)]
    return ProgramCost.total(func.sym_name.data, costs, target)


def module_costs(module: ModuleOp, target: Target = H200) -> dict[str, ProgramCost]:
    """Every defined function's cost, by name, in module order."""
    return {
        f.sym_name.data: function_cost(f, target)
        for f in module.ops
        if isinstance(f, FuncOp) and not f.is_declaration
    }


def module_cost(module: ModuleOp, target: Target = H200, entry: str | None = None) -> ProgramCost:
    """The cost of the entry function (the named one, else the first public one)."""
    from mk.source import entry_function

    return function_cost(entry_function(module, entry), target)
