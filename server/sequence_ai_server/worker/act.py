"""The act pipeline, whatever carried the request: HTTP ``POST /act`` (``app.py``), the websocket
channel ``/act/ws`` (``channel.py``) and openpi's websocket at ``/`` (``openpi.py``) all run it.

One request, in this order on every transport:

1. credentials -- the direct secret (a lease token signed by the gateway, or the worker secret;
   ``leases.DirectAuth``): none is 401 ``unauthorized`` (:func:`check_token`), an expired lease
   401 ``lease_expired``, an ended session 401;
2. size -- over the worker's body limit is 413 ``payload_too_large`` (``body_limit.too_large``);
3. strings -- a NUL or an unpaired surrogate in a string of the JSON is 400 ``invalid_request``
   ``bad_string`` (``json_guard.check_strings``; a body with no JSON, openpi's msgpack, passes);
4. the host ready (503 ``warming`` before), the body queued on a replica (:func:`queue_act`:
   decoded on the replica's own thread, one thread hop), the result awaited up to
   ``timeouts.request`` (:func:`await_result`, 504 past it), the chunk checked against the
   ActionContract (``action_check.check_chunk``), the answer's JSON (:class:`ActResponse`);
5. metering -- every answered request counted in the worker's ``meter.ActMeter``.

Each check is written once, here or in ``common/``. HTTP runs 1-3 as ASGI middleware (app.py)
since it refuses from the headers, before a byte of the body is read, and 5 as ``MeterLayer``;
the websockets call :class:`ActPipeline` per message. An error is an ``ApiError`` everywhere;
a websocket sends its body (:meth:`ActPipeline.settle`), HTTP answers it with the same body.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import secrets
import time
from typing import Any, Awaitable, Callable, Optional

import anyio
from pydantic import BaseModel, Field

from sequence_ai_core.protocol import MAX_BODY_BYTES, encode_act_answer

from sequence_ai_server.common.body_limit import too_large
from sequence_ai_server.common.credentials import bearer_token
from sequence_ai_server.common.errors import ApiError, internal_error, new_request_id
from sequence_ai_server.common.json_guard import check_strings
from sequence_ai_server.common.leases import period_floor_ms, session_of
from sequence_ai_server.worker.act_body import MAX_DEADLINE_MS, peek_deadline

SOONEST_MS = 1.0      # a deadline_ms this short asks for the soonest answer: not counted late
from sequence_ai_server.worker.action_check import check_chunk
from sequence_ai_server.worker.connections import ConnectionBudget, refuse_upgrade
from sequence_ai_server.worker.host import PolicyError, PolicyHost, Prepared

__all__ = ["ActPipeline", "ActRequest", "ActResponse", "ActionChunkOut", "WorkerState", "await_result",
           "check_control_token", "check_token", "missing_credentials", "queue_act", "run_act", "run_act_blocking",
           "request_timed_out", "run_prepared", "wait_result"]

log = logging.getLogger("sequence_ai_server.worker")


# ---------------------------------------------------------------- wire models (the OpenAPI document)

class ActRequest(BaseModel):
    """The JSON /act body (the binary body carries the same JSON after a length prefix)."""
    observation: dict[str, Any]
    params: dict[str, Any] = {}
    episode_id: Optional[str] = None
    end_episode: bool = False
    prefix: Optional[list[list[float]]] = None      # the committed rows (absolute, the chunk's action space)
    delay_steps: Optional[int] = None               # estimated inference delay, control steps
    obs_time: Optional[float] = None                # the observation's capture time (unix s)
    request_id: Optional[str] = None                # echoed in the answer
    generation: Optional[int] = None                # the run's generation, echoed in the answer
    deadline_ms: Optional[float] = Field(None, gt=0, le=MAX_DEADLINE_MS)   # playback left less the round trip
    period_ms: Optional[float] = Field(None, gt=0, le=MAX_DEADLINE_MS)     # the session's time between chunks


class ActionChunkOut(BaseModel):
    actions: list[list[float]]
    action_space: Optional[str]
    robot: Optional[str]
    control_frequency_hz: Optional[float]
    open_loop_horizon: Optional[int] = None


class ActResponse(BaseModel):
    action_chunk: Optional[ActionChunkOut]
    warnings: list[str] = []
    inference_ms: float
    batch_size: int = 1
    request_id: str
    generation: Optional[int] = None
    outputs: Any = None
    server_ms: Optional[float] = None               # queued to answered on the worker (ms)
    late: Optional[bool] = None                     # with a deadline_ms: answered past it


# ---------------------------------------------------------------- the worker's state

class WorkerState:
    """What every transport knows of the worker: the host once imported, the phase, the load's job id."""

    def __init__(self, name: Optional[str], load_estimate_s: float = 10.0):
        self.name = name
        self.host: Optional[PolicyHost] = None
        self.phase = "importing"
        self.job_id = "load_" + secrets.token_hex(6)
        self.t0 = time.monotonic()
        self.load_estimate_s = load_estimate_s

    def ready_host(self) -> PolicyHost:
        """The host, once it loaded and passed its check; before, 503 ``warming`` (Retry-After:
        what is left of the load estimate)."""
        host = self.host
        if host is None or not host.ready:
            left = max(1.0, self.load_estimate_s - (time.monotonic() - self.t0))
            raise ApiError("warming", f"the policy is still starting ({self.phase})", retry_after_s=left,
                           details={"phase": self.phase, "job_id": self.job_id},
                           hint="retry after Retry-After seconds; the worker answers as soon as load() returns")
        return host


