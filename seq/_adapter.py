"""``@seq.adapter``: the bridge an eval runs between a benchmark and a policy that disagree.

An adapter belongs to neither side: it is the third thing an eval names (``seq eval run POLICY
--benchmark B --adapter NAME[@vN]``). It turns each benchmark observation into the policy's
input, and each answer of the policy into the rows the benchmark steps::

    @seq.adapter(name="toy-adapter", policy_io="contract")
    class ToyAdapter(seq.Adapter):
        def __init__(self, *, gripper_threshold: float = 0.5): ...   # keywords = eval params
                                                                     # (--param adapter.gripper_threshold=0.3)
        @seq.observation_step(lossy="the wrist camera is dropped: the policy reads one view")
        def one_camera(self, obs: dict) -> dict: ...

        @seq.action_step(lossless=True)
        def rows(self, actions): ...

Steps run in the order they are written, observation steps on what the benchmark's
``@seq.observe`` returned (``{"images": {view: HxWx3 uint8}, "proprio": {field: [floats]},
"instruction": str}``), action steps on the policy's answer. Every step says whether it loses
information: ``lossless=True``, or ``lossy="why"`` (the reason is shown by ``seq adapter show``,
``seq adapter check`` and the eval report's ``adapter_lossy``). A step that says neither is
refused at declaration.

``policy_io``:

- ``"contract"`` (default): the policy declares an I/O contract. The last observation step
  returns ``{"images": {view: frame}, "proprio": {field: values}}`` (``"instruction"`` optional)
  as that contract reads it; action steps get the chunk's rows (a list of lists, the policy's
  action space) and the last one returns the benchmark's rows.
- ``"own"``: the policy has its own inputs and outputs. The last observation step returns
  exactly the dict its infer takes (JSON values only); action steps get what infer returned,
  and the last one returns the benchmark's rows.

An action step that needs the benchmark's state (e.g. to turn a delta into a target) reads what
an observation step kept on ``self``: both run on one instance per env, observation first.

``seq deploy adapter.py`` registers the file as a version (the same file again is the version it
already is; nothing builds); ``seq adapter ls | show | pull | check`` manage them.
"""
from __future__ import annotations

import ast
import copy
import inspect
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ._errors import DeclarationError
from ._params import InferParam, discover_params

__all__ = ["adapter", "Adapter", "AdapterSpec", "AdapterStep", "observation_step", "action_step",
           "is_adapter", "get_adapter_spec", "file_declares_adapter", "load_adapter_file",
           "AdapterRuntime", "check_adapter", "POLICY_IO"]

POLICY_IO = ("contract", "own")
_STEP_MARK = "__seq_adapter_step__"
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


class Adapter:
    """Optional base class for an adapter; ``@seq.adapter`` is what makes a class one."""


@dataclass(frozen=True)
class AdapterStep:
    """One declared step: its side (``"observation"`` or ``"action"``), its method, and why it
    loses information (``reason``; None for a lossless step)."""

    kind: str
    method: str
    lossy: bool
    reason: Optional[str] = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "method": self.method, "lossy": self.lossy, "reason": self.reason}


def _step_marker(kind: str) -> Callable:
    def marker(fn: Optional[Callable] = None, *, lossy: Optional[str] = None, lossless: bool = False):
        def mark(f: Callable) -> Callable:
            if not callable(f):
                raise DeclarationError(f"@seq.{kind}_step", f"decorates a method, got {f!r}")
            if lossy is not None and (not isinstance(lossy, str) or not lossy.strip()):
                raise DeclarationError(f"@seq.{kind}_step({f.__name__})", "lossy= needs the reason as a sentence",
                                       'write lossy="the wrist camera is dropped: the policy reads one view"')
            if lossy is not None and lossless:
                raise DeclarationError(f"@seq.{kind}_step({f.__name__})", "says both lossy= and lossless=True",
                                       "keep the one that is true")
            if lossy is None and not lossless:
                raise DeclarationError(f"@seq.{kind}_step({f.__name__})", "does not say whether it loses information",
                                       f'write @seq.{kind}_step(lossless=True) or @seq.{kind}_step(lossy="why")')
            setattr(f, _STEP_MARK, (kind, lossy.strip() if lossy else None))
            return f
        if fn is not None:      # bare @seq.observation_step: refused with the fix
            return mark(fn)
        return mark
    marker.__name__ = f"{kind}_step"
    marker.__doc__ = (f"Mark an adapter method as a {kind} step; say ``lossless=True`` or ``lossy=\"why\"``. "
                      "Steps run in the order they are written.")
    return marker


