"""Decoder model configurations (Llama-3 and Qwen3 families) and the public models' presets."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAMILIES = ("llama", "qwen3")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 frequency scaling ("rope_type": "llama3" in a Hugging Face config)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_context: int


@dataclass(frozen=True)
class ModelConfig:
    """The shapes and constants of a pre-norm decoder with GQA attention and a gated SiLU MLP."""

    name: str
    family: str  # "llama" | "qwen3"
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    rope_theta: float
    rms_eps: float
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before RoPE
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"model family must be one of {FAMILIES}, got {self.family!r}")
        for field in ("hidden", "heads", "kv_heads", "head_dim", "layers", "intermediate", "vocab"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter by its Hugging Face name, in the program's argument order."""
        h, i, v = self.hidden, self.intermediate, self.vocab
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
        for layer in range(self.layers):
            p = f"model.layers.{layer}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_proj.weight"] = (self.q_dim, h)
            shapes[p + "self_attn.k_proj.weight"] = (self.kv_dim, h)
            shapes[p + "self_attn.v_proj.weight"] = (self.kv_dim, h)
            if self.qk_norm:
                shapes[p + "self_attn.q_norm.weight"] = (self.head_dim,)
                shapes[p + "self_attn.k_norm.weight"] = (self.head_dim,)
            shapes[p + "self_attn.o_proj.weight"] = (h, self.q_dim)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "mlp.gate_proj.weight"] = (i, h)
            shapes[p + "mlp.up_proj.weight"] = (i, h)
            shapes[p + "mlp.down_proj.weight"] = (h, i)
        shapes["model.norm.weight"] = (h,)
        if not self.tied_embeddings:
            shapes["lm_head.weight"] = (v, h)
        return shapes

    def parameter_count(self) -> int:
        """Parameters (a tied lm_head counts once), from the shapes alone."""
        total = 0
        for shape in self.weight_shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def step_weight_bytes(self, batch: int, itemsize: int = 2) -> int:
        """Weight bytes one decode step must read: every parameter once, except that an untied
        embedding table is read only at the batch's `batch` tokens (a tied one is the lm_head's,
        read whole)."""
        total = self.parameter_count()
        if not self.tied_embeddings:
            total -= (self.vocab - batch) * self.hidden
        return total * itemsize

    def kv_cache_bytes(self, batch: int, context: int, itemsize: int = 2) -> int:
        """Bytes of the K and V caches of every layer."""
        return 2 * self.layers * batch * self.kv_heads * context * self.head_dim * itemsize

    def with_(self, **changes: object) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


_LLAMA32_SCALING = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context=8192
)

PRESETS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        # Small shapes for tests and CI; both families so that both paths are exercised.
        ModelConfig(
            name="tiny",
            family="llama",
            hidden=64,
            heads=4,
            kv_heads=2,
            head_dim=16,
            layers=2,
            intermediate=128,
            vocab=256,
            tied_embeddings=False,
            rope_theta=10000.0,
            rms_eps=1e-5,
            qk_norm=False,
        ),
        ModelConfig(
            name="tiny-qwen3",
            family="qwen3",
            hidden=64,
            heads=4,
            kv_heads=2,
            head_dim=32,
            layers=2,
            intermediate=128,
            vocab=256,
            tied_embeddings=True,
            rope_theta=1e6,
            rms_eps=1e-6,
            qk_norm=True,
        ),
        # The public models' shapes (config.json of each Hugging Face repository).
        ModelConfig(
            name="qwen3-0.6b",
            family="qwen3",
            hidden=1024,
            heads=16,
            kv_heads=8,
            head_dim=128,
            layers=28,
            intermediate=3072,
            vocab=151936,
            tied_embeddings=True,
            rope_theta=1e6,
            rms_eps=1e-6,
            qk_norm=True,
        ),
        ModelConfig(
            name="llama-3.2-1b",
            family="llama",
            hidden=2048,
            heads=32,
            kv_heads=8,
            head_dim=64,
            layers=16,
            intermediate=8192,
            vocab=128256,
            tied_embeddings=True,
            rope_theta=500000.0,
            rms_eps=1e-5,
            qk_norm=False,
            rope_scaling=_LLAMA32_SCALING,
        ),
        ModelConfig(
            name="qwen3-8b",
            family="qwen3",
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            layers=36,
            intermediate=12288,
            vocab=151936,
            tied_embeddings=False,
            rope_theta=1e6,
            rms_eps=1e-6,
            qk_norm=True,
        ),
    )
}


def preset(name: str) -> ModelConfig:
    """The preset called `name`; ValueError listing the presets otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}") from None


def config_from_hf(hf: Mapping[str, Any], name: str = "hf") -> ModelConfig:
    """A ModelConfig from a Hugging Face `config.json` (model_type "llama" or "qwen3")."""
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"config.json: model_type {family!r} is not one of {FAMILIES}")
    try:
        heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        scaling = hf.get("rope_scaling")
        rope = None
        if isinstance(scaling, Mapping) and scaling.get("rope_type") == "llama3":
            rope = RopeScaling(
                factor=float(scaling["factor"]),
                low_freq_factor=float(scaling["low_freq_factor"]),
                high_freq_factor=float(scaling["high_freq_factor"]),
                original_context=int(scaling["original_max_position_embeddings"]),
            )
        elif scaling is not None:
            raise ValueError(f"config.json: rope_scaling {scaling!r} is not supported")
        return ModelConfig(
            name=name,
            family=family,
            hidden=hidden,
            heads=heads,
            kv_heads=int(hf.get("num_key_value_heads", heads)),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            layers=int(hf["num_hidden_layers"]),
            intermediate=int(hf["intermediate_size"]),
            vocab=int(hf["vocab_size"]),
            tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            qk_norm=family == "qwen3",
            rope_scaling=rope,
        )
    except KeyError as e:
        raise ValueError(f"config.json: missing field {e.args[0]!r}") from None


def check_hf_config(config: ModelConfig, path: str | Path) -> None:
    """Raises ValueError naming every field where `config` differs from a config.json."""
    theirs = config_from_hf(json.loads(Path(path).read_text()), config.name)
    diffs = [
        f"{f.name} {getattr(config, f.name)!r} vs {getattr(theirs, f.name)!r}"
        for f in dataclasses.fields(ModelConfig)
        if f.name != "name" and getattr(config, f.name) != getattr(theirs, f.name)
    ]
    if diffs:
        raise ValueError(f"{path} does not describe {config.name}: {'; '.join(diffs)}")
