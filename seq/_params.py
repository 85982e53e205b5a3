"""Inference parameters: the keyword arguments of infer() that have defaults.

Discovered once, at declaration, from infer's signature. Each has a type (its annotation, else
its default's type; int, float, bool or str), a default, and optionally a ``seq.Range`` or
``seq.OneOf`` constraint written with ``typing.Annotated``. ``cast_params`` turns the ``params``
of a connect or /act request into the keyword arguments infer is called with, refusing unknown
names and values that do not fit, before any inference runs.
"""
from __future__ import annotations

import inspect
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ._errors import DeclarationError

__all__ = ["Range", "OneOf", "InferParam", "ParamError", "discover_params", "cast_params",
           "DELAY_INPUTS", "delay_inputs"]

#: Reserved keyword arguments of infer(): not inference parameters, filled by the worker from
#: the request's delay fields. ``prefix``: float32 array (k, action_dim), the committed rows
#: (None on a cold first request); ``delay_steps``: int >= 0, the estimated inference delay in
#: control steps at the contract's control frequency.
DELAY_INPUTS = ("prefix", "delay_steps")

_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


class ParamError(ValueError):
    """A request's params do not fit what infer declares (-> 400 invalid_request)."""

    def __init__(self, message: str, name: Optional[str] = None):
        super().__init__(message)
        self.name = name


