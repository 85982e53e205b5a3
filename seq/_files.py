"""Importing a user's declaration file (a policy, an adapter) as a module, the one way."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["import_file"]


def import_file(path: Path, module_name: str) -> ModuleType:
    """Run the file ``path`` as module ``module_name`` (registered in ``sys.modules`` first, so
    its dataclasses and pickling find it) and return the module.

    Raises ImportError when ``path`` is not a Python module, and whatever the module raises on
    import."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
