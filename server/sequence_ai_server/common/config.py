"""The gateway's settings, read once: every ``SEQ_*`` (and ``SEQUENCES_HOME``) variable the
gateway and its worker launchers obey, parsed into one frozen :class:`ServerConfig` when the
gateway starts. Nothing else in the gateway reads ``os.environ`` for a setting; the launchers
still hand the environment on to the worker processes they start. The data dir has this one
home on the server side: the gateway's ``serve`` and a worker started without ``--weights-dir``
(``<data_dir>/weights/<name>``) both take ``ServerConfig.from_env().data_dir``.

| variable | field | default |
|---|---|---|
| ``SEQUENCES_HOME`` | ``data_dir`` | ``~/.sequence-ai`` |
| ``SEQ_LEASE_TTL_S`` | ``lease_ttl_s`` | 300 s |
| ``SEQ_MAX_GPUS`` | ``max_gpus`` | None (no cap on running workers) |
| ``SEQ_HEALTH_INTERVAL_S`` | ``health_interval_s`` | 2 s |
| ``SEQ_PING_TIMEOUT_S`` | ``ping_timeout_s`` | 5 s (one health /ping; an alive worker silent for two is jammed) |
| ``SEQ_GATEWAY_MAX_BODY_BYTES`` | ``max_body_bytes`` | None (the gateway's MAX_BODY_BYTES, 32 MiB) |
| ``SEQ_BACKEND`` | ``backend`` | ``local`` (``ray``: workers as Ray actors) |
| ``SEQ_RAY_ADDRESS`` | ``ray_address`` | ``local`` (a private loopback head) |
| ``SEQ_RAY_GPUS_PER_NODE`` | ``ray_gpus_per_node`` | 8 (cards in one machine of a Ray group) |
| ``SEQ_ALERT_BACKOFF_S`` | ``alert_backoff_s`` | ``0.5,1,2,4`` (waits before each webhook retry) |
| ``SEQ_CPU_WORKERS`` | ``cpu_workers`` | the machine's core count (the most workers one CPU policy runs at once) |
| ``SEQ_FAKE_GPUS`` | ``fake_gpus`` | None (the real cards: NVML, else nvidia-smi); ``L4,L4,H100`` presents those cards |
| ``SEQ_HEADER_TIMEOUT_S`` | ``header_timeout_s`` | 10 s (a request's headers must arrive within it; the worker reads it too) |
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from sequence_ai_server.common.header_timeout import HEADER_TIMEOUT_S, header_timeout_setting

__all__ = ["ServerConfig", "LEASE_TTL_S", "HEALTH_INTERVAL_S", "PING_TIMEOUT_S"]

LEASE_TTL_S = 300.0            # default lease; $SEQ_LEASE_TTL_S overrides (tests use a few seconds)
HEALTH_INTERVAL_S = 2.0        # how often running workers are pinged for a jammed inference
PING_TIMEOUT_S = 5.0           # one health /ping (each of connect, read, write) at most


def _data_dir_setting(environ: Optional[Mapping[str, str]] = None) -> Path:
    """``$SEQUENCES_HOME``, else ``~/.sequence-ai`` (user-expanded): the server's data dir."""
    env = os.environ if environ is None else environ
    return Path(env.get("SEQUENCES_HOME") or Path.home() / ".sequence-ai").expanduser()


def _number(env: Mapping[str, str], name: str, kind: type, default):
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a {'whole ' if kind is int else ''}number; "
                         f"unset it or give one (e.g. {name}={default if default is not None else 1})") from None


