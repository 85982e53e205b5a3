"""``@seq.policy`` and the lifecycle markers: turning a class into something a worker can host.

The decorator validates every argument when the module is imported and records the result as
``cls.__seq_spec__`` (a ``PolicySpec``). Arguments that mean nothing self-hosted (gpu type,
region, image, ...) are validated and recorded, not dropped, so ``seq policy status`` shows
them. The worker reads only the spec: which methods are load/infer/..., the contracts, the
inference parameters and the timeouts.
"""
from __future__ import annotations

import difflib
import inspect
import math
import re
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ._contracts import ActionContract, ObservationContract
from ._errors import DeclarationError
from ._params import InferParam, delay_inputs, discover_params
from ._resources import Image, Secret, Timeouts, Volume, Weights, check_weight_uri
from ._scaling import Batching, Concurrency, batching_of, check_scaling, concurrency_of, gpu_count
from ._types import ActionChunk, Observation

__all__ = ["policy", "Policy", "PolicySpec", "load", "warmup", "infer", "on_episode", "shutdown",
           "is_policy", "get_spec"]

_STAGES = ("load", "warmup", "infer", "on_episode", "shutdown")
_REQUIRED = ("load", "infer")
_MARK = "__seq_stage__"
_GPU = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(:[1-9][0-9]*)?$")
_PART = re.compile(r"^[a-z][a-z0-9_-]*$")
_WEIGHT_SCHEMES = ("hf://", "vol://", "template://", "file://")
_DEPRECATED_SCHEMES = ("https://", "http://", "s3://", "gs://")


class Policy:
    """Optional base class for a policy; the decorator is what makes a class servable."""


def stage_marker(stage: str, attr: str, kind: str, doc: str) -> Callable:
    """Build the ``@seq.<stage>`` decorator that tags a method with ``attr = stage``.

    Shared by the policy lifecycle (``attr`` ``__seq_stage__``) and the benchmark stages
    (``__seq_benchmark_stage__``). Raises ``DeclarationError`` at decoration time when the target
    is not callable or already carries another stage of the same ``kind``.
    """
    def mark(fn: Callable) -> Callable:
        if not callable(fn):
            raise DeclarationError(f"@seq.{stage}", f"must decorate a method, got {fn!r}")
        current = getattr(fn, attr, None)
        if current not in (None, stage):
            raise DeclarationError(f"@seq.{stage}", f"{fn.__name__} is already marked @seq.{current}",
                                   f"each method has one {kind}")
        setattr(fn, attr, stage)
        return fn
    mark.__name__ = stage
    mark.__doc__ = doc
    return mark


def _marker(stage: str) -> Callable:
    return stage_marker(stage, _MARK, "lifecycle stage",
                        f"Mark the method that runs at the {stage} stage of the worker's lifecycle.")


load = _marker("load")
warmup = _marker("warmup")
infer = _marker("infer")
on_episode = _marker("on_episode")
shutdown = _marker("shutdown")


@dataclass
class PolicySpec:
    """Everything a declaration says, validated. ``to_dict()`` is what the gateway stores."""

    class_name: str
    module: str
    methods: dict[str, str]                     # stage -> method name
    action: Optional[ActionContract]
    observation: Optional[ObservationContract]
    params: list[InferParam]
    infer_mode: str                             # "observation" | "raw"
    timeouts: Timeouts
    idle_timeout: float = 600.0
    min_workers: int = 0
    buffer_workers: int = 0
    on_full: str = "queue"
    queue_timeout_s: float = 120.0
    streaming: bool = False
    weights: Any = None                         # None | str | {part: str}
    secrets: list[str] = field(default_factory=list)
    resources: dict[str, Any] = field(default_factory=dict)   # recorded only: gpu, max_gpus, cpu, memory, image, deps, models, region
    batching: Optional[Batching] = None
    concurrency: Optional[Concurrency] = None
    delay_inputs: list[str] = field(default_factory=list)   # "prefix" / "delay_steps" infer() declares

    def slots(self) -> int:
        """Model copies one worker holds (self-hosted: one card)."""
        return self.concurrency.slots(gpu_count(self.resources.get("gpu"))) if self.concurrency else 1

    def to_dict(self) -> dict:
        return {
            "class_name": self.class_name,
            "module": self.module,
            "methods": dict(self.methods),
            "contract": {"action": self.action.to_dict() if self.action else None,
                         "observation": self.observation.to_dict() if self.observation else None},
            "params": [p.to_dict() for p in self.params],
            "infer_mode": self.infer_mode,
            "timeouts": self.timeouts.to_dict(),
            "idle_timeout": self.idle_timeout,
            "min_workers": self.min_workers,
            "buffer_workers": self.buffer_workers,
            "on_full": self.on_full,
            "queue_timeout_s": self.queue_timeout_s,
            "streaming": self.streaming,
            "weights": self.weights,
            "secrets": list(self.secrets),
            "resources": dict(self.resources),
            "batching": self.batching.to_dict() if self.batching else None,
            "concurrency": self.concurrency.to_dict() if self.concurrency else None,
            "delay_inputs": list(self.delay_inputs),
        }


