"""On the GPU: the PyTorch executor of nn programs (the bench baselines) agrees with mk.reference."""

import sys
from pathlib import Path

import numpy as np
import pytest
from bench_scripts import load

import mk
from mk.inputs import random_inputs
from mk.source import entry_function, load_module

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.mlir") if "llama3" not in p.name)


@pytest.mark.gpu
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_torch_executor_matches_reference(path: Path) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from torch_nn import torch_callable

    inputs = random_inputs(entry_function(load_module(path)), seed=5)
    want = mk.reference(path, *inputs)
    dev = [
        torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
        if a.dtype.name == "bfloat16"
        else torch.from_numpy(a).cuda()
        for a in inputs
    ]
    got = torch_callable(path)(*dev)
    for g, w in zip(got, want, strict=True):
        g64 = g.float().cpu().numpy().astype(np.float64)
        w64 = w.astype(np.float64)
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g64, w64)
        else:
            err = np.linalg.norm(g64 - w64) / max(np.linalg.norm(w64), 1e-30)
            assert err <= 2e-2, f"{path.name}: relative error {err}"


@pytest.mark.gpu
def test_one_read_of_a_workloads_bytes_is_timed() -> None:
    """bench.read_ms (the table's "one read" column): a reduction over 64 MB takes no less than
    half of what those bytes take at the measured copy bandwidth, and no more than 100 times."""
    bench = load("bench")
    moved = 64 << 20
    floor_ms = moved / bench.copy_bandwidth(50) * 1e3
    ms = bench.read_ms(moved, 50)
    assert 0.5 * floor_ms <= ms <= 100 * floor_ms, (ms, floor_ms)
