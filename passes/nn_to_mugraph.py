"""The nn-to-mugraph pass: every nn op, or fused group of ops, becomes a mugraph kernel.

Rule-based, per function:

1. **Plan.** Claim groups of nn ops, most specific first: decode attention with the layout ops
   folded into its maps (split-KV graph_def + merge graph_def, or one graph_def when there is a
   single split); linear groups (`nn.linear` / `nn.matmul` heads sharing one activation, with
   the `nn.rms_norm` that produced it, an elementwise epilogue and split-heads reshapes of the
   outputs; see `nn_to_mugraph_fusion`); chains of two or more elementwise ops (one thread_map
   graph_def); argmax over the last dim of a rank >= 2 tensor (partial + reduce graph_defs);
   row chains — a RoPE or a standalone RMSNorm with rows to spread, with the standalone RMSNorm
   feeding the RoPE and a head-splitting reshape in front (one block per head, e.g. QK-norm +
   RoPE of q). Every op left becomes one library kernel (`mugraph.kernel "<kind>"`, the nn attributes with
   defaults filled in).
2. **Order.** A group's kernel needs every value its ops read, so groups are emitted in a
   stable topological order (program order where dependencies allow).
3. **Rewrite.** The function body is rebuilt from the kernels; the signature is unchanged.

Layout ops fold into maps in these cases (elsewhere they are library copy kernels):
- a reshape [B, Hq·D] -> [B, Hq, 1, D] feeding attention's q, and a reshape [B, Hq, 1, D] ->
  [B, Hq·D] of attention's result (Sq = 1);
- a reshape of a linear group's output (its only user) that changes only leading dims (rows not
  split), or splits the last dim into heads [..., H, 1, ..., D] when a block's column tile is a
  whole number of heads;
- a reshape [..., H·D] -> [..., H, 1, ..., D] feeding a row chain (its blocks read their heads
  from the source and reshape the tile);
- a reshape whose only user is an `nn.cache_write` (as the new slab): the `cache_write` kernel
  reads the reshape's source, the slab's elements in row-major order; but (`cache-rows=1`, the
  default) a head-splitting one of several rows into a donated cache at one position is a row
  chain of copy blocks instead, which mugraph-append-writes makes write the rows in place;
- a reshape of an `nn.embedding` result (its only user): the `embedding` kernel writes its rows
  straight into the reshape's result type (a library kernel's result may be any reshape of the
  nn op's, row-major);
- a reshape [B] -> [1, B] of a rank-2 argmax's indices (their only user): the argmax's reduce
  writes each row's index at its column (a decode step's next token, which
  `mugraph-append-writes` then writes into the history from the reduce itself).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import FileLineColLoc, ModuleOp, TensorType
from xdsl.dialects.func import FuncOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from mk.diagnostics import MkError, op_location
from mk.dialects import nn
from mk.dialects.mugraph import KernelOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.nn_decode import donated_arg
from mk.passes.nn_to_mugraph_attention import (
    AttentionPlan,
    NewRow,
    attention_kernels,
    merge_block_width,
)
from mk.passes.nn_to_mugraph_fusion import elementwise_kernel, linear_group_kernel
from mk.passes.nn_to_mugraph_groups import (
    LINEAR_OPS,
    match_elementwise_group,
    match_linear_group,
)
from mk.passes.nn_to_mugraph_rules import (
    RowChain,
    Tiling,
    ValueMap,
    argmax_kernels,
    head_transpose_kernel,
    head_transpose_views,
    head_view_source,
    is_head_transpose,
    library_kernel,
    nn_attributes,
    row_chain_kernel,
    row_dims,
)

Emit = Callable[[ValueMap], tuple[list[Operation], dict[SSAValue, SSAValue]]]

_LIBRARY = {op.name for op in nn.ALL_OPS}


@dataclass
class _Unit:
    """Ops replaced together and how to build their replacement. `reads`: the values its
    kernels read, when not its ops' operands; `after`: ops whose units must come first."""

    ops: list[Operation]
    emit: Emit
    reads: list[SSAValue] | None = None
    after: list[Operation] = field(default_factory=list)

    def inputs(self) -> list[SSAValue]:
        if self.reads is not None:
            return self.reads
        return [v for op in self.ops for v in op.operands]


# ------------------------------------------------------------------------------------------------
# Planning
# ------------------------------------------------------------------------------------------------


def _sole_user(value: SSAValue) -> Operation | None:
    users = {u.operation for u in value.uses}
    return users.pop() if len(users) == 1 else None


