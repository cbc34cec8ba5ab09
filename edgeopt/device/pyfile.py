"""Import a Python file as a module (user hooks on the build host, a bundle's shipped metric on the device).

Lean module: the standard library only."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(path: Path, prefix: str) -> ModuleType:
    """Execute ``path`` as a fresh module named after ``prefix`` and the file; its exceptions propagate."""
    module_name = f"{prefix}_{path.stem}_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
