"""The decoder in PyTorch with a static KV cache (CUDA-graph capturable): GPU check and baseline."""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mk.models.config import ModelConfig
from mk.models.reference import Generation
from mk.models.weights import check_prompt, check_weights, rope_tables


def _torch() -> Any:
    try:
        return importlib.import_module("torch")  # optional: not a dependency of mk
    except ImportError:
        raise RuntimeError("the PyTorch reference needs torch (not installed)") from None


def to_torch(array: np.ndarray, device: str) -> Any:
    """A NumPy array (bf16 as ml_dtypes.bfloat16) as a torch tensor on `device`."""
    torch = _torch()
    a = np.ascontiguousarray(array)
    if not a.flags.writeable:  # e.g. memory-mapped weights: torch wants writable memory
        a = a.copy()
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


def capture_graph(fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` recorded in a CUDA graph (after three warm-up calls on a side stream); returns
    the graph's replay."""
    torch = _torch()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


# What the GPU sleeps before a queued timing's start event: longer than the host takes to
# submit the start event, the timed work and the end event, so none of that submission is timed.
QUEUE_SLEEP_CYCLES = 400_000  # ~200 us at the H200's ~2 GHz


def event_ms(
    fn: Callable[[], object],
    runs: int,
    warmup: int = 10,
    setup: Callable[[], object] = lambda: None,
    queued: bool = False,
) -> float:
    """Median milliseconds of `fn` between two CUDA events (`setup` runs untimed before each).
    With `queued`, the GPU is kept busy (a sleep kernel) while the host submits the events and
    `fn`, so the time is the device's alone: replaying a CUDA graph on an idle GPU otherwise
    also times the host's submission, 10-17 us on the H200 machine (bench/launch.py)."""
    torch = _torch()
    for _ in range(warmup):
        setup()
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queued:
            torch.cuda._sleep(QUEUE_SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def device_name() -> str:
    """The current CUDA device's name (timings of different cards must not be compared)."""
    return str(_torch().cuda.get_device_name())


def copy_bandwidth(runs: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + written), median of `runs`."""
    torch = _torch()
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * n / (event_ms(lambda: dst.copy_(src), runs, warmup=3) * 1e-3)


class TorchDecoder:
    """One greedy decode step as fixed-address tensor operations, the way a PyTorch user writes a
    bf16 model: matmuls in bf16 (cuBLAS, f32 accumulation), norms and RoPE in f32, every op's
    result in bf16. All state lives in static buffers (token, position, caches, logits) and the
    step makes no host synchronisation, so `capture()` can record it in a CUDA graph.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, np.ndarray],
        batch: int,
        context: int,
        device: str = "cuda",
        dtype: str = "bfloat16",
    ) -> None:
        torch = _torch()
        self.torch, self.config, self.batch, self.context = torch, config, batch, context
        self.device = device
        bf16 = getattr(torch, dtype)  # "float32": the same model unrounded (an accuracy yardstick)
        self.w = {
            k: to_torch(v, device).to(bf16) for k, v in check_weights(config, weights).items()
        }
        self.norm_f32 = {k: v.float() for k, v in self.w.items() if v.dim() == 1}
        c = config
        shape = (c.layers, batch, c.kv_heads, context, c.head_dim)
        self.k_cache = torch.zeros(shape, dtype=bf16, device=device)
        self.v_cache = torch.zeros(shape, dtype=bf16, device=device)
        cos, sin = rope_tables(config, context)
        self.cos, self.sin = to_torch(cos, device), to_torch(sin, device)
        self.token = torch.zeros(batch, dtype=torch.int64, device=device)
        self.pos = torch.zeros(1, dtype=torch.int64, device=device)
        self.logits = torch.zeros(batch, c.vocab, dtype=bf16, device=device)
        self.positions = torch.arange(context, device=device)
        self.graph: Any = None

    def _rms_norm(self, x: Any, name: str) -> Any:
        """RMSNorm in f32 (torch's fused kernel where it has one), rounded to x's dtype."""
        xf, g = x.float(), self.norm_f32[name]
        fused = getattr(self.torch.nn.functional, "rms_norm", None)
        if fused is not None:
            return fused(xf, (xf.shape[-1],), g, self.config.rms_eps).to(x.dtype)
        ms = xf.pow(2).mean(-1, keepdim=True)
        return (xf * self.torch.rsqrt(ms + self.config.rms_eps) * g).to(x.dtype)

    def _rope(self, x: Any, cos: Any, sin: Any) -> Any:
        x1, x2 = x.float().chunk(2, dim=-1)
        c, s = cos.float(), sin.float()
        return self.torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)

    def step(self) -> None:
        """Runs `token` at `pos`: writes the caches at pos, `logits`, then token = argmax, pos += 1."""
        torch, c, b, d = self.torch, self.config, self.batch, self.config.head_dim
        F = torch.nn.functional
        w = self.w
        x = F.embedding(self.token, w["model.embed_tokens.weight"])
        cos = self.cos.index_select(0, self.pos)  # [1, d/2]: broadcast over batch and heads
        sin = self.sin.index_select(0, self.pos)
        mask = (self.positions <= self.pos).view(1, 1, 1, self.context)
        for layer in range(c.layers):
            p = f"model.layers.{layer}."
            h = self._rms_norm(x, p + "input_layernorm.weight")
            q = F.linear(h, w[p + "self_attn.q_proj.weight"]).view(b, c.heads, 1, d)
            k = F.linear(h, w[p + "self_attn.k_proj.weight"]).view(b, c.kv_heads, 1, d)
            v = F.linear(h, w[p + "self_attn.v_proj.weight"]).view(b, c.kv_heads, 1, d)
            if c.qk_norm:
                q = self._rms_norm(q, p + "self_attn.q_norm.weight")
                k = self._rms_norm(k, p + "self_attn.k_norm.weight")
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            kc, vc = self.k_cache[layer], self.v_cache[layer]
            kc.index_copy_(2, self.pos, k)
            vc.index_copy_(2, self.pos, v)
            a = F.scaled_dot_product_attention(
                q, kc, vc, attn_mask=mask, scale=d**-0.5, enable_gqa=c.heads != c.kv_heads
            )
            x = x + F.linear(a.reshape(b, c.q_dim), w[p + "self_attn.o_proj.weight"])
            h2 = self._rms_norm(x, p + "post_attention_layernorm.weight")
            g = F.linear(h2, w[p + "mlp.gate_proj.weight"])
            u = F.linear(h2, w[p + "mlp.up_proj.weight"])
            x = x + F.linear(F.silu(g) * u, w[p + "mlp.down_proj.weight"])
        head = w["model.embed_tokens.weight" if c.tied_embeddings else "lm_head.weight"]
        self.logits.copy_(F.linear(self._rms_norm(x, "model.norm.weight"), head))
        self.token.copy_(self.logits.argmax(-1))
        self.pos.add_(1)

    def reset(self, prompt: np.ndarray, stepwise: bool = False) -> None:
        """Empties the caches, runs the prompt [batch, P] but its last token, and sets that token
        at position P-1 as the next step's input. The prompt runs as one causal forward pass
        (a 1,000-token prompt took ~20 s one step at a time), or with `stepwise` step by step."""
        torch = self.torch
        prompt = check_prompt(self.config, prompt, self.batch, self.context)
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.pos.zero_()
        ids = torch.from_numpy(prompt.astype(np.int64)).to(self.device)
        if stepwise:
            for t in range(prompt.shape[1] - 1):
                self.token.copy_(ids[:, t])
                self.step()
        elif prompt.shape[1] > 1:
            self._prefill(ids[:, :-1])
            self.pos.fill_(prompt.shape[1] - 1)
        self.token.copy_(ids[:, -1])

    def _prefill(self, ids: Any) -> None:
        """The caches at positions 0..n-1 for ids [batch, n]: `step`'s ops over all n positions
        at once, each query attending to the keys at or before its position."""
        torch, c, b, d = self.torch, self.config, self.batch, self.config.head_dim
        F = torch.nn.functional
        w = self.w
        n = ids.shape[1]
        x = F.embedding(ids, w["model.embed_tokens.weight"])  # [b, n, hidden]
        cos, sin = self.cos[:n], self.sin[:n]  # [n, d/2]: broadcast over batch and heads
        rows = torch.arange(n, device=self.device).view(n, 1)
        mask = (self.positions.view(1, -1) <= rows).view(1, 1, n, self.context)

        def heads(t: Any, h: int) -> Any:  # [b, n, h·d] -> [b, h, n, d]
            return t.view(b, n, h, d).transpose(1, 2)

        for layer in range(c.layers):
            p = f"model.layers.{layer}."
            h = self._rms_norm(x, p + "input_layernorm.weight")
            q = heads(F.linear(h, w[p + "self_attn.q_proj.weight"]), c.heads)
            k = heads(F.linear(h, w[p + "self_attn.k_proj.weight"]), c.kv_heads)
            v = heads(F.linear(h, w[p + "self_attn.v_proj.weight"]), c.kv_heads)
            if c.qk_norm:
                q = self._rms_norm(q, p + "self_attn.q_norm.weight")
                k = self._rms_norm(k, p + "self_attn.k_norm.weight")
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            kc, vc = self.k_cache[layer], self.v_cache[layer]
            kc[:, :, :n] = k
            vc[:, :, :n] = v
            a = F.scaled_dot_product_attention(
                q, kc, vc, attn_mask=mask, scale=d**-0.5, enable_gqa=c.heads != c.kv_heads
            )
            x = x + F.linear(
                a.transpose(1, 2).reshape(b, n, c.q_dim), w[p + "self_attn.o_proj.weight"]
            )
            h2 = self._rms_norm(x, p + "post_attention_layernorm.weight")
            g = F.linear(h2, w[p + "mlp.gate_proj.weight"])
            u = F.linear(h2, w[p + "mlp.up_proj.weight"])
            x = x + F.linear(F.silu(g) * u, w[p + "mlp.down_proj.weight"])

    def capture(self) -> None:
        """Records `step` in a CUDA graph (warm-up on a side stream first; state is then stale:
        call `reset` before replaying)."""
        self.graph = capture_graph(self.step)

    def run_step(self) -> None:
        """One step: the captured graph's replay when there is one, else eager."""
        if self.graph is not None:
            self.graph()
        else:
            self.step()

    def generate(
        self, prompt: np.ndarray, steps: int, forced: np.ndarray | None = None
    ) -> Generation:
        """Greedy decoding (teacher-forced by `forced` [batch, steps] when given)."""
        torch = self.torch
        n = np.asarray(prompt).shape[-1]
        if n + steps > self.context:
            raise ValueError(f"a {n}-token prompt and {steps} steps do not fit {self.context}")
        self.reset(prompt)
        forced_t = None if forced is None else torch.from_numpy(forced.astype(np.int64))
        tokens = torch.zeros(steps, self.batch, dtype=torch.int64, device=self.device)
        logits = torch.zeros(steps, self.batch, self.config.vocab, device=self.device)
        for t in range(steps):
            self.run_step()
            tokens[t].copy_(self.token)
            logits[t].copy_(self.logits)
            if forced_t is not None:
                self.token.copy_(forced_t[:, t])
        return Generation(
            tokens.T.contiguous().cpu().numpy().astype(np.int32), logits.cpu().numpy()
        )


def torch_generate(
    config: ModelConfig,
    weights: Mapping[str, np.ndarray],
    prompt: np.ndarray,
    steps: int,
    *,
    context: int,
    forced: np.ndarray | None = None,
    graph: bool = True,
    device: str = "cuda",
    dtype: str = "bfloat16",
) -> Generation:
    """Greedy generation with TorchDecoder (in a CUDA graph by default)."""
    model = TorchDecoder(config, weights, np.asarray(prompt).shape[0], context, device, dtype)
    if graph:
        model.capture()
    return model.generate(prompt, steps, forced)