@dataclass(frozen=True)
class ServerConfig:
    """Every gateway setting (see the module table). Build it with :meth:`from_env`; the
    fields are plain values, so a test may construct one directly.

    ``lease_ttl_s`` (s): how long a lease lasts before it must be renewed. ``max_gpus``: the
    most workers that may run at once (None: no cap). ``health_interval_s`` (s): how often
    serving workers are pinged. ``ping_timeout_s`` (s): how long one health ping may take; an
    alive worker that answers none for two of them is jammed (gateway/health.py). ``max_body_bytes``: the largest request body the gateway reads
    (None: the gateway's MAX_BODY_BYTES). ``backend``: ``local`` or ``ray``. ``ray_address``:
    the Ray cluster (``local`` starts a private head). ``ray_gpus_per_node``: cards in one
    machine; a policy asking for more becomes a group of whole machines (launchers/ray.py).
    ``alert_backoff_s`` (s): the waits before each retry of a webhook delivery (alerts.py).
    ``fake_gpus``: card names (``NAME`` or ``NAME=GiB``) the gateway presents instead of the
    machine's cards, numbered from 0, for tests and CPU machines: workers are pinned to them as to
    real ones (ops/gpus.py).
    ``cpu_workers``: the most workers one CPU policy (``gpu="cpu"`` or none) may run at once; its
    ``max_gpus`` counts its workers, up to this (docs/guides/scaling.md).
    ``header_timeout_s`` (s): how long a connection may take to send a request's headers before
    it is answered 408 and closed (common/header_timeout.py)."""

    data_dir: Path = field(default_factory=_data_dir_setting)
    lease_ttl_s: float = LEASE_TTL_S
    max_gpus: Optional[int] = None
    health_interval_s: float = HEALTH_INTERVAL_S
    ping_timeout_s: float = PING_TIMEOUT_S
    max_body_bytes: Optional[int] = None
    backend: str = "local"
    ray_address: str = "local"
    ray_gpus_per_node: int = 8
    alert_backoff_s: tuple = (0.5, 1.0, 2.0, 4.0)
    fake_gpus: Optional[tuple] = None
    cpu_workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    header_timeout_s: float = HEADER_TIMEOUT_S

    @classmethod
    def from_env(cls, data_dir: Optional[Path] = None, environ: Optional[Mapping[str, str]] = None) -> "ServerConfig":
        """The settings from ``environ`` (default ``os.environ``); ``data_dir`` overrides
        ``$SEQUENCES_HOME``. Raises ValueError naming the variable whose value is not a number,
        an unknown ``SEQ_BACKEND``, or (backend ``ray``) a ``SEQ_RAY_GPUS_PER_NODE`` below 1."""
        env = os.environ if environ is None else environ
        backend = (env.get("SEQ_BACKEND") or "local").strip().lower() or "local"
        if backend not in ("local", "ray"):
            raise ValueError(f"unknown worker backend {backend!r}: use 'local' or 'ray'")
        return cls(
            data_dir=Path(data_dir).expanduser() if data_dir is not None else _data_dir_setting(env),
            lease_ttl_s=float(_number(env, "SEQ_LEASE_TTL_S", float, LEASE_TTL_S) or LEASE_TTL_S),
            max_gpus=_number(env, "SEQ_MAX_GPUS", int, None),
            health_interval_s=float(_number(env, "SEQ_HEALTH_INTERVAL_S", float, HEALTH_INTERVAL_S)
                                    or HEALTH_INTERVAL_S),
            ping_timeout_s=float(_number(env, "SEQ_PING_TIMEOUT_S", float, PING_TIMEOUT_S) or PING_TIMEOUT_S),
            max_body_bytes=_number(env, "SEQ_GATEWAY_MAX_BODY_BYTES", int, None) or None,
            backend=backend,
            ray_address=(env.get("SEQ_RAY_ADDRESS") or "local").strip() or "local",
            ray_gpus_per_node=gpus_per_node_setting(env) if backend == "ray" else 8,
            alert_backoff_s=_backoff(env),
            fake_gpus=fake_gpus_setting(env),
            cpu_workers=max(1, int(_number(env, "SEQ_CPU_WORKERS", int, None) or os.cpu_count() or 1)),
            header_timeout_s=header_timeout_setting(env),
        )


def fake_gpus_setting(env: Mapping[str, str]) -> Optional[tuple]:
    """``$SEQ_FAKE_GPUS`` in ``env`` as a tuple of card entries (None when unset or blank). Raises
    ValueError naming an empty entry or one whose ``=GiB`` is not a number above 0."""
    raw = (env.get("SEQ_FAKE_GPUS") or "").strip()
    if not raw:
        return None
    entries = tuple(e.strip() for e in raw.split(","))
    for e in entries:
        name, sep, mem = e.partition("=")
        bad = not name.strip()
        if sep and not bad:
            try:
                bad = not float(mem) > 0
            except ValueError:
                bad = True
        if bad:
            raise ValueError(f"SEQ_FAKE_GPUS={raw!r}: entry {e!r} is not a card name (or NAME=GiB); write e.g. "
                             f"SEQ_FAKE_GPUS=L4,L4,H100 or L4=24,H100=80")
    return entries


def gpus_per_node_setting(env: Mapping[str, str]) -> int:
    """``$SEQ_RAY_GPUS_PER_NODE`` in ``env`` (default 8). Raises ValueError for a value that is
    not a whole number >= 1."""
    raw = (env.get("SEQ_RAY_GPUS_PER_NODE") or "").strip()
    if not raw:
        return 8
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"SEQ_RAY_GPUS_PER_NODE={raw!r} is not a card count; set a whole number >= 1 (default 8)")
    return n


def _backoff(env: Mapping[str, str]) -> tuple:
    """``$SEQ_ALERT_BACKOFF_S`` (comma-separated seconds, default 0.5,1,2,4). Raises ValueError
    naming a value that is not a number >= 0."""
    raw = (env.get("SEQ_ALERT_BACKOFF_S") or "").strip()
    if not raw:
        return (0.5, 1.0, 2.0, 4.0)
    try:
        waits = tuple(float(x) for x in raw.split(",") if x.strip())
    except ValueError:
        waits = (-1.0,)
    if any(w < 0 for w in waits):
        raise ValueError(f"SEQ_ALERT_BACKOFF_S={raw!r} is not a list of seconds; write e.g. 0.5,1,2,4")
    return waits
