"""Entry points: connect() (sync Policy), aconnect() (AsyncPolicy), models() (the catalogue).

Defaults come from ``sequence_ai_core._config``: the key from ``api_key=`` then
``$SEQUENCES_API_KEY``; the gateway from ``gateway_url=`` then ``$SEQUENCES_GATEWAY_URL`` then
``http://127.0.0.1:8470``.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, List, Optional

from sequence_ai_core import DEFAULT_BODY_FORMAT, DEFAULT_TIMEOUT_S, AsyncPolicy, ModelInfo, fetch_models, resolve_gateway_url

from ._sync import Policy

__all__ = ["connect", "aconnect", "models"]


def connect(
    model: str,
    *,
    api_key: Optional[str] = None,
    gateway_url: Optional[str] = None,
    params: Optional[Dict[str, Any]] = None,
    expect: Optional[Dict[str, Any]] = None,
    validate: str = "warn",
    on_warming: Optional[Callable[[float, Optional[float]], Any]] = None,
    on_queue: Optional[Callable[..., Any]] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    body_format: str = DEFAULT_BODY_FORMAT,
) -> Policy:
    """Connect to a deployed model and return a ``Policy`` (a context manager).

    Performs the gateway handshake now, so a wrong key or an unknown model fails here. A
    worker that is still loading does not fail it: ``run()``/``act()`` wait that out before the
    first action, ``wait_until_ready()`` blocks on it, ``predict()`` raises
    ``Unavailable(warming=True)``.

    Args:
        model: the deployment name (``seq deploy`` / ``POST /v1/deployments``).
        api_key: the tenant key; default ``$SEQUENCES_API_KEY``.
        gateway_url: default ``$SEQUENCES_GATEWAY_URL``, then ``http://127.0.0.1:8470``.
        params: inference parameters sent with every request (the policy's infer() keywords).
        expect: action-contract fields the model must declare, e.g.
            ``{"robot": "panda", "action_space": "joint_absolute", "action_dim": 8}``;
            a difference raises ContractMismatch.
        validate: check observations against the model's contract before sending:
            ``"warn"`` (default, once per problem), ``"strict"`` (raise ContractMismatch), ``"off"``.
        on_warming: ``(waited_s, eta_s) -> None``, called while a cold worker loads.
        on_queue: accepted for compatibility; a self-hosted gateway does not queue robots.
        timeout_s: HTTP timeout per request (s), default 60.
        body_format: how /act bodies are sent: ``"json"`` (base64 frames), ``"binary"`` (the
            framed body of docs/design.md: raw JPEG bytes, no base64) or ``"auto"`` (binary,
            falling back to JSON for the session when the worker answers 415). Default
            ``DEFAULT_BODY_FORMAT`` in sequence_ai_core/_policy.py.

    Raises:
        AuthError: no key (the hint names the local key file) or a refused key.
        InvalidRequest: unknown model.  ContractMismatch: ``expect`` not met.
        TransportError: the gateway cannot be reached.
    """
    engine = AsyncPolicy(model, api_key=api_key, gateway_url=gateway_url, params=params,
                         expect=expect, validate=validate, on_warming=on_warming,
                         on_queue=on_queue, timeout_s=timeout_s, body_format=body_format)
    policy = Policy(engine)
    try:
        return policy._connect()
    except BaseException:
        policy.close()
        raise


def aconnect(
    model: str,
    *,
    api_key: Optional[str] = None,
    gateway_url: Optional[str] = None,
    params: Optional[Dict[str, Any]] = None,
    expect: Optional[Dict[str, Any]] = None,
    validate: str = "warn",
    on_warming: Optional[Callable[[float, Optional[float]], Any]] = None,
    on_queue: Optional[Callable[..., Any]] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    body_format: str = DEFAULT_BODY_FORMAT,
) -> AsyncPolicy:
    """The asyncio form of ``connect()``: ``async with sequence_ai.aconnect("m") as policy:``.

    Same arguments and errors as ``connect()``; the handshake happens on ``__aenter__`` (or
    ``await policy.connect()``). Every method is awaitable, and observe/act/validate/hold may be
    plain or async callables.
    """
    return AsyncPolicy(model, api_key=api_key, gateway_url=gateway_url, params=params,
                       expect=expect, validate=validate, on_warming=on_warming,
                       on_queue=on_queue, timeout_s=timeout_s, body_format=body_format)


def models(gateway_url: Optional[str] = None, *, timeout_s: float = 10.0) -> List[ModelInfo]:
    """The gateway's catalogue: one ``ModelInfo`` per deployment. Needs no API key.

    Raises TransportError when the gateway cannot be reached.
    """
    url = resolve_gateway_url(gateway_url)
    return asyncio.run(fetch_models(url, timeout_s))
