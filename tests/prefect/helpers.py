"""Import the example flows in flows/ (a folder of scripts, not a package) for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

FLOWS_DIR = Path(__file__).resolve().parents[2] / "flows"


def load_flow_module(stem: str) -> ModuleType:
    """Import flows/<stem>.py once under the module name `flows_<stem>`."""
    name = f"flows_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FLOWS_DIR / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
