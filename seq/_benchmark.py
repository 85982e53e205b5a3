"""``@seq.benchmark``: declare a simulated benchmark that ``seq eval run`` scores a policy on.

A benchmark is a class, written the way a policy is, whose marked methods the eval runner
calls in a loop it owns (reset -> step -> check, one control period per step)::

    @seq.benchmark(name="toy", tasks={"reach": "reach the red ball"},
                   observation=seq.ObservationContract(...), action=seq.ActionContract(...))
    class Toy(seq.Benchmark):
        @seq.setup
        def setup(self, *, max_seconds: float = 20.0): ...     # once per env; keywords = eval params
        @seq.reset
        def reset(self, task: str, seed: int): ...              # start an episode (task id, seed)
        @seq.observe
        def observe(self) -> dict: ...                          # {"images": {view: HxWx3 uint8},
                                                                #  "proprio": {field: [floats]}}
        @seq.step
        def step(self, action: list[float]): ...                # apply one row for one control period
        @seq.check
        def check(self) -> tuple[bool, dict]: ...               # (episode over?, metrics so far)
        @seq.score
        def score(self, metrics: dict) -> dict: ...             # optional: the episode's final metrics
        @seq.render
        def render(self): ...                                   # optional: an HxWx3 frame for videos

The metric names are the benchmark's own (``"success"`` is whatever ``check``/``score`` call
it); the runner averages each over episodes, overall and per task. The declared observation
and action contracts are what the eval compares with a deployed policy's before anything runs.
Nothing here imports a simulator: the class is only inspected until the runner instantiates it.
"""
from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ._contracts import ActionContract, ObservationContract
from ._errors import DeclarationError
from ._params import InferParam, discover_params
from ._policy import stage_marker

__all__ = ["benchmark", "Benchmark", "BenchmarkSpec", "setup", "reset", "observe", "step", "check",
           "score", "render", "is_benchmark", "get_benchmark_spec"]

_MARK = "__seq_benchmark_stage__"
_STAGES = ("setup", "reset", "observe", "step", "check", "score", "render")
_REQUIRED = ("reset", "observe", "step", "check")
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_WHAT = {
    "setup": "builds the simulator once per env (its keywords with defaults are eval parameters)",
    "reset": "starts an episode: reset(task_id, seed)",
    "observe": "returns {'images': {view: frame}, 'proprio': {field: values}}",
    "step": "applies one action row for one control period",
    "check": "returns (done, metrics) after each step",
    "score": "turns the last check's metrics into the episode's final metrics",
    "render": "returns an HxWx3 uint8 frame for the episode video",
}


class Benchmark:
    """Optional base class for a benchmark; ``@seq.benchmark`` is what makes a class one."""


def _marker(stage: str) -> Callable:
    return stage_marker(stage, _MARK, "benchmark stage", f"Mark the benchmark method that {_WHAT[stage]}.")


setup = _marker("setup")
reset = _marker("reset")
observe = _marker("observe")
step = _marker("step")
check = _marker("check")
score = _marker("score")
render = _marker("render")


@dataclass
class BenchmarkSpec:
    """A validated ``@seq.benchmark`` declaration.

    Attributes:
        name: registry name (lower-case, digits, dashes), e.g. ``"pick-place"``.
        tasks: task id -> instruction text, in declaration order.
        observation / action: what the benchmark provides and consumes (the policy's contract
            must agree; see ``contract_problems``).
        methods: stage -> method name.
        params: the ``@seq.setup`` keywords (eval parameters), as ``InferParam``.
        metrics: the metric names the benchmark reports (for the report's column order).
        primary_metric: the metric a bare ``--gate`` and the summary line use (default "success").
        episode_s_estimate: wall-clock seconds one episode takes, used by ``--dry-run`` until the
            store has measured ones.
        video_fps: frames per second of the recorded videos (one frame per ``1/video_fps`` s of
            simulated time).
    """

    name: str
    class_name: str
    module: str
    tasks: dict[str, str]
    observation: ObservationContract
    action: ActionContract
    methods: dict[str, str]
    params: list[InferParam]
    metrics: list[str] = field(default_factory=list)
    primary_metric: str = "success"
    episode_s_estimate: float = 30.0
    video_fps: float = 7.5

    @property
    def control_period_s(self) -> float:
        """Seconds of simulated time one ``step`` covers: 1 / the action contract's rate."""
        return 1.0 / self.action.control_frequency_hz

    def to_dict(self) -> dict:
        return {"name": self.name, "class_name": self.class_name, "module": self.module,
                "tasks": dict(self.tasks), "metrics": list(self.metrics), "primary_metric": self.primary_metric,
                "contract": {"observation": self.observation.to_dict(), "action": self.action.to_dict()},
                "methods": dict(self.methods), "params": [p.to_dict() for p in self.params],
                "episode_s_estimate": self.episode_s_estimate, "video_fps": self.video_fps}