# ---------------------------------------------------------------- credentials

def missing_credentials() -> ApiError:
    """401 ``unauthorized`` for a request that carries no direct secret at all."""
    return ApiError("unauthorized", "missing or wrong direct secret",
                    hint="send `Authorization: Bearer <direct_secret>` from POST /v1/connect")


def check_token(auth: Any, token: str) -> None:
    """The direct secret ``token`` (``""``: none was sent) against ``auth`` (``DirectAuth``):
    raises 401 (:func:`missing_credentials`, or ``auth.check``'s: expiry, revocation)."""
    if not token:
        raise missing_credentials()
    auth.check(token)


def check_control_token(auth: Any, token: str) -> None:
    """A ``/control/*`` caller's ``token``: only the raw worker secret passes (raises 401)."""
    if not token:
        raise missing_credentials()
    auth.check_control(token)


# ---------------------------------------------------------------- queue, await, check, answer

async def await_result(host: PolicyHost, future: Any, rid: str) -> tuple[Any, float, int]:
    """Wait for a queued request's future up to ``timeouts.request`` -> (result, seconds, batch
    size); 504 request_timeout past it (the inference still finishes), the policy's error as its
    ApiError, a refused body's ApiError as it is; a future cancelled before it ran raises
    ``asyncio.CancelledError``. Cancelling the awaiting task leaves the future alone.

    One wake-up of the loop when the replica is done (its done-callback schedules the waiter's
    result with ``call_soon_threadsafe``), and the timeout is a timer on the loop: no wrapping,
    shielding or ``wait_for`` task per request."""
    if future.done():                 # served inline (``_Replica.run_inline``): no wait, no wake-up
        return _outcome(future, rid)
    timeout = host.spec.timeouts.request
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def done(_: Any) -> None:         # on the replica's thread (or here, when already done)
        if not loop.is_closed():
            loop.call_soon_threadsafe(_release, waiter)

    future.add_done_callback(done)
    timer = loop.call_later(timeout, _release, waiter, True)
    try:
        timed_out = await waiter
    finally:
        timer.cancel()
    if timed_out:
        raise request_timed_out(rid, timeout)
    return _outcome(future, rid)


def wait_result(host: PolicyHost, future: Any, rid: str) -> tuple[Any, float, int]:
    """:func:`await_result` for a thread that may block (a same-host door connection's): the
    same answers, the same 504 past ``timeouts.request``."""
    timeout = host.spec.timeouts.request
    if not future.done() and not concurrent.futures.wait([future], timeout).done:
        raise request_timed_out(rid, timeout)
    return _outcome(future, rid)


def request_timed_out(rid: str, timeout: float) -> ApiError:
    """The 504 ``request_timeout`` for request ``rid`` past ``timeout`` (s), logged."""
    log.warning("%s ran past the request timeout (%g s); the worker finishes it", rid, timeout)
    return ApiError("request_timeout", f"inference ran past the request timeout of {timeout:g} s; "
                    "the worker finishes it before serving again", retry_after_s=1.0,
                    details={"timeout_s": timeout},
                    hint="raise timeouts=seq.Timeouts(request=...) or make infer faster")


def _outcome(future: Any, rid: str) -> tuple[Any, float, int]:
    """A done future's (result, seconds, batch size); its PolicyError as the ApiError."""
    if future.cancelled():
        raise asyncio.CancelledError()
    try:
        return future.result()
    except PolicyError as exc:
        log.warning("%s %s", rid, exc)
        raise exc.to_api_error() from None


def _release(waiter: asyncio.Future, timed_out: bool = False) -> None:
    if not waiter.done():
        waiter.set_result(timed_out)


