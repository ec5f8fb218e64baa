"""The nn dialect: mk's user-facing tensor program language (ops on static ranked tensors).

Every op prints as `%y = nn.op %a, %b {attrs} : (types) -> type`; see DESIGN.md for the
semantics. Shape rules and the op base classes live in `nn_base`, the layout ops in `nn_layout`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from xdsl.dialects.builtin import TensorType, i32
from xdsl.ir import Attribute, Dialect, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, opt_operand_def
from xdsl.utils.exceptions import VerifyException

from .nn_base import (
    ANY_TYPES,
    INDEX_TYPES,
    AttrValue,
    BinaryOp,
    NNOp,
    Operand,
    ReduceOp,
    Shape,
    UnaryOp,
    as_int,
    bool_attr,
    bool_prop,
    broadcast_shapes,
    element_type,
    f32_attr,
    f32_prop,
    fmt_dims,
    fmt_shape,
    i64_attr,
    i64_prop,
    normalize_dim,
    require_rank,
    require_rank_at_least,
    require_static,
    static_tensors,
    tensor_constr,
)
from .nn_base import DATA_TYPES as DATA_TYPES  # re-exported
from .nn_base import attribute_values as attribute_values  # re-exported
from .nn_layout import ConcatOp, ReshapeOp, SliceOp, TransposeOp

# ----------------------------------------------------------------------------- elementwise


@irdl_op_definition
class ExpOp(UnaryOp):
    """`nn.exp`: e^x."""

    name = "nn.exp"


@irdl_op_definition
class SqrtOp(UnaryOp):
    """`nn.sqrt`: √x."""

    name = "nn.sqrt"


@irdl_op_definition
class RsqrtOp(UnaryOp):
    """`nn.rsqrt`: 1/√x."""

    name = "nn.rsqrt"


@irdl_op_definition
class SquareOp(UnaryOp):
    """`nn.square`: x²."""

    name = "nn.square"


@irdl_op_definition
class NegOp(UnaryOp):
    """`nn.neg`: −x."""

    name = "nn.neg"


@irdl_op_definition
class ReluOp(UnaryOp):
    """`nn.relu`: max(x, 0)."""

    name = "nn.relu"


@irdl_op_definition
class SigmoidOp(UnaryOp):
    """`nn.sigmoid`: 1/(1+e^−x)."""

    name = "nn.sigmoid"


@irdl_op_definition
class SiluOp(UnaryOp):
    """`nn.silu`: x·sigmoid(x)."""

    name = "nn.silu"


@irdl_op_definition
class GeluOp(UnaryOp):
    """`nn.gelu`: exact erf form, x·(1+erf(x/√2))/2."""

    name = "nn.gelu"


@irdl_op_definition
class ScaleOp(UnaryOp):
    """`nn.scale {factor : f32}`: x·factor."""

    name = "nn.scale"
    factor = f32_prop("factor")

    def __init__(self, x: Operand, factor: float) -> None:
        self._create([x], {"factor": f32_attr(factor)})


@irdl_op_definition
class AddOp(BinaryOp):
    """`nn.add`: a + b (broadcast)."""

    name = "nn.add"


@irdl_op_definition
class SubOp(BinaryOp):
    """`nn.sub`: a − b (broadcast)."""

    name = "nn.sub"


@irdl_op_definition
class MulOp(BinaryOp):
    """`nn.mul`: a·b (broadcast)."""

    name = "nn.mul"


@irdl_op_definition
class DivOp(BinaryOp):
    """`nn.div`: a / b (broadcast)."""

    name = "nn.div"


@irdl_op_definition
class MaximumOp(BinaryOp):
    """`nn.maximum`: max(a, b) (broadcast)."""

    name = "nn.maximum"


# ----------------------------------------------------------------------------- reductions


@irdl_op_definition
class ReduceSumOp(ReduceOp):
    """`nn.reduce_sum {dim, keepdim}`."""

    name = "nn.reduce_sum"


@irdl_op_definition
class ReduceMaxOp(ReduceOp):
    """`nn.reduce_max {dim, keepdim}`."""

    name = "nn.reduce_max"


@irdl_op_definition
class ReduceMeanOp(ReduceOp):
    """`nn.reduce_mean {dim, keepdim}`."""

    name = "nn.reduce_mean"


@irdl_op_definition
class SoftmaxOp(NNOp):
    """`nn.softmax {dim = -1}`: numerically stable softmax along `dim`."""

    name = "nn.softmax"
    x = operand_def(tensor_constr("x"))
    dim = i64_prop("dim", -1)

    def __init__(self, x: Operand, dim: int = -1) -> None:
        self._create([x], {"dim": i64_attr(dim)})

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        (x,) = types
        element_type([("x", x)])
        normalize_dim(as_int(attrs["dim"]), x.get_num_dims())
        return x


@irdl_op_definition
class ArgmaxOp(NNOp):
    """`nn.argmax {dim = -1}`: first index of the maximum, as i32, `dim` removed."""

    name = "nn.argmax"
    x = operand_def(tensor_constr("x"))
    dim = i64_prop("dim", -1)

    def __init__(self, x: Operand, dim: int = -1) -> None:
        self._create([x], {"dim": i64_attr(dim)})

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        (x,) = types
        element_type([("x", x)])
        dim = normalize_dim(as_int(attrs["dim"]), x.get_num_dims())
        shape = list(x.get_shape())
        del shape[dim]
        return TensorType(i32, shape)


# ----------------------------------------------------------------------------- contractions


@irdl_op_definition
class MatmulOp(NNOp):
    """`nn.matmul`: a[..., M, K] @ b[..., K, N] -> [..., M, N], batch dims broadcast."""

    name = "nn.matmul"
    a = operand_def(tensor_constr("a"))
    b = operand_def(tensor_constr("b"))

    def __init__(self, a: Operand, b: Operand) -> None:
        self._create([a, b])

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        a, b = types
        dtype = element_type([("a", a), ("b", b)])
        require_rank_at_least("a", a, 2)
        require_rank_at_least("b", b, 2)
        sa, sb = a.get_shape(), b.get_shape()
        if sa[-1] != sb[-2]:
            raise VerifyException(
                f"inner dimensions differ: a is {fmt_dims(a)}, b is {fmt_dims(b)}"
            )
        batch = broadcast_shapes(sa[:-2], sb[:-2])
        if batch is None:
            raise VerifyException(
                f"batch dimensions do not broadcast: a is {fmt_dims(a)}, b is {fmt_dims(b)}"
            )
        return TensorType(dtype, (*batch, sa[-2], sb[-1]))


@irdl_op_definition
class LinearOp(NNOp):
    """`nn.linear`: x[..., K] @ w[N, K]ᵀ -> [..., N] (PyTorch weight layout)."""

    name = "nn.linear"
    x = operand_def(tensor_constr("x"))
    w = operand_def(tensor_constr("w"))

    def __init__(self, x: Operand, w: Operand) -> None:
        self._create([x, w])

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        x, w = types
        dtype = element_type([("x", x), ("w", w)])
        require_rank_at_least("x", x, 1)
        require_rank("w", w, 2, "[N, K]")
        sx, sw = x.get_shape(), w.get_shape()
        if sx[-1] != sw[1]:
            raise VerifyException(
                f"inner dimensions differ: x is {fmt_dims(x)}, w is {fmt_dims(w)} (w is [N, K])"
            )
        return TensorType(dtype, (*sx[:-1], sw[0]))


@irdl_op_definition
class AttentionOp(NNOp):
    """`nn.attention {scale, causal = false}`: softmax(q·kᵀ·scale)·v, grouped-query.

    q[B, Hq, Sq, D], k and v [B, Hkv, S, D], optional kv_len[B] i32 -> [B, Hq, Sq, D].
    """

    name = "nn.attention"
    q = operand_def(tensor_constr("q"))
    k = operand_def(tensor_constr("k"))
    v = operand_def(tensor_constr("v"))
    kv_len = opt_operand_def(tensor_constr("kv_len"))
    scale = f32_prop("scale")
    causal = bool_prop("causal")

    def __init__(
        self,
        q: Operand,
        k: Operand,
        v: Operand,
        kv_len: Operand | None = None,
        *,
        scale: float | None = None,
        causal: bool = False,
    ) -> None:
        if scale is None:
            scale = _default_scale(SSAValue.get(q).type)
        self._create([q, k, v, kv_len], {"scale": f32_attr(scale), "causal": bool_attr(causal)})

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        q, k, v = types[:3]
        element_type([("q", q), ("k", k), ("v", v)])
        require_rank("q", q, 4, "[B, Hq, Sq, D]")
        require_rank("k", k, 4, "[B, Hkv, S, D]")
        require_rank("v", v, 4, "[B, Hkv, S, D]")
        if k.get_shape() != v.get_shape():
            raise VerifyException(f"k and v shapes differ: k is {fmt_dims(k)}, v is {fmt_dims(v)}")
        (b, hq, sq, d), (bk, hkv, s, dk) = q.get_shape(), k.get_shape()
        if b != bk:
            raise VerifyException(f"batch sizes differ: q is {fmt_dims(q)}, k is {fmt_dims(k)}")
        if d != dk:
            raise VerifyException(f"head dims differ: q is {fmt_dims(q)}, k is {fmt_dims(k)}")
        if hkv == 0 or hq % hkv:
            raise VerifyException(
                f"query heads Hq = {hq} must be a multiple of key/value heads Hkv = {hkv}"
            )
        if attrs["causal"] and sq > s:
            raise VerifyException(f"causal attention needs Sq <= S, got Sq = {sq}, S = {s}")
        if len(types) == 4 and types[3] != TensorType(i32, [b]):
            raise VerifyException(f"kv_len must be tensor<{b}xi32> ([B] i32), got {types[3]}")
        return q


def _default_scale(q_type: Attribute) -> float:
    """1/√D, the usual attention scale; 1.0 when q is malformed (the verifier then says why)."""
    if isinstance(q_type, TensorType) and q_type.get_num_dims() and q_type.get_shape()[-1] > 0:
        return 1.0 / math.sqrt(q_type.get_shape()[-1])
    return 1.0


# ----------------------------------------------------------------------------- normalization


@irdl_op_definition
class RMSNormOp(NNOp):
    """`nn.rms_norm {epsilon = 1e-6}`: x / sqrt(mean(x², -1) + ε) · w, w[H] for x[..., H]."""

    name = "nn.rms_norm"
    x = operand_def(tensor_constr("x"))
    w = operand_def(tensor_constr("w"))
    epsilon = f32_prop("epsilon", 1e-6)

    def __init__(self, x: Operand, w: Operand, epsilon: float = 1e-6) -> None:
        self._create([x, w], {"epsilon": f32_attr(epsilon)})

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        x, w = types
        element_type([("x", x), ("w", w)])
        require_rank_at_least("x", x, 1)
        hidden = x.get_shape()[-1]
        if w.get_shape() != (hidden,):
            raise VerifyException(
                f"w must be [{hidden}] to match the last dim of x ({fmt_dims(x)}), got {fmt_dims(w)}"
            )
        epsilon = attrs["epsilon"]
        if not isinstance(epsilon, float) or epsilon < 0:
            raise VerifyException(f"epsilon must be >= 0, got {epsilon}")
        return x


@irdl_op_definition
class RopeOp(NNOp):
    """`nn.rope`: half-split rotation of x[..., D] by cos, sin [..., D/2]."""

    name = "nn.rope"
    x = operand_def(tensor_constr("x"))
    cos = operand_def(tensor_constr("cos"))
    sin = operand_def(tensor_constr("sin"))

    def __init__(self, x: Operand, cos: Operand, sin: Operand) -> None:
        self._create([x, cos, sin])

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        x, cos, sin = types
        element_type([("x", x)])
        element_type([("cos", cos), ("sin", sin)])  # tables may be kept at higher precision
        require_rank_at_least("x", x, 1)
        sx = x.get_shape()
        if sx[-1] % 2:
            raise VerifyException(f"last dim of x must be even, got {fmt_dims(x)}")
        for name, t in (("cos", cos), ("sin", sin)):
            _check_rope_table(name, t, sx)
        return x


def _check_rope_table(name: str, t: TensorType, x_shape: Shape) -> None:
    """cos/sin must be [..., D/2] with leading dims broadcastable to x's leading dims."""
    require_rank_at_least(name, t, 1)
    shape, half = t.get_shape(), x_shape[-1] // 2
    if shape[-1] != half:
        raise VerifyException(
            f"{name} must end in {half} (half of x's last dim), got {fmt_shape(shape)}"
        )
    lead, x_lead = shape[:-1], x_shape[:-1]
    if len(lead) > len(x_lead) or broadcast_shapes(lead, x_lead) != x_lead:
        raise VerifyException(
            f"{name} leading dims {fmt_shape(lead)} do not broadcast to x's {fmt_shape(x_lead)}"
        )


