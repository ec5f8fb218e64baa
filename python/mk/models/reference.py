"""Reference implementations of the decoder (NumPy, independent of the nn interpreter) and checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from mk.models.config import ModelConfig
from mk.models.weights import BF16, check_prompt, check_weights, rope_tables


@dataclass
class Generation:
    """Greedy generation: tokens [batch, steps] and the logits of every step [steps, batch, V]."""

    tokens: np.ndarray
    logits: np.ndarray


class NumpyDecoder:
    """The decoder in NumPy with a KV cache, one token per sequence per step.

    Math runs in `dtype` (float32 or float64) from the bf16 weights. With `round_bf16` every
    op's result is rounded to bf16 where a bf16 model (and an nn program) stores it: norms,
    projections, RoPE, attention, residual sums, the MLP's activations and the logits; and the
    RoPE tables are the program's. Without it, nothing is rounded (exact tables).
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, np.ndarray],
        batch: int,
        context: int,
        *,
        dtype: type[np.floating] = np.float32,
        round_bf16: bool = True,
    ) -> None:
        self.config, self.batch, self.context = config, batch, context
        self.dtype, self.round_bf16 = np.dtype(dtype), round_bf16
        self.w = {
            k: np.asarray(v).astype(self.dtype) for k, v in check_weights(config, weights).items()
        }
        shape = (batch, config.kv_heads, context, config.head_dim)
        self.k_cache = [np.zeros(shape, self.dtype) for _ in range(config.layers)]
        self.v_cache = [np.zeros(shape, self.dtype) for _ in range(config.layers)]
        # The program's tables; exact ones for the unrounded model.
        cos, sin = rope_tables(config, context, None if round_bf16 else np.dtype(np.float64))
        self.cos, self.sin = cos.astype(self.dtype), sin.astype(self.dtype)

    def _r(self, x: np.ndarray) -> np.ndarray:
        return x.astype(BF16).astype(self.dtype) if self.round_bf16 else x.astype(self.dtype)

    def _rms_norm(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return self._r(x / np.sqrt(ms + self.config.rms_eps) * g)

    def _rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self._r(np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1))

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return self._r(x @ self.w[name].T)

    def step(self, tokens: np.ndarray, pos: int) -> np.ndarray:
        """Runs the tokens [batch] at position `pos`, filling the caches there; logits [batch, V]."""
        c, b, d = self.config, self.batch, self.config.head_dim
        if not 0 <= pos < self.context:
            raise ValueError(f"position {pos} is outside the context of {self.context}")
        group = c.heads // c.kv_heads
        x = self.w["model.embed_tokens.weight"][np.asarray(tokens)]
        cos, sin = self.cos[pos], self.sin[pos]
        for layer in range(c.layers):
            p = f"model.layers.{layer}."
            h = self._rms_norm(x, self.w[p + "input_layernorm.weight"])
            q = self._linear(h, p + "self_attn.q_proj.weight").reshape(b, c.heads, d)
            k = self._linear(h, p + "self_attn.k_proj.weight").reshape(b, c.kv_heads, d)
            v = self._linear(h, p + "self_attn.v_proj.weight").reshape(b, c.kv_heads, d)
            if c.qk_norm:
                q = self._rms_norm(q, self.w[p + "self_attn.q_norm.weight"])
                k = self._rms_norm(k, self.w[p + "self_attn.k_norm.weight"])
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            self.k_cache[layer][:, :, pos] = k
            self.v_cache[layer][:, :, pos] = v
            keys = self.k_cache[layer][:, :, : pos + 1]  # [b, kv_heads, S, d]
            values = self.v_cache[layer][:, :, : pos + 1]
            qg = q.reshape(b, c.kv_heads, group, d)  # query head i reads kv head i // group
            scores = np.einsum("bkgd,bksd->bkgs", qg, keys) / np.sqrt(d)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            att = self._r(np.einsum("bkgs,bksd->bkgd", probs, values).reshape(b, c.q_dim))
            x = self._r(x + self._linear(att, p + "self_attn.o_proj.weight"))
            h2 = self._rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            g = self._linear(h2, p + "mlp.gate_proj.weight")
            u = self._linear(h2, p + "mlp.up_proj.weight")
            m = self._r(self._r(g / (1 + np.exp(-g))) * u)
            x = self._r(x + self._linear(m, p + "mlp.down_proj.weight"))
        xn = self._rms_norm(x, self.w["model.norm.weight"])
        head = "model.embed_tokens.weight" if c.tied_embeddings else "lm_head.weight"
        return self._linear(xn, head)

    def prefill(self, prompt: np.ndarray) -> None:
        """Fills the caches with the prompt [batch, P] at positions 0..P-1, one step at a time."""
        for t in range(prompt.shape[1]):
            self.step(prompt[:, t], t)

    def generate(
        self, prompt: np.ndarray, steps: int, forced: np.ndarray | None = None
    ) -> Generation:
        """Greedy decoding after `prompt` [batch, P] (its last token at position P-1).

        With `forced` [batch, steps] the token fed at each next step is forced[:, t] instead of
        the argmax (teacher forcing: the reference follows another implementation's path).
        """
        n = prompt.shape[1]
        if n + steps > self.context:
            raise ValueError(
                f"a {n}-token prompt and {steps} steps do not fit a context of {self.context}"
            )
        self.prefill(prompt[:, : n - 1])
        token = prompt[:, n - 1]
        tokens = np.zeros((self.batch, steps), np.int32)
        logits = np.zeros((steps, self.batch, self.config.vocab), self.dtype)
        with np.errstate(over="ignore"):
            for t in range(steps):
                logits[t] = self.step(token, n - 1 + t)
                tokens[:, t] = np.argmax(logits[t], axis=-1)
                token = tokens[:, t] if forced is None else forced[:, t]
        return Generation(tokens, logits)