observation_step = _step_marker("observation")
action_step = _step_marker("action")


@dataclass
class AdapterSpec:
    """A validated ``@seq.adapter`` declaration.

    Attributes:
        name: registry name (lower-case, digits, dashes), e.g. ``"toy-adapter"``.
        policy_io: ``"contract"`` or ``"own"`` (see the module docstring).
        steps: observation steps then action steps, each in written order.
        params: the ``__init__`` keywords (eval parameters ``adapter.<name>``), as ``InferParam``.
        description: the class docstring's first line.
    """

    name: str
    class_name: str
    module: str
    policy_io: str
    steps: list[AdapterStep]
    params: list[InferParam] = field(default_factory=list)
    description: str = ""

    @property
    def lossy(self) -> list[dict]:
        """Every lossy step with its reason: ``[{"kind", "method", "reason"}]`` (empty: lossless)."""
        return [{"kind": s.kind, "method": s.method, "reason": s.reason} for s in self.steps if s.lossy]

    def to_dict(self) -> dict:
        return {"name": self.name, "class_name": self.class_name, "module": self.module,
                "policy_io": self.policy_io, "steps": [s.to_dict() for s in self.steps],
                "params": [p.to_dict() for p in self.params], "lossy": self.lossy,
                "description": self.description}


def _steps(cls: type) -> list[AdapterStep]:
    seen: dict[str, AdapterStep] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            mark = getattr(value, _STEP_MARK, None)
            if mark is not None:
                seen.pop(attr, None)
                seen[attr] = AdapterStep(kind=mark[0], method=attr, lossy=mark[1] is not None, reason=mark[1])
    steps = list(seen.values())
    return [s for s in steps if s.kind == "observation"] + [s for s in steps if s.kind == "action"]


def adapter(*, name: str, policy_io: str = "contract") -> Callable[[type], type]:
    """Declare an adapter class (see the module docstring).

    Args:
        name: registry name, lower-case letters, digits and dashes (``--adapter NAME``).
        policy_io: ``"contract"`` (default: the policy declares an I/O contract) or ``"own"``
            (the policy takes and returns its own dicts; the adapter builds exactly what infer takes).

    Raises:
        DeclarationError: a malformed name or policy_io, no observation or no action step,
            ``__init__`` with positional arguments, naming the fix.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise DeclarationError("name", f"{name!r} is not an adapter name", 'use lower-case letters, digits and dashes, e.g. "toy-adapter"')
    if policy_io not in POLICY_IO:
        raise DeclarationError("policy_io", f"unknown value {policy_io!r}",
                               '"contract" (the policy declares a contract) or "own" (its own dict in, its own dict out)')

    def decorate(cls: type) -> type:
        if not inspect.isclass(cls):
            raise DeclarationError("@seq.adapter", f"decorates a class, got {cls!r}")
        steps = _steps(cls)
        for kind in ("observation", "action"):
            if not any(s.kind == kind for s in steps):
                raise DeclarationError(cls.__name__, f"no method is marked @seq.{kind}_step",
                                       f"add `@seq.{kind}_step(lossless=True)` (or lossy=\"why\") above the method "
                                       + ("that turns the benchmark's observation into the policy's input" if kind == "observation"
                                          else "that turns the policy's answer into the benchmark's rows"))
        params: list[InferParam] = []
        init = cls.__dict__.get("__init__")
        if init is not None:
            positional = [p for p in list(inspect.signature(init).parameters.values())[1:]
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            if positional:
                raise DeclarationError(f"{cls.__name__}.__init__", "takes keyword arguments only",
                                       f"write `def __init__(self, *, {positional[0].name}=...)`")
            params = discover_params(init, where=f"{cls.__name__}.__init__")
        doc = (inspect.getdoc(cls) or "").strip().splitlines()
        cls.__seq_adapter__ = AdapterSpec(name=name, class_name=cls.__name__, module=cls.__module__,
                                          policy_io=policy_io, steps=steps, params=params,
                                          description=doc[0] if doc else "")
        return cls
    return decorate


def is_adapter(obj: Any) -> bool:
    """True for a class decorated with ``@seq.adapter``."""
    return inspect.isclass(obj) and isinstance(getattr(obj, "__seq_adapter__", None), AdapterSpec)


def get_adapter_spec(cls: type) -> AdapterSpec:
    """The ``AdapterSpec`` of a decorated class; TypeError for anything else."""
    if not is_adapter(cls):
        raise TypeError(f"{cls!r} is not a @seq.adapter class")
    return cls.__seq_adapter__


def file_declares_adapter(path: Path) -> bool:
    """True when ``path`` (a .py file) has a class decorated ``@seq.adapter(...)`` / ``@adapter(...)``.
    Read with ``ast``: the file is not imported (a policy file may need a GPU to import)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if (isinstance(target, ast.Attribute) and target.attr == "adapter") or \
                        (isinstance(target, ast.Name) and target.id == "adapter"):
                    return True
    return False


