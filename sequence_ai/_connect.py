"""Entry points: connect() (sync Policy), aconnect() (AsyncPolicy), models() (the catalogue).

connect() and aconnect() take the same keyword options; they are declared, checked and
documented once, in ``sequence_ai_core.ConnectOptions`` (their ``help()`` signature is generated
from it). Defaults come from ``sequence_ai_core._config``: the key from ``api_key=`` then
``$SEQUENCES_API_KEY``; the gateway from ``gateway_url=`` then ``$SEQUENCES_GATEWAY_URL`` then
``http://127.0.0.1:8470``.
"""
from __future__ import annotations

import asyncio
import inspect
from typing import Any, List, Optional

from sequence_ai_core import AsyncPolicy, ConnectOptions, ModelInfo, fetch_models, resolve_gateway_url
from sequence_ai_core._options import options_signature

from ._sync import Policy

__all__ = ["connect", "aconnect", "models"]


def connect(model: str, **options: Any) -> Policy:
    """Connect to a deployed model and return a ``Policy`` (a context manager).

    Performs the gateway handshake now, so a wrong key or an unknown model fails here. A
    worker that is still loading does not fail it: ``run()``/``act()`` wait that out before the
    first action, ``wait_until_ready()`` blocks on it, ``predict()`` raises
    ``Unavailable(warming=True)``. A deployment whose every slot is taken puts the robot in line
    here, before its control loop starts (``on_queue``; Ctrl-C gives the place up).

    Args:
        model: the deployment name (``seq deploy`` / ``POST /v1/deployments``).
        **options: ``ConnectOptions`` fields: api_key, gateway_url, params, expect, validate,
            on_warming, on_queue, timeout_s, body_format (meaning and defaults there).

    Raises:
        AuthError: no key (the hint names the local key file) or a refused key.
        InvalidRequest: unknown model.  ContractMismatch: ``expect`` not met.
        Unavailable: code ``queue_timeout`` (waited the deployment's queue_timeout_s in line) or
            ``deployment_full`` (on_full="reject").
        TransportError: the gateway cannot be reached.
        TypeError / ValueError: an unknown option or a bad value.
    """
    policy = Policy(AsyncPolicy(model, ConnectOptions.from_kwargs("connect", options)))
    try:
        return policy._connect()
    except BaseException:
        policy.close()
        raise


def aconnect(model: str, **options: Any) -> AsyncPolicy:
    """The asyncio form of ``connect()``: ``async with sequence_ai.aconnect("m") as policy:``.

    Same options and errors as ``connect()``; the handshake (and any wait in line) happens on
    ``__aenter__`` (or ``await policy.connect()``), and ``policy.interrupt()`` stops that wait.
    Every method is awaitable, and observe/act/validate/hold may be plain or async callables.
    """
    return AsyncPolicy(model, ConnectOptions.from_kwargs("aconnect", options))


connect.__signature__ = options_signature(inspect.signature(connect))  # type: ignore[attr-defined]
aconnect.__signature__ = options_signature(inspect.signature(aconnect))  # type: ignore[attr-defined]


def models(gateway_url: Optional[str] = None, *, timeout_s: float = 10.0) -> List[ModelInfo]:
    """The gateway's catalogue: one ``ModelInfo`` per deployment. Needs no API key.

    Raises TransportError when the gateway cannot be reached.
    """
    url = resolve_gateway_url(gateway_url)
    return asyncio.run(fetch_models(url, timeout_s))
