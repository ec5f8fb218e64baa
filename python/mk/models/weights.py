"""Model weights (seeded random or read from .safetensors), RoPE tables and the program's inputs."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from mk.models.build import ROPE_TABLE, Arg, arguments, prefill_arguments
from mk.models.config import ModelConfig

BF16 = np.dtype(ml_dtypes.bfloat16)
Weights = dict[str, np.ndarray]

_SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "BF16": BF16,
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
}
_MAX_HEADER = 100 * 2**20  # the format's own limit on the JSON header (100 MiB)
_CHUNK = 1 << 24  # elements generated at a time for large random tensors


class WeightsError(ValueError):
    """Weights that cannot be read or do not fit the model (missing, mis-shaped, bad file)."""


# --------------------------------------------------------------------------- random weights


def _normal_bf16(seed: np.random.SeedSequence, shape: tuple[int, ...], std: float) -> np.ndarray:
    """Normal(0, std²) samples rounded to bf16, in chunks filled by a pool of threads (NumPy
    releases the GIL while it fills); chunk i has its own child seed, so the values do not
    depend on the number of threads."""
    out = np.empty(math.prod(shape), BF16)
    starts = range(0, out.size, _CHUNK)

    def fill(args: tuple[int, np.random.SeedSequence]) -> None:
        start, child = args
        n = min(_CHUNK, out.size - start)
        values = np.random.default_rng(child).standard_normal(n, np.float32)
        out[start : start + n] = (values * np.float32(std)).astype(BF16)

    jobs = list(zip(starts, seed.spawn(len(starts)), strict=True))
    if len(jobs) == 1:
        fill(jobs[0])
    else:
        with ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1)) as pool:
            list(pool.map(fill, jobs))
    return out.reshape(shape)


def random_weights(config: ModelConfig, seed: int = 0) -> Weights:
    """Seeded random weights under Hugging Face names, scaled so activations stay O(1).

    Linear weights are normal·1/√fan_in; norm weights 1 + 0.1·normal; the embedding is scaled so
    that the logits (through the lm_head or the tied embedding) have a spread of a few units,
    which keeps the greedy argmax away from ties most of the time.
    """
    rng = np.random.default_rng(seed)
    root = np.random.SeedSequence(seed)
    weights: Weights = {}
    for name, shape in config.weight_shapes().items():
        if len(shape) == 1:
            w = (1.0 + 0.1 * rng.standard_normal(shape)).astype(BF16)
        elif name == "model.embed_tokens.weight":
            std = 3.0 / math.sqrt(config.hidden) if config.tied_embeddings else 1.0
            w = _normal_bf16(root.spawn(1)[0], shape, std)
        elif name == "lm_head.weight":
            w = _normal_bf16(root.spawn(1)[0], shape, 3.0 / math.sqrt(shape[1]))
        else:
            w = _normal_bf16(root.spawn(1)[0], shape, 1.0 / math.sqrt(shape[1]))
        weights[name] = w
    return weights


# --------------------------------------------------------------------------- safetensors


def _safetensors_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise WeightsError(f"{path}: no .safetensors files in this directory")
        return files
    if not path.exists():
        raise WeightsError(f"{path}: no such file or directory")
    return [path]


def read_safetensors(path: str | Path) -> Weights:
    """The tensors of one .safetensors file, memory-mapped (bf16 as ml_dtypes.bfloat16).

    The format: an 8-byte little-endian header length N, N bytes of JSON mapping each name to
    {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data after the header),
    then the raw little-endian data. Supported dtypes: BF16, F16, F32.
    """
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise WeightsError(f"{path}: not a safetensors file (shorter than its 8-byte header)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise WeightsError(f"{path}: not a safetensors file (header length {n} bytes)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise WeightsError(f"{path}: the safetensors header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: the safetensors header is not a JSON object")
    data_start, data_size = 8 + n, size - 8 - n
    tensors: Weights = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor(path, name, info, data_start, data_size)
    return tensors


def _tensor(path: Path, name: str, info: object, data_start: int, data_size: int) -> np.ndarray:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise WeightsError(f"{where}: header entry is not an object")
    dtype_name, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype_name not in _SAFETENSORS_DTYPES:
        known = ", ".join(_SAFETENSORS_DTYPES)
        raise WeightsError(f"{where}: dtype {dtype_name} is not supported (supported: {known})")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise WeightsError(f"{where}: bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_size
    ):
        raise WeightsError(f"{where}: data offsets {offsets!r} outside the {data_size}-byte data")
    dtype = _SAFETENSORS_DTYPES[dtype_name]
    count = math.prod(shape)
    if offsets[1] - offsets[0] != count * dtype.itemsize:
        raise WeightsError(
            f"{where}: {offsets[1] - offsets[0]} bytes of data for shape {shape} {dtype_name} "
            f"({count * dtype.itemsize} bytes expected)"
        )
    if count == 0:
        return np.zeros(shape, dtype)
    data = np.memmap(path, dtype=dtype, mode="r", offset=data_start + offsets[0], shape=(count,))
    return data.reshape(shape)


def load_safetensors(path: str | Path | Sequence[str | Path]) -> Weights:
    """Every tensor of a .safetensors file, of every such file in a directory, or of a list of
    files (a sharded checkpoint); a name found in two files is an error."""
    paths = [Path(path)] if isinstance(path, str | Path) else [Path(p) for p in path]
    tensors: Weights = {}
    origin: dict[str, Path] = {}
    for file in [f for p in paths for f in _safetensors_files(p)]:
        for name, array in read_safetensors(file).items():
            if name in tensors:
                raise WeightsError(f"tensor {name!r} is in both {origin[name]} and {file}")
            tensors[name] = array
            origin[name] = file
    return tensors


def check_weights(config: ModelConfig, weights: Mapping[str, np.ndarray]) -> Weights:
    """The weights `config` needs, shape-checked and as bf16 (extra tensors are ignored).

    A tied model uses the embedding as lm_head, so a stored `lm_head.weight` is not needed.
    """
    shapes = config.weight_shapes()
    missing = [name for name in shapes if name not in weights]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise WeightsError(
            f"{config.name}: missing weight(s) {', '.join(missing[:3])}{more} "
            f"({len(weights)} tensors given)"
        )
    out: Weights = {}
    for name, shape in shapes.items():
        w = weights[name]
        if tuple(w.shape) != shape:
            raise WeightsError(
                f"{config.name}: weight {name!r} has shape {list(w.shape)}, expected {list(shape)}"
            )
        if w.dtype.kind not in "fV" and w.dtype != BF16:
            raise WeightsError(f"{config.name}: weight {name!r} has dtype {w.dtype}, not a float")
        out[name] = w if w.dtype == BF16 else np.asarray(w).astype(BF16)
    return out


# --------------------------------------------------------------------------- RoPE


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """RoPE's inverse frequencies θ^(-2i/D) (float64), with Llama-3 scaling when configured.

    Llama-3 scaling keeps high frequencies (wavelength < original_context / high_freq_factor),
    divides low ones (wavelength > original_context / low_freq_factor) by `factor`, and blends
    linearly in between.
    """
    d = config.head_dim
    inv = 1.0 / config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    s = config.rope_scaling
    if s is None:
        return inv
    wavelength = 2 * math.pi / inv
    low_wavelength = s.original_context / s.low_freq_factor
    high_wavelength = s.original_context / s.high_freq_factor
    smooth = (s.original_context / wavelength - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * inv / s.factor + smooth * inv
    return np.where(
        wavelength < high_wavelength,
        inv,
        np.where(wavelength > low_wavelength, inv / s.factor, blended),
    )


def rope_tables(
    config: ModelConfig, context: int, dtype: np.dtype | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [context, head_dim/2] of position·frequency, in `dtype` (default: the
    program's table dtype)."""
    angles = np.arange(context, dtype=np.float64)[:, None] * inverse_frequencies(config)[None, :]
    if dtype is None:
        dtype = BF16 if ROPE_TABLE == "bf16" else np.dtype(np.float32)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


