"""The server-facing face of ``seq``: what a server, an eval harness or a catalogue reads from a
policy, adapter or benchmark declaration, without running it.

Everything here is a public name; code outside ``seq`` imports these and never ``seq._*``:

* policies: :class:`PolicySpec`, :func:`get_spec`, :func:`is_policy`, :func:`load_policy_class`
  (import a policy file and find its ``@seq.policy`` class);
* per-request parameters: :class:`InferParam`, :func:`cast_params`, :class:`ParamError`;
* contracts: :class:`ObservationContract`, :class:`ActionContract`;
* batching: :data:`EVAL_BATCH_DEADLINE_MS` (the batch deadline of eval traffic, ms);
* benchmarks: :class:`BenchmarkSpec`, :func:`get_benchmark_spec`, :func:`is_benchmark`,
  :func:`contract_problems`;
* adapters: :class:`AdapterRuntime`, :func:`check_adapter`, :func:`get_adapter_spec`,
  :func:`load_adapter_file`;
* ``seq init`` templates: :class:`Template`, :data:`TEMPLATES` (the gateway's catalogue lists them);
* built-in benchmarks: :data:`BUILTIN_BENCHMARKS` (``seq eval run`` names them; the gateway counts them).

Importing this module imports no simulator, no server and no CLI framework, and each name's own
module only when that name is first used (numpy with the policy and benchmark declarations).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:   # what type checkers see; at run time __getattr__ below imports each name on first use
    from ._adapter import AdapterRuntime, check_adapter, get_adapter_spec, load_adapter_file
    from ._benchmark import BenchmarkSpec, contract_problems, get_benchmark_spec, is_benchmark
    from ._contracts import ActionContract, ObservationContract
    from ._params import InferParam, ParamError, cast_params
    from ._policy import PolicySpec, get_spec, is_policy
    from ._scaling import EVAL_BATCH_DEADLINE_MS

#: public name -> the module that defines it. Imported on first use (PEP 562): the gateway needs
#: only the params and contracts, ``seq --help`` none of them, and the policy and benchmark modules
#: import numpy (0.1 s of CPU per process that does not need it).
_LAZY = {name: module for module, names in {
    "_adapter": "AdapterRuntime check_adapter get_adapter_spec load_adapter_file",
    "_benchmark": "BenchmarkSpec contract_problems get_benchmark_spec is_benchmark",
    "_contracts": "ActionContract ObservationContract",
    "_params": "InferParam ParamError cast_params",
    "_policy": "PolicySpec get_spec is_policy",
    "_scaling": "EVAL_BATCH_DEADLINE_MS",
}.items() for name in names.split()}

__all__ = [
    "PolicySpec", "get_spec", "is_policy", "load_policy_class",
    "InferParam", "ParamError", "cast_params",
    "ObservationContract", "ActionContract", "EVAL_BATCH_DEADLINE_MS",
    "BenchmarkSpec", "get_benchmark_spec", "is_benchmark", "contract_problems",
    "AdapterRuntime", "check_adapter", "get_adapter_spec", "load_adapter_file",
    "Template", "TEMPLATES", "BUILTIN_BENCHMARKS",
]


def load_policy_class(file: str, class_name: Optional[str] = None) -> type:
    """Import ``file`` (its directory goes on sys.path) and return its @seq.policy class: the
    named one, or the only one the module defines.

    Raises:
        FileNotFoundError: no such file.
        ImportError: not a Python module.
        LookupError: no / several / not-decorated class (the message says which, and ``--class``).
        Whatever the module raises on import (a DeclarationError for a malformed declaration).
    """
    path = Path(file).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"policy file not found: {path}")
    directory = str(path.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    from ._files import import_file
    from ._policy import is_policy
    module = import_file(path, path.stem)
    if class_name:
        cls = getattr(module, class_name, None)
        if cls is None:
            raise LookupError(f"{path.name} has no class {class_name!r}")
        if not is_policy(cls):
            raise LookupError(f"{path.name}:{class_name} is not decorated with @seq.policy")
        return cls
    found = [obj for obj in vars(module).values() if is_policy(obj) and obj.__module__ == module.__name__]
    if not found:
        raise LookupError(f"{path.name} defines no @seq.policy class")
    if len(found) > 1:
        names = ", ".join(sorted(c.__name__ for c in found))
        raise LookupError(f"{path.name} defines several @seq.policy classes ({names}); name one with --class")
    return found[0]


_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parent


@dataclass(frozen=True)
class Template:
    """One ``seq init`` template.

    Attributes:
        name: what ``seq init NAME DIR`` takes.
        description: one line for ``seq init --list`` and the catalogue.
        source: a directory copied whole (only *.py, *.md, *.txt, *.json, *.yaml, *.toml); its
            ``policy.py`` holds the declaration the catalogue reads.
    """

    name: str
    description: str
    source: Path


#: The ``seq init`` templates by name.
TEMPLATES: dict = {t.name: t for t in (
    Template("toy-policy", "a @seq.policy with its own inputs and outputs (no contract, no weights)",
             _HERE / "templates" / "toy-policy"),
    Template("pick-place", "the demo: colour segmentation + IK pick-and-place for the simulated Panda",
             # a checkout's examples/pick_place; an installed package's copy of it (setup.py's build_py)
             _REPO / "examples" / "pick_place" if (_REPO / "examples" / "pick_place").is_dir()
             else _HERE / "templates" / "pick-place"),
    Template("pi05-droid", "pi0.5 on DROID with openpi (declaration only here: serving needs a GPU)",
             _HERE / "templates" / "pi05-droid"),
    Template("toy-adapter", "a @seq.adapter (policy_io=\"own\") between the pick-place benchmark and toy-policy",
             _HERE / "templates" / "toy-adapter"),
)}

#: Benchmarks that ship with sequence-ai: name -> ``"module:Class"`` (imported only when an eval
#: runs one; the module is ``sequence_ai_sim``'s, which this module never imports).
BUILTIN_BENCHMARKS: dict = {"pick-place": "sequence_ai_sim.benchmarks.pick_place:PickPlaceBenchmark"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"seq.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
