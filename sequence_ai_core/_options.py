"""ConnectOptions: the keyword arguments of connect() / aconnect() / AsyncPolicy, in one place.

``sequence_ai.connect()`` (sync), ``sequence_ai.aconnect()`` (asyncio) and ``AsyncPolicy``
take the same keywords. They are declared, checked and documented once, here; the three entry
points only pass them through (``ConnectOptions.from_kwargs``), and their ``help()`` signature is
generated from this dataclass (``options_signature``), so a new option is one field.

Also here: the default ``on_queue`` line (``print_queue_position``).
"""
from __future__ import annotations

import inspect
import math
import sys
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Dict, Optional

from ._interrupt import Operator
from ._wire import TRANSPORTS

__all__ = ["ConnectOptions", "DEFAULT_TIMEOUT_S", "DEFAULT_BODY_FORMAT", "VALIDATE_MODES",
           "print_queue_position", "options_signature"]

DEFAULT_TIMEOUT_S = 60.0
MIN_REQUEST_HZ, MAX_REQUEST_HZ = 0.01, 1000.0   # the chunks per second a robot may declare (the gateway's bounds)
# /act body format: "auto" sends the binary framing and falls back to JSON on a 415.
DEFAULT_BODY_FORMAT = "auto"
VALIDATE_MODES = ("warn", "strict", "off")
_BODY_FORMATS = ("json", "binary", "auto", "shm")


class _QueueLine:
    """The default ``on_queue``: one stderr line each time the robot's position changes."""

    def __init__(self) -> None:
        self._last: Optional[int] = None

    def __call__(self, position: int, estimate_s: Optional[float]) -> None:
        if position == self._last:
            return
        self._last = position
        about = f", about {estimate_s:.0f}s" if estimate_s is not None else ""
        print(f"[sequences] queued for a GPU slot: position {position}{about} …", file=sys.stderr, flush=True)


def print_queue_position() -> Callable[[int, Optional[float]], None]:
    """A fresh default ``on_queue`` callback: prints
    ``[sequences] queued for a GPU slot: position N, about Ns …`` to stderr whenever the position
    changes (not on every poll)."""
    return _QueueLine()


