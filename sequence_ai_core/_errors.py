"""Every error this client raises, and how a server's JSON error becomes one of them.

Catching ``SequencesError`` catches all of ours and none of httpx's. The tree::

    SequencesError                  root; carries code, retryable, request_id, hint, details
    ├── AuthError                   no key, wrong key, revoked key (401 unauthorized); stop
    ├── OutOfCredit                 the key's quota is used up (402 out_of_credit / quota_exceeded);
    │                               self-hosted: a limit set on the gateway; stop and hold
    ├── InvalidRequest              deterministic: fix the call (400 invalid_request, 404 not_found)
    │   ├── ContractMismatch        the observation or the model's declaration is not what you expect
    │   └── DelayUnsupported        the delay mode asked for, or the measured inference delay, is
    │                               outside what the policy declares (refused before motion)
    ├── Unavailable                 503: .warming (wait .retry_after_s) or an upstream failure
    ├── PolicyError                 the policy's own code raised (500 policy_error);
    │   │                           .exception_type, .remote_traceback
    │   └── <KeyError, ValueError, ...>  a Python built-in raised in the policy comes back as
    │                               itself: ``except KeyError`` catches it, and it is still a
    │                               PolicyError with .remote_traceback
    ├── ChunkExhausted              next_action() with an empty buffer and no observation
    ├── StaleCamera                 a camera stream stopped delivering new frames (.stream)
    └── TransportError              the network failed and one reconnect did not fix it
        └── ConnectionLost          the connection dropped mid-call

A rotated direct secret or an expired lease (401 from the worker) never reaches the caller as
an error: the wire reconnects through the gateway once and replays the call (``_wire.py``).

Every server error has one JSON shape (docs/design.md)::

    {"detail": str, "code": str, "retryable": bool, "retry_after_s": float|null,
     "request_id": str|null, "hint": str|null, "details": object|null}

``from_response()`` maps that shape, plus the status code, to the classes above.
"""
from __future__ import annotations

import builtins
from typing import Any, Dict, Optional

from .protocol import ERROR_CODES

__all__ = [
    "SequencesError",
    "AuthError",
    "OutOfCredit",
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
]


class SequencesError(Exception):
    """Root of every error this client raises.

    Attributes:
        code: the server's machine-readable code (``"warming"``, ``"policy_error"``, ...) or a
            local one (``"no_api_key"``, ``"busy"``, ...).
        retryable: True when the same call may succeed later unchanged.
        request_id: the server's request id (also sent as ``X-Request-ID``), or None.
        hint: one sentence on what to do about it, or None.
        details: the server's structured ``details`` object, or None.
        status_code: the HTTP status it came with, or None for local errors.
    """

    default_code = "error"
    default_retryable = False

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        retryable: Optional[bool] = None,
        request_id: Optional[str] = None,
        hint: Optional[str] = None,
        details: Optional[dict] = None,
        status_code: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.retryable = self.default_retryable if retryable is None else bool(retryable)
        self.request_id = request_id
        self.hint = hint
        self.details = details
        self.status_code = status_code

    def __str__(self) -> str:
        text = self.message
        if self.hint:
            text += f" (hint: {self.hint})"
        if self.request_id:
            text += f" [request_id={self.request_id}]"
        return text


class AuthError(SequencesError):
    """The API key is missing, wrong or revoked. Retrying will not help."""

    default_code = "unauthorized"


class OutOfCredit(SequencesError):
    """The key's credit or quota is used up (HTTP 402, code ``out_of_credit`` or ``quota_exceeded``).

    Self-hosted there is no billing: this is a usage limit configured on the gateway. Retrying
    will not help until the limit is raised; stop the robot (``run()`` holds) and tell someone.
    """

    default_code = "out_of_credit"


class InvalidRequest(SequencesError):
    """The request itself is wrong (unknown model, malformed observation, bad params).

    Deterministic: the same call fails the same way until it is fixed.
    """

    default_code = "invalid_request"


class ContractMismatch(InvalidRequest):
    """What was sent, or what the model declares, does not match the contract expected.

    Raised by ``connect(expect=...)`` when the deployment's action contract differs, and by
    ``validate="strict"`` when an observation would be refused by the worker.
    """

    default_code = "contract_mismatch"