def deadline_of(host: PolicyHost, raw: bytes, content_type: str, token: str = "") -> tuple[Optional[float], Optional[float]]:
    """An /act body's deadline -> (due, order), monotonic s, both None without ``deadline_ms``:
    ``due`` = now + deadline_ms (answered later, it counts late), ``order`` = what it is queued
    by: ``due`` clamped by its session's declared period (``schedule.DeadlineClamp``; the
    session is the lease ``token``'s; the worker secret, the gateway's own, is not clamped), and
    never by a shorter period than the one the gateway signed into the token (the rate the robot
    was admitted at, ``leases.period_floor_ms``).
    A claim of at most :data:`SOONEST_MS` (the client's floor: its robot has nothing left to
    play, as at a run's first request) is ordered the same way but has no ``due``: no answer can
    meet it, so it is neither marked nor counted late. Raises ApiError 400 naming
    ``deadline_ms`` / ``period_ms`` (``act_body.peek_deadline``)."""
    deadline_ms, period_ms = peek_deadline(raw, content_type)
    if deadline_ms is None:
        return None, None
    now = time.monotonic()
    due = now + deadline_ms / 1000.0
    session = session_of(token) if token else None
    floor = period_floor_ms(token) if session is not None else None
    if period_ms is not None and floor is not None:
        period_ms = max(period_ms, floor)     # never ordered by a shorter period than it was admitted at
    order = due if session is None else host.clamp.order_due(session, due, period_ms, now)
    return (None if deadline_ms <= SOONEST_MS else due), order


async def queue_act(host: PolicyHost, raw: bytes, content_type: str, token: str = "") -> tuple[Any, Any, Optional[float]]:
    """Queue one /act body -> (concurrent Future of (result, seconds, batch), holder whose
    ``.prepared`` is the decoded request once it ran, its deadline or None). Waiting requests
    are served earliest deadline first (:func:`deadline_of`; ``token``: the caller's direct
    secret). One replica: the body is parsed and decoded on the replica's own thread (one
    thread hop); several: decoded on a worker thread first, since routing by episode needs it.
    Raises ApiError for a bad deadline, or a refused body (several)."""
    due, order = deadline_of(host, raw, content_type, token)
    if host.decodes_on_replica:
        return (*host.submit_raw(raw, content_type, due, order), due)
    prepared = await anyio.to_thread.run_sync(host.prepare, raw, content_type)
    return host.submit(prepared, due=due, order=order), _Decoded(prepared), due


class _Decoded:
    """The holder ``queue_act`` returns when the body was decoded before queueing."""
    __slots__ = ("prepared",)

    def __init__(self, prepared: Any) -> None:
        self.prepared = prepared


async def run_act(host: PolicyHost, raw: bytes, content_type: str, rid: str, capture: Any = None,
                  on_queued: Any = None, token: str = "", binary_answer: bool = False) -> bytes:
    """One /act body (checked: steps 1-3 of the module docstring) end to end -> the answer's
    bytes: the JSON ``ActResponse``, or with ``binary_answer`` its binary form
    (``protocol.encode_act_answer``: the chunk's rows as raw float64 after the JSON; the /act
    channel's, when its client asked for it). ``on_queued(future)`` sees the queued request's
    future (the channel cancels it on the client's word); ``capture``: the ``CaptureWriter``
    kept episodes are handed to (or None); ``token``: the caller's direct secret (its session
    orders its deadlines). The answer's ``server_ms`` is queued-to-answered (ms); with a
    ``deadline_ms``, ``late`` says whether it was answered past it. Raises ApiError."""
    queued = time.monotonic()
    future, holder, due = await queue_act(host, raw, content_type, token)
    if on_queued is not None:
        on_queued(future)
    result = await await_result(host, future, rid)
    return _answer(host, result, holder.prepared, rid, queued, due, token, binary_answer, capture, raw, content_type)


def run_act_blocking(host: PolicyHost, raw: bytes, content_type: str, rid: str, capture: Any = None,
                     token: str = "", binary_answer: bool = False) -> bytes:
    """:func:`run_act` on a thread that may block (a same-host door connection's, ``local.py``)
    -> the same answer. The body is queued as ``queue_act`` queues it, but a cheap request to an
    idle replica runs on this thread (``_Replica.run_inline`` with ``caller_blocks``: no hand-off
    and no event loop on its path; a call that hangs then holds this connection and the replica,
    never the loop), and the result is waited for here (:func:`wait_result`). Raises ApiError."""
    queued = time.monotonic()
    due, order = deadline_of(host, raw, content_type, token)
    if host.decodes_on_replica:
        future, holder = host.submit_raw(raw, content_type, due, order, caller_blocks=True)
    else:
        holder = _Decoded(host.prepare(raw, content_type))
        future = host.submit(holder.prepared, due=due, order=order, caller_blocks=True)
    result = wait_result(host, future, rid)
    return _answer(host, result, holder.prepared, rid, queued, due, token, binary_answer, capture, raw, content_type)