def _stages(cls: type) -> dict[str, str]:
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            stage = getattr(value, _MARK, None)
            if stage is None:
                continue
            if found.get(stage) not in (None, attr) and klass is cls and found[stage] in vars(cls):
                raise DeclarationError(f"@seq.{stage}", f"both {found[stage]}() and {attr}() are marked",
                                       f"mark exactly one method @seq.{stage}")
            found[stage] = attr
    return found


def benchmark(*, name: str, tasks: Mapping[str, str], observation: ObservationContract, action: ActionContract,
              metrics: Optional[list[str]] = None, primary_metric: str = "success",
              episode_s_estimate: float = 30.0, video_fps: float = 7.5) -> Callable[[type], type]:
    """Declare a benchmark class (see the module docstring for the lifecycle).

    Args:
        name: registry name, lower-case letters, digits and dashes (``seq eval run --benchmark``).
        tasks: task id -> instruction; the instruction is what the policy is asked to do.
        observation: the cameras (exact frame sizes) and proprioception fields ``observe`` returns.
        action: the action rows ``step`` accepts (space, width, control_frequency_hz in Hz).
        metrics: metric names in report order (default: whatever ``check``/``score`` return).
        primary_metric: the headline metric (default ``"success"``).
        episode_s_estimate: expected wall-clock seconds per episode (s) for ``--dry-run``.
        video_fps: video frame rate (Hz of simulated time) when ``--videos`` is asked for.

    Raises:
        DeclarationError: a malformed argument or a missing required stage, naming the fix.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise DeclarationError("name", f"{name!r} is not a benchmark name", 'use lower-case letters, digits and dashes, e.g. "pick-place"')
    if not isinstance(tasks, Mapping) or not tasks:
        raise DeclarationError("tasks", "needs at least one task", 'write tasks={"red-on-green": "put the red cube on the green pad"}')
    for tid, text in tasks.items():
        if not isinstance(tid, str) or not _TASK_ID.match(tid):
            raise DeclarationError("tasks", f"task id {tid!r} is not a plain name", "use letters, digits, '-', '_' or '.'")
        if not isinstance(text, str) or not text.strip():
            raise DeclarationError("tasks", f"task {tid!r} has no instruction text")
    if not isinstance(observation, ObservationContract):
        raise DeclarationError("observation", "expected a seq.ObservationContract")
    if not isinstance(action, ActionContract):
        raise DeclarationError("action", "expected a seq.ActionContract")
    for arg, value in (("episode_s_estimate", episode_s_estimate), ("video_fps", video_fps)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise DeclarationError(arg, f"expected a positive number, got {value!r}")

    def decorate(cls: type) -> type:
        if not inspect.isclass(cls):
            raise DeclarationError("@seq.benchmark", f"decorates a class, got {cls!r}")
        stages = _stages(cls)
        for stage in _REQUIRED:
            if stage not in stages:
                raise DeclarationError(cls.__name__, f"no method is marked @seq.{stage}",
                                       f"add `@seq.{stage}` above the method that {_WHAT[stage]}")
        params: list[InferParam] = []
        if "setup" in stages:
            fn = getattr(cls, stages["setup"])
            sig = inspect.signature(fn)
            positional = [p for p in list(sig.parameters.values())[1:]
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            if positional:
                raise DeclarationError(f"{cls.__name__}.{stages['setup']}", "setup takes keyword arguments only",
                                       f"write `def {stages['setup']}(self, *, {positional[0].name}=...)`")
            # discover_params skips one leading positional (a policy's observation): give it self only.
            params = discover_params(fn, where=f"{cls.__name__}.{stages['setup']}")
        cls.__seq_benchmark__ = BenchmarkSpec(
            name=name, class_name=cls.__name__, module=cls.__module__, tasks=dict(tasks),
            observation=observation, action=action, methods=stages, params=params,
            metrics=list(metrics or []), primary_metric=primary_metric,
            episode_s_estimate=float(episode_s_estimate), video_fps=float(video_fps))
        return cls
    return decorate


def is_benchmark(obj: Any) -> bool:
    """True for a class decorated with ``@seq.benchmark``."""
    return inspect.isclass(obj) and isinstance(getattr(obj, "__seq_benchmark__", None), BenchmarkSpec)


def get_benchmark_spec(cls: type) -> BenchmarkSpec:
    """The ``BenchmarkSpec`` of a decorated class; TypeError for anything else."""
    if not is_benchmark(cls):
        raise TypeError(f"{cls!r} is not a @seq.benchmark class")
    return cls.__seq_benchmark__


def contract_problems(bench: BenchmarkSpec, policy_contract: Optional[Mapping[str, Any]]) -> list[str]:
    """Why a policy (its wire contract ``{"action": {...}, "observation": {...}}``) cannot be run on
    ``bench`` without an adapter; empty when they agree.

    Checked: robot, action space, action width and control frequency; every camera the policy reads
    is rendered at its exact size (and with depth if it asks); every proprioception field it reads
    is reported with its width; the history it wants (the runner sends one frame).
    """
    problems: list[str] = []
    contract = policy_contract or {}
    act, obs = contract.get("action"), contract.get("observation")
    b_act, b_obs = bench.action, bench.observation
    if not act:
        problems.append("the policy declares no action contract, so its rows cannot be checked against "
                        f"{bench.name}'s {b_act.action_space.value} x{b_act.action_dim}")
    else:
        if act.get("robot") and b_act.robot and act["robot"] != b_act.robot:
            problems.append(f"robot: the policy drives {act['robot']!r}, {bench.name} simulates {b_act.robot!r}")
        if act.get("action_space") != b_act.action_space.value:
            problems.append(f"action space: the policy returns {act.get('action_space')}, "
                            f"{bench.name} takes {b_act.action_space.value}")
        if act.get("action_dim") != b_act.action_dim:
            problems.append(f"action width: the policy returns {act.get('action_dim')} numbers a row, "
                            f"{bench.name} takes {b_act.action_dim}")
        hz = act.get("control_frequency_hz")
        if hz is None or abs(float(hz) - b_act.control_frequency_hz) > 1e-6:
            problems.append(f"control frequency: the policy's rows are for {hz} Hz, "
                            f"{bench.name} steps at {b_act.control_frequency_hz:g} Hz")
    if not obs:
        problems.append("the policy declares no observation contract (raw infer): an adapter must build its input")
        return problems
    have = b_obs.cameras
    for view, cam in (obs.get("cameras") or {}).items():
        mine = have.get(view)
        if mine is None:
            problems.append(f"camera {view!r}: the policy reads it, {bench.name} renders only {sorted(have)}")
        elif (mine.width, mine.height) != (cam["width"], cam["height"]):
            problems.append(f"camera {view!r}: the policy wants {cam['width']}x{cam['height']}, "
                            f"{bench.name} renders {mine.width}x{mine.height}")
        elif cam.get("depth") and not mine.depth:
            problems.append(f"camera {view!r}: the policy wants depth, {bench.name} renders colour only")
    for name, width in (obs.get("proprio") or {}).items():
        mine = b_obs.proprio.get(name)
        if mine is None:
            problems.append(f"proprio {name!r}: the policy reads it, {bench.name} reports only {sorted(b_obs.proprio)}")
        elif int(mine) != int(width):
            problems.append(f"proprio {name!r}: the policy wants {width} values, {bench.name} reports {mine}")
    if int(obs.get("history") or 1) > b_obs.history:
        problems.append(f"history: the policy wants {obs.get('history')} frames per camera, "
                        f"{bench.name} provides {b_obs.history}")
    return problems
