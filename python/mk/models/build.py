"""The decode-step and prompt-prefill nn programs of a decoder model, as deterministic, readable
MLIR text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mk.models.config import ModelConfig

# Element types chosen in one place. nn.linear and nn.rope take (and return) one element type
# for all operands, so the logits and the RoPE tables are bf16 like the activations (Hugging
# Face also casts cos/sin to the activation dtype); switch these if the ops grow mixed types.
ACT = "bf16"
LOGITS = "bf16"
ROPE_TABLE = "bf16"
INDEX = "i32"
ENTRY = "decode"
PREFILL_ENTRY = "prefill"


@dataclass(frozen=True)
class Arg:
    """One argument of the decode program."""

    name: str  # SSA name, without '%'
    shape: tuple[int, ...]
    dtype: str  # "bf16" | "i32" (MLIR spelling)
    # "tokens" | "pos" | "cos" | "sin" | "weight" | "k_cache" | "v_cache", and for the prefill
    # program "prompt" | "positions"
    role: str
    weight: str | None = None  # the Hugging Face parameter name of a weight
    donated: bool = False
    layer: int | None = None


def _weight(name: str, shape: tuple[int, ...], hf: str, layer: int | None = None) -> Arg:
    return Arg(name, shape, ACT, "weight", hf, layer=layer)


def arguments(config: ModelConfig, batch: int, context: int) -> list[Arg]:
    """The decode program's arguments in order (program_inputs and the builder both use this)."""
    c, b, h, d = config, batch, config.hidden, config.head_dim
    args = [
        Arg("tokens", (context, b), INDEX, "tokens", donated=True),
        Arg("pos", (1,), INDEX, "pos"),
        _weight("embed", (c.vocab, h), "model.embed_tokens.weight"),
        Arg("cos", (context, d // 2), ROPE_TABLE, "cos"),
        Arg("sin", (context, d // 2), ROPE_TABLE, "sin"),
    ]
    for layer in range(c.layers):
        p, hf = f"l{layer}_", f"model.layers.{layer}."
        args += [
            _weight(p + "attn_norm", (h,), hf + "input_layernorm.weight", layer),
            _weight(p + "wq", (c.q_dim, h), hf + "self_attn.q_proj.weight", layer),
            _weight(p + "wk", (c.kv_dim, h), hf + "self_attn.k_proj.weight", layer),
            _weight(p + "wv", (c.kv_dim, h), hf + "self_attn.v_proj.weight", layer),
        ]
        if c.qk_norm:
            args += [
                _weight(p + "q_norm", (d,), hf + "self_attn.q_norm.weight", layer),
                _weight(p + "k_norm", (d,), hf + "self_attn.k_norm.weight", layer),
            ]
        args += [
            _weight(p + "wo", (h, c.q_dim), hf + "self_attn.o_proj.weight", layer),
            _weight(p + "mlp_norm", (h,), hf + "post_attention_layernorm.weight", layer),
            _weight(p + "w_gate", (c.intermediate, h), hf + "mlp.gate_proj.weight", layer),
            _weight(p + "w_up", (c.intermediate, h), hf + "mlp.up_proj.weight", layer),
            _weight(p + "w_down", (h, c.intermediate), hf + "mlp.down_proj.weight", layer),
        ]
    args.append(_weight("final_norm", (h,), "model.norm.weight"))
    if not c.tied_embeddings:
        args.append(_weight("lm_head", (c.vocab, h), "lm_head.weight"))
    cache = (b, c.kv_heads, context, d)
    for layer in range(c.layers):
        args.append(Arg(f"l{layer}_k_cache", cache, ACT, "k_cache", donated=True, layer=layer))
        args.append(Arg(f"l{layer}_v_cache", cache, ACT, "v_cache", donated=True, layer=layer))
    return args


def prefill_arguments(config: ModelConfig, batch: int, length: int, context: int) -> list[Arg]:
    """The prefill program's arguments: the `length` prompt tokens of each sequence and their
    positions, then the decode program's weights, RoPE tables and K/V caches."""
    decode = arguments(config, batch, context)
    return [
        Arg("prompt", (batch, length), INDEX, "prompt"),
        Arg("positions", (length,), INDEX, "positions"),
        *(a for a in decode if a.role not in ("tokens", "pos")),
    ]


def tensor(shape: Sequence[int], dtype: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{dtype}>"


def float_attr(value: float) -> str:
    """An MLIR float literal (always with a '.', which MLIR's grammar requires) typed f32."""
    text = repr(float(value))
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}{'e' + exponent if exponent else ''} : f32"


def int_attr(value: int) -> str:
    return f"{value} : i64"


class _Body:
    """Collects `%name = nn.op ...` lines, remembering every value's type."""

    def __init__(self, args: Sequence[Arg]) -> None:
        self.types = {a.name: tensor(a.shape, a.dtype) for a in args}
        self.lines: list[str] = []

    def op(
        self,
        name: str,
        op: str,
        operands: Sequence[str],
        shape: Sequence[int],
        dtype: str = ACT,
        **attrs: str,
    ) -> str:
        if name in self.types:
            raise AssertionError(f"SSA name %{name} defined twice")
        result = tensor(shape, dtype)
        attr_text = ", ".join(f"{k} = {v}" for k, v in attrs.items())
        self.lines.append(
            f"  %{name} = nn.{op} {', '.join('%' + o for o in operands)}"
            f"{' {' + attr_text + '}' if attrs else ''}"
            f" : ({', '.join(self.types[o] for o in operands)}) -> {result}"
        )
        self.types[name] = result
        return name


def _attend(
    f: _Body,
    c: ModelConfig,
    n: str,
    qkv: tuple[str, str, str],
    rope: tuple[str, str],
    at: tuple[str, str],
    context: int,
    causal: bool,
) -> str:
    """Layer `n`'s attention on its [b, heads, s, d] q, k and v: QK-norm (Qwen3), RoPE with the
    (cos, sin) rows, the K/V rows written into the caches at `at`'s position, and GQA attention
    over the caches' first `at`'s kv_len positions."""
    q, k, val = qkv
    b, _, s, d = _shape(f.types[q])
    eps = {"epsilon": float_attr(c.rms_eps)}
    if c.qk_norm:
        q = f.op(n + "qn", "rms_norm", [q, n + "q_norm"], [b, c.heads, s, d], **eps)
        k = f.op(n + "kn", "rms_norm", [k, n + "k_norm"], [b, c.kv_heads, s, d], **eps)
    q = f.op(n + "qr", "rope", [q, *rope], [b, c.heads, s, d])
    k = f.op(n + "kr", "rope", [k, *rope], [b, c.kv_heads, s, d])
    cache = (b, c.kv_heads, context, d)
    kc = f.op(n + "kc", "cache_write", [n + "k_cache", k, at[0]], cache, dim=int_attr(2))
    vc = f.op(n + "vc", "cache_write", [n + "v_cache", val, at[0]], cache, dim=int_attr(2))
    return f.op(
        n + "att",
        "attention",
        [q, kc, vc, at[1]],
        [b, c.heads, s, d],
        scale=float_attr(1.0 / math.sqrt(d)),
        causal="true" if causal else "false",
    )


def _mlp(f: _Body, c: ModelConfig, n: str, x: str, rows: int) -> str:
    """x + layer `n`'s gated SiLU MLP of rms_norm(x), on `rows` rows."""
    eps = {"epsilon": float_attr(c.rms_eps)}
    h, i = c.hidden, c.intermediate
    h2 = f.op(n + "h2", "rms_norm", [x, n + "mlp_norm"], [rows, h], **eps)
    g = f.op(n + "g", "linear", [h2, n + "w_gate"], [rows, i])
    u = f.op(n + "u", "linear", [h2, n + "w_up"], [rows, i])
    g = f.op(n + "gs", "silu", [g], [rows, i])
    m = f.op(n + "m", "mul", [g, u], [rows, i])
    dn = f.op(n + "d", "linear", [m, n + "w_down"], [rows, h])
    return f.op(n + "y", "add", [x, dn], [rows, h])


def _shape(type_text: str) -> list[int]:
    """The dims of a `tensor<AxBx..xT>` type."""
    return [int(v) for v in type_text[len("tensor<") :].split("x")[:-1]]


def decode_program(config: ModelConfig, batch: int, context: int, steps: int = 1) -> str:
    """One greedy decode step of `config`, run `steps` times per call (nn.steps) when steps > 1.

    Step t reads the token at position p = pos + t from the donated token history, writes its
    K/V at p in the donated caches, attends over positions 0..p, and writes the argmax of the
    logits at p + 1. Returns (token history, logits of the last step).
    """
    if batch <= 0 or context <= 1 or steps <= 0:
        raise ValueError(
            f"batch and steps must be positive and context at least 2, "
            f"got batch {batch}, context {context}, steps {steps}"
        )
    if steps >= context:
        raise ValueError(f"{steps} steps do not fit a context of {context} positions")
    c, b, d = config, batch, config.head_dim
    hq, hkv, h, v = c.heads, c.kv_heads, c.hidden, c.vocab
    args = arguments(c, b, context)
    f = _Body(args)
    eps = {"epsilon": float_attr(c.rms_eps)}

    p = f.op("p", "step", ["pos"], [1], INDEX, offset=int_attr(0))
    p1 = f.op("p1", "step", ["pos"], [1], INDEX, offset=int_attr(1))
    kv_len = f.op("kv_len", "step", ["pos"], [b], INDEX, offset=int_attr(1))
    tok = f.op("tok", "embedding", ["tokens", p], [1, b], INDEX)
    x = f.op("x_embed", "embedding", ["embed", tok], [1, b, h])
    x = f.op("x", "reshape", [x], [b, h])
    cos = f.op("cos_t", "embedding", ["cos", p], [1, d // 2], ROPE_TABLE)
    sin = f.op("sin_t", "embedding", ["sin", p], [1, d // 2], ROPE_TABLE)

    for layer in range(c.layers):
        n = f"l{layer}_"
        hn = f.op(n + "h", "rms_norm", [x, n + "attn_norm"], [b, h], **eps)
        q = f.op(n + "q", "linear", [hn, n + "wq"], [b, hq * d])
        k = f.op(n + "k", "linear", [hn, n + "wk"], [b, hkv * d])
        val = f.op(n + "v", "linear", [hn, n + "wv"], [b, hkv * d])
        q = f.op(n + "q4", "reshape", [q], [b, hq, 1, d])
        k = f.op(n + "k4", "reshape", [k], [b, hkv, 1, d])
        val = f.op(n + "v4", "reshape", [val], [b, hkv, 1, d])
        a = _attend(f, c, n, (q, k, val), (cos, sin), (p, kv_len), context, causal=False)
        a = f.op(n + "att2", "reshape", [a], [b, hq * d])
        o = f.op(n + "o", "linear", [a, n + "wo"], [b, h])
        x = _mlp(f, c, n, f.op(n + "r", "add", [x, o], [b, h]), b)

    xn = f.op("xn", "rms_norm", [x, "final_norm"], [b, h], **eps)
    head = "embed" if c.tied_embeddings else "lm_head"
    logits = f.op("logits", "linear", [xn, head], [b, v], LOGITS)
    nxt = f.op("next", "argmax", [logits], [b], INDEX, dim=int_attr(-1))
    nxt = f.op("next2", "reshape", [nxt], [1, b], INDEX)
    tokens2 = f.op(
        "tokens2", "cache_write", ["tokens", nxt, p1], [context, b], INDEX, dim=int_attr(0)
    )

    params = ", ".join(
        f"%{a.name}: {tensor(a.shape, a.dtype)}{' {nn.donated}' if a.donated else ''}" for a in args
    )
    results = [f.types[tokens2], f.types[logits]]
    attributes = f" attributes {{nn.steps = {int_attr(steps)}}}" if steps > 1 else ""
    head_line = (
        f"// {c.name}: greedy decode, batch {b}, context {context}, {steps} step(s) per call.\n"
        f"func.func @{ENTRY}({params}) -> ({', '.join(results)}){attributes} {{"
    )
    ret = f"  func.return %{tokens2}, %{logits} : {', '.join(results)}"
    return "\n".join([head_line, *f.lines, ret, "}"]) + "\n"


def prefill_program(config: ModelConfig, batch: int, length: int, context: int) -> str:
    """The K/V caches of `length` prompt tokens a sequence, at `positions` (consecutive: the
    first is where the writes start, the caches holding the positions before it): every layer
    runs on all of them at once, its attention causal over the caches. Returns the final norm of
    the last position's hidden state [batch, hidden]; the caches are written in place."""
    if batch <= 0 or length <= 0 or length >= context:
        raise ValueError(
            f"batch and length must be positive and length below the context, "
            f"got batch {batch}, length {length}, context {context}"
        )
    c, b, s, d = config, batch, length, config.head_dim
    hq, hkv, h = c.heads, c.kv_heads, c.hidden
    args = prefill_arguments(c, b, s, context)
    f = _Body(args)
    eps = {"epsilon": float_attr(c.rms_eps)}
    first = f.op(
        "first", "slice", ["positions"], [1], INDEX, offsets="array<i64: 0>", sizes="array<i64: 1>"
    )
    last = f.op(
        "last",
        "slice",
        ["positions"],
        [1],
        INDEX,
        offsets=f"array<i64: {s - 1}>",
        sizes="array<i64: 1>",
    )
    kv_len = f.op("kv_len", "step", [last], [b], INDEX, offset=int_attr(1))
    # The prompt's ids as one row, so that the embedding's rows are the layers' [b·s, h] as they
    # are (reshaping the rows instead costs a copy of them on the GPU).
    ids = f.op("ids", "reshape", ["prompt"], [b * s], INDEX)
    x = f.op("x_embed", "embedding", ["embed", ids], [b * s, h])
    cos = f.op("cos_t", "embedding", ["cos", "positions"], [s, d // 2], ROPE_TABLE)
    sin = f.op("sin_t", "embedding", ["sin", "positions"], [s, d // 2], ROPE_TABLE)

    def heads(name: str, value: str, n: int) -> str:
        """[b·s, n·d] rows as [b, n, s, d] heads."""
        value = f.op(name + "4", "reshape", [value], [b, s, n, d])
        return f.op(name + "t", "transpose", [value], [b, n, s, d], perm="array<i64: 0, 2, 1, 3>")

    for layer in range(c.layers):
        n = f"l{layer}_"
        hn = f.op(n + "h", "rms_norm", [x, n + "attn_norm"], [b * s, h], **eps)
        q = heads(n + "q", f.op(n + "q", "linear", [hn, n + "wq"], [b * s, hq * d]), hq)
        k = heads(n + "k", f.op(n + "k", "linear", [hn, n + "wk"], [b * s, hkv * d]), hkv)
        val = heads(n + "v", f.op(n + "v", "linear", [hn, n + "wv"], [b * s, hkv * d]), hkv)
        a = _attend(f, c, n, (q, k, val), (cos, sin), (first, kv_len), context, causal=True)
        a = f.op(n + "att_t", "transpose", [a], [b, s, hq, d], perm="array<i64: 0, 2, 1, 3>")
        a = f.op(n + "att2", "reshape", [a], [b * s, hq * d])
        o = f.op(n + "o", "linear", [a, n + "wo"], [b * s, h])
        x = _mlp(f, c, n, f.op(n + "r", "add", [x, o], [b * s, h]), b * s)

    if b == 1:  # the last row as it is
        x = f.op(
            "x_last",
            "slice",
            [x],
            [1, h],
            offsets=f"array<i64: {s - 1}, 0>",
            sizes=f"array<i64: 1, {h}>",
        )
    else:
        x = f.op("x_rows", "reshape", [x], [b, s, h])
        x = f.op(
            "x_last",
            "slice",
            [x],
            [b, 1, h],
            offsets=f"array<i64: 0, {s - 1}, 0>",
            sizes=f"array<i64: {b}, 1, {h}>",
        )
        x = f.op("x_last2", "reshape", [x], [b, h])
    xn = f.op("xn", "rms_norm", [x, "final_norm"], [b, h], **eps)
    params = ", ".join(
        f"%{a.name}: {tensor(a.shape, a.dtype)}{' {nn.donated}' if a.donated else ''}" for a in args
    )
    head_line = (
        f"// {c.name}: prefill of {s} prompt tokens, batch {b}, context {context}.\n"
        f"func.func @{PREFILL_ENTRY}({params}) -> {f.types[xn]} {{"
    )
    ret = f"  func.return %{xn} : {f.types[xn]}"
    return "\n".join([head_line, *f.lines, ret, "}"]) + "\n"