# ---------------------------------------------------------------- argument validation

def _number(name: str, value: Any, *, positive: bool = True, example: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (positive and value <= 0):
        raise DeclarationError(name, f"expected a positive number, got {value!r}", f"write e.g. {name}={example}" if example else None)
    return float(value)


def _count(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DeclarationError(name, f"expected an integer >= {minimum}, got {value!r}")
    return value


def _strings(name: str, value: Any, example: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise DeclarationError(name, f"expected a list of non-empty strings, got {value!r}", f"write e.g. {name}={example}")
    return list(value)


def _check_gpu(value: Any) -> Any:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise DeclarationError("gpu", f"expected a card name or a list of them, got {value!r}", 'write e.g. gpu="L4" or gpu=["H100", "A100"]')
    counts = set()
    for item in items:
        if not isinstance(item, str) or not _GPU.match(item):
            raise DeclarationError("gpu", f"{item!r} is not a card name", 'write "TYPE" or "TYPE:N", e.g. "H100:2", or "cpu"')
        counts.add(item.split(":")[1] if ":" in item else "1")
    if len(counts) > 1:
        raise DeclarationError("gpu", f"fallback cards ask for different counts {sorted(counts)}", "every entry needs the same card count")
    return value if isinstance(value, str) else list(value)


def _check_cpu_mem(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise DeclarationError(name, f"expected a number or (request, limit), got {value!r}")
        request, limit = (_number(name, v, example="(2, 4)") for v in value)
        if request > limit:
            raise DeclarationError(name, f"request {request} is above limit {limit}", "write (request, limit) with request <= limit")
        return [request, limit]
    return _number(name, value, example="4")


def _weight_ref(name: str, value: Any) -> str:
    if isinstance(value, (Volume, Weights)):
        return value.uri()
    if isinstance(value, str) and value.strip():
        if value.startswith(_DEPRECATED_SCHEMES):
            warnings.warn(f"{name}: weights from {value.split('://')[0]}:// URLs are deprecated; "
                          "put the files in a local directory or a volume", DeprecationWarning, stacklevel=4)
            return value
        return check_weight_uri(name, value)
    raise DeclarationError(name, f"expected hf://..., vol://..., template://..., a local directory, "
                                 f"seq.Volume or seq.Weights, got {value!r}")


def _check_weights(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, Mapping):
        if not value or len(value) > 8:
            raise DeclarationError("weights", f"{len(value)} parts; a dict of weights holds 1 to 8 named parts")
        out = {}
        for part, ref in value.items():
            if not isinstance(part, str) or not _PART.match(part):
                raise DeclarationError("weights", f"part name {part!r} is not valid", "name parts [a-z][a-z0-9_-]*")
            out[part] = _weight_ref(f"weights[{part!r}]", ref)
        return out
    return _weight_ref("weights", value)


def _check_secrets(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise DeclarationError("secrets", f"expected a list, got {value!r}", 'write secrets=[seq.Secret.from_name("hf")]')
    out = []
    for item in value:
        if isinstance(item, Secret):
            out.append(item.name)
        elif isinstance(item, str):
            out.append(Secret.from_name(item).name)
        else:
            raise DeclarationError("secrets", f"{item!r} is not a secret", 'write seq.Secret.from_name("name")')
    return out


def _check_image(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, Image):
        return value.to_dict()
    if isinstance(value, str) and value.strip():
        return {"base": value, "steps": []}
    raise DeclarationError("image", f"expected seq.Image or an image reference string, got {value!r}",
                           "write e.g. image=seq.Image.debian_slim().apt_install(\"libgl1\")")


def _check_timeouts(value: Any) -> Timeouts:
    if value is None:
        return Timeouts()
    if isinstance(value, Timeouts):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"startup", "request"}
        if unknown:
            raise DeclarationError("timeouts", f"unknown key(s) {sorted(unknown)}", "use startup= and request=")
        return Timeouts(**value)
    raise DeclarationError("timeouts", f"expected seq.Timeouts, got {value!r}", "write timeouts=seq.Timeouts(startup=900, request=5)")


_ARGS = ("gpu", "max_gpus", "cpu", "memory", "image", "weights", "secrets", "action", "observation",
         "timeouts", "idle_timeout", "min_workers", "buffer_workers", "on_full", "queue_timeout_s",
         "streaming", "deps", "models", "region")


def _validate_args(kw: dict[str, Any]) -> dict[str, Any]:
    unknown = [k for k in kw if k not in _ARGS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], _ARGS, n=1)
        raise DeclarationError(unknown[0], "is not an argument of @seq.policy",
                               f"did you mean {close[0]}=?" if close else f"arguments are: {', '.join(_ARGS)}")
    out: dict[str, Any] = {}
    out["gpu"] = _check_gpu(kw.get("gpu"))
    out["max_gpus"] = None if kw.get("max_gpus") is None else _count("max_gpus", kw["max_gpus"], minimum=1)
    out["cpu"] = _check_cpu_mem("cpu", kw.get("cpu"))
    out["memory"] = _check_cpu_mem("memory", kw.get("memory"))
    out["image"] = _check_image(kw.get("image"))
    out["weights"] = _check_weights(kw.get("weights"))
    out["secrets"] = _check_secrets(kw.get("secrets"))
    action = kw.get("action")
    if isinstance(action, Mapping):
        action = ActionContract.from_dict(action)
    if action is not None and not isinstance(action, ActionContract):
        raise DeclarationError("action", f"expected seq.ActionContract, got {action!r}",
                               "write action=seq.ActionContract(robot=..., action_space=..., action_dim=..., control_frequency_hz=...)")
    out["action"] = action
    observation = kw.get("observation")
    if isinstance(observation, Mapping):
        observation = ObservationContract.from_dict(observation)
    if observation is not None and not isinstance(observation, ObservationContract):
        raise DeclarationError("observation", f"expected seq.ObservationContract, got {observation!r}",
                               "write observation=seq.ObservationContract(cameras={...}, proprio={...})")
    out["observation"] = observation
    out["timeouts"] = _check_timeouts(kw.get("timeouts"))
    out["idle_timeout"] = _number("idle_timeout", kw.get("idle_timeout", 600.0), example="600")
    out["min_workers"] = _count("min_workers", kw.get("min_workers", 0), minimum=0)
    out["buffer_workers"] = _count("buffer_workers", kw.get("buffer_workers", 0), minimum=0)
    on_full = kw.get("on_full", "queue")
    if on_full not in ("queue", "reject"):
        raise DeclarationError("on_full", f"unknown value {on_full!r}", 'use "queue" (the default) or "reject"')
    out["on_full"] = on_full
    out["queue_timeout_s"] = _number("queue_timeout_s", kw.get("queue_timeout_s", 120.0), example="120")
    streaming = kw.get("streaming", False)
    if not isinstance(streaming, bool):
        raise DeclarationError("streaming", f"expected True or False, got {streaming!r}")
    out["streaming"] = streaming
    out["deps"] = None if kw.get("deps") is None else _strings("deps", kw["deps"], '["einops==0.8.0"]')
    out["models"] = None if kw.get("models") is None else _strings("models", kw["models"], '["qwen3-8-27b"]')
    region = kw.get("region")
    if region is not None and (not isinstance(region, str) or not region.strip()):
        raise DeclarationError("region", f"expected a region name, got {region!r}", 'write e.g. region="eu"')
    out["region"] = region
    return out


# ---------------------------------------------------------------- the class decorator

def _find_stages(cls: type) -> dict[str, str]:
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            stage = getattr(fn, _MARK, None)
            if stage is None:
                continue
            previous = found.get(stage)
            if previous is not None and previous != attr and klass is cls and previous in vars(cls):
                raise DeclarationError(f"@seq.{stage}", f"both {previous}() and {attr}() are marked",
                                       f"mark exactly one method @seq.{stage}")
            found[stage] = attr
    return found


def _infer_mode(fn: Callable, observation: Optional[ObservationContract]) -> str:
    if observation is not None:
        return "observation"
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    first = hints.get(params[0].name) if params else None
    if first is Observation or hints.get("return") is ActionChunk:
        return "observation"
    return "raw"


def policy(cls: Optional[type] = None, /, **kwargs: Any) -> Any:
    """Declare a servable policy class. See the module docstring and docs/design.md."""
    if cls is not None:  # bare @seq.policy
        return _decorate(cls, _validate_args({}))
    args = _validate_args(kwargs)

    def decorate(klass: type) -> type:
        return _decorate(klass, args)
    return decorate


def _decorate(cls: Any, args: dict[str, Any]) -> type:
    if not inspect.isclass(cls):
        raise DeclarationError("@seq.policy", f"decorates a class, got {cls!r}", "put it above `class MyPolicy(seq.Policy):`")
    stages = _find_stages(cls)
    missing = [s for s in _REQUIRED if s not in stages]
    if missing:
        raise DeclarationError(f"{cls.__name__}", f"no method is marked @seq.{missing[0]}",
                               f"add `@seq.{missing[0]}` above the method that " +
                               ("loads the model (it receives weights_dir)" if missing[0] == "load" else "turns an observation into an ActionChunk"))
    if args["streaming"] and "on_episode" not in stages:
        raise DeclarationError("streaming", "streaming=True needs an @seq.on_episode method",
                               "add one that frees an episode's state, or drop streaming=True")
    infer_fn = getattr(cls, stages["infer"])
    params = discover_params(infer_fn, where=f"{cls.__name__}.{stages['infer']}")
    takes = delay_inputs(infer_fn)
    action = args["action"]
    if action is not None and action.delay_aware and "prefix" not in takes:
        raise DeclarationError(f"{cls.__name__}.{stages['infer']}",
                               f"the contract declares delay_modes {list(action.delay_modes)} but infer() takes no prefix",
                               "add `prefix=None, delay_steps=0` to infer's keyword arguments, or declare delay_modes=(\"chunk\",)")
    batching = batching_of(infer_fn)
    if batching is not None and args["streaming"]:
        raise DeclarationError("@seq.batched", "is not for streaming=True: a stateful episode owns its replica",
                               "drop @seq.batched, or drop streaming=True and keep state out of the class")
    load_fn = getattr(cls, stages["load"])
    n_load_args = len([p for p in inspect.signature(load_fn).parameters.values()
                       if p.name != "self" and p.default is inspect.Parameter.empty
                       and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])
    if n_load_args > 1:
        raise DeclarationError(f"{cls.__name__}.{stages['load']}", "takes more than one argument",
                               "define it as `def load(self, weights_dir):`")
    spec = PolicySpec(
        class_name=cls.__name__,
        module=cls.__module__,
        methods=stages,
        action=args["action"],
        observation=args["observation"],
        params=params,
        infer_mode=_infer_mode(infer_fn, args["observation"]),
        timeouts=args["timeouts"],
        idle_timeout=args["idle_timeout"],
        min_workers=args["min_workers"],
        buffer_workers=args["buffer_workers"],
        on_full=args["on_full"],
        queue_timeout_s=args["queue_timeout_s"],
        streaming=args["streaming"],
        weights=args["weights"],
        secrets=args["secrets"],
        resources={k: args[k] for k in ("gpu", "max_gpus", "cpu", "memory", "image", "deps", "models", "region")},
        batching=batching,
        concurrency=concurrency_of(cls),
        delay_inputs=takes,
    )
    check_scaling(spec.resources.get("gpu"), spec.concurrency, batching)
    cls.__seq_spec__ = spec
    return cls


def is_policy(obj: Any) -> bool:
    return inspect.isclass(obj) and isinstance(getattr(obj, "__dict__", {}).get("__seq_spec__"), PolicySpec)


def get_spec(cls: type) -> PolicySpec:
    if not is_policy(cls):
        raise DeclarationError(getattr(cls, "__name__", repr(cls)), "is not decorated with @seq.policy")
    return cls.__dict__["__seq_spec__"]
