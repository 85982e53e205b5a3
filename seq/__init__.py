"""seq: author a policy that a sequence-ai worker can host.

    import seq

    @seq.policy(action=seq.ActionContract(...), observation=seq.ObservationContract(...))
    class MyPolicy(seq.Policy):
        @seq.load
        def load(self, weights_dir): ...
        @seq.infer
        def infer(self, obs: seq.Observation, *, replan_steps: int = 5) -> seq.ActionChunk: ...

``@seq.benchmark`` declares a simulated benchmark and ``@seq.adapter`` the bridge an eval runs
between a benchmark and a policy that disagree (``seq/_adapter.py``).

The declaration is validated at import; ``seq deploy my_policy.py`` hands the file to the local
gateway, which starts a worker process for it. The ``seq`` command lives in ``seq.cli``.
"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # what type checkers and IDEs see; at run time __getattr__ below loads each name
    from ._benchmark import Benchmark, BenchmarkSpec, benchmark, check, get_benchmark_spec, is_benchmark, observe, render, reset, score, setup, step
    from ._contracts import ActionContract, ActionSpace, Camera, ObservationContract
    from ._errors import DeclarationError, PolicyInputError
    from ._params import InferParam, OneOf, Range
    from ._policy import Policy, PolicySpec, get_spec, infer, is_policy, load, on_episode, policy, shutdown, warmup
    from ._resources import Image, ImageStep, Secret, Timeouts, Volume, Weights
    from ._scaling import Batching, Concurrency, batched, concurrent
    from ._types import ActionChunk, Observation
    from ._adapter import Adapter, AdapterSpec, action_step, adapter, get_adapter_spec, is_adapter, observation_step

#: exported name -> the module that defines it, imported on first use (PEP 562), so that ``import
#: seq`` stays cheap and needs no numpy (Observation and ActionChunk do): ``python -m seq`` in a
#: client-only install reaches ``seq.__main__``'s one line instead of an import traceback.
_EXPORTS = {name: module for module, names in {
    "_benchmark": "Benchmark BenchmarkSpec benchmark check get_benchmark_spec is_benchmark observe render reset "
                  "score setup step",
    "_contracts": "ActionContract ActionSpace Camera ObservationContract",
    "_errors": "DeclarationError PolicyInputError",
    "_params": "InferParam OneOf Range",
    "_policy": "Policy PolicySpec get_spec infer is_policy load on_episode policy shutdown warmup",
    "_resources": "Image ImageStep Secret Timeouts Volume Weights",
    "_scaling": "Batching Concurrency batched concurrent",
    "_types": "ActionChunk Observation",
    "_adapter": "Adapter AdapterSpec action_step adapter get_adapter_spec is_adapter observation_step",
}.items() for name in names.split()}

__version__ = "0.1.0"

__all__ = [
    "policy", "Policy", "PolicySpec", "get_spec", "is_policy",
    "load", "warmup", "infer", "on_episode", "shutdown",
    "ActionSpace", "ActionContract", "ObservationContract", "Camera",
    "Observation", "ActionChunk",
    "Range", "OneOf", "InferParam", "batched", "concurrent", "Batching", "Concurrency", "ImageStep",
    "Timeouts", "Secret", "Volume", "Weights", "Image",
    "DeclarationError", "PolicyInputError",
    "benchmark", "Benchmark", "BenchmarkSpec", "get_benchmark_spec", "is_benchmark",
    "setup", "reset", "observe", "step", "check", "score", "render",
    "adapter", "Adapter", "AdapterSpec", "observation_step", "action_step", "is_adapter", "get_adapter_spec",
    "adapter_source",
]


def adapter_source(name: str, version: "int | None" = None, *, gateway_url: "str | None" = None,
                   api_key: "str | None" = None) -> str:
    """The file of adapter ``name`` version ``version`` (default: its latest), exactly as it was
    registered with ``seq deploy``. Asks the gateway (``$SEQUENCES_GATEWAY_URL``, key from
    ``$SEQUENCES_API_KEY`` or the data dir's ``api_key``).

    Raises LookupError for an unknown adapter or version, RuntimeError for any other refusal.
    """
    from ._adapter_registry import fetch_version
    return fetch_version(name, version, gateway_url=gateway_url, api_key=api_key)["source"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