def _match_attention(op: nn.AttentionOp, claimed: set[Operation], fold: int) -> AttentionPlan:
    """The attention with a q reshape / result reshape folded in where Sq = 1 allows it; with
    `fold` 1, q's per-head norm and RoPE and the new K and V rows (see `NewRow`), with 2 the
    rows only (q's chain keeps its own kernel), with 3 the rows as their kernels made them (the
    attention waits for the K row's norm and RoPE, not for its cache write)."""
    (bsz, hq, sq, d) = shape_of(op.q)
    q_view = op.q.owner
    if not (
        sq == 1
        and isinstance(q_view, nn.ReshapeOp)
        and q_view not in claimed
        and _sole_user(q_view.results[0]) is op
        and shape_of(q_view.operands[0]) == (bsz, hq * d)
    ):
        q_view = None
    out_view = _sole_user(op.results[0])
    if not (
        sq == 1
        and isinstance(out_view, nn.ReshapeOp)
        and out_view not in claimed
        and shape_of(out_view.results[0]) == (bsz, hq * d)
    ):
        out_view = None
    if not fold or sq != 1:
        return AttentionPlan(op, q_view, out_view)
    owner = op.q.owner
    q_chain = (
        _match_row_chain(owner, claimed) if fold == 1 and isinstance(owner, Operation) else None
    )
    if q_chain is not None and not (
        _sole_user(op.q) is op and all(_sole_user(o.results[0]) for o in q_chain.ops())
    ):
        q_chain = None
    chains = fold != 3
    k_row, v_row = _new_row(op.k, op, chains), _new_row(op.v, op, chains)
    return AttentionPlan(op, None if q_chain else q_view, out_view, q_chain, k_row, v_row)


def _new_row(cache: SSAValue, attention: nn.AttentionOp, chain: bool) -> NewRow | None:
    """The one-row cache write behind a K or V operand that only the attention reads; with
    `chain`, the per-head ops that made its row are recomputed in the attention."""
    write = cache.owner
    if not isinstance(write, nn.CacheWriteOp) or _sole_user(cache) is not attention:
        return None
    dim = nn.attribute_values(write)["dim"]
    new, index = shape_of(write.new), shape_of(write.index)
    if dim != 2 or new[2] != 1 or index not in ((1,), (new[0],)):
        return None
    owner = write.new.owner
    if not chain or not isinstance(owner, Operation):
        return NewRow(write, None)
    return NewRow(write, _match_row_chain(owner, set()))


def _library_unit(op: Operation) -> _Unit:
    if op.name not in _LIBRARY:
        raise MkError(f"'{op.name}' has no lowering to mugraph", op_location(op))

    def emit(lookup: ValueMap) -> tuple[list[Operation], dict[SSAValue, SSAValue]]:
        kernel = library_kernel(op, lookup)
        return [kernel], dict(zip(op.results, kernel.results, strict=True))

    return _Unit([op], emit)


def _kept_unit(op: Operation) -> _Unit:
    """A non-nn op (e.g. func.call) kept as it is, its operands remapped."""

    def emit(lookup: ValueMap) -> tuple[list[Operation], dict[SSAValue, SSAValue]]:
        op.detach()
        for i, v in enumerate(op.operands):
            op.operands[i] = lookup(v)
        return [op], {r: r for r in op.results}

    return _Unit([op], emit)


def _is_last_dim_argmax(op: Operation) -> bool:
    if not isinstance(op, nn.ArgmaxOp):
        return False
    rank = len(shape_of(op.operands[0]))
    dim = nn.attribute_values(op)["dim"]
    assert isinstance(dim, int)
    # Rank 1 would need a rank-0 graph_def result; the library kernel handles it.
    return rank >= 2 and dim % rank == rank - 1


