"""Hosting one ``@seq.policy`` class: load, warm up, check, infer, batch, route episodes.

Everything here is independent of the process launcher: the HTTP worker (``main.py``) drives
it today, and another launcher (a Ray actor, say) can drive the same object. The pieces:

  * ``load_policy_class(file, class_name)`` -- import a policy file, find its class.
  * ``PolicyHost`` -- the replicas (``@seq.concurrent``: one instance and one thread each), the
    batcher (``@seq.batched``), sticky episodes (``episode_id`` -> replica; ``@seq.on_episode``
    at episode end, explicit or after ``episode_idle_s`` of quiet).

Reading a request (body, contract check, frame decoding) is ``act_body.py``; checking the
returned chunk against the ActionContract is ``action_check.py``. Every call into policy code runs on
that replica's own thread, never on the caller's event loop.
"""
from __future__ import annotations

import bisect
import collections
import concurrent.futures
import json
import logging
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import seq
from seq.spec import EVAL_BATCH_DEADLINE_MS, ParamError, PolicySpec, cast_params, get_spec, load_policy_class

from sequence_ai_server.worker.action_check import check_chunk, policy_error
from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.worker.act_body import fits_float, parse_act_body, parse_delay, parse_observation, synthetic_observation
from sequence_ai_server.worker.schedule import CostCurve, DeadlineClamp, DeadlineQueue, LateCounter, RobotTimes

__all__ = [
    "EPISODE_IDLE_S", "PolicyError", "PolicyHost", "Prepared",
    "load_policy_class", "synthetic_observation", "export_compile_caches",
]

log = logging.getLogger("sequence_ai_server.worker")

EPISODE_IDLE_S = 300.0                        # an episode with no /act for this long is ended by the worker
# A request is served on the caller's thread (the event loop) instead of its replica's when the
# replica's last INLINE_WINDOW requests took under INLINE_MS at the median and none of them over
# INLINE_MAX_MS, decode and infer together (``_Replica.run_inline``): a hand-off's two
# cross-thread wake-ups cost about as much as such a request, and the loop is never held long
# -- unless the call hangs: then it holds /ping and every other robot with it, so it is opt-in
# (the worker's --inline / $SEQ_WORKER_INLINE; off by default).
INLINE_MS = 0.5
INLINE_MAX_MS = 5.0
INLINE_WINDOW = 32
# What the policy's own code may raise out of a call and is answered as its error: sys.exit() or a
# KeyboardInterrupt in infer would otherwise end the replica's thread (every later request 504) or,
# served inline, unwind the event loop's thread.
_POLICY_RAISES = (Exception, SystemExit, KeyboardInterrupt)


# ---------------------------------------------------------------- loading a policy file

def export_compile_caches(cache_dir: str) -> dict[str, str]:
    """Point the torch inductor, Triton and JAX compilation caches at ``cache_dir`` (created),
    so what one worker compiled is read by the next. Sets and returns the variables."""
    root = Path(cache_dir)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"), "TRITON_CACHE_DIR": str(root / "triton"),
           "JAX_COMPILATION_CACHE_DIR": str(root / "jax")}
    for value in env.values():
        Path(value).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    return env


# ---------------------------------------------------------------- the host

class PolicyError(Exception):
    """The policy's own code raised; carries the exception, its name and traceback, the stage."""

    def __init__(self, exc: BaseException, tb: str, stage: str):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc
        self.exception_type = type(exc).__name__
        self.remote_traceback = tb
        self.stage = stage

    def to_api_error(self) -> ApiError:
        """PolicyInputError -> 400 invalid_request with its message; anything else -> 500
        policy_error with ``details.exception_type``, ``details.builtin`` (a Python built-in
        exception the client may re-raise as itself), ``details.remote_traceback``."""
        if isinstance(self.exc, seq.PolicyInputError):
            return ApiError("invalid_request", str(self.exc) or "the policy refused this input",
                            details={"exception_type": self.exception_type},
                            hint="the policy's own check refused this request (a PolicyInputError, not a "
                                 "server fault); its message says what to change in what you sent")
        builtin = type(self.exc).__module__ == "builtins"
        return ApiError("policy_error", f"the policy raised {self.exception_type} in {self.stage}(): {self.exc}",
                        details={"exception_type": self.exception_type, "builtin": builtin,
                                 "exception_args": [str(a) for a in self.exc.args][:4] if builtin else None,
                                 "remote_traceback": self.remote_traceback},
                        hint="this is the policy's own error; fix it in the policy file (traceback in details.remote_traceback)")