@irdl_op_definition
class EmbeddingOp(NNOp):
    """`nn.embedding`: rows of table[V, H] gathered by integer ids[...] -> [..., H]."""

    name = "nn.embedding"
    table = operand_def(tensor_constr("table"))
    ids = operand_def(tensor_constr("ids"))

    def __init__(self, table: Operand, ids: Operand) -> None:
        self._create([table, ids])

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        table, ids = types
        dtype = element_type([("table", table)], ANY_TYPES)
        element_type([("ids", ids)], INDEX_TYPES)
        require_rank("table", table, 2, "[V, H]")
        return TensorType(dtype, (*ids.get_shape(), table.get_shape()[1]))


# ----------------------------------------------------------------------------- decode loop


@irdl_op_definition
class StepOp(NNOp):
    """`nn.step {offset = 0}`: base + offset + t, t the decode-loop step, broadcast to the result.

    t counts the runs of the function body inside one call (`nn.steps`); it is 0 without one.
    """

    name = "nn.step"
    base = operand_def(tensor_constr("base"))
    offset = i64_prop("offset", 0)

    def __init__(self, base: Operand, shape: Sequence[int] | None = None, offset: int = 0) -> None:
        value = SSAValue.get(base)
        (bt,) = static_tensors(type(self), [value.type])
        result = TensorType(bt.element_type, bt.get_shape() if shape is None else shape)
        super().__init__(
            operands=[value], result_types=[result], properties={"offset": i64_attr(offset)}
        )
        check_step(bt, result)

    def verify_(self) -> None:
        (base,) = static_tensors(type(self), self.operand_types)
        check_step(base, self.result.type)


