"""seq: author a policy that a sequence-ai worker can host.

    import seq

    @seq.policy(action=seq.ActionContract(...), observation=seq.ObservationContract(...))
    class MyPolicy(seq.Policy):
        @seq.load
        def load(self, weights_dir): ...
        @seq.infer
        def infer(self, obs: seq.Observation, *, replan_steps: int = 5) -> seq.ActionChunk: ...

The declaration is validated at import; ``seq deploy my_policy.py`` hands the file to the local
gateway, which starts a worker process for it. The ``seq`` command lives in ``seq.cli``.
"""
from ._benchmark import Benchmark, BenchmarkSpec, benchmark, check, get_benchmark_spec, is_benchmark, observe, render, reset, score, setup, step
from ._contracts import ActionContract, ActionSpace, Camera, ObservationContract
from ._errors import DeclarationError, PolicyInputError
from ._params import InferParam, OneOf, Range
from ._policy import Policy, PolicySpec, get_spec, infer, is_policy, load, on_episode, policy, shutdown, warmup
from ._resources import Image, ImageStep, Secret, Timeouts, Volume, Weights
from ._scaling import Batching, Concurrency, batched, concurrent
from ._types import ActionChunk, Observation

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
]