def plan_units(ops: list[Operation], t: Tiling) -> list[_Unit]:
    """Claim every op of a function body (its terminator excluded) into units."""
    order = {op: i for i, op in enumerate(ops)}
    claimed: set[Operation] = set()
    units: list[_Unit] = []

    after: dict[Operation, list[Operation]] = {}  # a cache write after the reads of its cache

    def claim(unit: _Unit) -> None:
        claimed.update(unit.ops)
        unit.after = [a for op in unit.ops for a in after.get(op, [])]
        units.append(unit)

    merged: dict[SSAValue, int] = {}
    for op in ops:
        if isinstance(op, nn.AttentionOp):
            plan = _match_attention(op, claimed, t.attention_fold)
            emit: Emit = lambda lookup, p=plan: attention_kernels(p, t, lookup)  # noqa: E731
            claim(_Unit(plan.ops(), emit, reads=plan.sources()))
            for row in (plan.k_row, plan.v_row):
                if row is not None:
                    after.setdefault(row.write, []).append(op)
            if width := merge_block_width(plan, t):
                merged[plan.result()] = width
    for op in ops:
        if isinstance(op, LINEAR_OPS) and op not in claimed:
            group = match_linear_group(op, claimed, order, t, merged)
            if group is not None:
                claim(_Unit(group.ops(), lambda lookup, g=group: linear_group_kernel(g, t, lookup)))
    for kind in (nn.RopeOp, nn.RMSNormOp):  # a RoPE first, to take the norm that feeds it
        for op in ops:
            chain = _match_row_chain(op, claimed) if isinstance(op, kind) else None
            if chain is not None:
                claim(_row_chain_unit(chain, t))
    for op in ops:
        if _is_last_dim_argmax(op) and (view := _argmax_view(op, claimed)) is not None:
            claim(_Unit([op, view], lambda lookup, o=op, v=view: _argmax_emit(o, t, lookup, v)))
    for op in ops:
        if not isinstance(op, nn.CacheWriteOp):
            continue
        view = _cache_write_view(op, claimed)
        if view is not None and t.cache_rows and _copies_rows(op, view):
            copy = _row_chain_unit(RowChain(view, None, None), t)
            claim(copy)
            copy.after += after.get(op, [])  # the write moves into the copy
        elif view is not None:
            claim(_Unit([view, op], lambda lookup, o=op, v=view: _cache_write_emit(o, v, lookup)))
    for op in ops:
        found = _embedding_view(op, claimed, t.gather_pairs == 1)
        if found is not None:
            emit = lambda lookup, p=found: _embedding_view_emit(*p, lookup)  # noqa: E731
            claim(_Unit([o for o in found if o is not None], emit))
    for op in ops:
        if op not in claimed and is_head_transpose(op):
            claim(_transpose_unit(op, claimed))
    for op in ops:
        if op in claimed:
            continue
        chain = match_elementwise_group(op, claimed, order)
        if chain is not None:
            claim(_Unit(chain.ops, lambda lookup, c=chain: elementwise_kernel(c, t, lookup)))
        elif _is_last_dim_argmax(op):
            claim(_Unit([op], lambda lookup, o=op: _argmax_emit(o, t, lookup)))
        elif op.dialect_name() == "nn":
            claim(_library_unit(op))
        else:
            claim(_kept_unit(op))
    return units


def _cache_write_view(op: nn.CacheWriteOp, claimed: set[Operation]) -> nn.ReshapeOp | None:
    """The reshape producing a cache write's new slab, when the write is its only user: the
    kernel reads the reshape's source instead (the same bytes), so no copy task runs."""
    if op in claimed:
        return None
    view = _sole_unclaimed(op.new, op, claimed)
    return view if isinstance(view, nn.ReshapeOp) else None


def _copies_rows(op: nn.CacheWriteOp, view: nn.ReshapeOp) -> bool:
    """Whether the write's head-split rows become copy blocks, one per head, that
    mugraph-append-writes then writes in place: one small task per head instead of one task
    copying every head's rows (a decode step's V rows at batch 8: the one task copied 16 KB in
    ~7 us on the H100, a round trip a word). One row of a head (batch 1) stays in the one task:
    each block would copy a few hundred bytes."""
    source = shape_of(view.operands[0])
    heads = shape_of(view.results[0])[len(source) - 1]
    return (
        head_view_source(view) is not None
        and heads > 1
        and math.prod(source[:-1]) > 1
        and donated_arg(op.cache) is not None
        and math.prod(shape_of(op.index)) == 1
    )


def _cache_write_emit(
    op: nn.CacheWriteOp, view: nn.ReshapeOp, lookup: ValueMap
) -> tuple[list[Operation], dict[SSAValue, SSAValue]]:
    operands = [lookup(op.cache), lookup(view.operands[0]), lookup(op.index)]
    kernel = KernelOp("cache_write", operands, [op.results[0].type], nn_attributes(op))
    kernel.results[0].name_hint = op.results[0].name_hint
    kernel.location = op.location
    return [kernel], {op.results[0]: kernel.results[0]}