def check_step(base: TensorType, result: Attribute) -> None:
    """An integer base whose shape broadcasts to the result's, of the same element type."""
    element_type([("base", base)], INDEX_TYPES)
    if not isinstance(result, TensorType):
        raise VerifyException(f"result must be a ranked tensor, got {result}")
    require_static("result", result)
    if result.element_type != base.element_type:
        raise VerifyException(
            f"result element type is {result.element_type}, expected {base.element_type}"
        )
    shape = tuple(result.get_shape())
    if broadcast_shapes(base.get_shape(), shape) != shape:
        raise VerifyException(
            f"base {fmt_dims(base)} does not broadcast to the result {fmt_dims(result)}"
        )


@irdl_op_definition
class CacheWriteOp(NNOp):
    """`nn.cache_write {dim}`: cache with `new` written at positions index.. along `dim`.

    cache[..., C, ...], new[..., n, ...] (cache's shape but n <= C along dim), index [1] or
    [cache.shape[0]] (one position per leading row, dim > 0) int -> cache's type. On a donated
    argument (`{nn.donated}`) the write happens in place.
    """

    name = "nn.cache_write"
    cache = operand_def(tensor_constr("cache"))
    new = operand_def(tensor_constr("new"))
    index = operand_def(tensor_constr("index"))
    dim = i64_prop("dim")

    def __init__(self, cache: Operand, new: Operand, index: Operand, dim: int) -> None:
        self._create([cache, new, index], {"dim": i64_attr(dim)})

    @classmethod
    def _infer(cls, types: list[TensorType], attrs: Mapping[str, AttrValue]) -> TensorType:
        cache, new, index = types
        element_type([("cache", cache)], ANY_TYPES)
        element_type([("index", index)], INDEX_TYPES)
        if new.element_type != cache.element_type:
            raise VerifyException(
                f"new has element type {new.element_type}, cache has {cache.element_type}"
            )
        rank = cache.get_num_dims()
        dim = normalize_dim(as_int(attrs["dim"]), rank)
        require_rank("new", new, rank, "cache's rank")
        c, n = cache.get_shape(), new.get_shape()
        for d in range(rank):
            if (d == dim and n[d] > c[d]) or (d != dim and n[d] != c[d]):
                raise VerifyException(
                    f"new {fmt_dims(new)} does not fit cache {fmt_dims(cache)} along dim {dim}"
                )
        rows = (1, c[0]) if dim > 0 else (1,)
        if index.get_num_dims() != 1 or index.get_shape()[0] not in rows:
            allowed = " or ".join(f"[{r}]" for r in dict.fromkeys(rows))
            raise VerifyException(f"index must have shape {allowed}, got {list(index.get_shape())}")
        return cache


# ----------------------------------------------------------------------------- dialect

UNARY_OPS = (ExpOp, SqrtOp, RsqrtOp, SquareOp, NegOp, ReluOp, SigmoidOp, SiluOp, GeluOp, ScaleOp)
BINARY_OPS = (AddOp, SubOp, MulOp, DivOp, MaximumOp)
REDUCE_OPS = (ReduceSumOp, ReduceMaxOp, ReduceMeanOp)
LAYOUT_OPS = (ReshapeOp, TransposeOp, ConcatOp, SliceOp)
ALL_OPS: tuple[type[NNOp], ...] = (
    MatmulOp,
    LinearOp,
    *UNARY_OPS,
    *BINARY_OPS,
    *REDUCE_OPS,
    SoftmaxOp,
    RMSNormOp,
    RopeOp,
    EmbeddingOp,
    ArgmaxOp,
    *LAYOUT_OPS,
    AttentionOp,
    StepOp,
    CacheWriteOp,
)

NN = Dialect("nn", list(ALL_OPS), [])
