"""The streamed form of a decode-attention graph_def's loop, and the device call that runs it.

A graph_def whose for-loop only scores a few loop-invariant query rows against K tiles
(q·kᵀ, then a scale or an elementwise mask of the score, the key's position and loop-invariant
scalars) and folds them with V into one online-softmax accumulator does not need its tiles:
`mk::gpu::stream_attention` (mk/cuda_attention.cuh) computes the accumulator's final state
in one pass over the keys, and the epilogue runs as usual on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.ir import Operation, SSAValue

from mk.backends.cpu.emit_scalar import dtype_code, float_literal, is_float, scalar_body
from mk.backends.cuda import attention_switches
from mk.backends.cuda.causal import CausalBound, causal_bound, length_bound
from mk.dialects.mugraph import GraphDefOp, InputOp, PositionOp
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_tiles import (
    AccumOp,
    AccumSoftmaxOp,
    MatmulOp,
    ReduceOp,
    ReshapeOp,
    RMSNormOp,
    RopeOp,
    ThreadMapOp,
    UnaryOp,
)

MAX_ROWS = 8  # mk::gpu::kAttentionMaxRows
HEAD_DIMS = (8, 16, 32, 64, 128, 256)  # D / 8 lanes per key must divide a warp
BLOCK_MAX_ROWS = 128  # mk::gpu::kBlockAttentionMaxRows: more rows go to block_attention
BLOCK_KEYS = 64  # mk::gpu::kBlockAttentionKeys
BLOCK_STAGES = 3  # mk::gpu::kBlockAttentionStages
THREADS = 256  # mk::kCudaThreads
_KV_DTYPES = ("mk::DTYPE_BF16", "mk::DTYPE_F16")
_Q_DTYPES = ("mk::DTYPE_BF16", "mk::DTYPE_F16", "mk::DTYPE_F32")


@dataclass(frozen=True)
class NewRowSelect:
    """A K or V chunk with one row replaced: `select(position == at, new, chunk)`, the new
    cache row that the attention reads before the cache write lands (nn-to-mugraph's
    `NewRow`). `new` is a loop-invariant [.., D] value the body computes before the call."""

    op: ThreadMapOp
    position: PositionOp
    at: InputOp
    new: SSAValue


@dataclass(frozen=True)
class HeadRow:
    """Rows read from an input and put through an optional RMSNorm and RoPE before rounding
    (`mk::gpu::RowOps`): q's per-head ops, or the new K row's, which the call applies to the
    rows in registers as it loads them, instead of tile steps before it."""

    x: InputOp
    norm: RMSNormOp | None
    g: InputOp | None
    rope: RopeOp | None
    tables: tuple[InputOp, InputOp] | None
    out: SSAValue
    ops: frozenset[Operation]


@dataclass(frozen=True)
class AttentionPlan:
    """The loop of a graph_def in streamed form. `args` says what feeds each operand of the
    score transform: "s" the dot product, "key" the key's position, or a scalar input. `q` is
    an input read in place, or a loop-invariant tile the body computes first (e.g. q's norm
    and RoPE); `prologue` holds the loop-invariant ops that run before the call."""

    q: InputOp | SSAValue
    k: InputOp
    v: InputOp
    acc: AccumSoftmaxOp
    transform: UnaryOp | ThreadMapOp | None
    args: tuple[str | InputOp, ...]
    handled: frozenset[Operation]
    k_new: NewRowSelect | None = None
    v_new: NewRowSelect | None = None
    prologue: tuple[Operation, ...] = ()
    head_rows: tuple[HeadRow, ...] = ()  # q / new rows the call computes as it loads them
    causal: CausalBound | None = None  # a block plan's causal mask (backends/cuda/causal.py)
    length: InputOp | None = None  # the kv length of a `key < len` mask: keys from it on

    @property
    def rows(self) -> int:
        return shape_of(self.acc.o)[0]

    @property
    def block(self) -> bool:
        """Whether the rows are many (a prefill's): mk::gpu::block_attention on tensor cores,
        q read in runs, the score given each row's query position."""
        return self.rows > MAX_ROWS

    @property
    def head_dim(self) -> int:
        return shape_of(self.acc.o)[1]

    def scalars(self) -> list[InputOp]:
        ats = [r.at for r in (self.k_new, self.v_new) if r is not None]
        found = [a for a in self.args if isinstance(a, InputOp)] + ats
        return list(dict.fromkeys(found))

    def head_row(self, value: SSAValue) -> HeadRow | None:
        return next((r for r in self.head_rows if r.out == value), None)

    def new_at(self) -> InputOp | None:
        """The scalar input holding the new row's key position."""
        rows = [r for r in (self.k_new, self.v_new) if r is not None]
        return rows[0].at if rows else None

    def streamed(self) -> set[SSAValue]:
        """The values the streamed loop never holds as tiles."""
        return {r for op in self.handled for r in op.results}

    def smem_floats(self) -> int:
        if self.block:  # mk::gpu::block_attention_smem_bytes: stages of K and V chunks
            return BLOCK_STAGES * 2 * BLOCK_KEYS * (self.head_dim + 8) * 2 // 4
        slots = THREADS // (self.head_dim // 8)
        # The slots' states (o, m, l), and their weights where they are computed once.
        per_slot_row = self.head_dim + (3 if attention_switches.attention_merge_weights() else 2)
        return slots * self.rows * per_slot_row


MMA_KEYS = 64  # mk::gpu::mma_attention_chunk_keys(8): the chunk that MK_CUDA_ATTN_MMA=auto counts


def mma_chunk_keys() -> int:
    """mk::gpu::mma_attention_chunk_keys: 8 warps' keys (MK_CUDA_ATTN_WARP_KEYS)."""
    return 8 * attention_switches.attention_warp_keys()


def mma_chunks(keys: int, chunk_keys: int = MMA_KEYS) -> int:
    """The chunks of `chunk_keys` keys stream_attention_mma stages for a task of up to `keys`
    keys (it takes a stage for each, up to MK_CUDA_ATTN_MMA_STAGES)."""
    return max(1, -(-keys // chunk_keys))


def mma_smem_floats(rows: int, d: int, stages: int) -> int:
    """mk::gpu::mma_attention_smem_bytes(rows, d, stages) in floats: prepare_rows' rows
    (128-byte aligned), then the stages of K and V chunks of rows padded by 8 elements."""
    rows_bytes = -(-(rows + 2) * d * 4 // 128) * 128
    return (rows_bytes + stages * 2 * mma_chunk_keys() * (d + 8) * 2) // 4


def plan_attention(op: GraphDefOp) -> AttentionPlan | None:
    """The streamed form of `op`'s loop, or None when the loop does anything else."""
    loop = op.loop_ops()
    accs = [o for o in loop if isinstance(o, AccumOp | AccumSoftmaxOp)]
    if len(accs) != 1 or not isinstance(accs[0], AccumSoftmaxOp):
        return None
    acc = accs[0]
    o_shape = shape_of(acc.o)
    if len(o_shape) != 2 or not _rows_fit(o_shape[0], o_shape[1]):
        return None
    block = o_shape[0] > MAX_ROWS
    varying = _varying(loop)
    v, v_view, v_new = _key_side(acc.v, o_shape[1], varying)
    found = _transform(acc.scores)
    if v is None or found is None:
        return None
    transform, args, chain = found
    product = acc.scores if transform is None else transform.operands[0]
    matmul = product.owner
    if not isinstance(matmul, MatmulOp) or matmul.transpose_b is None:
        return None
    if dtype_code(matmul.res.type) != "mk::DTYPE_F32" or shape_of(matmul.res) != (
        o_shape[0],
        shape_of(acc.v)[0],
    ):
        return None
    k, k_view, k_new = _key_side(matmul.b, o_shape[1], varying)
    q, q_view = _query_side(matmul.a, o_shape, varying, block)
    if k is None or q is None or not _same_walk(k, v) or shape_of(matmul.a) != o_shape:
        return None
    queries = [p for p in chain if isinstance(p, PositionOp) and p.x != k.tile]
    if block and (k_new or v_new or not isinstance(q, InputOp) or _dtype(q) != _dtype(k)):
        return None
    if any(not (block and isinstance(q, InputOp) and p.x == q.tile) for p in queries):
        return None
    if k_new and v_new and (k_new.at.source, k_new.at.imap) != (v_new.at.source, v_new.at.imap):
        return None
    handled: set[Operation] = {acc, matmul, k, v, *chain}
    handled |= {x for x in (q_view, k_view, v_view, transform) if x is not None}
    handled |= {o for r in (k_new, v_new) if r is not None for o in (r.op, r.position)}
    if isinstance(q, InputOp):
        handled.add(q)
    scalars: set[Operation] = {a for a in args if isinstance(a, InputOp)}
    scalars |= {r.at for r in (k_new, v_new) if r is not None}
    head_rows = []
    for value, count in ((q, o_shape[0]), *((r.new, 1) for r in (k_new, v_new) if r)):
        row = None if isinstance(value, InputOp) else _head_row(value, count, o_shape[1])
        if row is not None:
            head_rows.append(row)
    row_ops = {o for r in head_rows for o in r.ops}
    if used_only_by(row_ops, handled | row_ops):  # else they stay tile steps before the call
        handled |= row_ops
    else:
        head_rows = []
    prologue = [o for o in loop if o not in handled and o not in scalars]
    if any(o in varying for o in prologue):
        return None
    if not used_only_by(handled - {acc}, handled) or not used_only_by(scalars, handled):
        return None
    causal = causal_bound(transform, args) if block else None
    length = length_bound(transform, args)
    return AttentionPlan(
        q, k, v, acc, transform, args, frozenset(handled - {acc}), k_new, v_new, tuple(prologue),
        tuple(head_rows), causal, length,
    )  # fmt: skip


def _rows_fit(rows: int, d: int) -> bool:
    """Whether stream_attention (a few rows) or block_attention (many) takes [rows, d]."""
    if rows <= MAX_ROWS:
        return rows >= 1 and d in HEAD_DIMS
    return rows <= BLOCK_MAX_ROWS and d % 16 == 0 and d <= 128  # registers hold 16 rows of o


def _dtype(op: InputOp) -> str:
    return dtype_code(op.tile.type)


def query_runs(op: InputOp) -> tuple[int, int]:
    """(rows a run, elements between runs) of a block plan's q: its tile's rows, runs of the
    second-last dim's rows, one run per index of the dim before it."""
    tile, src = op.tile_shape(), shape_of(op.source)
    return tile[-2], src[-2] * src[-1]


def _head_row(value: SSAValue, rows: int, d: int) -> HeadRow | None:
    """`value` as input → reshape → [RMSNorm] → [RoPE] over rows of d elements; None for
    anything else."""
    base, view = _strip_reshape(value)
    rope = base.owner if isinstance(base.owner, RopeOp) else None
    below = rope.x if rope else base
    norm = below.owner if isinstance(below.owner, RMSNormOp) else None
    raw = norm.x if norm else below
    raw_base, raw_view = _strip_reshape(raw)
    x = raw_base.owner
    if not isinstance(x, InputOp) or not _contiguous_rows(x, rows * d) or shape_of(base)[-1] != d:
        return None
    g = _whole(norm.g, d) if norm else None
    if norm is not None and g is None:
        return None
    tables = None
    if rope is not None:
        if d < 16:
            return None  # a lane's 8 elements would hold both halves the RoPE pairs
        cos, sin = _whole(rope.cos, d // 2), _whole(rope.sin, d // 2)
        if cos is None or sin is None or dtype_code(cos.tile.type) != dtype_code(sin.tile.type):
            return None
        if norm is not None and dtype_code(norm.res.type) != "mk::DTYPE_F32":
            return None  # rounded between the norm and the RoPE
        tables = (cos, sin)
    chain = [o for o in (x, raw_view, norm, g, rope, view) if o is not None]
    chain += list(tables) if tables else []
    return HeadRow(x, norm, g, rope, tables, value, frozenset(chain))


def _whole(value: SSAValue, n: int) -> InputOp | None:
    """A loop-invariant input tile of n contiguous elements, the same for every row."""
    op = value.owner
    if not isinstance(op, InputOp) or op.fmap_dim() >= 0 or math.prod(op.tile_shape()) != n:
        return None
    ok = op.tile_shape()[-1] == n and dtype_code(op.tile.type) == dtype_code(op.source.type)
    return op if ok else None


def _varying(loop: Sequence[Operation]) -> set[Operation]:
    """The loop's ops that read a for-loop-mapped input, directly or through other ops."""
    varying: set[Operation] = set()
    for o in loop:
        walks = isinstance(o, InputOp) and o.fmap_dim() >= 0
        if walks or any(isinstance(a.owner, Operation) and a.owner in varying for a in o.operands):
            varying.add(o)
    return varying


def _invariant(value: SSAValue, varying: set[Operation]) -> bool:
    return not (isinstance(value.owner, Operation) and value.owner in varying)


def _strip_reshape(value: SSAValue) -> tuple[SSAValue, ReshapeOp | None]:
    owner = value.owner
    if isinstance(owner, ReshapeOp):
        return owner.x, owner
    return value, None


def _key_side(
    value: SSAValue, d: int, varying: set[Operation]
) -> tuple[InputOp | None, ReshapeOp | None, NewRowSelect | None]:
    """The K or V input behind a [C, D] tile: keys along the source's second-last dim, every
    head element of a key in the tile; possibly with the new row selected in."""
    base, view = _strip_reshape(value)
    select = _new_row_select(base, d, varying)
    op = select.position.x.owner if select else base.owner
    if not isinstance(op, InputOp):
        return None, None, None
    tile, src = op.tile_shape(), shape_of(op.source)
    n = len(src)
    ok = (
        n >= 2
        and shape_of(value) == (tile[-2], d)
        and op.fmap_dim() == n - 2
        and src[-1] == d
        and tile[-1] == d
        and all(t == 1 for t in tile[:-2])
        and dtype_code(op.tile.type) == dtype_code(op.source.type)
        and dtype_code(op.tile.type) in _KV_DTYPES
    )
    return (op, view, select) if ok else (None, None, None)


def _new_row_select(value: SSAValue, d: int, varying: set[Operation]) -> NewRowSelect | None:
    """`select(position(chunk) == at, new, chunk)` over a K or V input chunk; None otherwise."""
    op = value.owner
    if not isinstance(op, ThreadMapOp) or len(op.args) != 4 or len(op.res) != 1:
        return None
    pos, at, new, chunk = op.args
    position, at_op = pos.owner, at.owner
    body = list(op.body.block.ops)
    ok = (
        isinstance(position, PositionOp)
        and isinstance(chunk.owner, InputOp)
        and position.x == chunk
        and position.dim.value.data == chunk.owner.fmap_dim()
        and isinstance(at_op, InputOp)
        and at_op.fmap_dim() < 0
        and math.prod(shape_of(at)) == 1
        and not is_float(at.type)
        and _invariant(new, varying)
        and math.prod(shape_of(new)) == d
        and shape_of(new)[-1] == d
        and dtype_code(op.res[0].type) == dtype_code(chunk.type)
        and _is_row_select(body, op.body.block.args)
    )
    if not ok:
        return None
    assert isinstance(position, PositionOp) and isinstance(at_op, InputOp)
    return NewRowSelect(op, position, at_op, new)


def _is_row_select(body: Sequence[Operation], args: Sequence[SSAValue]) -> bool:
    """The body `select(a0 == a1, a2, a3)`."""
    if len(body) != 3:
        return False
    cmp, sel, out = body
    return (
        isinstance(cmp, arith.CmpiOp)
        and cmp.predicate.value.data == 0  # eq
        and tuple(cmp.operands) == (args[0], args[1])
        and isinstance(sel, arith.SelectOp)
        and tuple(sel.operands) == (cmp.result, args[2], args[3])
        and tuple(out.operands) == (sel.result,)
    )


def _query_side(
    value: SSAValue, o_shape: Sequence[int], varying: set[Operation], block: bool
) -> tuple[InputOp | SSAValue | None, ReshapeOp | None]:
    """The loop-invariant query rows behind the [R, D] tile: an input read as one contiguous
    run (for a block plan: in runs, query_runs), or a tile the body computes before the loop."""
    base, view = _strip_reshape(value)
    op = base.owner
    if not isinstance(op, InputOp):
        computed = _invariant(base, varying) and math.prod(shape_of(base)) == math.prod(o_shape)
        return (base, view) if computed else (None, None)
    rows = _query_in_runs(op, o_shape) if block else _contiguous_rows(op, math.prod(o_shape))
    return (op, view) if op.fmap_dim() < 0 and rows else (None, None)


def _query_in_runs(op: InputOp, o_shape: Sequence[int]) -> bool:
    """A loop-invariant 16-bit input tile [1.., A, B, D] of whole rows: A runs of B rows."""
    tile, src = op.tile_shape(), shape_of(op.source)
    return (
        len(tile) >= 2
        and tile[-1] == src[-1] == o_shape[1]
        and math.prod(tile) == math.prod(o_shape)
        and all(t == 1 for t in tile[:-3])
        and _dtype(op) == dtype_code(op.source.type)
        and _dtype(op) in _KV_DTYPES
    )


def _contiguous_rows(op: InputOp, n: int) -> bool:
    """A loop-invariant input tile of n elements read as one contiguous run, in place."""
    tile, src = op.tile_shape(), shape_of(op.source)
    first = next((i for i, t in enumerate(tile) if t != 1), len(tile))
    return (
        op.fmap_dim() < 0
        and math.prod(tile) == n
        and tuple(tile[first + 1 :]) == tuple(src[first + 1 :])
        and dtype_code(op.tile.type) == dtype_code(op.source.type)
        and dtype_code(op.tile.type) in _Q_DTYPES
    )


def _same_walk(k: InputOp, v: InputOp) -> bool:
    return (
        k.tile_shape() == v.tile_shape()
        and shape_of(k.source) == shape_of(v.source)
        and k.imap_dims() == v.imap_dims()
        and dtype_code(k.tile.type) == dtype_code(v.tile.type)
    )


Transform = tuple[UnaryOp | ThreadMapOp | None, tuple[str | InputOp, ...], list[Operation]]


def _transform(scores: SSAValue) -> Transform | None:
    """(the op between q·kᵀ and the softmax, what feeds its operands, the key-position ops);
    None when the scores are computed some other way."""
    owner = scores.owner
    if isinstance(owner, MatmulOp):
        return None, (), []
    if isinstance(owner, UnaryOp) and owner.kind.data == "scale":
        ok = dtype_code(owner.res.type) == "mk::DTYPE_F32"
        return (owner, ("s",), []) if ok else None
    if not isinstance(owner, ThreadMapOp) or len(owner.res) != 1 or not owner.args:
        return None
    if dtype_code(owner.res[0].type) != "mk::DTYPE_F32":
        return None
    args: list[str | InputOp] = ["s"]
    chain: list[Operation] = []
    for a in owner.args[1:]:
        key = _key_positions(a)
        query = _query_positions(a)
        src = a.owner
        if key is not None:
            args.append("key")
            chain += key
        elif query is not None:
            args.append("query")
            chain += query
        elif isinstance(src, InputOp) and src.fmap_dim() < 0 and math.prod(shape_of(a)) == 1:
            args.append(src)
        else:
            return None
    return owner, tuple(args), chain


def _positions(
    value: SSAValue,
) -> tuple[PositionOp, ThreadMapOp, ReduceOp, ReshapeOp | None] | None:
    """position(an input tile) -> sitofp -> max over a dim -> optional reshape, else None."""
    base, view = _strip_reshape(value)
    red = base.owner
    if not isinstance(red, ReduceOp) or red.kind.data != "max":
        return None
    conv = red.x.owner
    if not isinstance(conv, ThreadMapOp) or len(conv.args) != 1 or not _is_sitofp(conv):
        return None
    pos = conv.args[0].owner
    if not isinstance(pos, PositionOp) or not isinstance(pos.x.owner, InputOp):
        return None
    return pos, conv, red, view


def _key_positions(value: SSAValue) -> list[Operation] | None:
    """The ops of position(k) -> sitofp -> max over the head dim -> reshape to [1, C]: each
    key's position as a float; None for any other value."""
    found = _positions(value)
    if found is None:
        return None
    pos, _, red, _ = found
    src = pos.input_op()
    n = len(src.tile_shape())
    if pos.dim.value.data != src.fmap_dim() or red.dim.value.data == pos.dim.value.data:
        return None
    if red.dim.value.data != n - 1 or math.prod(shape_of(value)) != src.tile_shape()[n - 2]:
        return None
    return [o for o in found if o is not None]


def _query_positions(value: SSAValue) -> list[Operation] | None:
    """The ops of position(q) along its rows' dim -> sitofp -> max over the head dim ->
    reshape to [R, 1]: each query row's position as a float; None for any other value."""
    found = _positions(value)
    if found is None:
        return None
    pos, _, red, _ = found
    n = len(pos.input_op().tile_shape())
    if pos.input_op().fmap_dim() >= 0 or pos.dim.value.data != n - 2 or red.dim.value.data != n - 1:
        return None
    if shape_of(value)[-1] != 1:
        return None
    return [o for o in found if o is not None]


def _is_sitofp(op: ThreadMapOp) -> bool:
    body = list(op.body.block.ops)
    return len(body) == 2 and body[0].name == "arith.sitofp" and is_float(op.res[0].type)


def used_only_by(ops: set[Operation], within: set[Operation]) -> bool:
    """Whether every user of `ops`' results is one of `within`."""
    return all(u.operation in within for o in ops for r in o.results for u in r.uses)


def score_lambda(
    plan: AttentionPlan, scalar: Callable[[InputOp], str], fresh: Callable[[], str]
) -> list[str]:
    """A device lambda `score(float s, int64_t key) -> float` computing the transform; a block
    plan's takes the query row's position as well, both positions as the floats the transform
    reads them as (mk::gpu::block_attention converts them once, not per score):
    `score(s, float key, float query)`."""
    position = "float" if plan.block else "int64_t"
    query = ", float query" if plan.block else ""
    head = f"const auto score = [&](float s, {position} key{query}) -> float {{"
    unused = ["(void)key;"] + (["(void)query;"] if plan.block else [])
    t = plan.transform
    if t is None:
        return [head, *unused, "return s;", "};"]
    if isinstance(t, UnaryOp):
        factor = float(t.factor.value.data) if t.factor is not None else 1.0
        return [head, *unused, f"return s * {float_literal(factor)};", "};"]
    inputs, hoisted = [], []
    for a, block_arg in zip(plan.args, t.body.block.args, strict=True):
        ctype = "float" if is_float(block_arg.type) else "int64_t"
        if a == "s":
            inputs.append(f"static_cast<{ctype}>(s)")
        elif a in ("key", "query"):
            inputs.append(f"static_cast<{ctype}>(static_cast<float>({a}))")  # a no-op on floats
        else:
            assert isinstance(a, InputOp)
            value = f"static_cast<{ctype}>({scalar(a)})"
            if plan.block:  # read once before the block's scores, not at each of them
                name = fresh()
                hoisted.append(f"const {ctype} {name} = {value};")
                value = name
            inputs.append(value)
    lines, (y,) = scalar_body(t.body.block, inputs, fresh)
    unused = [f"(void){a};" for a in ("key", "query") if a not in plan.args]
    if not plan.block:
        unused = [u for u in unused if u != "(void)query;"]
    return [
        *hoisted,
        head,
        *unused,
        *lines,
        f"return static_cast<float>({y});",
        "};",
    ]