def _answer(host: PolicyHost, result: tuple[Any, float, int], prepared: Prepared, rid: str, queued: float,
            due: Optional[float], token: str, binary_answer: bool, capture: Any, raw: bytes,
            content_type: str) -> bytes:
    """The answer to one request whose ``result`` (result, seconds, batch size) came (step 4's
    end): the chunk checked, the payload timed from ``queued`` (monotonic s), the bytes, the
    capture hand-off."""
    result, seconds, batch = result
    chunk, more, outputs = check_chunk(result, host.spec, as_array=True)
    if more:
        log.info("%s clipped: %s", rid, more[0])
    rows = None if chunk is None else chunk["actions"]
    payload = {"action_chunk": chunk, "warnings": prepared.warnings + more,
               "inference_ms": round(seconds * 1000.0, 3), "batch_size": batch, "request_id": rid,
               "outputs": outputs, **prepared.echo}   # the client's request_id / generation, when it sent them
    answered = time.monotonic()
    payload["server_ms"] = round((answered - queued) * 1000.0, 3)
    host.robot_times.add(session_of(token), payload["server_ms"], answered)
    if due is not None:
        payload["late"] = answered > due
    if chunk is not None and (capture is not None or not binary_answer):
        chunk = payload["action_chunk"] = dict(chunk, actions=rows.tolist())
    content = _answer_bytes(payload, binary_answer, rows)
    if capture is not None:   # a non-blocking hand-off to the capture writer's thread
        capture.offer(raw, content_type, prepared.episode_id, prepared.params, chunk, rid, payload["inference_ms"])
    return content


def _answer_bytes(payload: dict, binary: bool, rows: Any) -> bytes:
    """``payload`` as JSON bytes, or with ``binary`` the binary answer (``rows``: the chunk's
    float64 array, or None without a chunk). Raises ApiError(policy_error) for outputs that are
    not JSON."""
    try:
        if not binary:
            return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        if rows is None:
            return encode_act_answer(payload, None, None)
        return encode_act_answer(payload, rows.astype("<f8", copy=False).tobytes(), rows.shape)
    except (TypeError, ValueError) as exc:
        raise ApiError("policy_error", f"infer() returned outputs that are not JSON ({exc})",
                       details={"reason": "outputs"}, hint="return dicts/lists of numbers and strings") from None


async def run_prepared(host: PolicyHost, prepared: Prepared, rid: str) -> tuple[dict, float]:
    """An observation a transport decoded itself (openpi's msgpack) through the rest of the
    pipeline -> (the checked chunk dict, its ``actions`` the T x D float64 array; inference
    seconds). Raises ApiError (policy_error when
    ``infer()`` returned no chunk)."""
    result, seconds, _ = await await_result(host, host.submit(prepared), rid)
    chunk, _, _ = check_chunk(result, host.spec, as_array=True)
    if chunk is None:
        raise ApiError("policy_error", "infer() returned no action chunk", hint="return a chunk from @seq.infer")
    return chunk, seconds


# ---------------------------------------------------------------- one worker's pipeline