class DelayUnsupported(InvalidRequest):
    """The delay is outside what the policy declares (``ActionContract.delay_modes`` /
    ``max_delay_steps``).

    Raised before the first action when ``run(delay_mode=...)`` names a mode the policy does not
    declare, or the delay measured at start-up is beyond ``max_delay_steps``; mid-run the loop
    holds and ends with ``RunOutcome.reason == "delay_exceeded"`` carrying one as ``.fault``.
    A worker refusing a request for it (400, ``details.reason == "delay_exceeded"``) is one too.

    Attributes:
        delay_steps: the measured delay (control steps), or None for a mode mismatch.
        max_delay_steps: the declared maximum (control steps), or None.
    """

    default_code = "delay_unsupported"

    def __init__(self, message: str, *, delay_steps: Optional[int] = None,
                 max_delay_steps: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.delay_steps = delay_steps
        self.max_delay_steps = max_delay_steps


class StaleCamera(SequencesError):
    """A camera stream stopped delivering new frames: the same frame again, or stamps that stop
    advancing, for longer than its ``max_frame_age_s``.

    The loop sends no request with the stale frame, holds, and ends the run with
    ``RunOutcome.reason == "stale_camera"`` and this error as ``RunOutcome.fault``.

    Attributes:
        stream: the camera view that went stale.
        age_s: seconds since it last delivered a new frame (s).
    """

    default_code = "stale_camera"

    def __init__(self, message: str, *, stream: str, age_s: float, **kwargs: Any) -> None:
        kwargs.setdefault("hint", f"check the {stream!r} camera driver; the run resumes only when you call run() again")
        super().__init__(message, **kwargs)
        self.stream = stream
        self.age_s = age_s


class Unavailable(SequencesError):
    """The service cannot answer now (HTTP 503).

    Attributes:
        warming: True when the worker is loading: retry after ``retry_after_s`` seconds (an
            estimate, not a countdown). False when the upstream failed: retrying is a guess.
        retry_after_s: the server's estimate in seconds, or None.
        job_id: the deployment or job the wait belongs to, when the server names one.
    """

    default_code = "unavailable"

    def __init__(
        self,
        message: str,
        *,
        warming: bool = False,
        retry_after_s: Optional[float] = None,
        job_id: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("retryable", warming)
        super().__init__(message, **kwargs)
        self.warming = warming
        self.retry_after_s = retry_after_s
        self.job_id = job_id


class PolicyError(SequencesError):
    """The policy's own code raised inside the worker (HTTP 500 policy_error).

    Attributes:
        exception_type: the remote exception's class name, e.g. ``"RuntimeError"``.
        remote_traceback: the worker-side traceback as text, or None.
    """

    default_code = "policy_error"

    def __init__(
        self,
        message: str,
        *,
        exception_type: Optional[str] = None,
        remote_traceback: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.exception_type = exception_type
        self.remote_traceback = remote_traceback


class ChunkExhausted(SequencesError):
    """``next_action()`` found the buffer empty and had no observation to refill it from."""

    default_code = "chunk_exhausted"


class TransportError(SequencesError):
    """The network failed (connect refused, timeout, protocol error) and a reconnect did not help."""

    default_code = "transport_error"
    default_retryable = True


class ConnectionLost(TransportError):
    """The connection dropped while a call was in flight, and the one replay failed too."""

    default_code = "connection_lost"


def _by_code() -> Dict[str, type]:
    """code -> class, from the protocol's error table (the server answers with the same table)."""
    classes = {cls.__name__: cls for cls in (SequencesError, AuthError, OutOfCredit, InvalidRequest,
                                             ContractMismatch, Unavailable, PolicyError)}
    return {code: classes[row.client_class] for code, row in ERROR_CODES.items()}


_BY_CODE = _by_code()


def _class_for_status(status: int) -> type:
    """The class for a status the table does not name a code for (a proxy's 502, a bare 403)."""
    if status in (401, 403):
        return AuthError
    if status == 402:
        return OutOfCredit
    if status == 503 or status == 502 or status == 504:
        return Unavailable
    if 400 <= status < 500:
        return InvalidRequest
    return SequencesError


def _float_or_none(value: Any) -> Optional[float]:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def from_response(response: Any) -> SequencesError:
    """Build the matching error from an httpx response carrying the server's error shape.

    Tolerates a body that is not JSON, or FastAPI's own ``{"detail": [...]}`` validation
    shape: the status code then picks the class. ``Retry-After`` and ``X-Request-ID``
    headers fill in what the body leaves out.
    """
    status = response.status_code
    try:
        body = response.json()
    except Exception:  # noqa: BLE001 - any undecodable body
        body = None
    if not isinstance(body, dict):
        body = {"detail": (response.text or "")[:500] or f"HTTP {status}"}
    detail = body.get("detail")
    message = detail if isinstance(detail, str) else (str(detail) if detail else f"HTTP {status}")
    code = body.get("code")
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = _class_for_status(status)
    details = body.get("details") if isinstance(body.get("details"), dict) else None
    common = dict(
        code=code if isinstance(code, str) else None,
        request_id=body.get("request_id") or response.headers.get("x-request-id"),
        hint=body.get("hint"),
        details=details,
        status_code=status,
    )
    if "retryable" in body and body["retryable"] is not None:
        common["retryable"] = bool(body["retryable"])
    if cls is Unavailable:
        retry_after = _float_or_none(body.get("retry_after_s"))
        if retry_after is None:
            retry_after = _float_or_none(response.headers.get("retry-after"))
        warming = code == "warming"
        job_id = (details or {}).get("job_id") or body.get("job_id")
        return Unavailable(message, warming=warming, retry_after_s=retry_after, job_id=job_id,
                           **common)
    if cls is InvalidRequest and (details or {}).get("reason") == "delay_exceeded":
        return DelayUnsupported(message, delay_steps=details.get("delay_steps"),
                                max_delay_steps=details.get("max_delay_steps"), **common)
    if cls is PolicyError:
        d = details or {}
        return policy_error(
            message,
            exception_type=d.get("exception_type"),
            remote_traceback=d.get("remote_traceback"),
            **common,
        )
    return cls(message, **common)


# Built-ins that must not come back as themselves: control flow, not errors.
_NOT_REBUILT = {"StopIteration", "StopAsyncIteration", "GeneratorExit", "SystemExit",
                "KeyboardInterrupt", "BaseException", "Exception"}
_REBUILT: Dict[str, Optional[type]] = {}


def _builtin_twin(name: Optional[str]) -> Optional[type]:
    """``PolicyError`` subclass that is also the built-in exception ``name`` (cached), or None."""
    if not name or name in _NOT_REBUILT:
        return None
    if name not in _REBUILT:
        base = getattr(builtins, name, None)
        twin: Optional[type] = None
        if isinstance(base, type) and issubclass(base, Exception):
            try:
                twin = type(name, (PolicyError, base), {
                    "__module__": "builtins.remote",
                    "__doc__": f"{name} raised inside the policy (also a PolicyError).",
                    "__str__": SequencesError.__str__,
                })
            except TypeError:  # layout conflict: keep PolicyError
                twin = None
        _REBUILT[name] = twin
    return _REBUILT[name]


def policy_error(message: str, *, exception_type: Optional[str] = None,
                 remote_traceback: Optional[str] = None, **kwargs: Any) -> PolicyError:
    """The error for a policy that raised: the built-in class itself when ``exception_type`` is a
    Python built-in exception (``KeyError`` ...), which is also a ``PolicyError``; otherwise a
    plain ``PolicyError`` naming the type in ``.exception_type``."""
    twin = _builtin_twin(exception_type)
    if twin is not None:
        try:
            return twin(message, exception_type=exception_type,
                        remote_traceback=remote_traceback, **kwargs)
        except TypeError:  # a built-in whose constructor wants more (UnicodeDecodeError)
            pass
    return PolicyError(message, exception_type=exception_type,
                       remote_traceback=remote_traceback, **kwargs)
