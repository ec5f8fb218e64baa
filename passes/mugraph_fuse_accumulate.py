"""mugraph-fuse-accumulate: a residual linear over a tensor whose K a producer's blocks split runs
in those blocks, each adding its product into an f32 accumulator.

`y = r + m @ W^T`, where graph_def P writes m in G blocks along K and graph_def R writes r, costs
a phase of its own in a decode step (the down projection of a gated MLP: a task per output slice,
its event and the hop). Here each block of P also multiplies its slice of m with the matching
columns of W and adds the [B, N] product into y (`mugraph.output ... accumulate over %acc`); R
writes r a second time, in f32, as the accumulator's start. The consumer kernel, its event and
one hop disappear; y becomes f32 (rounded where it is returned), so its readers get the sum
before rounding.

Conditions, each checked: the consumer is exactly `input m (all -1, loop over K)`, `input W
(N split by grid x, loop over K)`, a transposed matmul summed over the loop, plus `r` added by a
thread_map, written along N; P has one result, m, only the consumer reads it, and P writes it
along K by grid x; R is a graph_def with one plain output of r; every reader of y is a graph_def
that only feeds its tile to elementwise, reduction or matmul ops, or the function's return.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith
from xdsl.dialects.builtin import ModuleOp, StringAttr, TensorType, f32
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from mk.diagnostics import MkError
from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph import FUSED_ATTR, GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of, tensor_type
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_tiles import AccumOp, BinaryOp, MatmulOp, ThreadMapOp, YieldOp

# What a reader of y may do with its tile when y turns f32: ops that take any float tile.
DTYPE_BLIND = (ThreadMapOp, BinaryOp, AccumOp, MatmulOp)
NO_AXIS = (-1, -1, -1)


@dataclass(frozen=True)
class Fusion:
    """A residual linear `consumer` over `producer`'s result, started from `residual`'s."""

    consumer: GraphDefOp
    producer: GraphDefOp
    m_out: OutputOp
    weight: SSAValue
    residual: GraphDefOp
    r_out: OutputOp


def _ops(graph: GraphDefOp) -> dict[type, list[Operation]]:
    kinds: dict[type, list[Operation]] = {}
    for op in graph.body.block.ops:
        kinds.setdefault(type(op), []).append(op)
    return kinds


def is_add_of(tm: ThreadMapOp, a: SSAValue, b: SSAValue) -> bool:
    """Whether `tm` yields exactly the sum of its tiles `a` and `b`."""
    if set(tm.operands) != {a, b} or len(tm.operands) != 2 or len(tm.results) != 1:
        return False
    body = list(tm.body.block.ops)
    if len(body) != 2 or not isinstance(body[0], arith.AddfOp) or not isinstance(body[1], YieldOp):
        return False
    args = set(tm.body.block.args)
    return set(body[0].operands) == args and body[1].operands[0] is body[0].result


def _single_writer(value: SSAValue) -> tuple[GraphDefOp, OutputOp] | None:
    owner = value.owner
    if not isinstance(owner, GraphDefOp):
        return None
    dest = owner.result_args()[owner.results.index(value)]
    outs = [o for o in owner.output_ops() if o.dest is dest]
    if len(outs) != 1 or outs[0].over() is not None:
        return None
    return owner, outs[0]


def _linear_parts(c: GraphDefOp) -> tuple[InputOp, InputOp, InputOp, OutputOp] | None:
    """(m's input, W's input, r's input, the output) of a residual linear, else None."""
    kinds = _ops(c)
    inputs, outs = kinds.get(InputOp, []), kinds.get(OutputOp, [])
    mms, accs, tms = kinds.get(MatmulOp, []), kinds.get(AccumOp, []), kinds.get(ThreadMapOp, [])
    if len(c.body.block.ops) != 7 or (len(inputs), len(outs), len(mms), len(accs), len(tms)) != (
        3, 1, 1, 1, 1
    ):  # fmt: skip
        return None
    mm, acc, tm, out = mms[0], accs[0], tms[0], outs[0]
    assert isinstance(mm, MatmulOp) and isinstance(acc, AccumOp) and isinstance(tm, ThreadMapOp)
    assert isinstance(out, OutputOp)
    by_tile: dict[SSAValue, InputOp] = {i.tile: i for i in inputs if isinstance(i, InputOp)}
    xm, xw = by_tile.get(mm.operands[0]), by_tile.get(mm.operands[1])
    rest = [i for i in by_tile.values() if i not in (xm, xw)]
    if xm is None or xw is None or len(rest) != 1 or mm.transpose_b is None:
        return None
    xr = rest[0]
    grid = c.grid_shape()
    x_w, x_n = along_x_maps(grid[0])
    shapes_ok = (
        grid[1:] == (1, 1)
        and len(shape_of(xm.source)) == 2
        and xm.imap_dims() == NO_AXIS and xm.fmap_dim() == 1
        and xw.imap_dims() in x_w and xw.fmap_dim() == 1
        and xr.imap_dims() in x_n and xr.fmap_dim() == -1
        and out.omap_dims() in x_n and out.over() is None
    )  # fmt: skip
    if not shapes_ok or acc.kind.data != "sum" or acc.operands[0] is not mm.results[0]:
        return None
    if not is_add_of(tm, acc.results[0], xr.tile) or out.tile is not tm.results[0]:
        return None
    return xm, xw, xr, out


def along_x_maps(blocks: int) -> tuple[set[tuple[int, ...]], set[tuple[int, ...]]]:
    """The maps that split W [N, K] and a [B, N] tile along N by grid x: with one block along
    x they may also leave x out (the same tiles)."""
    w, n = (0, -1, -1), (1, -1, -1)
    return ({w, NO_AXIS}, {n, NO_AXIS}) if blocks == 1 else ({w}, {n})


def readers_ok(value: SSAValue) -> bool:
    """Whether every reader of `value` takes an f32 tensor in its place."""
    for use in value.uses:
        user = use.operation
        if isinstance(user, ReturnOp):
            continue
        if not isinstance(user, GraphDefOp) or user.in_place_result(use.index) is not None:
            return False
        arg = user.input_args()[use.index]
        for inp in (u.operation for u in arg.uses):
            if not isinstance(inp, InputOp):
                return False
            if any(not isinstance(u.operation, DTYPE_BLIND) for u in inp.tile.uses):
                return False
    return True


def match(consumer: GraphDefOp, columns: int = 0, row_columns: int = 0) -> Fusion | None:
    """The fusion of `consumer` into its producer, or None when a condition fails, a block would
    read more than `columns` columns of each weight row (0: no bound) or fewer than `row_columns`
    columns a row of m (0: no bound)."""
    parts = _linear_parts(consumer)
    if parts is None:
        return None
    xm, xw, xr, _ = parts
    m, r = consumer.args[xm.source_index()], consumer.args[xr.source_index()]
    made, residual = _single_writer(m), _single_writer(r)
    if made is None or residual is None or len(list(m.uses)) != 1 or made[0] is residual[0]:
        return None
    producer, m_out = made
    grid = producer.grid_shape()
    if len(producer.results) != 1 or grid[0] < 2 or grid[1:] != (1, 1):
        return None
    if m_out.omap_dims() != (1, -1, -1) or not readers_ok(consumer.results[0]):
        return None
    rows, cols = shape_of(m_out.tile)
    if (columns and cols > columns) or cols < row_columns * rows:
        return None
    return Fusion(consumer, producer, m_out, consumer.args[xw.source_index()], *residual)


def _suffixed(name: str | None, suffix: str) -> str | None:
    return None if name is None else name + suffix


def _rebuilt(
    graph: GraphDefOp, args: list[SSAValue], result_types: list[Attribute], body: Region
) -> GraphDefOp:
    made = GraphDefOp(
        args, result_types, graph.grid_shape(), graph.thread_count(), graph.forloop_range(), body
    )
    made.attributes |= graph.attributes
    return made


def _replace(old: GraphDefOp, new: GraphDefOp) -> None:
    """Put `new` where `old` is; `old`'s results become `new`'s first ones."""
    Rewriter.replace_op(old, new, new.results[: len(old.results)])


def _with_accumulator(residual: GraphDefOp, r_out: OutputOp, name: str | None) -> SSAValue:
    """Replace `residual` by a graph_def that also writes its result in f32 (the accumulator's
    start); returns that f32 result."""
    acc_type = TensorType(f32, tensor_type(r_out.dest).get_shape())
    body = residual.body.clone()
    block = body.block
    index = len(residual.args) + r_out.result_index()
    dest = block.insert_arg(acc_type, len(block.args))
    dest.name_hint = _suffixed(name, "_r")
    written = next(o for o in block.ops if isinstance(o, OutputOp) and o.dest is block.args[index])
    block.add_op(OutputOp(written.tile, dest, r_out.omap_dims()))
    types = [r.type for r in residual.results]
    graph = _rebuilt(residual, list(residual.args), [*types, acc_type], body)
    _replace(residual, graph)
    graph.results[-1].name_hint = name
    return graph.results[-1]


def _fused(f: Fusion, acc: SSAValue) -> GraphDefOp:
    """The producer's blocks, each also adding its product with W's columns into `acc`."""
    p = f.producer
    y_type = acc.type
    assert isinstance(y_type, TensorType)
    args = [*p.args, f.weight, acc]
    block = Block(arg_types=[*(a.type for a in args), y_type])
    old = p.body.block
    mapper: dict[SSAValue, SSAValue] = dict(zip(old.args[: len(p.args)], block.args, strict=False))
    for op in old.ops:
        if op is not f.m_out:
            block.add_op(op.clone(value_mapper=mapper))
    for new, arg in zip(block.args, p.input_args(), strict=False):
        new.name_hint = arg.name_hint
    w_arg, acc_arg, y_arg = block.args[len(p.args) :]
    w_arg.name_hint = _suffixed(f.weight.name_hint, "_a")
    acc_arg.name_hint = _suffixed(acc.name_hint, "_a")
    y_arg.name_hint = _suffixed(f.consumer.results[0].name_hint, "_r")
    shape = maps.input_tile_shape(
        shape_of(w_arg), p.grid_shape(), (1, -1, -1), -1, p.forloop_range()
    )
    w_tile = TensorType(tensor_type(w_arg).element_type, shape)
    wt = InputOp(w_arg, (1, -1, -1), -1, w_tile)
    mm = MatmulOp(mapper[f.m_out.tile], wt.tile, transpose_b=True)
    block.add_ops([wt, mm, OutputOp(mm.res, y_arg, (-1, -1, -1), accumulate_over=acc_arg)])
    wt.tile.name_hint, mm.res.name_hint = "wt", "d"
    graph = _rebuilt(p, args, [y_type], Region(block))
    label = p.attributes.get(FUSED_ATTR)
    kept = label.data if isinstance(label, StringAttr) else "graph"
    graph.attributes[FUSED_ATTR] = StringAttr(f"{kept}+linear+add")
    return graph


def _retyped(reader: GraphDefOp, index: int, value: SSAValue) -> None:
    """`reader` with operand #`index` replaced by `value`, another float dtype of its shape."""
    body = reader.body.clone()
    block = body.block
    old = block.args[index]
    new = block.insert_arg(value.type, index)
    new.name_hint = old.name_hint
    elem = tensor_type(value).element_type
    for use in list(old.uses):
        inp = use.operation
        assert isinstance(inp, InputOp)
        tile_type = TensorType(elem, tensor_type(inp.tile).get_shape())
        made = InputOp(new, inp.imap_dims(), inp.fmap_dim(), tile_type)
        made.attributes |= inp.attributes
        block.insert_op_before(made, inp)
        made.tile.name_hint = inp.tile.name_hint
        inp.tile.replace_all_uses_with(made.tile)
        block.erase_op(inp)
    block.erase_arg(old)
    args = list(reader.args)
    args[index] = value
    _replace(reader, _rebuilt(reader, args, [r.type for r in reader.results], body))


def _rounded(value: SSAValue, like: SSAValue, blocks: int, threads: int) -> GraphDefOp:
    """A graph_def rounding `value` to `like`'s type: where an f32 sum is returned."""
    b = BlockGraphBuilder([value], [like.type], (blocks, 1, 1), threads, 1, ["y_a"], ["y_r"])
    t = b.input(0, imap=(1, -1, -1), fmap=-1, name="t")
    out_type = TensorType(tensor_type(like).element_type, shape_of(t))
    r = b.thread_map([t], [out_type], lambda x: [x], "rt").results[0]
    b.output(r, 0, omap=(1, -1, -1))
    graph = b.finish()
    graph.attributes[FUSED_ATTR] = StringAttr("round")
    return graph


def fuse(f: Fusion) -> None:
    """Rewrite one match in place."""
    c = f.consumer
    y, y_name = c.results[0], c.results[0].name_hint
    acc = _with_accumulator(f.residual, f.r_out, _suffixed(y_name, "_acc"))
    graph = _fused(f, acc)
    block = c.parent_block()
    assert block is not None
    block.insert_op_before(graph, c)
    retype_readers(y, graph.results[0], block, c.grid_shape()[0], c.thread_count())
    block.erase_op(c)
    block.erase_op(f.producer)


def retype_readers(y: SSAValue, y_sum: SSAValue, block: Block, blocks: int, threads: int) -> None:
    """`y`'s readers read the f32 `y_sum` instead (readers_ok holds); where y is returned, a
    graph_def of `blocks` blocks, inserted before y's writer, rounds y_sum to y's type."""
    y_name = y.name_hint
    returned = [u for u in y.uses if isinstance(u.operation, ReturnOp)]
    y_sum.name_hint = _suffixed(y_name, "_sum") if returned else y_name
    if returned:
        rounded = _rounded(y_sum, y, blocks, threads)
        assert isinstance(y.owner, Operation)
        block.insert_op_before(rounded, y.owner)
        rounded.results[0].name_hint = y_name
        for use in returned:
            use.operation.operands[use.index] = rounded.results[0]
    while y.first_use is not None:  # each rebuild drops one use
        use = y.first_use
        assert isinstance(use.operation, GraphDefOp)
        _retyped(use.operation, use.index, y_sum)


@dataclass(frozen=True)
class MugraphFuseAccumulatePass(ModulePass):
    """`mugraph-fuse-accumulate{fuse-accumulate=1 accumulate-columns=64 accumulate-row-columns=4}`:
    residual linears over a K-split producer join its blocks (0 turns the pass off).
    `accumulate-columns=N` keeps the linears whose blocks would read more than N columns of each
    weight row (0: no bound): on the H200 short strided runs gained up to 64 columns (qwen3-0.6b's
    24, llama-3.2-1b's 64), broke even at 96 (qwen3-8b) and lost 3% at 112 (the Llama-3-8B
    block). `accumulate-row-columns=N` keeps those whose blocks read fewer than N columns of each
    weight row per row of m (0: no bound): a block streams W's rows x its columns of weights and
    adds m's rows x W's rows floats into y, so below 4 columns a row the adds (f32) outweigh half
    its weight bytes. On the H200 the separate down projection ran qwen3-0.6b at batch 8 (24
    columns, 8 rows) 1.5 % faster, llama-3.2-1b at batch 8 (64 columns) 6 % slower and qwen3-0.6b
    at batch 1 6 % slower."""

    name = "mugraph-fuse-accumulate"

    fuse_accumulate: int = 1
    accumulate_columns: int = 64
    accumulate_row_columns: int = 4

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for option in ("accumulate_columns", "accumulate_row_columns"):
            if getattr(self, option) < 0:
                raise MkError(f"{self.name}: {option.replace('_', '-')} must be >= 0")
        if not self.fuse_accumulate:
            return
        for func in op.walk():
            if isinstance(func, FuncOp):
                while (f := self._first_match(func)) is not None:
                    fuse(f)

    def _first_match(self, func: FuncOp) -> Fusion | None:
        for op in func.body.block.ops:
            if not isinstance(op, GraphDefOp):
                continue
            if (f := match(op, self.accumulate_columns, self.accumulate_row_columns)) is not None:
                return f
        return None
