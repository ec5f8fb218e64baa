"""The nn dialect from Python: builders, round trips, attribute_values and verifier errors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from io import StringIO

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.builder import Builder
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DenseArrayBase,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    TensorType,
    bf16,
    f16,
    f32,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, SSAValue
from xdsl.printer import Printer
from xdsl.rewriter import InsertPoint
from xdsl.utils.exceptions import VerifyException

from mk.diagnostics import parse_module
from mk.dialects import make_context, nn

# ----------------------------------------------------------------------------- helpers


def T(*shape: int, dtype: Attribute = f32) -> TensorType:
    return TensorType(dtype, shape)


def values(*types: Attribute) -> tuple[SSAValue, ...]:
    """Fresh SSA values of these types (block arguments of a detached block)."""
    return tuple(Block(arg_types=types).args)


def reparse(text: str) -> ModuleOp:
    return parse_module(make_context(), text, "<t>")


def generic(module: ModuleOp) -> str:
    out = StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    return out.getvalue()


# ----------------------------------------------------------------------------- a decoder layer

B, S, H, HQ, HKV, D, FF, V, CACHE = 1, 4, 64, 4, 2, 16, 128, 100, 32


def _linear(b: Builder, x: SSAValue, w: SSAValue) -> SSAValue:
    return b.insert(nn.LinearOp(x, w)).result


def _heads(b: Builder, x: SSAValue, heads: int) -> SSAValue:
    """[S, heads*D] -> [B, heads, S, D]."""
    r = b.insert(nn.ReshapeOp(x, [B, S, heads, D])).result
    return b.insert(nn.TransposeOp(r, [0, 2, 1, 3])).result


def build_decoder(dtype: Attribute = bf16) -> tuple[ModuleOp, func.FuncOp]:
    """A one-layer decoder step built with the Python builders (GQA, rope, SwiGLU, argmax)."""
    arg_types = {
        "ids": T(S, dtype=i32),
        "table": T(V, H, dtype=dtype),
        "norm1": T(H, dtype=dtype),
        "wq": T(HQ * D, H, dtype=dtype),
        "wk": T(HKV * D, H, dtype=dtype),
        "wv": T(HKV * D, H, dtype=dtype),
        "wo": T(H, HQ * D, dtype=dtype),
        "cos": T(S, D // 2, dtype=dtype),
        "sin": T(S, D // 2, dtype=dtype),
        "k_cache": T(B, HKV, CACHE, D, dtype=dtype),
        "v_cache": T(B, HKV, CACHE, D, dtype=dtype),
        "kv_len": T(B, dtype=i32),
        "norm2": T(H, dtype=dtype),
        "w_gate": T(FF, H, dtype=dtype),
        "w_up": T(FF, H, dtype=dtype),
        "w_down": T(H, FF, dtype=dtype),
    }
    fn = func.FuncOp("decode", (list(arg_types.values()), [T(S, dtype=i32), T(S, H, dtype=dtype)]))
    for arg, name in zip(fn.args, arg_types, strict=True):
        arg.name_hint = name
    a = dict(zip(arg_types, fn.args, strict=True))
    b = Builder(InsertPoint.at_end(fn.body.block))

    x = b.insert(nn.EmbeddingOp(a["table"], a["ids"])).result
    h = b.insert(nn.RMSNormOp(x, a["norm1"], epsilon=1e-5)).result
    q = _heads(b, _linear(b, h, a["wq"]), HQ)
    k = _heads(b, _linear(b, h, a["wk"]), HKV)
    q = b.insert(nn.RopeOp(q, a["cos"], a["sin"])).result
    k = b.insert(nn.RopeOp(k, a["cos"], a["sin"])).result
    keys = b.insert(nn.ConcatOp([a["k_cache"], k], dim=2)).result
    vals = b.insert(nn.ConcatOp([a["v_cache"], _heads(b, _linear(b, h, a["wv"]), HKV)], 2)).result
    att = b.insert(nn.AttentionOp(q, keys, vals, a["kv_len"], causal=True)).result
    att = b.insert(nn.TransposeOp(att, [0, 2, 1, 3])).result
    att = b.insert(nn.ReshapeOp(att, [S, HQ * D])).result
    x = b.insert(nn.AddOp(x, _linear(b, att, a["wo"]))).result
    h = b.insert(nn.RMSNormOp(x, a["norm2"])).result
    gate = b.insert(nn.SiluOp(_linear(b, h, a["w_gate"]))).result
    up = b.insert(nn.MulOp(gate, _linear(b, h, a["w_up"]))).result
    x = b.insert(nn.AddOp(x, _linear(b, up, a["w_down"]))).result
    logits = b.insert(nn.MatmulOp(x, b.insert(nn.TransposeOp(a["table"], [1, 0])).result))
    token = b.insert(nn.ArgmaxOp(logits.result)).result
    b.insert(func.ReturnOp(token, x))
    return ModuleOp([fn]), fn


def test_decoder_builds_verifies_and_round_trips() -> None:
    module, fn = build_decoder()
    module.verify()
    text = str(module)
    assert "nn.attention %" in text and "causal = true" in text
    again = reparse(text)
    again.verify()
    assert str(again) == text
    assert again.is_structurally_equivalent(module)


def test_decoder_generic_form_round_trips() -> None:
    module, _ = build_decoder(f16)
    text = generic(module)
    assert '"nn.rms_norm"' in text and "<{epsilon = 1.000000e-06 : f32}>" in text
    assert str(reparse(text)) == str(module)


def test_builders_infer_result_types() -> None:
    _, fn = build_decoder()
    types = {op.name: op.results[0].type for op in fn.body.ops if isinstance(op, nn.NNOp)}
    assert types["nn.embedding"] == T(S, H, dtype=bf16)
    assert types["nn.attention"] == T(B, HQ, S, D, dtype=bf16)
    assert types["nn.argmax"] == T(S, dtype=i32)
    concat = next(op for op in fn.body.ops if isinstance(op, nn.ConcatOp))
    assert concat.result.type == T(B, HKV, CACHE + S, D, dtype=bf16)


# ----------------------------------------------------------------------------- builders


def test_builder_shapes_follow_the_rules() -> None:
    a, b, c, x = values(T(2, 1, 8, 16), T(3, 16, 4), T(8), T(2, 3, 8))
    assert nn.MatmulOp(a, b).result.type == T(2, 3, 8, 4)
    assert nn.MaximumOp(x, c).result.type == T(2, 3, 8)
    assert nn.ReduceMeanOp(x, dim=-2, keepdim=True).result.type == T(2, 1, 8)
    assert nn.ReduceMaxOp(x, dim=0).result.type == T(3, 8)
    assert nn.ReduceSumOp(c, dim=0).result.type == T()
    assert nn.SliceOp(x, [1, 0, 2], [1, 3, 4]).result.type == T(1, 3, 4)
    assert nn.ScaleOp(x, 0.5).result.type == x.type
    assert nn.ConcatOp([x, x, x], dim=-1).result.type == T(2, 3, 24)


def test_builders_reject_bad_inputs_early() -> None:
    a, b = values(T(8, 4096, dtype=bf16), T(4000, 6144, dtype=bf16))
    with pytest.raises(
        VerifyException, match="inner dimensions differ: a is 8x4096, b is 4000x6144"
    ):
        nn.MatmulOp(a, b)
    with pytest.raises(VerifyException, match="element counts differ"):
        nn.ReshapeOp(a, [8, 4000])
    with pytest.raises(VerifyException, match="dim 2 is out of range for rank 2"):
        nn.SoftmaxOp(a, dim=2)


def test_infer_result_type_is_usable_without_an_op() -> None:
    assert nn.LinearOp.infer_result_type([T(2, 8, 64), T(32, 64)]) == T(2, 8, 32)
    assert nn.ReduceSumOp.infer_result_type([T(4, 5)], {"dim": 1}) == T(4)
    assert nn.ArgmaxOp.infer_result_type([T(4, 5)]) == T(4, dtype=i32)
    with pytest.raises(VerifyException, match="missing attribute 'dim'"):
        nn.ReduceSumOp.infer_result_type([T(4, 5)])


def test_attention_default_scale_is_inverse_sqrt_head_dim() -> None:
    q, k = values(T(1, 8, 1, 64), T(1, 2, 16, 64))
    op = nn.AttentionOp(q, k, k)
    assert nn.attribute_values(op)["scale"] == pytest.approx(1 / math.sqrt(64))
    assert op.kv_len is None and len(op.operands) == 3


# ----------------------------------------------------------------------------- attribute_values

DEFAULTS_SRC = """
func.func @f(%x: tensor<4x8xf32>, %g: tensor<8xf32>, %q: tensor<1x2x4x8xf32>) {
  %n = nn.rms_norm %x, %g : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %r = nn.reduce_sum %x {dim = 1 : i64} : (tensor<4x8xf32>) -> tensor<4xf32>
  %s = nn.softmax %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %a = nn.argmax %x : (tensor<4x8xf32>) -> tensor<4xi32>
  %t = nn.attention %q, %q, %q {scale = 0.5 : f32} : (tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
  %p = nn.transpose %x {perm = array<i64: 1, 0>} : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %c = nn.slice %x {offsets = array<i64: 1, 2>, sizes = array<i64: 2, 3>} : (tensor<4x8xf32>) -> tensor<2x3xf32>
  %e = nn.exp %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return
}
"""


def test_attribute_values_fill_in_defaults() -> None:
    module = reparse(DEFAULTS_SRC)
    got = {op.name: nn.attribute_values(op) for op in module.walk() if isinstance(op, nn.NNOp)}
    assert got["nn.rms_norm"] == {"epsilon": pytest.approx(1e-6)}
    assert got["nn.reduce_sum"] == {"dim": 1, "keepdim": False}
    assert got["nn.softmax"] == {"dim": -1}
    assert got["nn.argmax"] == {"dim": -1}
    assert got["nn.attention"] == {"scale": 0.5, "causal": False}
    assert got["nn.transpose"] == {"perm": (1, 0)}
    assert got["nn.slice"] == {"offsets": (1, 2), "sizes": (2, 3)}
    assert got["nn.exp"] == {}


def test_attribute_values_are_plain_python() -> None:
    (x,) = values(T(4, 8))
    got = nn.attribute_values(nn.ReduceMaxOp(x, dim=-1, keepdim=True))
    assert got == {"dim": -1, "keepdim": True}
    assert type(got["keepdim"]) is bool and type(got["dim"]) is int
    perm = nn.attribute_values(nn.TransposeOp(x, [1, 0]))["perm"]
    assert type(perm) is tuple and perm == (1, 0)
    assert type(nn.attribute_values(nn.ScaleOp(x, 2.0))["factor"]) is float


def test_attribute_values_rejects_other_ops() -> None:
    with pytest.raises(TypeError, match="not an nn op"):
        nn.attribute_values(func.ReturnOp())


def test_default_property_is_omitted_in_custom_form_but_round_trips() -> None:
    module = reparse(DEFAULTS_SRC)
    text = str(module)
    assert "epsilon" not in text and "keepdim" not in text and "causal" not in text
    assert "causal = false" in generic(module)
    assert str(reparse(generic(module))) == text


# ----------------------------------------------------------------------------- verifier via .build

DATA = T(8, 16)
BAD_BUILDS: list[
    tuple[type[nn.NNOp], Sequence[Attribute], Attribute, dict[str, Attribute], str]
] = [
    (nn.ExpOp, [T(8, 16, dtype=i32)], T(8, 16, dtype=i32), {}, "x must have element type f32"),
    (nn.AddOp, [DATA, T(8, 16, dtype=f16)], DATA, {}, "element types differ: a is f32, b is f16"),
    (nn.SubOp, [DATA, T(4, 16)], DATA, {}, "operands do not broadcast: a is 8x16, b is 4x16"),
    (nn.NegOp, [DATA], T(8, 16, dtype=bf16), {}, "result element type is bf16, expected f32"),
    (nn.MatmulOp, [DATA, T(15, 4)], T(8, 4), {}, "inner dimensions differ: a is 8x16, b is 15x4"),
    (nn.MatmulOp, [DATA, T(16, 4)], T(8, 5), {}, "result shape is 8x5, expected 8x4"),
    (nn.LinearOp, [DATA, T(4, 15)], T(8, 4), {}, r"inner dimensions differ: x is 8x16, w is 4x15"),
    (
        nn.ReduceSumOp,
        [DATA],
        T(8),
        {"dim": IntegerAttr(-3, i64)},
        r"dim -3 is out of range for rank 2",
    ),
    (nn.ArgmaxOp, [DATA], T(8), {}, "result element type is f32, expected i32"),
    (nn.RMSNormOp, [DATA, T(8)], DATA, {}, r"w must be \[16\] to match the last dim of x"),
    (nn.RopeOp, [T(8, 15), T(8, 7), T(8, 7)], T(8, 15), {}, "last dim of x must be even"),
    (nn.EmbeddingOp, [T(10, 4), T(3)], T(3, 4), {}, "ids must have element type i32 or i64"),
    (nn.ReshapeOp, [DATA], T(100), {}, "element counts differ"),
    (
        nn.TransposeOp,
        [DATA],
        T(16, 8),
        {"perm": DenseArrayBase.from_list(i64, [0, 0])},
        r"perm \[0, 0\] is not a permutation of 0..1",
    ),
    (
        nn.SliceOp,
        [DATA],
        T(8, 8),
        {
            "offsets": DenseArrayBase.from_list(i64, [0, 10]),
            "sizes": DenseArrayBase.from_list(i64, [8, 8]),
        },
        r"slice \[10, 18\) of dim 1 is out of bounds",
    ),
    (
        nn.ConcatOp,
        [DATA, T(8, 4)],
        T(16, 16),
        {"dim": IntegerAttr(0, i64)},
        "dims other than 0 differ",
    ),
    (
        nn.AttentionOp,
        [T(1, 6, 2, 8), T(1, 4, 5, 8), T(1, 4, 5, 8)],
        T(1, 6, 2, 8),
        {"scale": FloatAttr(1.0, f32)},
        "query heads Hq = 6 must be a multiple of key/value heads Hkv = 4",
    ),
    (
        nn.AttentionOp,
        [T(2, 4, 2, 8), T(2, 2, 5, 8), T(2, 2, 5, 8), T(2, dtype=i64)],
        T(2, 4, 2, 8),
        {"scale": FloatAttr(1.0, f32)},
        r"kv_len must be tensor<2xi32>",
    ),
    (nn.ScaleOp, [DATA], DATA, {"factor": FloatAttr(2.0, 64)}, "attribute 'factor' must be an f32"),
    (nn.SoftmaxOp, [T(8, -1)], T(8, -1), {}, r"x has a dynamic shape 8x\?"),
    (nn.ReluOp, [T(8, 0)], T(8, 0), {}, r"x is empty \(8x0\); nn takes no zero-size dimension"),
]


@pytest.mark.parametrize(
    ("cls", "operand_types", "result_type", "props", "message"),
    BAD_BUILDS,
    ids=[f"{case[0].name}-{i}" for i, case in enumerate(BAD_BUILDS)],
)
def test_verifier_rejects_bad_ops(
    cls: type[nn.NNOp],
    operand_types: Sequence[Attribute],
    result_type: Attribute,
    props: dict[str, Attribute],
    message: str,
) -> None:
    operands: list[SSAValue | list[SSAValue]] = list(values(*operand_types))
    if cls is nn.ConcatOp:
        operands = [list(operands)]  # type: ignore[list-item]
    if cls is nn.AttentionOp and len(operands) == 3:
        operands.append([])  # the optional kv_len, absent
    op = cls.build(operands=operands, result_types=[result_type], properties=props)
    with pytest.raises(VerifyException, match=message):
        op.verify()


def test_verifier_accepts_what_builders_make() -> None:
    module, fn = build_decoder(f32)
    for op in fn.body.ops:
        op.verify()
    used = {type(op).__name__ for op in module.walk() if isinstance(op, nn.NNOp)}
    assert used == {
        "EmbeddingOp", "RMSNormOp", "LinearOp", "ReshapeOp", "TransposeOp", "RopeOp", "ConcatOp",
        "AttentionOp", "AddOp", "SiluOp", "MulOp", "MatmulOp", "ArgmaxOp",
    }  # fmt: skip


# ----------------------------------------------------------------------------- registry


def test_dialect_lists_every_op_once() -> None:
    names = [op.name for op in nn.NN.operations]
    assert len(names) == len(set(names)) == len(nn.ALL_OPS) == 32
    assert all(name.startswith("nn.") for name in names)
    assert {"nn.rms_norm", "nn.reduce_mean", "nn.attention", "nn.concat"} <= set(names)


def test_dispatch_tuples() -> None:
    assert len(nn.UNARY_OPS) == 10 and nn.ScaleOp in nn.UNARY_OPS
    assert [op.name for op in nn.BINARY_OPS] == [
        "nn.add",
        "nn.sub",
        "nn.mul",
        "nn.div",
        "nn.maximum",
    ]
    assert [op.name for op in nn.REDUCE_OPS] == ["nn.reduce_sum", "nn.reduce_max", "nn.reduce_mean"]
    assert set(nn.UNARY_OPS + nn.BINARY_OPS + nn.REDUCE_OPS) <= set(nn.ALL_OPS)


# ----------------------------------------------------------------------------- shape helpers

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=4).map(tuple)


@settings(max_examples=50, deadline=None)
@given(shapes, shapes)
def test_broadcast_shapes_matches_numpy(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    try:
        expected: tuple[int, ...] | None = tuple(np.broadcast_shapes(a, b))
    except ValueError:
        expected = None
    assert nn.broadcast_shapes(a, b) == expected


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 5), st.integers(-8, 8))
def test_normalize_dim(rank: int, dim: int) -> None:
    if -rank <= dim < rank:
        assert nn.normalize_dim(dim, rank) == list(range(rank))[dim]
    else:
        with pytest.raises(VerifyException, match=f"dim {dim} is out of range for rank {rank}"):
            nn.normalize_dim(dim, rank)