@dataclass(frozen=True)
class ConnectOptions:
    """How to reach and talk to one deployed model (every keyword of connect()/aconnect()).

    Attributes:
        api_key: the tenant key; default ``$SEQUENCES_API_KEY`` (``_config.resolve_api_key``).
        gateway_url: default ``$SEQUENCES_GATEWAY_URL``, then ``http://127.0.0.1:8470``.
        params: inference parameters sent with every request (the policy's infer() keywords).
        expect: action-contract fields the model must declare, e.g.
            ``{"robot": "panda", "action_space": "joint_absolute", "action_dim": 8}``; a
            difference raises ContractMismatch on connect.
        validate: check observations against the model's contract before sending: ``"warn"``
            (default, once per problem), ``"strict"`` (raise ContractMismatch) or ``"off"``.
        on_warming: ``(waited_s, eta_s) -> None``, called while a cold worker loads (s).
        on_queue: ``(position, estimate_s) -> None``, called each time the gateway answers that
            every slot of the deployment is taken and the robot waits in line (position 1 is
            next; estimate in s, or None). Default: a ``[sequences] queued for a GPU slot: …``
            line on stderr whenever the position changes. The wait ends when a slot frees, with
            ``Unavailable`` (code ``queue_timeout``) after the deployment's ``queue_timeout_s``,
            or on ``interrupt()``/Ctrl-C, which also gives the place in line up.
        timeout_s: HTTP timeout per request (s), default ``DEFAULT_TIMEOUT_S`` (60).
        body_format: how /act bodies are sent: ``"json"`` (base64 frames), ``"binary"`` (the
            framed body of docs/design.md: raw JPEG bytes, no base64), ``"auto"`` (default:
            binary, falling back to JSON for the session when the worker answers 415) or
            ``"shm"``: the same-host path, for a worker on this machine run by this user (Linux):
            the binary body over the /act channel with its frames in shared memory, not the
            socket; pair it with ``observation(codec="raw")`` for no codec at all (a fidelity
            choice: docs/design.md "The same-host path"). A worker elsewhere refuses it (400).
        transport: how /act travels: ``"auto"`` (the worker's persistent websocket channel when
            the ``websockets`` package is installed and the worker has one, else HTTP),
            ``"channel"`` (the channel only) or ``"http"`` (``POST /act`` per request). Default
            ``$SEQUENCE_AI_TRANSPORT``, then ``"auto"``.
        operator: the robot's ``Operator`` (a human who outranks this code): while it is
            active, run()/act() return ``reason="operator"`` without moving, and a run under way
            holds within one control period and ends ``operator``. Default: a fresh one, inactive,
            read back as ``policy.operator``.
        request_hz: the chunks per second this robot asks for (its control rate over the rows it
            plays per chunk, e.g. 15 Hz replanning every 8 rows: 1.875), declared at connect so
            the gateway admits robots onto a worker by their real rates. Default None: the
            gateway derives it from the contract (``control_frequency_hz`` over the session's
            ``replan_steps`` / ``open_loop_horizon`` param, else 8 rows).

    Raises ValueError (on construction) for an unknown ``validate``/``body_format``/``transport`` or a
    ``timeout_s`` that is not a finite number > 0 or a ``request_hz`` outside [0.01, 1000], and TypeError for a callback that is not callable.
    """

    api_key: Optional[str] = None
    gateway_url: Optional[str] = None
    params: Optional[Dict[str, Any]] = None
    expect: Optional[Dict[str, Any]] = None
    validate: str = "warn"
    on_warming: Optional[Callable[[float, Optional[float]], Any]] = None
    on_queue: Optional[Callable[[int, Optional[float]], Any]] = field(default=None)
    timeout_s: float = DEFAULT_TIMEOUT_S
    body_format: str = DEFAULT_BODY_FORMAT
    transport: Optional[str] = None
    operator: Optional[Operator] = None
    request_hz: Optional[float] = None

    def __post_init__(self) -> None:
        if self.validate not in VALIDATE_MODES:
            raise ValueError(f'validate must be "warn", "strict" or "off", not {self.validate!r}')
        if self.body_format not in _BODY_FORMATS:
            raise ValueError(f"body_format must be one of {_BODY_FORMATS}, not {self.body_format!r}")
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {self.transport!r}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not 0 < self.timeout_s <= sys.float_info.max:   # NaN, inf and ints past a float (10**400)
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, not {self.timeout_s!r}")
        for name in ("on_warming", "on_queue"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a callable or None, not {type(fn).__name__}")
        if self.operator is not None and not isinstance(self.operator, Operator):
            raise TypeError(f"operator must be a sequence_ai.Operator, not {type(self.operator).__name__}")
        if self.request_hz is not None and (isinstance(self.request_hz, bool)
                                            or not isinstance(self.request_hz, (int, float))
                                            or not MIN_REQUEST_HZ <= self.request_hz <= MAX_REQUEST_HZ
                                            or not math.isfinite(self.request_hz)):   # range first: 10**400
            raise ValueError(f"request_hz must be a number of chunks per second in [{MIN_REQUEST_HZ:g}, "
                             f"{MAX_REQUEST_HZ:g}], not {self.request_hz!r}")
        if self.params is not None and not isinstance(self.params, dict):
            raise TypeError(f"params must be a dict of inference parameters, not {type(self.params).__name__}")

    @classmethod
    def from_kwargs(cls, where: str, kwargs: Dict[str, Any]) -> "ConnectOptions":
        """Build from the keywords given to ``where`` (a function name, for the error).

        Raises TypeError naming an unknown keyword and listing the known ones.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"{where}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                            f"it takes {', '.join(sorted(known))}")
        return cls(**kwargs)


def options_signature(head: inspect.Signature) -> inspect.Signature:
    """``head``'s positional parameters followed by every option as a keyword-only parameter
    (for ``help()`` and IDEs on functions declared ``(model, **options)``)."""
    params = [p for p in head.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for f in fields(ConnectOptions):
        default = f.default if f.default is not MISSING else None
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=f.type))
    return head.replace(parameters=params)
