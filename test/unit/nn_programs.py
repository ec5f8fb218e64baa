"""Hypothesis strategies for random, valid nn programs (small shapes, and decode-shaped ones),
shared by the pipeline tests."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import strategies as st
from xdsl.dialects.builtin import FunctionType, ModuleOp, TensorType, bf16, f16, f32, i32
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Attribute, Block, Region, SSAValue

from mk.dialects import nn

UNARY = (nn.NegOp, nn.ReluOp, nn.SigmoidOp, nn.SiluOp, nn.GeluOp, nn.SquareOp, nn.ExpOp)
BINARY = (nn.AddOp, nn.SubOp, nn.MulOp, nn.MaximumOp)


class ProgramBuilder:
    """Builds a random nn function op by op; new operands become function arguments."""

    def __init__(self, draw: st.DrawFn, dtype: Attribute) -> None:
        self.draw = draw
        self.dtype = dtype
        self.args: list[TensorType] = []
        self.block = Block()
        self.values: list[SSAValue] = []

    def arg(self, shape: Sequence[int], dtype: Attribute | None = None) -> SSAValue:
        ty = TensorType(dtype or self.dtype, shape)
        self.args.append(ty)
        value = self.block.insert_arg(ty, len(self.block.args))
        value.name_hint = f"a{len(self.block.args) - 1}"
        return value

    def add(self, op: nn.NNOp) -> SSAValue:
        self.block.add_op(op)
        op.result.name_hint = f"v{len(self.values)}"
        self.values.append(op.result)
        return op.result

    def pick(self, min_rank: int = 1) -> SSAValue:
        floats = [v for v in self.values if _shape(v) and len(_shape(v)) >= min_rank]
        floats = [v for v in floats if _elem(v) == self.dtype]
        if not floats:
            return self.arg(self.draw(_shapes(min_rank)))
        if self.draw(st.booleans()):
            return floats[-1]  # chains on the newest value are what fusions look for
        return self.draw(st.sampled_from(floats))

    def module(self, results: Sequence[SSAValue]) -> ModuleOp:
        self.block.add_op(ReturnOp(*results))
        ftype = FunctionType.from_lists(self.args, [v.type for v in results])
        func = FuncOp("random", ftype, Region(self.block))
        return ModuleOp([func])


def _shape(v: SSAValue) -> tuple[int, ...]:
    assert isinstance(v.type, TensorType)
    return tuple(v.type.get_shape())


def _elem(v: SSAValue) -> Attribute:
    assert isinstance(v.type, TensorType)
    return v.type.element_type


def _shapes(min_rank: int = 1) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(1, 6), min_size=min_rank, max_size=3).map(tuple)


def _step_linear(p: ProgramBuilder) -> None:
    x = p.pick()
    n = p.draw(st.integers(1, 9))
    heads = p.draw(st.integers(1, 2))
    outs = [p.add(nn.LinearOp(x, p.arg((n, _shape(x)[-1])))) for _ in range(heads)]
    if heads == 2 and p.draw(st.booleans()):
        outs = [p.add(nn.MulOp(p.add(nn.SiluOp(outs[0])), outs[1]))]
    if n % 2 == 0 and p.draw(st.booleans()):  # split heads, as before attention
        lead = _shape(outs[0])[:-1]
        p.add(nn.ReshapeOp(outs[0], (*lead, 2, 1, n // 2)))


def _step_norm_linear(p: ProgramBuilder) -> None:
    x = p.pick()
    h = p.add(nn.RMSNormOp(x, p.arg(_shape(x)[-1:]), epsilon=1e-5))
    if p.draw(st.booleans()):
        p.add(nn.LinearOp(h, p.arg((p.draw(st.integers(1, 9)), _shape(x)[-1]))))


def _step_matmul(p: ProgramBuilder) -> None:
    a = p.pick(min_rank=2)
    k = _shape(a)[-1]
    p.add(nn.MatmulOp(a, p.arg((k, p.draw(st.integers(1, 7))))))


def _step_unary(p: ProgramBuilder) -> None:
    x = p.pick()
    op = p.draw(st.sampled_from(UNARY))
    if op is nn.ExpOp:
        x = p.add(nn.SigmoidOp(x))  # keeps exp chains bounded
    p.add(op(x))
    if p.draw(st.booleans()):
        p.add(nn.ScaleOp(p.values[-1], p.draw(st.sampled_from([0.5, -2.0]))))


def _step_binary(p: ProgramBuilder) -> None:
    a = p.pick()
    shape = _shape(a)
    kind = p.draw(st.sampled_from(["same", "row", "value"]))
    if kind == "row":
        b = p.arg(shape[-1:])
    else:
        same = [v for v in p.values if _shape(v) == shape and _elem(v) == p.dtype and v is not a]
        b = p.draw(st.sampled_from(same)) if kind == "value" and same else p.arg(shape)
    p.add(p.draw(st.sampled_from(BINARY))(a, b))


def _step_reduce(p: ProgramBuilder) -> None:
    x = p.pick()
    dim = p.draw(st.integers(-len(_shape(x)), len(_shape(x)) - 1))
    if p.draw(st.integers(0, 3)) == 0:
        p.add(nn.SoftmaxOp(x, dim))
        return
    op = p.draw(st.sampled_from([nn.ReduceSumOp, nn.ReduceMaxOp, nn.ReduceMeanOp]))
    p.add(op(x, dim, p.draw(st.booleans())))


def _step_layout(p: ProgramBuilder) -> None:
    x = p.pick()
    shape = _shape(x)
    kind = p.draw(st.sampled_from(["reshape", "transpose", "slice", "concat"]))
    if kind == "reshape":
        size = math.prod(shape)
        p.add(nn.ReshapeOp(x, (size,) if len(shape) > 1 else (1, size)))
    elif kind == "transpose":
        p.add(nn.TransposeOp(x, p.draw(st.permutations(range(len(shape))))))
    elif kind == "slice":
        sizes = [p.draw(st.integers(1, s)) for s in shape]
        offsets = [p.draw(st.integers(0, s - z)) for s, z in zip(shape, sizes, strict=True)]
        p.add(nn.SliceOp(x, offsets, sizes))
    else:
        p.add(nn.ConcatOp([x, p.arg(shape)], p.draw(st.integers(0, len(shape) - 1))))


def _step_attention(p: ProgramBuilder) -> None:
    b, hkv, group = (p.draw(st.integers(1, 2)) for _ in range(3))
    sq, s, d = p.draw(st.integers(1, 2)), p.draw(st.integers(2, 9)), p.draw(st.sampled_from([2, 4]))
    causal = p.draw(st.booleans()) and sq <= s
    q = p.arg((b, hkv * group, sq, d))
    if sq == 1 and p.draw(st.booleans()):
        q = p.add(nn.ReshapeOp(p.arg((b, hkv * group * d)), (b, hkv * group, 1, d)))
    k, v = p.arg((b, hkv, s, d)), p.arg((b, hkv, s, d))
    kv_len = p.arg((b,), i32) if p.draw(st.booleans()) else None
    out = p.add(nn.AttentionOp(q, k, v, kv_len, scale=0.5, causal=causal))
    if sq == 1 and p.draw(st.booleans()):
        p.add(nn.ReshapeOp(out, (b, hkv * group * d)))


STEPS = (
    _step_linear, _step_norm_linear, _step_matmul, _step_unary, _step_binary, _step_reduce,
    _step_layout, _step_attention,
)  # fmt: skip


@st.composite
def programs(draw: st.DrawFn) -> ModuleOp:
    p = ProgramBuilder(draw, draw(st.sampled_from([f32, bf16, f16])))
    p.arg(draw(_shapes()))
    for _ in range(draw(st.integers(1, 5))):
        draw(st.sampled_from(STEPS))(p)
    if p.dtype == f32 and draw(st.booleans()):
        p.add(nn.ArgmaxOp(p.pick(), -1))
    results = [p.values[-1]] if p.values else []
    extra = [v for v in p.values[:-1] if v.uses and draw(st.booleans())]
    return p.module(results + extra[:1])


OPTIONS = st.fixed_dictionaries(
    {
        "num_sms": st.integers(1, 16),
        "tile_n": st.integers(1, 8),
        "tile_k": st.integers(1, 8),
        "kv_chunk": st.integers(1, 8),
        "kv_splits": st.integers(0, 3),
    }
)


# Decode-shaped programs: a few activation rows against weights of realistic widths, the shapes
# where the CUDA target picks among its streamed, tensor-core, split-K and split-KV paths. Their
# ops are well conditioned (no reductions into a norm, no argmax of near ties), so a different
# summation order stays within the dtype's tolerance.
ROWS = (1, 2, 3, 5, 8, 16)
WIDTHS = (16, 48, 64, 96, 130, 256, 512, 1024, 2048)


class DecodeBuilder(ProgramBuilder):
    """Picks [rows, width] values only; a new one is an argument of decode shape."""

    def pick(self, min_rank: int = 1) -> SSAValue:
        rows = [v for v in self.values if len(_shape(v)) == 2 and _elem(v) == self.dtype]
        if not rows:
            return self.arg((self.draw(st.sampled_from(ROWS)), self.draw(st.sampled_from(WIDTHS))))
        return rows[-1] if self.draw(st.booleans()) else self.draw(st.sampled_from(rows))

    def residual(self, y: SSAValue) -> None:
        """Sometimes y + a fresh [rows, n] argument, as a decoder adds its residual."""
        if self.draw(st.booleans()):
            self.add(nn.AddOp(y, self.arg(_shape(y))))


def _decode_linear(p: DecodeBuilder) -> None:
    x = p.pick()
    if p.draw(st.booleans()):
        x = p.add(nn.RMSNormOp(x, p.arg(_shape(x)[-1:]), epsilon=1e-5))
    n, k = p.draw(st.sampled_from(WIDTHS)), _shape(x)[-1]
    y = p.add(nn.LinearOp(x, p.arg((n, k))))
    if p.draw(st.booleans()):  # gate and up
        y = p.add(nn.MulOp(p.add(nn.SiluOp(y)), p.add(nn.LinearOp(x, p.arg((n, k))))))
    p.residual(y)


def _decode_attention(p: DecodeBuilder) -> None:
    b, hkv, group = (p.draw(st.sampled_from(v)) for v in ((1, 2, 3), (1, 2, 4), (1, 2, 4)))
    d, s = p.draw(st.sampled_from((64, 128))), p.draw(st.sampled_from((5, 64, 100, 257, 600)))
    q = p.add(nn.ReshapeOp(p.arg((b, hkv * group * d)), (b, hkv * group, 1, d)))
    k, v = p.arg((b, hkv, s, d)), p.arg((b, hkv, s, d))
    kv_len = p.arg((b,), i32) if p.draw(st.booleans()) else None
    out = p.add(nn.AttentionOp(q, k, v, kv_len, scale=d**-0.5, causal=False))
    out = p.add(nn.ReshapeOp(out, (b, hkv * group * d)))
    if p.draw(st.booleans()):  # the o-projection
        p.residual(
            p.add(nn.LinearOp(out, p.arg((p.draw(st.sampled_from(WIDTHS)), _shape(out)[1]))))
        )


def _decode_softmax(p: DecodeBuilder) -> None:
    p.add(nn.SoftmaxOp(p.pick(), -1))


DECODE_STEPS = (_decode_linear, _decode_attention, _decode_softmax, _step_unary, _step_binary)


@st.composite
def decode_programs(draw: st.DrawFn) -> ModuleOp:
    p = DecodeBuilder(draw, draw(st.sampled_from([f32, bf16, f16])))
    draw(st.sampled_from(DECODE_STEPS[:2]))(p)  # a linear or an attention, what decode is
    for _ in range(draw(st.integers(0, 3))):
        draw(st.sampled_from(DECODE_STEPS))(p)
    return p.module([p.values[-1]])
