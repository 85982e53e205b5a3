"""Declarations of things a policy needs from outside its code: timeouts, weights, secrets, an image.

All of them are pure data. Self-hosted, the region is recorded on the policy's spec (shown by
``seq policy status``) but changes nothing; a GPU type is checked against this machine's cards
when the version loads; an image's ``pip_install`` / ``uv_pip_install`` / ``env`` steps are built
into a Python environment of its own (``sequence_ai_server/launchers/envs.py``), and ``apt_install``,
``run_commands`` and a registry base image are refused at deploy; weights that name a local
directory are handed to ``load`` as they are, and a secret is read from the environment variable
of the same name in upper case.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
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
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
            raise DeclarationError("Volume.from_name", f"version {version!r} is not an integer >= 1")
        return cls(_check_name("Volume", name), version)

    def uri(self) -> str:
        return f"vol://{self.name}" + (f"@v{self.version}" if self.version is not None else "")


# Templates whose weights a deployment may name (template://<name>@vN): name -> newest version.
TEMPLATE_WEIGHTS: dict[str, int] = {"pi05-droid": 1}


@dataclass(frozen=True)
class Weights:
    """A template's weights (``template://name@vN``); ``version=None`` takes the newest."""

    uri_: str

    @classmethod
    def template(cls, name: str, version: Optional[int] = None) -> "Weights":
        """Raises DeclarationError for a template that ships no weights or a bad version."""
        ref = f"template://{name}" + (f"@v{version}" if version is not None else "")
        return cls(check_weight_uri("Weights.template", ref))

    def uri(self) -> str:
        return self.uri_


_VERSION = re.compile(r"^v[1-9][0-9]*$")
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_REV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


