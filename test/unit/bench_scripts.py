"""The scripts under bench/, loaded as modules for their tests (they are not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """bench/<name>.py as the module `name` (registered in sys.modules, so its dataclasses
    resolve their own annotations)."""
    if str(ROOT / "bench") not in sys.path:  # the scripts import each other, as when run
        sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(name, ROOT / f"bench/{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
