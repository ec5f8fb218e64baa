"""pytest configuration: `gpu`-marked tests skip cleanly on machines without an NVIDIA GPU."""

import pytest


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _has_gpu():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU and torch with CUDA")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def gpu_present() -> bool:
    """Whether an NVIDIA GPU (and torch with CUDA) is available to this test run."""
    return _has_gpu()


@pytest.fixture
def no_nvcc(monkeypatch: pytest.MonkeyPatch) -> None:
    """target='cuda' compiles emit the source only (no nvcc build), as on a machine without it."""
    import mk.backends.cuda as backend
    from mk.backends.cuda import build as cuda_build

    monkeypatch.setattr(cuda_build, "nvcc", lambda: None)
    monkeypatch.setattr(backend, "nvcc", lambda: None)