def load_adapter_file(file: str, class_name: Optional[str] = None, module_name: Optional[str] = None) -> type:
    """Import ``file`` and return its ``@seq.adapter`` class (the named one, or the only one).

    Raises FileNotFoundError, LookupError (no / several / undecorated class), or whatever the
    module raises on import (a DeclarationError for a malformed declaration).
    """
    from ._files import import_file

    path = Path(file).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"adapter file not found: {path}")
    module = import_file(path, module_name or f"_seq_adapter_{path.stem}_{abs(hash(str(path))) % 10**8}")
    found = [v for v in vars(module).values() if is_adapter(v) and v.__module__ == module.__name__]
    if class_name:
        found = [c for c in found if c.__name__ == class_name]
        if not found:
            raise LookupError(f"{path.name} has no @seq.adapter class {class_name!r}")
    if not found:
        raise LookupError(f"{path.name} defines no @seq.adapter class")
    if len(found) > 1:
        raise LookupError(f"{path.name} defines several @seq.adapter classes "
                          f"({', '.join(sorted(c.__name__ for c in found))}); name one: FILE:Class")
    return found[0]


class AdapterRuntime:
    """One adapter instance, run by an eval env (or by ``seq adapter check``).

    Args:
        cls: the ``@seq.adapter`` class.
        params: its ``__init__`` keywords (already cast).
    """

    def __init__(self, cls: type, params: Optional[Mapping[str, Any]] = None) -> None:
        self.spec = get_adapter_spec(cls)
        self.inst = cls(**dict(params or {}))

    def _run(self, kind: str, value: Any) -> Any:
        for step in self.spec.steps:
            if step.kind == kind:
                value = getattr(self.inst, step.method)(value)
        return value

    def to_policy(self, observation: Mapping[str, Any]) -> Any:
        """The benchmark's observation (``{"images", "proprio", "instruction"}``) through every
        observation step: the policy's input. Raises whatever a step raises."""
        return self._run("observation", dict(observation))

    def to_benchmark(self, answer: Any) -> list[list[float]]:
        """The policy's answer (the chunk's rows, or its own outputs) through every action step:
        the benchmark's rows, as floats. Raises ValueError when the last step returns no rows."""
        rows = self._run("action", answer)
        try:
            out = [[float(x) for x in row] for row in rows]
        except TypeError:
            raise ValueError(f"{self.spec.name}'s action steps returned {type(rows).__name__}, "
                             "not a list of rows (one list of floats per benchmark step)") from None
        if not out:
            raise ValueError(f"{self.spec.name}'s action steps returned no rows")
        return out


def _sample_frame(width: int, height: int):
    import numpy as np
    return np.zeros((height, width, 3), dtype=np.uint8)


def _check_contract_observation(adapted: Mapping[str, Any], obs_c: Mapping[str, Any], problems: list,
                                notes: list) -> None:
    """Compare the adapter's observation with the policy's observation contract: every camera the
    policy reads at its size (height x width), every proprio key at its width. Appends what does
    not fit to ``problems`` and views the client will drop to ``notes``."""
    images = adapted.get("images") or {}
    for view, cam in (obs_c.get("cameras") or {}).items():
        frame = images.get(view)
        if frame is None:
            problems.append(f"camera {view!r}: the policy reads it, the adapter gives only {sorted(images)}")
            continue
        shape = tuple(getattr(frame, "shape", ()))
        if shape[:2] != (cam["height"], cam["width"]):
            problems.append(f"camera {view!r}: the policy wants {cam['width']}x{cam['height']}, "
                            f"the adapter gives {shape[1] if len(shape) > 1 else '?'}x{shape[0] if shape else '?'}")
    extra = sorted(set(images) - set(obs_c.get("cameras") or {}))
    if extra:
        notes.append(f"views the policy does not declare are dropped by the client: {extra}")
    proprio = adapted.get("proprio") or {}
    for name, width in (obs_c.get("proprio") or {}).items():
        got = proprio.get(name)
        if got is None:
            problems.append(f"proprio {name!r}: the policy reads it, the adapter gives only {sorted(proprio)}")
        elif len(list(got)) != int(width):
            problems.append(f"proprio {name!r}: the policy wants {width} values, the adapter gives {len(list(got))}")