def _embedding_view(
    op: Operation, claimed: set[Operation], pairs: bool
) -> tuple[nn.EmbeddingOp, nn.ReshapeOp, nn.EmbeddingOp | None] | None:
    """The embedding a reshape reads, when the reshape is its only user: the gather writes its
    rows straight into the reshape's result (the same bytes in the same order), so no copy task
    runs (a decode step's [1, B, H] embedding seen as [B, H]). With it, the embedding that picks
    its ids, when the gather is that one's only user (a decode step's token ids picked from the
    token history at the step's position): one kernel gathers table[ids[at]], so no task and
    no hop stand between the position and the embedded rows."""
    if not isinstance(op, nn.ReshapeOp) or op in claimed:
        return None
    gather = _sole_unclaimed(op.operands[0], op, claimed)
    if not isinstance(gather, nn.EmbeddingOp):
        return None
    inner = _sole_unclaimed(gather.ids, gather, claimed) if pairs else None
    return gather, op, inner if isinstance(inner, nn.EmbeddingOp) else None


def _embedding_view_emit(
    gather: nn.EmbeddingOp, view: nn.ReshapeOp, inner: nn.EmbeddingOp | None, lookup: ValueMap
) -> tuple[list[Operation], dict[SSAValue, SSAValue]]:
    ids = [lookup(gather.ids)] if inner is None else [lookup(inner.table), lookup(inner.ids)]
    operands = [lookup(gather.table), *ids]
    kernel = KernelOp("embedding", operands, [view.results[0].type], nn_attributes(gather))
    kernel.results[0].name_hint = view.results[0].name_hint
    kernel.location = gather.location  # an id out of range names the embedding's line
    return [kernel], {view.results[0]: kernel.results[0]}


def _sole_unclaimed(value: SSAValue, user: Operation, claimed: set[Operation]) -> Operation | None:
    """The op defining `value` when `user` is its only user and it is not claimed yet."""
    op = value.owner
    if isinstance(op, Operation) and op not in claimed and _sole_user(value) is user:
        return op
    return None


def _match_row_chain(op: Operation, claimed: set[Operation]) -> RowChain | None:
    """A RoPE or standalone RMSNorm with rows to spread, with the standalone RMSNorm feeding the
    RoPE and the head-splitting reshape feeding the first of them."""
    if op in claimed or not row_dims(shape_of(op.results[0])):
        return None
    rope = op if isinstance(op, nn.RopeOp) else None
    norm = op if isinstance(op, nn.RMSNormOp) else None
    if rope is None and norm is None:
        return None
    if rope is not None:
        below = _sole_unclaimed(rope.operands[0], rope, claimed)
        norm = below if isinstance(below, nn.RMSNormOp) else None
    first = norm or rope
    assert first is not None
    view = _sole_unclaimed(first.operands[0], first, claimed)
    if view is None or head_view_source(view) is None:
        view = None
    return RowChain(view, norm, rope)


def _row_chain_unit(chain: RowChain, t: Tiling) -> _Unit:
    def emit(lookup: ValueMap) -> tuple[list[Operation], dict[SSAValue, SSAValue]]:
        kernels = row_chain_kernel(chain, t, lookup)
        return kernels, {chain.last().results[0]: kernels[-1].results[0]}

    return _Unit(chain.ops(), emit)


def _transpose_unit(op: Operation, claimed: set[Operation]) -> _Unit:
    """A head transpose with the reshapes it reads or writes through (head_transpose_views)."""
    user = _sole_user(op.results[0])
    after = user if user is not None and user not in claimed else None
    source, result = head_transpose_views(op, _sole_unclaimed(op.operands[0], op, claimed), after)
    last = result or op

    def emit(lookup: ValueMap) -> tuple[list[Operation], dict[SSAValue, SSAValue]]:
        kernels = head_transpose_kernel(op, lookup, source, result)
        return kernels, {last.results[0]: kernels[0].results[0]}

    return _Unit([o for o in (source, op, result) if o is not None], emit)


def _argmax_view(op: Operation, claimed: set[Operation]) -> nn.ReshapeOp | None:
    """The reshape [B] -> [1, B] of a rank-2 argmax's indices, when it is their only user: the
    reduce writes each row's index at its column of [1, B], so no copy task runs, and a cache
    write of the row (a decode step's next token into the history) can then go into the reduce
    too (mugraph-append-writes)."""
    view = _sole_user(op.results[0]) if op not in claimed else None
    if not isinstance(view, nn.ReshapeOp) or view in claimed or len(shape_of(op.operands[0])) != 2:
        return None
    return view if shape_of(view.results[0]) == (1, *shape_of(op.results[0])) else None


