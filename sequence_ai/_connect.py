"""Entry points: connect() (sync Policy), aconnect() (AsyncPolicy), models() (the catalogue).

connect() and aconnect() take the same keyword options; they are declared, checked and
documented once, in ``sequence_ai_core.ConnectOptions`` (their ``help()`` signature is generated
from it). Defaults come from ``sequence_ai_core._config``: the key from ``api_key=`` then
``$SEQUENCES_API_KEY``; the gateway from ``gateway_url=`` then ``$SEQUENCES_GATEWAY_URL`` then
``http://127.0.0.1:8470``.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional

from sequence_ai_core import AsyncPolicy, ConnectOptions, ModelInfo, fetch_models, resolve_gateway_url
from sequence_ai_core import options_signature

from ._sync import Policy, run_blocking

__all__ = ["connect", "aconnect", "models", "account"]


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
            on_warming, on_queue, timeout_s, body_format, transport, operator, request_hz
            (meaning and defaults there).

    Raises:
        AuthError: no key (the hint names the local key file) or a refused key.
        InvalidRequest: unknown model.  ContractMismatch: ``expect`` not met.
        Unavailable: code ``queue_timeout`` (waited the deployment's queue_timeout_s in line),
            ``deployment_full`` (on_full="reject"), or ``deployment_stopped`` (``seq policy stop``;
            refused until ``seq policy start NAME``, which the hint names).
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


def models(gateway_url: Optional[str] = None, *, kind: Optional[str] = None,
           endpoint: Optional[str] = None, timeout_s: float = 10.0) -> List[ModelInfo]:
    """The gateway's catalogue: one ``ModelInfo`` per deployment, then one per ``seq init``
    template. Needs no API key. Works from inside a ``run()`` callback too.

    Args:
        gateway_url: default ``$SEQUENCES_GATEWAY_URL``, else ``http://127.0.0.1:8470``.
        kind: ``"model"`` (deployments only) or ``"template"`` (templates only); None: both.
        endpoint: ``"act"``: only what ``connect()`` can drive (templates have no endpoint).
        timeout_s: HTTP timeout (s).

    Returns a list (key it yourself: ``{m.short_id: m for m in models()}``).

    Raises:
        ValueError: an unknown ``kind`` or ``endpoint``.
        TransportError: the gateway cannot be reached.
    """
    if kind not in (None, "model", "template"):
        raise ValueError(f'kind must be "model", "template" or None, not {kind!r}')
    if endpoint not in (None, "act"):
        raise ValueError(f'endpoint must be "act" or None, not {endpoint!r} (chat and decide are '
                         "not served by a self-hosted gateway)")
    url = resolve_gateway_url(gateway_url)
    rows = run_blocking(fetch_models(url, timeout_s))
    return [m for m in rows if (kind is None or m.kind == kind) and (endpoint is None or m.endpoint == endpoint)]


def account(*, api_key: Optional[str] = None, gateway_url: Optional[str] = None,
            timeout_s: float = 10.0) -> Dict[str, Any]:
    """The read-only status of the account ``api_key`` belongs to (``GET /v1/account``).

    Returns a dict::

        {"key":     {"id", "name", "deployment", ...},     # the key itself (never its secret)
         "balance": None,                                  # self-hosted: there is no money to count
         "self_hosted": True,
         "usage":   {"policies": 1, "benchmarks": 0, "running_workers": 1, "sessions": 0,
                     "deployments": {name: {"total": {"worker_s": {"cpu": 12.5}, "requests", "errors",
                                                      "bytes_in", "bytes_out"} | None,
                                            "today": {...} | None, "captured_bytes": int}}},
         "limits":  {"max_gpus": None | int, "lease_ttl_s": 300.0, ...,
                     "quotas": [{"scope": "account" | "key:<id>", "max_workers", "max_cards",
                                 "worker_hours_per_day", "used": {...}}]}}

    Worker-seconds are counted per card type (``cpu`` without ``gpu=``); requests, errors and
    bytes are the deployment's ``/act`` traffic as its workers counted it (``seq policy usage``).

    ``balance`` is None on a self-hosted gateway, which meters nothing in money (the hosted
    service is prepaid); ``limits`` are the caps this gateway is configured with (None: no cap).
    Works from inside a ``run()`` callback too.

    Raises:
        AuthError: no key, or a refused one.  TransportError: the gateway cannot be reached.
    """
    from sequence_ai_core import TransportError, from_response, resolve_api_key
    from sequence_ai_core import http_client as _client

    key = resolve_api_key(api_key)
    url = resolve_gateway_url(gateway_url)

    async def fetch() -> Dict[str, Any]:
        async with _client(timeout_s) as http:
            try:
                response = await http.get(f"{url}/v1/account", headers={"Authorization": f"Bearer {key}"})
            except Exception as exc:  # noqa: BLE001 - httpx's errors become ours
                raise TransportError(f"cannot reach the gateway at {url}: {exc!r}",
                                     hint="is it running? `seq serve` starts it") from exc
        if response.is_error:
            raise from_response(response)
        return response.json()

    return run_blocking(fetch())
