"""Declarations of things a policy needs from outside its code: timeouts, weights, secrets, an image.

All of them are pure data. Self-hosted, the image, GPU type and region are recorded on the
policy's spec (shown by ``seq policy status``) but change nothing; weights that name a local
directory are handed to ``load`` as they are, and a secret is read from the environment variable
of the same name in upper case.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ._errors import DeclarationError

__all__ = ["Timeouts", "Secret", "Volume", "Weights", "Image"]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Timeouts:
    """startup: seconds a worker may take to load (default 1800); request: seconds one
    inference may take (default 300)."""

    startup: float = 1800.0
    request: float = 300.0

    def __post_init__(self) -> None:
        for name in ("startup", "request"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise DeclarationError(f"Timeouts.{name}", f"expected a positive number of seconds, got {value!r}")
            object.__setattr__(self, name, float(value))

    def to_dict(self) -> dict:
        return {"startup": self.startup, "request": self.request}


def _check_name(kind: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise DeclarationError(f"{kind}.from_name", f"{name!r} is not a valid name",
                               "use letters, digits, '_', '-' or '.', starting with a letter")
    return name


@dataclass(frozen=True)
class Secret:
    """A secret referred to by name only; its value never appears in code."""

    name: str

    @classmethod
    def from_name(cls, name: str) -> "Secret":
        return cls(_check_name("Secret", name))

    def to_dict(self) -> dict:
        return {"secret": self.name}


@dataclass(frozen=True)
class Volume:
    """Weights uploaded under a name (``vol://name@vN``)."""

    name: str
    version: Optional[int] = None

    @classmethod
    def from_name(cls, name: str, version: Optional[int] = None) -> "Volume":
        return cls(_check_name("Volume", name), version)

    def uri(self) -> str:
        return f"vol://{self.name}" + (f"@v{self.version}" if self.version is not None else "")


@dataclass(frozen=True)
class Weights:
    """A template's weights (``template://name@vN``)."""

    uri_: str

    @classmethod
    def template(cls, name: str, version: Optional[int] = None) -> "Weights":
        _check_name("Weights.template", name)
        return cls(f"template://{name}" + (f"@v{version}" if version is not None else ""))

    def uri(self) -> str:
        return self.uri_


@dataclass(frozen=True)
class Image:
    """A declarative container image: each method returns a new image with one more step."""

    base: str = "debian_slim"
    steps: tuple = field(default_factory=tuple)

    @classmethod
    def debian_slim(cls, python: str = "3.11") -> "Image":
        return cls(base=f"debian_slim(python={python})")

    @classmethod
    def from_registry(cls, ref: str) -> "Image":
        return cls(base=str(ref))

    def _with(self, kind: str, *args: Any, **kwargs: Any) -> "Image":
        return Image(self.base, self.steps + ((kind, tuple(str(a) for a in args),
                                               tuple(sorted((k, repr(v)) for k, v in kwargs.items()))),))

    def apt_install(self, *packages: str, **kw: Any) -> "Image":
        return self._with("apt_install", *packages, **kw)

    def pip_install(self, *packages: str, **kw: Any) -> "Image":
        return self._with("pip_install", *packages, **kw)

    def uv_pip_install(self, *packages: str, **kw: Any) -> "Image":
        return self._with("uv_pip_install", *packages, **kw)

    def run_commands(self, *commands: str, **kw: Any) -> "Image":
        return self._with("run_commands", *commands, **kw)

    def env(self, **variables: str) -> "Image":
        return self._with("env", **variables)

    def to_dict(self) -> dict:
        return {"base": self.base, "steps": [{"kind": k, "args": list(a)} for k, a, _ in self.steps]}