def _argmax_emit(
    op: Operation, t: Tiling, lookup: ValueMap, view: nn.ReshapeOp | None = None
) -> tuple[list[Operation], dict[SSAValue, SSAValue]]:
    if view is None:
        kernels = argmax_kernels(op, t, lookup)
        return kernels, {op.results[0]: kernels[-1].results[0]}
    viewed = view.results[0].type
    assert isinstance(viewed, TensorType)
    kernels = argmax_kernels(op, t, lookup, viewed)
    kernels[-1].results[0].name_hint = view.results[0].name_hint
    return kernels, {view.results[0]: kernels[-1].results[0]}


# ------------------------------------------------------------------------------------------------
# Ordering and rewriting
# ------------------------------------------------------------------------------------------------


def _topological(units: list[_Unit], order: dict[Operation, int]) -> list[_Unit]:
    """Units in dependency order; among ready units, the one whose first op comes first."""
    owner = {op: i for i, u in enumerate(units) for op in u.ops}
    deps: list[set[int]] = []
    for i, u in enumerate(units):
        ds = {
            owner[v.owner]
            for v in u.inputs()
            if isinstance(v.owner, Operation) and v.owner in owner
        }
        ds |= {owner[op] for op in u.after}
        deps.append(ds - {i})
    users: list[list[int]] = [[] for _ in units]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    key = [min(order[op] for op in u.ops) for u in units]
    waiting = [len(ds) for ds in deps]
    ready = [(key[i], i) for i in range(len(units)) if not waiting[i]]
    heapq.heapify(ready)
    result: list[_Unit] = []
    while ready:
        _, i = heapq.heappop(ready)
        result.append(units[i])
        for j in users[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, (key[j], j))
    if len(result) != len(units):
        stuck = next(u for i, u in enumerate(units) if waiting[i])
        raise MkError("fused kernels depend on each other in a cycle", op_location(stuck.ops[0]))
    return result


def lower_block(block: Block, t: Tiling) -> None:
    """Replace the nn ops of a function body by mugraph kernels."""
    terminator = block.last_op
    ops = [op for op in block.ops if op is not terminator]
    if not any(op.dialect_name() == "nn" for op in ops):
        return
    order = {op: i for i, op in enumerate(ops)}
    units = _topological(plan_units(ops, t), order)
    mapping: dict[SSAValue, SSAValue] = {}

    def lookup(v: SSAValue) -> SSAValue:
        return mapping.get(v, v)

    for unit in units:
        new_ops, produced = unit.emit(lookup)
        for new in new_ops:
            if not isinstance(new.location, FileLineColLoc):  # later errors name the nn op
                new.location = unit.ops[-1].location
            if new.parent is None:
                block.insert_op_before(new, terminator) if terminator else block.add_op(new)
        mapping.update(produced)
    if terminator is not None:
        for i, v in enumerate(terminator.operands):
            terminator.operands[i] = lookup(v)
    for op in reversed(ops):
        if op.parent is block and op.dialect_name() == "nn":
            block.erase_op(op)


