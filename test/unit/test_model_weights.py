"""mk.models' weights through safetensors files: the round trip, a model's weights, the errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from mk.models import WeightsError, check_weights, load_safetensors, preset, random_weights

BF16 = np.dtype(ml_dtypes.bfloat16)


_ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "int64": "I64"}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A minimal writer of the format (independent of the reader under test)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": _ST_DTYPES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_safetensors_roundtrip(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5)).astype(BF16)
    b = rng.standard_normal(7).astype(np.float16)
    c = rng.standard_normal((2, 2, 2)).astype(np.float32)
    write_safetensors(tmp_path / "one.safetensors", {"a": a, "b": b})
    write_safetensors(tmp_path / "two.safetensors", {"c": c})
    one = load_safetensors(tmp_path / "one.safetensors")
    assert sorted(one) == ["a", "b"]
    both = load_safetensors(tmp_path)  # a directory: every shard
    assert sorted(both) == ["a", "b", "c"]
    assert both["a"].dtype == BF16 and both["b"].dtype == np.float16
    np.testing.assert_array_equal(both["a"].view(np.uint16), a.view(np.uint16))
    np.testing.assert_array_equal(both["b"], b)
    np.testing.assert_array_equal(both["c"], c)
    listed = load_safetensors([tmp_path / "two.safetensors", tmp_path / "one.safetensors"])
    assert sorted(listed) == ["a", "b", "c"]


def test_model_weights_through_safetensors(tmp_path: Path) -> None:
    config = preset("tiny-qwen3")
    weights = random_weights(config, seed=3)
    names = list(weights)
    half = len(names) // 2
    write_safetensors(tmp_path / "model-00001.safetensors", {n: weights[n] for n in names[:half]})
    # The second shard stores f32 (converted to bf16 on load) and an unused extra tensor.
    rest = {n: weights[n].astype(np.float32) for n in names[half:]}
    rest["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(16, np.float32)
    write_safetensors(tmp_path / "model-00002.safetensors", rest)
    loaded = check_weights(config, load_safetensors(tmp_path))
    assert sorted(loaded) == sorted(weights)
    for name, w in weights.items():
        assert loaded[name].dtype == BF16
        np.testing.assert_array_equal(loaded[name].view(np.uint16), w.view(np.uint16))


def test_safetensors_errors(tmp_path: Path) -> None:
    config = preset("tiny")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(WeightsError, match="header length"):
        load_safetensors(bad)
    bad.write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(WeightsError, match="not valid JSON"):
        load_safetensors(bad)
    bad.write_bytes(b"abc")
    with pytest.raises(WeightsError, match="shorter than its 8-byte header"):
        load_safetensors(bad)
    with pytest.raises(WeightsError, match="no such file"):
        load_safetensors(tmp_path / "nothing.safetensors")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WeightsError, match="no .safetensors files"):
        load_safetensors(empty)
    write_safetensors(bad, {"x": np.zeros(4, np.int64)})
    with pytest.raises(WeightsError, match="dtype I64 is not supported"):
        load_safetensors(bad)
    # Data offsets that do not match the shape.
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(WeightsError, match="8 bytes of data for shape"):
        load_safetensors(bad)
    # Weights that do not fit the model.
    weights = random_weights(config)
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(WeightsError, match=r"missing weight\(s\) model.layers.1.mlp.up_proj"):
        check_weights(config, weights)
    weights = random_weights(config)
    weights["model.norm.weight"] = np.ones(65, BF16)
    with pytest.raises(
        WeightsError, match=r"'model.norm.weight' has shape \[65\], expected \[64\]"
    ):
        check_weights(config, weights)
    write_safetensors(tmp_path / "a.safetensors", {"x": np.ones(2, np.float32)})
    write_safetensors(tmp_path / "b.safetensors", {"x": np.ones(2, np.float32)})
    with pytest.raises(WeightsError, match="'x' is in both"):
        load_safetensors([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