@dataclass(frozen=True)
class Range:
    """Bounds a number: ``Annotated[int, seq.Range(1, 10)]`` or ``seq.Range(min=0.0)``."""

    min: Optional[float] = None
    max: Optional[float] = None

    def __post_init__(self) -> None:
        for name in ("min", "max"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise DeclarationError(f"Range({name}=)", f"expected a finite number, got {v!r}")
        if self.min is None and self.max is None:
            raise DeclarationError("Range", "bounds nothing", "write seq.Range(1, 10) or seq.Range(min=0.0)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise DeclarationError("Range", f"min {self.min} is above max {self.max}", "swap them")

    def allowed(self) -> str:
        if self.min is not None and self.max is not None:
            return f"allowed: {self.min:g} to {self.max:g}"
        return f"allowed: >= {self.min:g}" if self.min is not None else f"allowed: <= {self.max:g}"

    def check(self, value: Any) -> Optional[str]:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return f"is not a number ({self.allowed()})"
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            return f"is out of range ({self.allowed()})"
        return None

    def to_dict(self) -> dict:
        return {"range": [self.min, self.max]}


class OneOf:
    """Lists the values a parameter takes: ``Annotated[str, seq.OneOf("fast", "careful")]``."""

    def __init__(self, *values: Any):
        if not values:
            raise DeclarationError("OneOf", "needs at least one value")
        self.values = tuple(values)

    def check(self, value: Any) -> Optional[str]:
        return None if value in self.values else f"is not allowed (allowed: one of {list(self.values)})"

    def to_dict(self) -> dict:
        return {"one_of": list(self.values)}

    def __repr__(self) -> str:
        return f"OneOf{self.values!r}"


@dataclass(frozen=True)
class InferParam:
    name: str
    type: Optional[str]          # "int" | "float" | "bool" | "str" | None (any JSON value)
    default: Any
    nullable: bool = False
    constraint: Any = None       # Range | OneOf | None

    def to_dict(self) -> dict:
        out = {"name": self.name, "type": self.type, "default": self.default, "nullable": self.nullable}
        if self.constraint is not None:
            out.update(self.constraint.to_dict())
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "InferParam":
        constraint = None
        if "range" in data:
            constraint = Range(*data["range"])
        elif "one_of" in data:
            constraint = OneOf(*data["one_of"])
        return cls(data["name"], data.get("type"), data.get("default"), bool(data.get("nullable")), constraint)

    def cast(self, value: Any) -> Any:
        if value is None:
            if self.nullable or self.type is None:
                return None
            raise ParamError(f"param {self.name!r} is {self.type} and cannot be null", self.name)
        if self.type is None:
            return value
        cast = _CASTS[self.type]
        try:
            out = cast(value)
        except (TypeError, ValueError):
            raise ParamError(f"param {self.name!r} expects {self.type}, got {value!r}", self.name) from None
        if self.constraint is not None:
            problem = self.constraint.check(out)
            if problem:
                raise ParamError(f"param {self.name!r}={out!r} {problem}", self.name)
        return out


def _cast_int(v: Any) -> int:
    if isinstance(v, bool):
        raise TypeError
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        return int(v.strip())
    raise TypeError


def _cast_float(v: Any) -> float:
    if isinstance(v, bool):
        raise TypeError
    if isinstance(v, (int, float, str)):
        out = float(v)
        if not math.isfinite(out):
            raise ValueError
        return out
    raise TypeError


def _cast_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    raise ValueError


def _cast_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    raise TypeError


_CASTS: dict[str, Callable[[Any], Any]] = {"int": _cast_int, "float": _cast_float, "bool": _cast_bool, "str": _cast_str}


def _unwrap(annotation: Any) -> tuple[Any, bool, Any]:
    """-> (base type, nullable, constraint) from an annotation like Annotated[Optional[int], Range(..)]."""
    constraint = None
    nullable = False
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        for extra in extras:
            if isinstance(extra, (Range, OneOf)):
                constraint = extra
        annotation = base
    origin = typing.get_origin(annotation)
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        if len(args) == 1:
            inner, _, inner_constraint = _unwrap(args[0])
            return inner, nullable, constraint or inner_constraint
        return annotation, nullable, constraint
    return annotation, nullable, constraint


def discover_params(infer: Callable, where: str = "infer") -> list[InferParam]:
    """The inference parameters infer() declares: its arguments after the observation that have
    defaults. Refuses a type that is not int, float, bool or str (or Optional of one)."""
    sig = inspect.signature(infer)
    try:
        hints = typing.get_type_hints(infer, include_extras=True)
    except Exception:  # unresolved forward references: fall back to the raw annotations
        hints = {}
    params = list(sig.parameters.values())
    # skip self and the observation argument
    if params and params[0].name == "self":
        params = params[1:]
    if params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        params = params[1:]
    out = []
    for p in params:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if p.name in DELAY_INPUTS:
            continue
        if p.default is inspect.Parameter.empty:
            raise DeclarationError(f"{where}({p.name})", "an argument after the observation has no default",
                                   f"give it one (e.g. `*, {p.name}: int = 5`) so it becomes an inference parameter")
        annotation = hints.get(p.name, p.annotation)
        if annotation is inspect.Parameter.empty:
            base, nullable, constraint = (type(p.default) if p.default is not None else None), p.default is None, None
        else:
            base, nullable, constraint = _unwrap(annotation)
            if p.default is None:
                nullable = True
        if base is not None and base is not typing.Any:
            name = getattr(base, "__name__", None)
            if name not in _TYPES or _TYPES[name] is not base:
                raise DeclarationError(f"{where}({p.name})", f"parameter type {annotation!r} is not supported",
                                       "annotate it int, float, bool or str")
            type_name = name
        else:
            type_name = None
        if isinstance(constraint, Range) and type_name not in ("int", "float"):
            raise DeclarationError(f"{where}({p.name})", f"seq.Range bounds a number, but the parameter is {type_name or 'untyped'}",
                                   "annotate it Annotated[int, seq.Range(...)] or Annotated[float, seq.Range(...)]")
        if isinstance(constraint, OneOf) and type_name is not None:
            for v in constraint.values:
                try:
                    _CASTS[type_name](v)
                except (TypeError, ValueError):
                    raise DeclarationError(f"{where}({p.name})", f"seq.OneOf value {v!r} is not a {type_name}") from None
        param = InferParam(p.name, type_name, p.default, nullable, constraint)
        if p.default is not None and type_name is not None:
            try:
                param.cast(p.default)
            except ParamError as exc:
                raise DeclarationError(f"{where}({p.name})", f"default {p.default!r} does not fit: {exc}") from None
        out.append(param)
    return out


def delay_inputs(infer: Callable) -> list[str]:
    """The reserved delay inputs (``DELAY_INPUTS``) infer() declares, in that order."""
    names = inspect.signature(infer).parameters
    return [name for name in DELAY_INPUTS if name in names]


def cast_params(declared: list[InferParam], given: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """Cast the given params to their declared types; refuse names infer does not declare."""
    if not given:
        return {}
    if not isinstance(given, Mapping):
        raise ParamError(f"params must be an object of name -> value, got {type(given).__name__}")
    by_name = {p.name: p for p in declared}
    unknown = [k for k in given if k not in by_name]
    if unknown:
        known = ", ".join(sorted(by_name)) or "none"
        raise ParamError(f"unknown param(s) {sorted(unknown)}; this policy declares: {known}", unknown[0])
    return {k: by_name[k].cast(v) for k, v in given.items()}
