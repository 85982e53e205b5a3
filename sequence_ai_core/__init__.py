"""sequence_ai_core: the asyncio engine behind ``sequence_ai``.

Wire client, chunk buffer, prefetch, seam, pacing, interrupt and typed errors, one module each:

    _wire.py       WorkerLink, the session client: gateway handshake, direct /act (JSON or binary
                   body), reconnect and replay, lease renewal (with _lease.py)
    _transport.py  ActTransport: how /act travels (HTTP, _channel.py's asyncio websocket,
                   _blocking.py's websocket on the calling thread), one open at a time
    _limits.py     declared bounds / max_delta applied across chunk boundaries
    _buffer.py     chunks queued and played, open_loop_horizon rows each
    _prefetch.py   when to start the next request (refill latency vs buffer time left)
    _seam.py       seam measurement (max_seam_jump) and opt-in smoothing
    _pacing.py     the drift-free monotonic action schedule
    _interrupt.py  StopToken (one run's stop request) and the loop's single wait point
    _loop.py       run()/act(): the control loop and its endings
    _policy.py     AsyncPolicy, the handle that ties them together
    _options.py    ConnectOptions: connect()/aconnect() keywords, checked and documented once
    _errors.py     the exception tree
    _types.py      wire dataclasses (Observation, ActionChunk, RunOutcome, ...)
    protocol.py    the wire shared with the server: content types, /act framing, body limit,
                   error-code table, typed contract views (standard library only)
    framing.py     the same-host door's message framing, both ends (standard library only)

The names below are imported on first use: the server imports only ``protocol`` and ``framing``.

Imports only the standard library, httpx and anyio. Users import ``sequence_ai``.
"""
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker and an IDE see: the same names, imported eagerly
    from ._config import DEFAULT_GATEWAY_URL, data_dir, resolve_api_key, resolve_gateway_url
    from ._errors import (
        AuthError,
        OutOfCredit,
        ChunkExhausted,
        ConnectionLost,
        ContractMismatch,
        DelayUnsupported,
        StaleCamera,
        InvalidRequest,
        PolicyError,
        SequencesError,
        TransportError,
        Unavailable,
        from_response,
    )
    from ._options import DEFAULT_BODY_FORMAT, DEFAULT_TIMEOUT_S, ConnectOptions, options_signature
    from ._policy import AsyncPolicy, warn_if_no_validate
    from ._interrupt import Operator, StopToken
    from ._types import (
        END_REASONS,
        ActionChunk,
        ImageFrame,
        ModelInfo,
        Observation,
        Prediction,
        Proprioception,
        RunOutcome,
        is_absolute_action_space,
    )
    from ._limits import Limits, LimitWarning, max_delta_rule
    from ._wire import fetch_models
    from ._wire import _client as http_client   # the client's httpx.AsyncClient settings (no proxy, 2 keep-alive)
    from .protocol import BINARY_CONTENT_TYPE, encode_act_body

# name -> (module, attribute): each is imported on first use (PEP 562), so a process that needs
# only ``protocol`` or ``framing`` (the server's workers and gateway: standard library only) does not
# load httpx, websockets and the engine's modules at start (about 50 ms of a worker's cold start).
_EXPORTS = {
    "DEFAULT_GATEWAY_URL": ("_config", "DEFAULT_GATEWAY_URL"),
    "data_dir": ("_config", "data_dir"),
    "resolve_api_key": ("_config", "resolve_api_key"),
    "resolve_gateway_url": ("_config", "resolve_gateway_url"),
    "AuthError": ("_errors", "AuthError"),
    "OutOfCredit": ("_errors", "OutOfCredit"),
    "ChunkExhausted": ("_errors", "ChunkExhausted"),
    "ConnectionLost": ("_errors", "ConnectionLost"),
    "ContractMismatch": ("_errors", "ContractMismatch"),
    "DelayUnsupported": ("_errors", "DelayUnsupported"),
    "StaleCamera": ("_errors", "StaleCamera"),
    "InvalidRequest": ("_errors", "InvalidRequest"),
    "PolicyError": ("_errors", "PolicyError"),
    "SequencesError": ("_errors", "SequencesError"),
    "TransportError": ("_errors", "TransportError"),
    "Unavailable": ("_errors", "Unavailable"),
    "from_response": ("_errors", "from_response"),
    "DEFAULT_BODY_FORMAT": ("_options", "DEFAULT_BODY_FORMAT"),
    "DEFAULT_TIMEOUT_S": ("_options", "DEFAULT_TIMEOUT_S"),
    "ConnectOptions": ("_options", "ConnectOptions"),
    "options_signature": ("_options", "options_signature"),
    "AsyncPolicy": ("_policy", "AsyncPolicy"),
    "warn_if_no_validate": ("_policy", "warn_if_no_validate"),
    "Operator": ("_interrupt", "Operator"),
    "StopToken": ("_interrupt", "StopToken"),
    "END_REASONS": ("_types", "END_REASONS"),
    "ActionChunk": ("_types", "ActionChunk"),
    "ImageFrame": ("_types", "ImageFrame"),
    "ModelInfo": ("_types", "ModelInfo"),
    "Observation": ("_types", "Observation"),
    "Prediction": ("_types", "Prediction"),
    "Proprioception": ("_types", "Proprioception"),
    "RunOutcome": ("_types", "RunOutcome"),
    "is_absolute_action_space": ("_types", "is_absolute_action_space"),
    "Limits": ("_limits", "Limits"),
    "LimitWarning": ("_limits", "LimitWarning"),
    "max_delta_rule": ("_limits", "max_delta_rule"),
    "fetch_models": ("_wire", "fetch_models"),
    "http_client": ("_wire", "_client"),
    "BINARY_CONTENT_TYPE": ("protocol", "BINARY_CONTENT_TYPE"),
    "encode_act_body": ("protocol", "encode_act_body"),
}

__all__ = [
    "AsyncPolicy",
    "StopToken",
    "Operator",
    "END_REASONS",
    "ConnectOptions",
    "Limits",
    "ActionChunk",
    "ImageFrame",
    "ModelInfo",
    "Observation",
    "Prediction",
    "Proprioception",
    "RunOutcome",
    "is_absolute_action_space",
    "fetch_models",
    "DEFAULT_GATEWAY_URL",
    "DEFAULT_TIMEOUT_S",
    "data_dir",
    "resolve_api_key",
    "resolve_gateway_url",
    "SequencesError",
    "AuthError",
    "OutOfCredit",
    "DEFAULT_BODY_FORMAT",
    "encode_act_body",
    "BINARY_CONTENT_TYPE",
    "InvalidRequest",
    "ContractMismatch",
    "DelayUnsupported",
    "StaleCamera",
    "Unavailable",
    "PolicyError",
    "ChunkExhausted",
    "TransportError",
    "ConnectionLost",
    "from_response",
    "LimitWarning",
    "max_delta_rule",
    "options_signature",
    "warn_if_no_validate",
    "http_client",
]


def __getattr__(name: str) -> Any:
    """Import the engine's public names on first use (``from sequence_ai_core import AsyncPolicy``
    works as before); AttributeError for a name this package does not export."""
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("." + where[0], __name__), where[1])
    globals()[name] = value          # later lookups skip this function
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))