@dataclass
class Prepared:
    """A checked, decoded request waiting for its replica."""

    observation: Any
    params: dict[str, Any]
    warnings: list[str]
    episode_id: Optional[str]
    end_episode: bool = False
    delay: dict[str, Any] = field(default_factory=dict)   # prefix / delay_steps, for an infer that declares them
    echo: dict[str, Any] = field(default_factory=dict)    # request_id / generation, answered back


@dataclass
class _Item:
    prepared: Optional[Prepared]
    future: concurrent.futures.Future
    episode_end: Optional[str] = None          # an on_episode call instead of an inference
    raw: Optional[tuple] = None                # (body, content type): decoded on the replica's thread
    due: Optional[float] = None                # the deadline it claimed (monotonic s): late past it


class RecentTimes:
    """A replica's last ``size`` request times (ms), with their median and maximum kept as they
    come in, for ``_Replica.run_inline``'s rule (it reads them on every request, so they are not
    recomputed there: a running sorted copy of the window, updated by ``bisect``, O(size) memmove
    a request instead of a sort).

    ``append(ms)``: a request's time; the oldest leaves once ``size`` are held. ``len()``: how
    many are held. ``summary``: ``(median, max)`` of a full window (the median is the upper one,
    ``sorted(window)[size // 2]``: the rule's as it was before), None while fewer than ``size``
    are held. Appends come from one thread at a time (under the replica's ``run_lock``); a reader
    on another thread gets one whole summary (one attribute, replaced, never changed in place)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._times: collections.deque = collections.deque()
        self._sorted: list[float] = []
        self.summary: Optional[tuple[float, float]] = None

    def append(self, ms: float) -> None:
        times, ordered = self._times, self._sorted
        if len(times) == self.size:
            del ordered[bisect.bisect_left(ordered, times.popleft())]
        times.append(ms)
        bisect.insort(ordered, ms)
        if len(times) == self.size:
            self.summary = (ordered[self.size // 2], ordered[-1])

    def __len__(self) -> int:
        return len(self._times)


@dataclass
class _Episode:
    replica: int
    last_seen: float


class _Replica:
    """One policy instance with its own thread and queue; runs acts alone or in batches."""

    def __init__(self, host: "PolicyHost", index: int):
        self.host = host
        self.index = index
        self.instance: Any = None
        self.queue = DeadlineQueue()               # earliest deadline first (schedule.py)
        self.busy = False
        self.busy_since = 0.0      # time.monotonic() when the current item started (valid while busy)
        self.thread: Optional[threading.Thread] = None
        self.run_lock = threading.Lock()           # held while an item is served, by either thread
        self.item_ms = RecentTimes(INLINE_WINDOW)  # recent requests' ms, their median and max
        self.inline = 0                            # requests served on the caller's thread

    def load_instance(self) -> None:
        self.instance = self.host.cls()
        try:
            self.instance.seq_replica = self.index
        except Exception:  # __slots__ or a property: the policy does not need to know
            pass

    def method(self, stage: str) -> Optional[Callable]:
        name = self.host.spec.methods.get(stage)
        return getattr(self.instance, name) if name else None

    def call(self, stage: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.method(stage)(*args, **kwargs)
        except _POLICY_RAISES as exc:
            raise PolicyError(exc, traceback.format_exc(), stage) from exc

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"policy-{self.index}", daemon=True)
        self.thread.start()

    def load(self) -> None:
        """On the caller's thread, before the replica thread starts."""
        self.load_instance()

    def _gather(self, first: _Item) -> list[_Item]:
        batching = self.host.spec.batching
        items = [first]
        if batching is None or first.prepared is None:
            return items
        t0 = time.monotonic()
        if self.host.mode == "eval":
            quiet, deadline = batching.eval_wait_ms / 1000.0, t0 + EVAL_BATCH_DEADLINE_MS / 1000.0
        else:
            quiet, deadline = batching.serve_wait_ms / 1000.0, t0 + batching.serve_wait_ms / 1000.0
        while len(items) < batching.max_batch_size:
            try:
                item = self.queue.get_nowait()       # whatever already waits joins at no cost
            except queue.Empty:
                wait = min(quiet, deadline - time.monotonic(), self._slack(items))
                if wait <= 0:
                    break
                try:
                    item = self.queue.get(timeout=wait)
                except queue.Empty:
                    break
            if item.episode_end is not None:        # an episode end: run it after this batch
                self.queue.put_last(item)
                break
            if item.raw is not None and not self._prepare(item):
                continue
            items.append(item)
        return items

    def _slack(self, items: list[_Item]) -> float:
        """How long (s) the batch may still wait for one more request: its earliest deadline
        less the predicted time of a call one larger (``CostCurve``); inf when none has a deadline."""
        dues = [i.due for i in items if i.due is not None]
        if not dues:
            return float("inf")
        predicted = self.host.cost.predict_ms(len(items) + 1) or 0.0
        return min(dues) - predicted / 1000.0 - time.monotonic()

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            with self.run_lock:
                self._serve(first)

    def _serve(self, first: _Item) -> None:
        """One item taken from the queue (or handed inline): an episode end, or a request and
        whatever batches with it. Holds ``run_lock`` (the caller took it)."""
        self.busy_since = time.monotonic()
        self.busy = True
        t0 = time.perf_counter()
        try:
            if first.episode_end is not None:
                self._end_episode(first)
                return
            if first.raw is not None and not self._prepare(first):
                return
            items = self._gather(first)
            live = [i for i in items if i.future.set_running_or_notify_cancel()]
            if live:
                self.run_batch(live)
            if len(items) == 1:
                self.item_ms.append((time.perf_counter() - t0) * 1000.0)
        finally:
            self.busy = False

    def run_inline(self, item: _Item, caller_blocks: bool = False) -> bool:
        """Serve ``item`` on the caller's thread -> True, when that costs less than handing it to
        this replica's thread: no batching, the replica idle with nothing queued, and its last
        ``INLINE_WINDOW`` requests (decode and infer) done in under ``INLINE_MS`` at the median,
        none over ``INLINE_MAX_MS`` (both kept as the times come in: :class:`RecentTimes`). The
        two cross-thread wake-ups of a hand-off cost 0.1-0.3 ms;
        a trivially cheap policy's whole request costs about that. Never at once with the
        replica's thread (``run_lock``): the policy instance is still called by one thread at a
        time. An item the replica's thread took from the queue just before may run after this
        one (the window is the replica's wake-up; a robot has one request in flight). False:
        queue it as usual (so ``infer`` may run on this replica's thread or the caller's, one at
        a time). Only on a host made with ``inline=True`` (the worker's ``--inline``),
        or for a caller whose thread may block (``caller_blocks``: a same-host door connection's
        own thread, ``local.py``): a call that hangs inline on the event loop holds /ping and
        every other robot with it until the gateway's health check replaces the worker, where a
        hang on the replica's thread (or on a door's) is answered 504 to the others and reported
        ``degraded`` (``busy_since``)."""
        summary = self.item_ms.summary        # (median, max) of the last INLINE_WINDOW, kept as they come
        if (not (self.host.inline or caller_blocks) or self.host.spec.batching is not None or self.busy or self.queue.qsize()
                or summary is None or summary[0] >= INLINE_MS or summary[1] >= INLINE_MAX_MS
                or not self.run_lock.acquire(blocking=False)):
            return False
        try:
            if self.queue.qsize():
                return False
            self._serve(item)
        finally:
            self.run_lock.release()
        self.inline += 1
        return True

    def _prepare(self, item: _Item) -> bool:
        """Decode a raw item here, on the replica's thread (``PolicyHost.submit_raw``). False when
        it was cancelled before, or its body was refused (the future then carries the ApiError)."""
        raw, item.raw = item.raw, None
        if item.future.cancelled():
            return False
        try:
            item.prepared = prepared = self.host.prepare(*raw)
        except Exception as exc:  # noqa: BLE001 - an ApiError (bad body) or a bug: the caller answers it
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(exc)
            return False
        if prepared.episode_id is not None:
            self.host.replica_for(prepared.episode_id)       # episode bookkeeping (one replica: this one)
            if prepared.end_episode:
                self.host.end_episode(prepared.episode_id)
        return True

    def _end_episode(self, item: _Item) -> None:
        try:
            if "on_episode" in self.host.spec.methods:
                self.call("on_episode", item.episode_end)
            item.future.set_result(None)
        except PolicyError as exc:
            log.warning("on_episode(%s) raised %s", item.episode_end, exc)
            item.future.set_exception(exc)

    def run_batch(self, items: list[_Item]) -> None:
        """Run the user's ``infer`` on ``items`` (one, or a batch under ``@seq.batched``), on this
        replica's thread; each item's future gets ``(result, seconds, batch size)`` or the error."""
        fn = self.method("infer")
        t0 = time.perf_counter()
        try:
            if self.host.spec.batching is None:
                p = items[0].prepared
                results = [fn(p.observation, **p.params, **p.delay)]
            else:
                obs = [i.prepared.observation for i in items]
                params = {d.name: [i.prepared.params.get(d.name, d.default) for i in items] for d in self.host.spec.params}
                for name in self.host.spec.delay_inputs:
                    params[name] = [i.prepared.delay.get(name) for i in items]
                results = fn(obs, **params)
                if not isinstance(results, (list, tuple)) or len(results) != len(items):
                    got = f"{len(results)} result(s)" if isinstance(results, (list, tuple)) else type(results).__name__
                    err = policy_error(f"batched infer() got {len(items)} request(s) and returned {got}; "
                                        "return a list with one chunk per request, in order", "batch")
                    for i in items:
                        i.future.set_exception(err)
                    return
        except _POLICY_RAISES as exc:
            err = PolicyError(exc, traceback.format_exc(), "infer")
            for i in items:
                i.future.set_exception(err)
            return
        seconds = time.perf_counter() - t0
        self.host.batch_sizes.append(len(items))
        self.host.cost.add(len(items), seconds)
        done = time.monotonic()
        for i, r in zip(items, results):
            if i.due is not None:                   # late or not, it is answered
                self.host.late.count(done > i.due)
            i.future.set_result((r, seconds, len(items)))


