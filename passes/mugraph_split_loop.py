"""mugraph-split-loop: a residual linear whose loop walks a folded merge runs one block per
iteration, each adding its product into the residual.

After `mugraph-fuse-loop` a decode step's o-projection (`r = x + merge(partials) @ Wo^T`) walks K
in one for-loop iteration per KV head, and every one of its blocks merges all the split-KV
partials: at batch 1 each o-projection task of qwen3-0.6b reads 128 KB of partials for 32 KB of
weights, and the partials double with the splits. Here the loop becomes grid z: block (n, i)
merges KV head i's partials only and adds its product with those K columns of Wo into r, which
starts as a copy of x (`mugraph.output ... accumulate over`). A small graph_def writes that
start, in f32, once per output of the sum (the o-projection also writes the gated MLP's
accumulator start after `mugraph-fuse-accumulate`); r becomes f32, rounded where returned.

Conditions, each checked: the graph_def came from a fold (its `mk.fused` label starts with
`loop+`), has grid [N, 1, 1] with N a multiple of its for-loop L ≥ 2 or below it (one block
along N then), and ends in exactly `input W (N by grid x, loop over K)`, a transposed matmul of
a loop tile with it summed over the loop, `input x (N by grid x)` added to the sum,
and plain outputs of that sum along N; every other op is a loop op that reads whole inputs
(imap all -1) and sums nothing over the loop, and no op reads the sum otherwise; every reader
of a result that turns f32 takes any float tile.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, TensorType, f32
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from mk.diagnostics import MkError
from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph import FUSED_ATTR, GraphDefOp, InputOp, OutputOp
from mk.dialects.mugraph_base import shape_of, tensor_type
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_tiles import AccumOp, MatmulOp, ThreadMapOp
from mk.passes.mugraph_fuse_accumulate import (
    along_x_maps,
    is_add_of,
    readers_ok,
    retype_readers,
)

NO_AXIS = (-1, -1, -1)
ALONG_N = (1, -1, -1)


@dataclass(frozen=True)
class Split:
    """A residual linear `graph` whose loop becomes grid z, `per_block` iterations a block
    (`tail`: the ops rebuilt)."""

    graph: GraphDefOp
    weight: InputOp
    matmul: MatmulOp
    accum: AccumOp
    residual: InputOp
    add: ThreadMapOp
    outs: tuple[OutputOp, ...]
    per_block: int = 1

    @property
    def parts(self) -> int:
        """Blocks along grid z: the loop's iterations in runs of per_block."""
        return self.graph.forloop_range() // self.per_block

    @property
    def tail(self) -> set[Operation]:
        return {self.weight, self.matmul, self.accum, self.residual, self.add, *self.outs}

    @property
    def blocks(self) -> int:
        """Blocks along N after the split: the same number of blocks in all (or one, where
        there were fewer than the parts)."""
        return max(1, self.graph.grid_shape()[0] // self.parts)


def _folded(graph: GraphDefOp) -> bool:
    label = graph.attributes.get(FUSED_ATTR)
    return isinstance(label, StringAttr) and label.data.startswith("loop+")


def _tail(graph: GraphDefOp, per_block: int) -> Split | None:
    """The residual sum's ops at the end of `graph`, or None."""
    w_map, along_n = along_x_maps(graph.grid_shape()[0])
    outs = tuple(o for o in graph.body.block.ops if isinstance(o, OutputOp))
    if not outs or any(o.over() is not None or o.omap_dims() not in along_n for o in outs):
        return None
    add = outs[0].tile.owner
    if not isinstance(add, ThreadMapOp) or any(o.tile is not add.results[0] for o in outs):
        return None
    acc = next((a.owner for a in add.operands if isinstance(a.owner, AccumOp)), None)
    residual = next((a.owner for a in add.operands if isinstance(a.owner, InputOp)), None)
    if acc is None or residual is None or acc.kind.data != "sum":
        return None
    if not is_add_of(add, acc.results[0], residual.tile):
        return None
    mm = acc.operands[0].owner
    if not isinstance(mm, MatmulOp) or mm.transpose_b is None:
        return None
    w = mm.operands[1].owner
    if not isinstance(w, InputOp) or w.imap_dims() not in w_map or w.fmap_dim() != 1:
        return None
    if residual.imap_dims() not in along_n or residual.fmap_dim() != -1:
        return None
    return Split(graph, w, mm, acc, residual, add, outs, per_block)


def match(graph: GraphDefOp, per_block: int = 1) -> Split | None:
    """The split of `graph` into blocks of `per_block` iterations, or None when a condition
    fails."""
    grid, loop = graph.grid_shape(), graph.forloop_range()
    if not _folded(graph) or grid[1:] != (1, 1) or loop % per_block or loop // per_block < 2:
        return None
    parts = loop // per_block
    if grid[0] % parts and grid[0] > parts:
        return None
    split = _tail(graph, per_block)
    if split is None:
        return None
    n = shape_of(split.weight.source)[0]
    if n % split.blocks or len(shape_of(split.residual.source)) != 2:
        return None
    tail = split.tail
    for op in graph.body.block.ops:
        if op in tail:
            continue
        if isinstance(op, InputOp) and op.imap_dims() != NO_AXIS:
            return None
        if isinstance(op, AccumOp):  # a sum over the loop would become a block's own
            return None
        if any(u.operation in tail - {split.matmul} for r in op.results for u in r.uses):
            return None
    if split.matmul.operands[0].owner in tail:
        return None
    if any(u.operation not in tail for op in tail for r in op.results for u in r.uses):
        return None  # the rebuilt ops feed nothing else
    for i, r in enumerate(graph.results):
        if tensor_type(r).element_type != f32 and not readers_ok(r):
            return None
        if not any(o.result_index() == i for o in split.outs):
            return None
    return split


def _starts(split: Split) -> GraphDefOp:
    """One block writing x, in f32, into a start per result: what the blocks add onto."""
    g = split.graph
    x = g.args[split.residual.source_index()]
    types = [TensorType(f32, shape_of(r)) for r in g.results]
    # The starts' buffers become the sums': they keep the sums' names (a returned sum's buffer
    # is the output's, and its name goes to the rounded result).
    names = [
        f"{r.name_hint or 'r'}_start" if _returned(r) else (r.name_hint or "r") for r in g.results
    ]
    arg_names = ["x_a", *(f"{n}_r" for n in names)]
    blocks = _start_blocks(shape_of(x))
    along = ALONG_N if blocks > 1 else NO_AXIS
    b = BlockGraphBuilder([x], types, (blocks, 1, 1), g.thread_count(), 1, arg_names)
    t = b.input(0, along, -1, "xt")
    for i in range(len(types)):
        b.output(t, i, along)
    graph = b.finish()
    graph.attributes[FUSED_ATTR] = StringAttr("start")
    for r, name in zip(graph.results, names, strict=True):
        r.name_hint = name
    return graph


# Elements a start block copies at most: a batch-1 decode's x is one block; larger tiles made
# the copy's unrolled loads spill (a batch of 8 rows of 1,024 floats: 116 bytes).
START_ELEMENTS = 1024


def _start_blocks(shape: tuple[int, ...]) -> int:
    """Blocks along N for copying x [B, N]: halved tiles until one holds START_ELEMENTS."""
    rows, n = shape
    blocks = 1
    while rows * n // blocks > START_ELEMENTS and n % (2 * blocks) == 0:
        blocks *= 2
    return blocks


def _returned(value: SSAValue) -> bool:
    return any(isinstance(u.operation, ReturnOp) for u in value.uses)


def _split_input(op: InputOp, source: SSAValue) -> InputOp:
    """A loop input read at the block's iterations: grid z picks the run the loop walks."""
    dim = op.fmap_dim()
    imap = (-1, -1, dim) if dim >= 0 else NO_AXIS
    made = InputOp(source, imap, dim, op.tile.type)
    made.tile.name_hint = op.tile.name_hint
    return made


def _split_graph(split: Split, starts: GraphDefOp) -> GraphDefOp:
    g = split.graph
    # x is no longer read unless a loop op reads it too.
    read = sorted({op.source_index() for op in g.input_ops() if op is not split.residual})
    kept = [g.args[i] for i in read]
    args = [*kept, *starts.results]
    result_types = [TensorType(f32, shape_of(r)) for r in g.results]
    block = Block(arg_types=[*(a.type for a in args), *result_types])
    remap: dict[SSAValue, SSAValue] = {}
    for new, i in zip(block.args, read, strict=False):
        old = g.input_args()[i]
        remap[old] = new
        new.name_hint = old.name_hint
    start_args = block.args[len(kept) : len(args)]
    result_args = block.args[len(args) :]
    for a, r in zip(start_args, starts.results, strict=True):
        a.name_hint = f"{r.name_hint}_a"
    for a, old in zip(result_args, g.result_args(), strict=True):
        a.name_hint = old.name_hint
    tail = split.tail
    for op in g.body.block.ops:
        if op in tail:
            continue
        if isinstance(op, InputOp):
            made = _split_input(op, remap[op.source])
            block.add_op(made)
            remap[op.tile] = made.tile
        else:
            block.add_op(op.clone(value_mapper=remap))
    grid = (split.blocks, 1, split.parts)
    w_src = remap[split.weight.source]
    shape = maps.input_tile_shape(shape_of(w_src), grid, (0, -1, 1), 1, split.per_block)
    wt = InputOp(w_src, (0, -1, 1), 1, TensorType(tensor_type(w_src).element_type, shape))
    mm = MatmulOp(remap[split.matmul.operands[0]], wt.tile, transpose_b=True)
    acc = AccumOp("sum", mm.res)
    block.add_ops([wt, mm, acc])
    wt.tile.name_hint = split.weight.tile.name_hint
    mm.res.name_hint, acc.results[0].name_hint = split.matmul.res.name_hint, "sum"
    for out in split.outs:
        i = out.result_index()
        block.add_op(
            OutputOp(acc.results[0], result_args[i], ALONG_N, accumulate_over=start_args[i])
        )
    made = GraphDefOp(args, result_types, grid, g.thread_count(), split.per_block, Region(block))
    made.attributes |= g.attributes
    label = g.attributes[FUSED_ATTR]
    assert isinstance(label, StringAttr)
    made.attributes[FUSED_ATTR] = StringAttr(label.data.replace("loop+", "split+", 1))
    return made


def rewrite(split: Split) -> None:
    """Replace `split.graph` by its start graph_def and its split form."""
    g = split.graph
    block = g.parent_block()
    assert block is not None
    starts = _starts(split)
    block.insert_op_before(starts, g)
    made = _split_graph(split, starts)
    block.insert_op_before(made, g)
    for old, new in zip(g.results, made.results, strict=True):
        new.name_hint = old.name_hint
        if old.type == new.type:
            old.replace_all_uses_with(new)
        else:
            retype_readers(old, new, block, g.grid_shape()[0], g.thread_count())
    block.erase_op(g)


def split_loops(module: ModuleOp, per_block: int = 1) -> int:
    """Applies every split in `module`; returns how many."""
    count = 0
    for func in [op for op in module.walk() if isinstance(op, FuncOp)]:
        for graph in [op for op in func.body.block.ops if isinstance(op, GraphDefOp)]:
            if (split := match(graph, per_block)) is not None:
                rewrite(split)
                count += 1
    return count


@dataclass(frozen=True)
class MugraphSplitLoopPass(ModulePass):
    """`mugraph-split-loop{split-loop=1}`: N > 0 gives each block N of the loop's iterations
    (KV heads), 0 turns the pass off. On the H200 at batch 1 with 16 splits (nn-to-mugraph's
    choice when this pass is on), one head a block: qwen3-0.6b 1.030 -> 1.016 ms/token,
    llama-3.2-1b 1.063 -> 1.053 (bench/RESULTS.md, session 59); 2 (half the blocks' code) is
    not yet timed."""

    name = "mugraph-split-loop"

    split_loop: int = 1

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.split_loop < 0:
            raise MkError("mugraph-split-loop: split-loop must be >= 0")
        if self.split_loop:
            split_loops(op, self.split_loop)