# --------------------------------------------------------------------------- program inputs


def random_prompt(config: ModelConfig, batch: int, length: int = 1, seed: int = 0) -> np.ndarray:
    """Seeded random prompt tokens [batch, length]."""
    rng = np.random.default_rng(seed + 7919)
    return rng.integers(0, config.vocab, (batch, length)).astype(np.int32)


def check_prompt(config: ModelConfig, prompt: np.ndarray, batch: int, context: int) -> np.ndarray:
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[0] != batch or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be [batch={batch}, length >= 1], got {list(prompt.shape)}")
    if prompt.dtype.kind not in "iu":
        raise ValueError(f"prompt tokens must be integers, got {prompt.dtype}")
    if prompt.size and (prompt.min() < 0 or prompt.max() >= config.vocab):
        raise ValueError(f"prompt tokens must be in [0, {config.vocab}), got {prompt.max()}")
    if prompt.shape[1] >= context:
        raise ValueError(f"a {prompt.shape[1]}-token prompt does not fit a context of {context}")
    return prompt.astype(np.int32)


def program_inputs(
    config: ModelConfig,
    weights: Mapping[str, np.ndarray],
    batch: int,
    context: int,
    prompt: np.ndarray | None = None,
    *,
    prefill: bool = True,
) -> list[np.ndarray]:
    """The decode program's arguments, in order (see build.arguments).

    `prompt` [batch, P] (default: one random token per sequence) goes into the token history at
    positions 0..P-1 and `pos` is P-1, the position of its last token. The K/V caches hold the
    prompt's first P-1 positions, computed by the NumPy reference (zeros beyond): the program's
    first step then continues the prompt; with `prefill=False` the caches stay zero for the
    caller to fill (e.g. on the GPU). Caches and token history are fresh, writable arrays.
    """
    from mk.models.reference import NumpyDecoder

    prompt = check_prompt(
        config, random_prompt(config, batch) if prompt is None else prompt, batch, context
    )
    w = check_weights(config, weights)
    tokens = np.zeros((context, batch), np.int32)
    tokens[: prompt.shape[1]] = prompt.T
    pos = prompt.shape[1] - 1
    k_caches = [np.zeros(a.shape, BF16) for a in _args(config, batch, context, "k_cache")]
    v_caches = [np.zeros(a.shape, BF16) for a in _args(config, batch, context, "v_cache")]
    if pos > 0 and prefill:
        model = NumpyDecoder(config, w, batch, context)
        model.prefill(prompt[:, :pos])
        for layer in range(config.layers):
            k_caches[layer][:, :, :pos] = model.k_cache[layer][:, :, :pos].astype(BF16)
            v_caches[layer][:, :, :pos] = model.v_cache[layer][:, :, :pos].astype(BF16)
    cos, sin = rope_tables(config, context)
    values: list[np.ndarray] = []
    for arg in arguments(config, batch, context):
        if arg.role == "tokens":
            values.append(tokens)
        elif arg.role == "pos":
            values.append(np.array([pos], np.int32))
        elif arg.role == "cos":
            values.append(cos)
        elif arg.role == "sin":
            values.append(sin)
        elif arg.role == "weight":
            assert arg.weight is not None
            values.append(w[arg.weight])
        elif arg.role == "k_cache":
            values.append(k_caches[arg.layer or 0])
        else:
            values.append(v_caches[arg.layer or 0])
    return values