@dataclass(frozen=True)
class NnToMugraphPass(ModulePass):
    """`nn-to-mugraph{num-sms=132 tile-n=64 tile-k=64 tile-m=0 kv-chunk=64 kv-splits=0
    k-splits=1 attention-fold=1 task-us=3 norm-rows=16 merge-rows=1 split-loop=1 gather-pairs=1
    cache-rows=1}`."""

    name = "nn-to-mugraph"

    num_sms: int = 132
    tile_n: int = 64  # output columns per block for the linear family; 0 fits the SMs' waves
    tile_k: int = 64  # K elements per for-loop iteration
    # rows per block of ops over rows; 0: 64, and with tile-n=0 a linear of many rows takes
    # 128 x 128 blocks where they still give every SM one (prefill-shaped products)
    tile_m: int = 0
    kv_chunk: int = 64  # keys per for-loop iteration in attention
    kv_splits: int = 0  # splits of the KV length; 0 chooses blocks ≈ num_sms
    # splits of a linear's K (at most 16); 0 chooses blocks ≈ num_sms, 1 never splits. The default
    # stays 1 until mugraph-to-task builds exact (not coarse) events for split-K consumers.
    k_splits: int = 1
    # 1: decode attention computes q's per-head norm and RoPE and reads the new K/V row itself,
    # so it waits for neither those kernels nor the cache writes; 2: the new rows only (q's
    # norm and RoPE keep their kernel); 3: the new rows as their kernels made them (it waits
    # for the K row's norm and RoPE, not for the cache write); 0: it reads their results. 1 by
    # default: a layer's phase fewer (qwen3-0.6b 1.146 -> 1.110 ms/token on the H200 once its
    # CUDA body ran the row ops once a task, bench/RESULTS.md session 52).
    attention_fold: int = 1
    # With tile-n=0, > 0: the column blocks of a linear that takes several waves minimise the
    # modelled time, waves × (task-us + the task's weight bytes at one SM's share of HBM), instead
    # of only filling the last wave (an lm_head of 1,187 or 5,344 small tasks pays a task's
    # fixed cost, ~3 µs on the H200, at every one of them). 0 keeps the fill rule. qwen3-0.6b's
    # lm_head went from 1,187 tasks to 128 and 1.275 -> 1.258 ms/token on the H200.
    task_us: int = 3
    # An RMSNorm fuses into the linears that read it only when it normalises at most this many
    # rows (0: at any count). Fused, each K chunk of x is scaled by g in the tile before the
    # product; a tensor-core tile of a prefill's rows ran 3-4 us a chunk so on the H200 against
    # ~0.6-0.8 without (bench/RESULTS.md, session 47), so many rows are normalised once instead.
    norm_rows: int = 16
    # A decode attention's split merge is cut into one block per KV head, all batch rows in it, so
    # that mugraph-fuse-loop folds it into the o-projection, up to this many batch rows (their
    # partials within the fold's bytes). 1, the default: batch 1 only (at batch 8 the merge is a
    # phase of its own, a block per KV head and batch row; folded there it is not yet timed).
    merge_rows: int = 1
    # N > 0 (1 by default): mugraph-split-loop gives each o-projection block N KV heads'
    # partials of a folded merge, so the batch-1 splits need not be two chunks long (kv-splits 0).
    split_loop: int = 1
    # 1: an embedding whose ids an embedding picks (its only user) is one kernel,
    # table[ids[at]] (a decode step's token and its embedding); 0 keeps two kernels.
    gather_pairs: int = 1
    # 1 (default): a cache write whose new rows (more than one) a head-splitting reshape makes (a
    # batch's V rows in a decode step) is a grid of copy blocks, one per head, that
    # mugraph-append-writes then writes in place; 0: one library task copies them all. On the
    # H100 at batch 8 (bench/RESULTS.md, session 98): qwen3-0.6b -0.10 %, llama-3.2-1b -0.19 %,
    # the V write 6.9 -> 1.4 and 3.0 -> 1.3 µs a task.
    cache_rows: int = 1

    def tiling(self) -> Tiling:
        for option in ("num_sms", "tile_k", "kv_chunk"):
            if getattr(self, option) < 1:
                raise MkError(f"nn-to-mugraph: {option.replace('_', '-')} must be >= 1")
        for option in ("tile_n", "tile_m", "kv_splits", "k_splits", "task_us", "norm_rows"):
            if getattr(self, option) < 0:
                raise MkError(f"nn-to-mugraph: {option.replace('_', '-')} must be >= 0")
        if self.split_loop < 0:
            raise MkError("nn-to-mugraph: split-loop must be >= 0")
        if self.merge_rows < 1:
            raise MkError("nn-to-mugraph: merge-rows must be >= 1")
        for option in ("gather_pairs", "cache_rows"):
            if getattr(self, option) not in (0, 1):
                raise MkError(f"nn-to-mugraph: {option.replace('_', '-')} must be 0 or 1")
        if self.attention_fold not in (0, 1, 2, 3):
            raise MkError("nn-to-mugraph: attention-fold must be 0, 1, 2 or 3")
        return Tiling(
            self.num_sms, self.tile_n, self.tile_k, self.kv_chunk, self.kv_splits,
            tile_m=self.tile_m, k_splits=self.k_splits, attention_fold=self.attention_fold,
            task_us=self.task_us, norm_rows=self.norm_rows, merge_rows=self.merge_rows,
            split_loop=self.split_loop, gather_pairs=self.gather_pairs, cache_rows=self.cache_rows,
        )  # fmt: skip

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        t = self.tiling()
        funcs = [f for f in op.walk() if isinstance(f, FuncOp) and not f.is_declaration]
        for func in funcs:
            lower_block(func.body.block, t)
