"""pytest configuration: `gpu`-marked tests skip cleanly without a GPU; builds are shared by content."""

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


# The suite's C++ builds at -O1: about 60 % of -O2's build time (mk.compile's CPU libraries are
# built by the dozen here and each run for milliseconds). A test may still set its own.
os.environ.setdefault("MK_CPU_CXXFLAGS", "-O1")


class _StoredCompiles:
    """`subprocess` for mk's two build modules, with each successful compile's output kept by its
    inputs (the command with the source's text in place of its path, and the output's path left
    out) in a folder the session's workers share: many tests build the same program into caches
    of their own, and the second build of a source then copies the first one's library (and
    replays its compiler output, which the CUDA build reads registers and spills from)."""

    def __init__(self, store: Path) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    def run(self, cmd: Any, *args: Any, **kwargs: Any) -> Any:
        key = self.key(cmd)
        if key is None:
            return subprocess.run(cmd, *args, **kwargs)
        out = Path(cmd[cmd.index("-o") + 1])
        kept, log = self.store / f"{key}.out", self.store / f"{key}.json"
        if kept.is_file() and log.is_file():
            shutil.copyfile(kept, out)
            stdout, stderr = json.loads(log.read_text())
            return subprocess.CompletedProcess(cmd, 0, stdout, stderr)
        done = subprocess.run(cmd, *args, **kwargs)
        if done.returncode == 0 and out.is_file() and isinstance(done.stdout, str):
            fd, tmp = tempfile.mkstemp(dir=self.store)
            os.close(fd)
            shutil.copyfile(out, tmp)
            Path(tmp + ".json").write_text(json.dumps([done.stdout, done.stderr]))
            os.replace(tmp + ".json", log)
            os.replace(tmp, kept)
        return done

    @staticmethod
    def key(cmd: Any) -> str | None:
        if not isinstance(cmd, list) or "-o" not in cmd:
            return None
        sources = [a for a in cmd if str(a).endswith((".cu", ".cpp"))]
        if len(sources) != 1:
            return None
        digest = hashlib.sha256(Path(sources[0]).read_bytes())
        skip = {sources[0], cmd[cmd.index("-o") + 1]}
        for arg in cmd:
            if arg not in skip:
                digest.update(str(arg).encode() + b"\0")
        return digest.hexdigest()


@pytest.fixture(scope="session", autouse=True)
def stored_compiles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test's nvcc and C++ builds through _StoredCompiles."""
    from mk.backends.cpu import build as cpu_build
    from mk.backends.cuda import build as cuda_build

    base = tmp_path_factory.getbasetemp()
    store = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "compile-store"
    store.mkdir(exist_ok=True)
    shim = _StoredCompiles(store)
    modules = (cpu_build, cuda_build)
    for module in modules:
        module.subprocess = shim  # type: ignore[attr-defined]
    yield
    for module in modules:
        module.subprocess = subprocess  # type: ignore[attr-defined]