class PolicyHost:
    """Hosts one @seq.policy class: ``slots`` replicas (``@seq.concurrent``), each an instance
    with its own thread; requests are routed by episode (sticky) or to the least busy replica and
    batched per ``@seq.batched``.

    mode: "serve" (default: a batch never waits for more requests, except ``serve_wait_ms``) or
    "eval" (a batch closes after ``eval_wait_ms`` of quiet, when full, or 250 ms after its first
    request). episode_idle_s: an episode with no request for this long is ended (default 300 s).

    Lifecycle: ``start(weights_dir)`` constructs, loads, warms up and runs the synthetic check;
    ``prepare`` (any thread) checks/decodes a request; ``submit`` queues it and returns a Future of
    ``(result, inference seconds, batch size)``; ``check_chunk`` checks the result; ``stop`` runs
    ``@seq.shutdown``.
    """

    def __init__(self, cls: type, name: Optional[str] = None, *, mode: str = "serve",
                 episode_idle_s: float = EPISODE_IDLE_S, inline: bool = False):
        if mode not in ("serve", "eval"):
            raise ValueError(f"mode must be 'serve' or 'eval', got {mode!r}")
        self.cls = cls
        self.spec: PolicySpec = get_spec(cls)
        self.name = name or cls.__name__
        self.mode = mode
        self.episode_idle_s = float(episode_idle_s)
        self.inline = bool(inline)               # cheap requests may run on the caller's thread (run_inline)
        self.replicas = [_Replica(self, i) for i in range(self.spec.slots())]
        self.episodes: dict[str, _Episode] = {}
        self.lock = threading.Lock()
        self.timings: dict[str, float] = {}
        self.batch_sizes: list[int] = []
        self.cost = CostCurve()                  # ms per infer call by batch size, measured (/ping "cost")
        self.clamp = DeadlineClamp()             # a session's deadlines, spaced by its declared period
        self.late = LateCounter()                # requests with a deadline, and those answered past it
        self.robot_times = RobotTimes()          # each session's queued-to-answered ms (/ping "robots")
        self.ready = False
        self._stopped = False

    # -- lifecycle
    def start(self, weights_dir: Any, phase: Callable[[str], None] = lambda p: None) -> None:
        """Construct and load every replica, warm each up, then run one synthetic /act (black
        frames, zero vectors) through the whole path. Raises PolicyError (the policy's own
        error) or RuntimeError (the synthetic check failed)."""
        t0 = time.monotonic()
        phase("loading")
        for r in self.replicas:
            try:
                r.load_instance()
            except Exception as exc:
                raise PolicyError(exc, traceback.format_exc(), "__init__") from exc
            r.call("load", weights_dir)
        self.timings["load_s"] = time.monotonic() - t0
        if "warmup" in self.spec.methods:
            phase("warmup")
            t1 = time.monotonic()
            for r in self.replicas:
                r.call("warmup")
            self.timings["warmup_s"] = time.monotonic() - t1
        for r in self.replicas:
            r.start()
        if self.spec.observation is not None:
            phase("checking")
            t2 = time.monotonic()
            body = json.dumps({"observation": synthetic_observation(self.spec)}).encode()
            for r in self.replicas:
                try:
                    prepared = self.prepare(body)
                    result, _, _ = self.submit(prepared, replica=r.index).result()
                    check_chunk(result, self.spec)
                except PolicyError as exc:
                    if not isinstance(exc.exc, seq.PolicyInputError):
                        raise
                    log.info("synthetic check: the policy refused the synthetic input (%s); accepted", exc)
                except ApiError as exc:
                    raise RuntimeError(f"synthetic /act check failed: {exc.detail}") from exc
            self.timings["check_s"] = time.monotonic() - t2
        self.ready = True

    def stop(self, timeout: float = 10.0) -> None:
        """End open episodes (on_episode), then run @seq.shutdown on each replica."""
        if self._stopped:
            return
        self._stopped = True
        with self.lock:
            open_episodes = list(self.episodes)
        for eid in open_episodes:
            try:
                self.end_episode(eid).result(timeout=timeout)
            except Exception:
                log.exception("ending episode %s at shutdown", eid)
        for r in self.replicas:
            if r.thread is not None:
                r.queue.put_last(None)
                r.thread.join(timeout=timeout)
            # a call still running on another thread (a same-host door connection's, or the event
            # loop's under --inline) holds run_lock: shutdown waits for it as for the replica's own
            ran = r.run_lock.acquire(timeout=timeout)
            try:
                if r.instance is not None and "shutdown" in self.spec.methods:
                    try:
                        r.call("shutdown")
                    except Exception:
                        log.exception("@seq.shutdown raised")
            finally:
                if ran:
                    r.run_lock.release()

    # -- requests
    def prepare(self, raw: bytes, content_type: str = "application/json") -> Prepared:
        """Parse and check one /act body and decode its frames (any thread; no policy code).
        Raises ApiError(invalid_request) for a malformed body, a contract mismatch or params."""
        body, blobs = parse_act_body(raw, content_type)
        episode_id = body.get("episode_id")
        if episode_id is not None and (not isinstance(episode_id, str) or not 0 < len(episode_id) <= 128):
            raise ApiError("invalid_request", "episode_id must be a string of 1 to 128 characters")
        given = body.get("params") or {}
        if isinstance(given, dict):
            for name, value in given.items():
                if isinstance(value, int) and not isinstance(value, bool) and not fits_float(value):
                    raise ApiError("invalid_request", f"param {name!r} is a number too large for a 64-bit float",
                                   details={"reason": "params", "param": name}, hint="send a value in the declared range")
        try:
            params = cast_params(self.spec.params, given)
        except ParamError as exc:
            raise ApiError("invalid_request", str(exc), details={"reason": "params", "param": exc.name,
                           "declared": [p.to_dict() for p in self.spec.params]},
                           hint="send only the params infer() declares, with allowed values (seq policy status lists them)") from None
        end = body.get("end_episode", False)
        if not isinstance(end, bool):  # "false" is truthy: refuse anything but a JSON boolean
            raise ApiError("invalid_request", f"end_episode must be true or false, got {end!r}",
                           hint='send "end_episode": true')
        delay, echo = parse_delay(body, self.spec)
        if self.spec.infer_mode == "raw":
            return Prepared(body["observation"], params, [], episode_id, end, delay, echo)
        obs, warnings = parse_observation(body["observation"], self.spec, episode_id, blobs)
        return Prepared(obs, params, warnings, episode_id, end, delay, echo)

    def replica_for(self, episode_id: Optional[str]) -> _Replica:
        """The replica an episode's requests go to: the one it started on (sticky; a new episode
        takes the replica holding the fewest, then the shortest queue), or for a request with no
        episode the least busy one. Notes the episode as seen now."""
        if len(self.replicas) == 1 and episode_id is None:
            return self.replicas[0]
        now = time.monotonic()
        with self.lock:
            if episode_id is not None:
                ep = self.episodes.get(episode_id)
                if ep is None:
                    counts = [0] * len(self.replicas)
                    for e in self.episodes.values():
                        counts[e.replica] += 1
                    index = min(range(len(self.replicas)), key=lambda i: (counts[i], self.replicas[i].queue.qsize()))
                    ep = self.episodes[episode_id] = _Episode(index, now)
                ep.last_seen = now
                return self.replicas[ep.replica]
            return min(self.replicas, key=lambda r: r.queue.qsize() + r.busy)

    def oldest_request_s(self, now: Optional[float] = None) -> float:
        """Seconds the longest-running item (an inference or an episode end) has been running on
        any replica; 0.0 when every replica is idle. Read by /ping to report a jammed worker."""
        now = time.monotonic() if now is None else now
        ages = [now - r.busy_since for r in self.replicas if r.busy]
        return max(ages, default=0.0)

    def submit(self, prepared: Prepared, replica: Optional[int] = None, due: Optional[float] = None,
               order: Optional[float] = None, caller_blocks: bool = False) -> concurrent.futures.Future:
        """Queue a prepared request on its replica. -> Future of (result, seconds, batch size);
        the future raises PolicyError or ApiError(policy_error). ``due``: its deadline (monotonic
        s; answered later it is counted late), ``order``: the deadline it is queued by (the
        clamped ``due``, ``DeadlineClamp``); both None: first-come first-served.
        ``caller_blocks``: the caller's thread may run it (``_Replica.run_inline``)."""
        target = self.replicas[replica] if replica is not None else self.replica_for(prepared.episode_id)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        item = _Item(prepared, fut, due=due)
        if not target.run_inline(item, caller_blocks):
            target.queue.put(item, due if order is None else order)
        if prepared.end_episode and prepared.episode_id is not None:
            self.end_episode(prepared.episode_id)
        return fut

    @property
    def decodes_on_replica(self) -> bool:
        """True when ``submit_raw`` may be used: one replica, so no routing needs the body first."""
        return len(self.replicas) == 1

    def submit_raw(self, raw: bytes, content_type: str, due: Optional[float] = None,
                   order: Optional[float] = None, caller_blocks: bool = False) -> tuple[concurrent.futures.Future, _Item]:
        """Queue an undecoded /act body on the only replica: it is parsed, checked and decoded on
        the replica's thread just before inference (one thread hop in all). -> (Future of
        (result, seconds, batch size), the item: ``item.prepared`` is set once decoded). The
        future raises ApiError(invalid_request) for a refused body, else as ``submit``. Only
        when ``decodes_on_replica``; with several replicas use ``prepare`` + ``submit``.
        ``due`` / ``order`` / ``caller_blocks``: as ``submit``."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        item = _Item(None, fut, raw=(raw, content_type), due=due)
        if not self.replicas[0].run_inline(item, caller_blocks):
            self.replicas[0].queue.put(item, due if order is None else order)
        return fut, item

    def end_episode(self, episode_id: str) -> concurrent.futures.Future:
        """End an episode: ``@seq.on_episode(episode_id)`` runs on its replica after the acts
        already queued there. Unknown episodes end at once (a Future already done)."""
        with self.lock:
            ep = self.episodes.pop(episode_id, None)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if ep is None:
            fut.set_result(None)
            return fut
        self.replicas[ep.replica].queue.put_last(_Item(None, fut, episode_end=episode_id))
        return fut

    def reap_idle_episodes(self, now: Optional[float] = None) -> list[str]:
        """End every episode idle for ``episode_idle_s``; -> their ids."""
        now = time.monotonic() if now is None else now
        with self.lock:
            idle = [eid for eid, ep in self.episodes.items() if now - ep.last_seen >= self.episode_idle_s]
        for eid in idle:
            log.info("episode %s idle for %.0f s: ended by the worker", eid, self.episode_idle_s)
            self.end_episode(eid)
        return idle