def check_adapter(cls: type, bench: Any = None, policy_contract: Optional[Mapping[str, Any]] = None,
                  params: Optional[Mapping[str, Any]] = None) -> dict:
    """Classify every step, and with a benchmark spec and a policy's wire contract, run a sample
    of each side through the adapter and say where they do not fit. Sends nothing anywhere.

    The benchmark sample is black frames at its declared sizes and zero vectors; the policy
    sample is a two-row zero chunk of its declared action width.

    Returns ``{"steps": [...], "lossy": [...], "problems": [str], "notes": [str]}``; empty
    ``problems`` means the sample fit both sides.
    """
    spec = get_adapter_spec(cls)
    result = {"steps": [s.to_dict() for s in spec.steps], "lossy": spec.lossy, "problems": [], "notes": []}
    if bench is None:
        return result
    problems, notes = result["problems"], result["notes"]
    try:
        runtime = AdapterRuntime(cls, params)
    except Exception as exc:  # noqa: BLE001 - reported, not raised: this is a check
        problems.append(f"{spec.class_name}() failed: {type(exc).__name__}: {exc}")
        return result
    b_obs = bench.observation
    sample = {"images": {v: _sample_frame(c.width, c.height) for v, c in b_obs.cameras.items()},
              "proprio": {k: [0.0] * int(w) for k, w in b_obs.proprio.items()},
              "instruction": next(iter(bench.tasks.values()))}
    try:
        adapted = runtime.to_policy(copy.deepcopy(sample))
    except Exception as exc:  # noqa: BLE001
        problems.append(f"observation steps failed on {bench.name}'s sample: {type(exc).__name__}: {exc}")
        adapted = None
    contract = policy_contract or {}
    obs_c, act_c = contract.get("observation"), contract.get("action")
    if spec.policy_io == "contract" and adapted is not None:
        if not obs_c:
            problems.append('policy_io="contract", but the policy declares no observation contract '
                            '(write policy_io="own" for a policy with its own inputs)')
        elif not isinstance(adapted, Mapping):
            problems.append(f"observation steps returned {type(adapted).__name__}, not "
                            "{'images': {...}, 'proprio': {...}}")
        else:
            _check_contract_observation(adapted, obs_c, problems, notes)
    elif spec.policy_io == "own" and adapted is not None:
        import json
        try:
            json.dumps(adapted)
        except (TypeError, ValueError) as exc:
            problems.append(f"observation steps returned something that is not JSON ({exc}): "
                            'policy_io="own" sends it as the request body')
        notes.append('policy_io="own": the policy\'s inputs are its own format, so only the JSON shape was checked')
    b_act = bench.action
    if spec.policy_io == "contract":
        if not act_c:
            problems.append('policy_io="contract", but the policy declares no action contract')
            return result
        answer: Any = [[0.0] * int(act_c["action_dim"]) for _ in range(2)]
    else:
        notes.append('policy_io="own": no policy sample to run the action steps on; they run in the eval')
        return result
    try:
        rows = runtime.to_benchmark(answer)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"action steps failed on a {act_c['action_dim']}-wide sample chunk: {type(exc).__name__}: {exc}")
        return result
    widths = sorted({len(r) for r in rows})
    if widths != [b_act.action_dim]:
        problems.append(f"action rows: {bench.name} takes {b_act.action_dim} numbers a row, the adapter gives {widths}")
    if not all(math.isfinite(x) for r in rows for x in r):
        problems.append("action rows: the adapter's rows hold NaN or infinity for a zero chunk")
    hz = act_c.get("control_frequency_hz")
    if hz is not None and abs(float(hz) - b_act.control_frequency_hz) > 1e-6 and len(rows) == len(answer):
        notes.append(f"the policy's rows are for {hz} Hz and {bench.name} steps at {b_act.control_frequency_hz:g} Hz: "
                     "the adapter keeps one row per step")
    return result
