"""Runs an nn program with PyTorch: the GPU reference for tests and the eager / CUDA-graph baselines.

Each op is written the way a PyTorch user would (bf16 matmuls through cuBLAS, norms and softmax in
f32), so the baselines are fair; results are cast to each op's result dtype as DESIGN.md specifies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Operation, SSAValue

from mk.dialects.nn import attribute_values
from mk.dialects.nn_decode import decode_steps, donated_args, donated_write
from mk.source import Source, entry_function, load_module

DTYPES = {
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "f32": torch.float32,
    "i32": torch.int32,
    "i64": torch.int64,
}


def torch_dtype(t: TensorType) -> torch.dtype:
    return DTYPES[str(t.element_type)]


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos.float(), sin.float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _attention(q, k, v, kv_len=None, *, scale: float, causal: bool) -> torch.Tensor:
    b, hq, sq, _ = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if kv_len is None and not causal:  # the fused kernel, reading each KV head once
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=hq != hkv)
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    keys = torch.arange(s, device=q.device)
    length = kv_len.long() if kv_len is not None else torch.full((b,), s, device=q.device)
    mask = keys[None, None, None, :] < length[:, None, None, None]
    if causal:
        pos = length[:, None] - sq + torch.arange(sq, device=q.device)[None, :]
        mask = mask & (keys[None, None, None, :] <= pos[:, None, :, None])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _cache_write(cache, new, index, *, dim: int, in_place: bool) -> torch.Tensor:
    """index_copy_ at index.. along dim (per leading row when index has one entry per row)."""
    out = cache if in_place else cache.clone()
    dim %= cache.dim()
    n = new.shape[dim]
    span = torch.arange(n, device=cache.device)
    if index.numel() == 1:
        out.index_copy_(dim, index.long().reshape(1) + span, new)
    else:
        for row in range(cache.shape[0]):
            out[row].index_copy_(dim - 1, index[row].long() + span, new[row])
    return out


def _op_fn(op: Operation, step: int, in_place: bool) -> Callable[..., torch.Tensor]:
    a = attribute_values(op)
    name = op.name.removeprefix("nn.")
    out_shape = tuple(op.results[0].type.get_shape())  # type: ignore[attr-defined]
    table: dict[str, Callable[..., torch.Tensor]] = {
        "matmul": torch.matmul, "linear": F.linear, "exp": torch.exp, "sqrt": torch.sqrt,
        "rsqrt": torch.rsqrt, "square": torch.square, "neg": torch.neg, "relu": F.relu,
        "sigmoid": torch.sigmoid, "silu": F.silu, "gelu": F.gelu,
        "scale": lambda x: x * a.get("factor", 1.0), "add": torch.add, "sub": torch.sub,
        "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
        "reduce_sum": lambda x: x.float().sum(a.get("dim", -1), keepdim=bool(a.get("keepdim"))),
        "reduce_max": lambda x: x.amax(a.get("dim", -1), keepdim=bool(a.get("keepdim"))),
        "reduce_mean": lambda x: x.float().mean(a.get("dim", -1), keepdim=bool(a.get("keepdim"))),
        "softmax": lambda x: torch.softmax(x.float(), a.get("dim", -1)),
        "rms_norm": lambda x, w: _rms_norm(x, w, a.get("epsilon", 1e-6)),
        "rope": _rope, "embedding": lambda t, ids: t[ids.long()],
        "argmax": lambda x: x.argmax(a.get("dim", -1)),
        "reshape": lambda x: x.reshape(out_shape), "transpose": lambda x: x.permute(a["perm"]),
        "concat": lambda *xs: torch.cat(xs, a["dim"]),
        "slice": lambda x: x[tuple(slice(o, o + s) for o, s in zip(a["offsets"], a["sizes"], strict=True))],
        "attention": lambda *xs: _attention(*xs, scale=a["scale"], causal=bool(a.get("causal"))),
        "step": lambda base: (base.long() + a.get("offset", 0) + step).expand(out_shape),
        "cache_write": lambda c, n, i: _cache_write(c, n, i, dim=a["dim"], in_place=in_place),
    }  # fmt: skip
    return table[name]


def torch_callable(
    source: Source, entry: str | None = None
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """A Python function running the program's entry with PyTorch ops (capturable in a CUDA graph).

    A decode function runs its body `nn.steps` times (unrolled); donated arguments are written in
    place (`index_copy_`), as the megakernel does.
    """
    module: ModuleOp = load_module(source)
    func: FuncOp = entry_function(module, entry)
    donated = {func.args[i] for i in donated_args(func)}
    bodies = []
    returned: Sequence[SSAValue] = ()
    for step in range(decode_steps(func)):
        ops: list[
            tuple[Callable[..., torch.Tensor], Sequence[SSAValue], SSAValue, torch.dtype]
        ] = []
        for op in func.body.block.ops:
            if isinstance(op, ReturnOp):
                returned = op.arguments
                continue
            result = op.results[0]
            in_place = op.name == "nn.cache_write" and op.operands[0] in donated
            fn = _op_fn(op, step, in_place)
            ops.append((fn, op.operands, result, torch_dtype(result.type)))  # type: ignore[arg-type]
        bodies.append(ops)
    args = func.body.block.args
    writes = {v: donated_write(func, i) for i, v in enumerate(args) if v in donated}

    def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env: dict[SSAValue, Any] = dict(zip(args, inputs, strict=True))
        for ops in bodies:
            for fn, operands, result, dtype in ops:
                env[result] = fn(*(env[v] for v in operands)).to(dtype)
            for arg, value in writes.items():  # already the same tensor: written in place
                env[arg] = env[value]
        return tuple(env[v] for v in returned)

    return run