def check_weight_uri(argument: str, ref: str) -> str:
    """Validate a weights reference and return it unchanged.

    Accepted: ``template://name[@vN]`` (a template that ships weights), ``hf://org/model[@rev]``,
    ``vol://name[@vN]``, ``file://DIR`` or a local directory path. Raises DeclarationError naming
    the problem for an unknown scheme, a ``..`` segment, an hf:// without a repo, an unknown
    template, or a malformed version.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise DeclarationError(argument, f"expected a weights reference, got {ref!r}")
    scheme, sep, rest = ref.partition("://")
    path_part = rest if sep else ref
    if ".." in path_part.replace("\\", "/").split("/"):
        raise DeclarationError(argument, f"{ref!r} contains a '..' path segment (traversal is refused)",
                               "name the directory or repository directly")
    if not sep:
        return ref                                     # a local directory (self-hosted)
    name, at, version = rest.partition("@")
    if scheme == "file":
        if not rest:
            raise DeclarationError(argument, "file:// names no directory", "write file:///abs/path/to/checkpoint")
        return ref
    if scheme == "hf":
        parts = name.split("/")
        if not name or len(parts) > 2 or not all(_HF_PART.match(p) for p in parts):
            raise DeclarationError(argument, f"{ref!r} names no Hugging Face repository" if not name
                                   else f"{name!r} is not a Hugging Face repository name",
                                   'write hf://org/model or hf://org/model@<revision>')
        if at and not _REV.match(version):
            raise DeclarationError(argument, f"revision {version!r} is empty or malformed", "write hf://org/model@main or @<commit>")
        return ref
    if scheme in ("vol", "template"):
        if not name or not _NAME.match(name):
            raise DeclarationError(argument, f"{ref!r}: {name!r} is not a {'volume' if scheme == 'vol' else 'template'} name",
                                   f"write {scheme}://name@v1")
        if at and not _VERSION.match(version):
            raise DeclarationError(argument, f"{ref!r}: version {version!r} is not vN", f"write {scheme}://{name}@v1")
        if scheme == "template":
            if name not in TEMPLATE_WEIGHTS:
                raise DeclarationError(argument, f"unknown template {name!r}",
                                       f"templates with weights: {', '.join(sorted(TEMPLATE_WEIGHTS))} (seq init --list)")
            if at and int(version[1:]) > TEMPLATE_WEIGHTS[name]:
                raise DeclarationError(argument, f"template {name!r} has no version {version}",
                                       f"the newest is v{TEMPLATE_WEIGHTS[name]}")
        return ref
    raise DeclarationError(argument, f"unknown weights scheme {scheme + '://'!r} in {ref!r}",
                           "use hf://org/model, vol://name, template://name, or a local directory")


# ---------------------------------------------------------------- the image spec

_PYTHONS = ("3.11", "3.12", "3.13", "image")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CREDENTIAL_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH)", re.I)
_CREDENTIAL_VALUE = re.compile(r"(^|[^A-Za-z0-9])(hf_[A-Za-z0-9]{20,}|ghp_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
                               r"|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9-]{10,}|seq_(live|local)_[A-Za-z0-9_-]{8,})")
_PACKAGE = re.compile(r"^[^\s'\"`$;&|<>]+$")


@dataclass(frozen=True)
class ImageStep:
    """One build step: kind (apt_install|pip_install|uv_pip_install|run_commands|env), its
    arguments, the secrets only this step sees, and (for env) the variables."""

    kind: str
    args: tuple = ()
    secrets: tuple = ()
    env: tuple = ()

    def to_dict(self) -> dict:
        out: dict = {"kind": self.kind, "args": list(self.args)}
        if self.secrets:
            out["secrets"] = list(self.secrets)
        if self.env:
            out["env"] = dict(self.env)
        return out


def _step_secrets(where: str, secrets: Any) -> tuple:
    if secrets is None:
        return ()
    if not isinstance(secrets, (list, tuple)):
        raise DeclarationError(f"Image.{where}(secrets=)", f"expected a list, got {secrets!r}",
                               'write secrets=[seq.Secret.from_name("gh")]')
    names = []
    for s in secrets:
        if isinstance(s, Secret):
            names.append(s.name)
        elif isinstance(s, str):
            names.append(Secret.from_name(s).name)
        else:
            raise DeclarationError(f"Image.{where}(secrets=)", f"{s!r} is not a secret", 'write seq.Secret.from_name("gh")')
    return tuple(names)


def _strings_arg(where: str, values: tuple, what: str, pattern: Optional[re.Pattern] = None) -> tuple:
    if not values:
        raise DeclarationError(f"Image.{where}", f"names no {what}")
    for v in values:
        if not isinstance(v, str) or not v.strip():
            raise DeclarationError(f"Image.{where}", f"{v!r} is not a {what}")
        if pattern is not None and not pattern.match(v):
            raise DeclarationError(f"Image.{where}", f"{v!r} is not a {what} (no spaces or shell characters)")
        if _CREDENTIAL_VALUE.search(v):
            raise DeclarationError(f"Image.{where}", f"{v[:12]!r}... looks like a credential written into the image",
                                   'declare it on the step instead: secrets=[seq.Secret.from_name("gh")] and refer to $GH_TOKEN')
    return tuple(values)


@dataclass(frozen=True)
class Image:
    """A declarative container image. Immutable: each method returns a new Image with one more
    step, in build order. Self-hosted, ``pip_install`` / ``uv_pip_install`` / ``env`` steps are built
    into a Python environment per image spec (the worker runs in it); ``apt_install``,
    ``run_commands`` and a registry base (``from_registry``) are refused at deploy, naming the step.
    ``seq image dockerfile FILE`` renders the whole image as a Dockerfile.

    python: "3.11" (default), "3.12", "3.13", or "image" (the base's own Python).
    Raises DeclarationError for an unknown python, an empty or shell-looking package name, or a
    credential in ``env`` (declare it as a step secret instead).
    """

    base: str = "debian_slim"
    python: Optional[str] = "3.11"
    steps: tuple = ()

    def __post_init__(self) -> None:
        if not isinstance(self.base, str) or not self.base.strip():
            raise DeclarationError("Image", f"base {self.base!r} is not an image reference")
        if self.python is not None and self.python not in _PYTHONS:
            raise DeclarationError("Image(python=)", f"{self.python!r} is not offered", f"use one of {', '.join(_PYTHONS)}")
        if not isinstance(self.steps, tuple) or not all(isinstance(s, ImageStep) for s in self.steps):
            raise DeclarationError("Image", "steps are built with the Image methods, not passed in")

    @classmethod
    def debian_slim(cls, python: str = "3.11") -> "Image":
        """A small pinned Debian (bookworm) base with the given Python."""
        return cls(base="debian_slim", python=python)

    @classmethod
    def from_registry(cls, ref: str, python: Optional[str] = None) -> "Image":
        """Any registry image, e.g. ``"nvidia/cuda:12.2.2-cudnn8-runtime-ubuntu22.04"``; python=None
        keeps the image's own Python."""
        if not isinstance(ref, str) or not ref.strip() or any(c.isspace() for c in ref):
            raise DeclarationError("Image.from_registry", f"{ref!r} is not an image reference", 'write e.g. "python:3.11-slim"')
        return cls(base=ref, python=python)

    def _add(self, step: ImageStep) -> "Image":
        return Image(self.base, self.python, self.steps + (step,))

    def apt_install(self, *packages: str, secrets: Any = None) -> "Image":
        return self._add(ImageStep("apt_install", _strings_arg("apt_install", packages, "package name", _PACKAGE),
                                   _step_secrets("apt_install", secrets)))

    def pip_install(self, *packages: str, secrets: Any = None) -> "Image":
        return self._add(ImageStep("pip_install", _strings_arg("pip_install", packages, "requirement", _PACKAGE),
                                   _step_secrets("pip_install", secrets)))

    def uv_pip_install(self, *packages: str, secrets: Any = None) -> "Image":
        return self._add(ImageStep("uv_pip_install", _strings_arg("uv_pip_install", packages, "requirement", _PACKAGE),
                                   _step_secrets("uv_pip_install", secrets)))

    def run_commands(self, *commands: str, secrets: Any = None) -> "Image":
        """Shell commands, in order. ``secrets=`` are seen by this step only, while it runs."""
        return self._add(ImageStep("run_commands", _strings_arg("run_commands", commands, "command"),
                                   _step_secrets("run_commands", secrets)))

    def env(self, variables: Optional[dict] = None, **more: str) -> "Image":
        """Build-time environment variables (ordinary values only: a credential is refused)."""
        items = {**(variables or {}), **more}
        if not items:
            raise DeclarationError("Image.env", "names no variables")
        for k, v in items.items():
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                raise DeclarationError("Image.env", f"{k!r} is not an environment variable name")
            if not isinstance(v, str):
                raise DeclarationError("Image.env", f"{k}: expected a string value, got {type(v).__name__}")
            if _CREDENTIAL_NAME.search(k) or _CREDENTIAL_VALUE.search(v):
                raise DeclarationError("Image.env", f"{k} looks like a credential; the image is not a place for secrets",
                                       'store it with `seq secret set` and declare secrets=[seq.Secret.from_name(...)]')
        return self._add(ImageStep("env", (), (), tuple(sorted(items.items()))))

    def to_dict(self) -> dict:
        return {"base": self.base, "python": self.python, "steps": [s.to_dict() for s in self.steps]}

    def dockerfile(self) -> str:
        """Render this spec as a Dockerfile (BuildKit: step secrets become secret mounts, read
        from ``/run/secrets/<name>`` as KEY=VALUE lines: ``docker build --secret id=gh,src=gh.env``)."""
        import json as _json
        import shlex
        lines = ["# syntax=docker/dockerfile:1", "# rendered by `seq image dockerfile`; build order = declaration order"]
        if self.base == "debian_slim":
            lines.append(f"FROM python:{self.python if self.python not in (None, 'image') else '3.11'}-slim-bookworm")
        else:
            lines.append(f"FROM {self.base}")
        uv_ready = False
        for step in self.steps:
            mounts = "".join(f" --mount=type=secret,id={n}" for n in step.secrets)
            prefix = "".join(f"set -a && . /run/secrets/{n} && set +a && " for n in step.secrets)

            def run(cmd: str) -> str:
                return f"RUN{mounts} " + (f"sh -c {shlex.quote(prefix + cmd)}" if step.secrets else cmd)
            if step.kind == "apt_install":
                lines.append(run("apt-get update && apt-get install -y --no-install-recommends "
                                 + " ".join(step.args) + " && rm -rf /var/lib/apt/lists/*"))
            elif step.kind == "pip_install":
                lines.append(run("python -m pip install --no-cache-dir " + " ".join(shlex.quote(a) for a in step.args)))
            elif step.kind == "uv_pip_install":
                if not uv_ready:
                    lines.append("RUN python -m pip install --no-cache-dir uv")
                    uv_ready = True
                lines.append(run("uv pip install --system " + " ".join(shlex.quote(a) for a in step.args)))
            elif step.kind == "run_commands":
                lines.extend(run(c) for c in step.args)
            elif step.kind == "env":
                lines.append("ENV " + " ".join(f"{k}={_json.dumps(v)}" for k, v in step.env))
        return "\n".join(lines) + "\n"