def reference_generate(
    config: ModelConfig,
    weights: Mapping[str, np.ndarray],
    prompt: np.ndarray,
    steps: int,
    *,
    context: int | None = None,
    forced: np.ndarray | None = None,
    dtype: type[np.floating] = np.float32,
    round_bf16: bool = True,
) -> Generation:
    """Greedy generation with the NumPy decoder (see NumpyDecoder.generate)."""
    prompt = np.asarray(prompt)
    batch = prompt.shape[0] if prompt.ndim == 2 else 0
    length = prompt.shape[-1] + steps if context is None else context
    prompt = check_prompt(config, prompt, batch, length + 1)
    model = NumpyDecoder(config, weights, batch, length, dtype=dtype, round_bf16=round_bf16)
    return model.generate(prompt, steps, forced)


# --------------------------------------------------------------------------- comparing


@dataclass
class Comparison:
    """Tokens and logits of an implementation against a teacher-forced reference."""

    ok: bool = True
    tokens_ok: bool = True
    logits_ok: bool = True
    problems: list[str] = field(default_factory=list)
    divergence: tuple[int, int] | None = None  # (step, sequence) of the first near-tie choice
    divergence_gap: float = 0.0  # how far below the reference's top logit that choice was
    logit_error: float = 0.0  # max over compared steps of ‖out − ref‖ / ‖ref‖
    logit_abs_error: float = 0.0
    compared_steps: list[int] = field(default_factory=list)


def top2_gap(logits: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 logit along the last axis."""
    top = np.partition(logits, -2, axis=-1)
    return top[..., -1] - top[..., -2]


def compare(
    tokens: np.ndarray,
    ref_logits: np.ndarray,
    logits: Mapping[int, np.ndarray],
    *,
    tie_tol: float = 0.05,
    logit_tol: float = 2e-2,
) -> Comparison:
    """Checks generated `tokens` [batch, steps] against reference logits [steps, batch, V]
    computed on the same token path (teacher forcing), and `logits` {step: [batch, V]}.

    A token must be the reference's argmax unless the reference's top logit beats the chosen
    token's logit by at most `tie_tol`·rms(reference logits) (a near-tie). Logits must be within
    `logit_tol` relative (‖out − ref‖ / ‖ref‖) at every given step.
    """
    out = Comparison()
    steps, batch = ref_logits.shape[:2]
    ref = ref_logits.astype(np.float64)
    for t in range(steps):
        for b in range(batch):
            row, chosen = ref[t, b], int(tokens[b, t])
            best = int(np.argmax(row))
            if chosen == best:
                continue
            scale = float(np.sqrt(np.mean(row * row)))
            behind = float(row[best] - row[chosen]) if 0 <= chosen < row.size else np.inf
            if behind <= tie_tol * scale:
                if out.divergence is None:
                    out.divergence, out.divergence_gap = (t, b), behind
                continue
            out.ok = out.tokens_ok = False
            out.problems.append(
                f"step {t} sequence {b}: token {chosen}, reference {best} "
                f"(its logit is {behind:.4g} below the top, tolerance {tie_tol * scale:.3g})"
            )
    for t in sorted(logits):
        got, want = np.asarray(logits[t]).astype(np.float64), ref[t]
        err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
        out.logit_error = max(out.logit_error, err)
        out.logit_abs_error = max(out.logit_abs_error, float(np.max(np.abs(got - want))))
        out.compared_steps.append(t)
        if not err <= logit_tol:
            out.ok = out.logits_ok = False
            out.problems.append(f"step {t}: logits differ by {err:.3e} relative (> {logit_tol:g})")
    return out


def logit_error(logits: Mapping[int, np.ndarray], exact: np.ndarray) -> float:
    """Max over the given steps of ‖logits[t] − exact[t]‖ / ‖exact[t]‖ (exact: [steps, batch, V])."""
    worst = 0.0
    for t, got in logits.items():
        want = exact[t].astype(np.float64)
        err = np.linalg.norm(np.asarray(got, np.float64) - want) / max(np.linalg.norm(want), 1e-30)
        worst = max(worst, float(err))
    return worst