def prefill_inputs(
    config: ModelConfig,
    decode_inputs: Sequence[Any],
    prompt: np.ndarray,
    context: int,
    rows: int | None = None,
) -> list[Any]:
    """The prefill program's arguments for the decode program's `decode_inputs` (NumPy arrays
    or device tensors, shared: the prefill writes their caches in place) and `prompt` [batch,
    P]: its first P-1 tokens at positions 0..P-2, which the decode program's first step, at
    position P-1, then continues. With `rows` (at least P-1, below `context`: prefill_rows)
    the program of that many positions: the rows past P-2 repeat token P-1 at the positions
    after, whose cache slots the decode steps overwrite before reading. Prompt and positions
    are NumPy arrays (the caller moves them to the device with the rest)."""
    batch, length = prompt.shape[0], prompt.shape[1] - 1
    count: int = length if rows is None else rows
    if not length <= count < context:
        raise ValueError(
            f"rows must be at least the prompt's {length} positions and below the context "
            f"{context}, got {count}"
        )
    by_name = {
        a.name: value
        for a, value in zip(arguments(config, batch, context), decode_inputs, strict=True)
    }
    pad = np.repeat(prompt[:, length : length + 1], count - length, axis=1)
    by_name["prompt"] = np.ascontiguousarray(
        np.concatenate([prompt[:, :length], pad], axis=1), dtype=np.int32
    )
    by_name["positions"] = np.arange(count, dtype=np.int32)
    return [by_name[a.name] for a in prefill_arguments(config, batch, count, context)]


def _args(config: ModelConfig, batch: int, context: int, role: str) -> list[Arg]:
    return [a for a in arguments(config, batch, context) if a.role == role]


def generated_tokens(tokens: np.ndarray, pos: int, steps: int) -> np.ndarray:
    """The `steps` tokens generated after position `pos`, per sequence: [batch, steps]."""
    return np.ascontiguousarray(tokens[pos + 1 : pos + 1 + steps].T)