class ActPipeline:
    """One worker's act pipeline, for the transports that read whole messages (the websockets;
    HTTP runs the same checks as middleware, module docstring). ``state``: the ``WorkerState``
    (``ready_host()``); ``auth``: its ``DirectAuth``; ``max_body_bytes``: the body limit;
    ``capture``: the ``CaptureWriter`` or None; ``meter``: the ``ActMeter`` or None;
    ``budget``: the open websockets' ``ConnectionBudget``."""

    def __init__(self, state: Any, auth: Any, *, max_body_bytes: int = MAX_BODY_BYTES, capture: Any = None,
                 meter: Any = None, budget: Optional[ConnectionBudget] = None) -> None:
        self.state, self.auth, self.max_body_bytes = state, auth, int(max_body_bytes)
        self.capture, self.meter = capture, meter
        self.budget = budget if budget is not None else ConnectionBudget()

    # -- the checks (module docstring, steps 1-3)
    def check_token(self, token: str) -> None:
        """Step 1: 401 unless ``token`` is a valid direct secret now (expiry, revocation); the
        same check as :func:`check_token`, on every message of an open websocket."""
        if not token:
            raise missing_credentials()
        self.auth.check(token)

    def check_body(self, body: Any, content_type: str, **wording: Any) -> bytes:
        """Steps 2 and 3 on one message's ``body`` (bytes, a bytearray or a memoryview) -> it as
        bytes (a bytearray as it is).
        ``wording``: ``body_limit.too_large``'s keywords (``what``, ``hint``) for the 413."""
        if len(body) > self.max_body_bytes:
            raise too_large(self.max_body_bytes, len(body), **wording)
        raw = body if isinstance(body, (bytes, bytearray)) else bytes(body)    # a bytearray: the same-host body
        check_strings(raw, content_type)
        return raw

    async def admit(self, websocket: Any, path: str, schemes: tuple[str, ...] = ("bearer",),
                    ready: bool = False) -> Optional[str]:
        """A websocket upgrade to ``path``: its credentials (``Authorization`` in one of
        ``schemes``), the host ready when ``ready``, then a place in the connection budget ->
        the token, to be checked again per message; None when it was refused (answered with
        the error as HTTP, ``connections.refuse_upgrade``). The caller accepts the websocket
        and calls ``budget.release()`` when it ends."""
        token = bearer_token(websocket.headers.get("authorization", ""), schemes)
        try:
            self.check_token(token)
            if ready:
                self.state.ready_host()
            self.budget.take(path)
        except ApiError as exc:
            exc.request_id = new_request_id()
            await refuse_upgrade(websocket, exc)
            return None
        return token

    # -- the rest of it
    async def run(self, raw: bytes, content_type: str, rid: str, on_queued: Any = None, token: str = "",
                  binary_answer: bool = False) -> bytes:
        """Step 4 on a checked /act body -> the answer's bytes (:func:`run_act`: JSON, or its
        binary form with ``binary_answer``; ``token``: the caller's direct secret, whose session
        orders its deadlines)."""
        return await run_act(self.state.ready_host(), raw, content_type, rid, self.capture, on_queued=on_queued,
                             token=token, binary_answer=binary_answer)

    async def settle(self, rid: str, work: Awaitable[bytes], where: str) -> tuple[int, bytes]:
        """Await ``work`` (one request's answer) -> ``(200, its bytes)``, or an ApiError's
        ``(status, error body JSON)`` with ``rid`` as its request id; a bug (any other
        exception) is 500 ``internal``, logged with ``where`` (the transport), so the connection
        stays usable. Cancellation goes on."""
        try:
            return 200, await work
        except Exception as exc:  # noqa: BLE001 - ApiError, or a bug: a typed answer (cancellation goes on)
            return _failed(exc, rid, where)

    def run_blocking(self, raw: bytes, content_type: str, rid: str, token: str = "",
                     binary_answer: bool = False) -> bytes:
        """:meth:`run` on a thread that may block (:func:`run_act_blocking`)."""
        return run_act_blocking(self.state.ready_host(), raw, content_type, rid, self.capture, token=token,
                                binary_answer=binary_answer)

    def request_timeout_s(self) -> Optional[float]:
        """The host's ``timeouts.request`` (s), None before it is ready."""
        host = self.state.host
        return None if host is None else host.spec.timeouts.request

    def settle_blocking(self, rid: str, work: Callable[[], bytes], where: str) -> tuple[int, bytes]:
        """:meth:`settle` for ``work`` called on this thread."""
        try:
            return 200, work()
        except Exception as exc:  # noqa: BLE001 - ApiError, or a bug: a typed answer
            return _failed(exc, rid, where)

    def count(self, started: float, status: int, size_in: int, size_out: int) -> None:
        """Step 5: meter one request answered on a websocket like an HTTP /act (``started``:
        ``time.perf_counter()`` when it arrived; ``status`` 0: the answer never reached the
        client, counted as an error with no bytes out)."""
        if self.meter is not None:
            self.meter.count((time.perf_counter() - started) * 1000.0, status, size_in, size_out if status else 0)


def _failed(exc: Exception, rid: str, where: str) -> tuple[int, bytes]:
    """An exception from one request's work -> ``(status, error body)``: an ApiError as it is
    (``rid`` its request id), any other a bug, logged, answered 500 ``internal``."""
    if isinstance(exc, ApiError):
        exc.request_id = exc.request_id or rid
        return exc.status, exc.json_bytes()
    log.error("unhandled error on %s", where, exc_info=exc)
    err = internal_error(exc, rid)
    return err.status, err.json_bytes()
