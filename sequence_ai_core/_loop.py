"""The control loop behind ``run()`` and ``act()``: observe, fetch, pace, act, stop.

One pass of the loop is one control tick::

    harvest a finished fetch -> maybe start the next one (prefetch) -> sleep to action k's deadline
    -> (buffer empty? underrun: wait for the chunk) -> validate -> act -> until?

Decisions, in one place:

- Pacing: action k is due at ``t0 + k / control_frequency_hz`` on the monotonic clock
  (``_pacing.Pacer``). A loop more than one period late resyncs rather than bursting, and counts a
  late tick.
- Open-loop horizon: each chunk plays its first ``open_loop_horizon`` rows (all rows without
  one), then the next chunk takes over (``_buffer.ChunkBuffer``).
- Prefetch: the next request starts when the buffer's time left falls to the worst refill
  turnaround of the last ``_prefetch.WINDOW`` requests (the connection's cold first one left
  out) plus one period (``_prefetch.LatencyEstimate``; the mean would plan for the typical wait
  and underrun whenever synchronized robots queue on one replica). The loop wakes at that
  moment (``_prefetch_at``), not only at action deadlines; one request is in flight at a time,
  and at most ``lookahead`` chunks are held or requested ahead of the playing one. With
  ``prefetch=False`` the loop observes and requests only when an action is due and the buffer
  is empty: strictly closed loop, stall included, and each stall is an underrun.
- Lookahead: ``lookahead=N`` keeps N chunks queued behind the playing one; it does not only cap
  the queue. N = 1 (the default) is the refill plan above: the one chunk behind the playing one
  is requested as late as the latency allows, so its observation is the freshest that still
  lands in time. N >= 2 asks for depth over freshness: the next request starts as soon as fewer
  than N chunks are queued and none is in flight, without waiting for the refill lead (waiting
  could only leave the queue shallower). In steady state a request starts when a queued chunk
  starts playing, so it has about N chunks' playing time to land (against the worst recent
  turnaround plus a period at N = 1), and from its arrival until the playing chunk ends the
  queue holds N. Still one request in flight at a time: the depth is bought with staleness (a
  chunk is planned from an observation taken about N chunks before it plays), never with extra
  load on the worker. Queued chunks play in order, each whole, each measured (and, if asked,
  smoothed) at its own seam against the last executed action (``_buffer.ChunkBuffer``); an
  interrupt drops them.
- Underrun: an action was due and the buffer was empty. Counted once, ``on_underrun()`` called
  once, and the seconds from the missed deadline to the chunk's arrival added to ``underrun_s``.
  The first chunk of a run is startup, not an underrun.
- Warming: before the first action a 503 warming is waited out (re-observing each attempt) for up
  to ``startup_timeout_s``; after the first action it is raised.
- Endings: ``completed`` (max_actions executed) and ``until`` (the caller's predicate) are the
  endings the caller asked for. ``interrupted``, ``validate``, ``timeout`` and any exception are
  early endings: ``hold()`` is called exactly once for them, in a ``finally``, and an exception is
  re-raised after it. A caller who also wants a hold after success calls it after run() returns.
- ``max_seconds`` (``act()``) bounds motion: its clock starts at the first action; the startup
  wait is bounded by ``startup_timeout_s`` instead.
- Limits: each row is clipped into the declared bounds / max_delta (``_limits.py``) right
  before validate and act, against the last executed row, so they hold across seams; a chunk
  that needed it raises one ``LimitWarning``; ``on_violation="refuse"`` ends the run instead
  (``PolicyError``, reason ``bounds``, after ``hold``).
- Progress: "starting …", "running …", "done: RunOutcome(...)" go to ``on_status`` and, with
  ``progress="auto"``, to stderr only when it is a terminal, as one line rewritten in place
  (``_progress.py``).
- Interrupt: the flag is checked at every wake and immediately before every ``act``; in-flight
  requests are cancelled and buffered rows dropped.
- Episode: every request of one run carries the run's ``episode_id``; when the run ends, however
  it ends (exception included), after ``hold()``, the worker is told the episode is over
  (``POST /episode/end``) so the policy's ``@seq.on_episode`` frees its state at once. The
  answer is awaited for half a control period at most (the worker answers only after the
  episode's queued acts), so run() still returns within one period of an interrupt.
"""
from __future__ import annotations

import asyncio
import inspect
import math
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ._buffer import ChunkBuffer, Entry
from ._errors import SequencesError, Unavailable
from ._limits import Limits, LimitWarning
from ._pacing import Pacer
from ._progress import progress_line
from ._types import RunOutcome, observation_to_wire
from .protocol import Contract

__all__ = ["LoopConfig", "ControlLoop", "EARLY_ENDINGS"]

EARLY_ENDINGS = frozenset({"interrupted", "validate", "timeout"})
_DEFAULT_HZ = 15.0


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async callable on the loop's thread; await the result if it is awaitable."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


@dataclass
class LoopConfig:
    """Everything one run() / act() was asked to do (see AsyncPolicy.run for the meaning)."""

    observe: Callable[[], Any]
    act: Callable[[Any], Any]
    max_actions: Optional[int] = None
    max_seconds: Optional[float] = None
    validate: Optional[Callable[[Any], Any]] = None
    hold: Optional[Callable[[], Any]] = None
    on_underrun: Optional[Callable[[], Any]] = None
    until: Optional[Callable[[], Any]] = None
    prefetch: bool = True
    lookahead: int = 1
    smooth_seam: int = 0
    startup_timeout_s: float = 1800.0
    on_status: Optional[Callable[[str], Any]] = None
    on_chunk: Optional[Callable[[Any, int], Any]] = None
    on_warming: Optional[Callable[[float, Optional[float]], Any]] = None
    progress: Any = "auto"
    params: Optional[Dict[str, Any]] = None


class _Stop(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


class ControlLoop:
    """One run of the loop. Built by AsyncPolicy for each run()/act(); not reused.

    Args:
        policy: the AsyncPolicy (its wire, interrupt, latency estimate and instruction state).
        config: what the caller asked for.
    """

    def __init__(self, policy: Any, config: LoopConfig) -> None:
        self.p = policy
        self.cfg = config
        self.buffer: ChunkBuffer = policy._buffer
        self.interrupt = policy._interrupt
        self.latency = policy._latency
        self.episode_id = f"ep_{uuid.uuid4().hex[:12]}"
        self.fetch: Optional[asyncio.Task] = None
        self.fetch_started = 0.0
        self.fetch_version = 0
        self.requests = 0
        self.out = RunOutcome(reason="")
        self.k = 0
        self.pacer: Optional[Pacer] = None
        self.motion_end = math.inf
        self.limits: Optional[Limits] = None
        self._limits_from: Any = None
        self._warned_chunk: Optional[int] = None
        self._print = progress_line(config.progress)

    # ---------------------------------------------------------------- entry

    async def run(self) -> RunOutcome:
        """Drive until an ending; hold on early endings and exceptions; return the outcome."""
        t_start = time.monotonic()
        self.interrupt.bind()
        self.buffer.reset()
        self.buffer.smooth_seam = max(0, int(self.cfg.smooth_seam))
        reason: Optional[str] = None
        self._status(f"starting {self.p.model}…")
        try:
            try:
                await self._startup()
                self._status(f"running {self.p.model}")
                await self._drive()
            except _Stop as stop:
                reason = stop.reason
        finally:
            await self._cancel_fetch()
            self.buffer.clear()
            if reason is None:          # an exception: end the progress line before it surfaces
                self._print.end()
            self.interrupt.unbind()
            self.out.seconds = time.monotonic() - t_start
            try:
                if self.cfg.hold is not None and (reason is None or reason in EARLY_ENDINGS):
                    await _call(self.cfg.hold)
            finally:
                if self.requests:
                    self.p._wire.end_episode_soon(self.episode_id)
                # the episode end (and leaving a line, if the run waited in one) get half a
                # period to be answered; the rest finishes in the background
                period = self.pacer.period_s if self.pacer is not None else 1.0 / _DEFAULT_HZ
                await self.p._wire.settle(period / 2)
        self.out.reason = reason
        self.out.actions = self.k
        self.out.chunks = self.buffer.chunks_started
        self.out.max_seam_jump = self.buffer.max_seam_jump
        self._status(f"done: {self.out!r}")
        self._print.end()
        return self.out

    # -------------------------------------------------------------- startup

    async def _startup(self) -> None:
        """Fetch the first chunk, waiting out warming for up to startup_timeout_s."""
        t0 = time.monotonic()
        limit = max(0.0, float(self.cfg.startup_timeout_s or 0.0))
        if self.cfg.max_actions == 0:
            raise _Stop("completed")
        while True:
            self._check_interrupt()
            await self._start_fetch()
            while not self.fetch.done():
                self._check_interrupt()
                await self.interrupt.sleep_until(math.inf)
            self._check_interrupt()
            try:
                self._harvest()
                break
            except Unavailable as exc:
                waited = time.monotonic() - t0
                if not exc.warming or limit <= 0 or waited >= limit:
                    raise
                self._warming(waited, exc.retry_after_s)
                pause = min(max(exc.retry_after_s or 1.0, 0.25), 2.0, limit - waited)
                await self.interrupt.sleep_until(time.monotonic() + pause)
        if len(self.buffer) == 0:
            raise SequencesError("the policy returned an empty action chunk", code="empty_chunk")
        now = time.monotonic()
        self.pacer = Pacer(now, self._period(self.buffer.queued[0]))
        if self.cfg.max_seconds is not None:
            self.motion_end = now + float(self.cfg.max_seconds)

    def _warming(self, waited: float, eta: Optional[float]) -> None:
        text = f"starting {self.p.model}: waited {waited:.0f}s" + (
            f", ready in ~{eta:.0f}s" if eta is not None else "")
        if self.p._on_warming is not None:
            self.p._on_warming(waited, eta)
        if self.cfg.on_warming is not None:
            self.cfg.on_warming(waited, eta)
        self._status(text)

    def _status(self, text: str) -> None:
        """One progress line: to ``on_status`` and, when enabled, to stderr."""
        if self.cfg.on_status is not None:
            self.cfg.on_status(text)
        self._print(text)

    # ----------------------------------------------------------------- drive

    async def _drive(self) -> None:
        cfg = self.cfg
        while True:
            self._check_interrupt()
            if cfg.max_actions is not None and self.k >= cfg.max_actions:
                raise _Stop("completed")
            self._harvest()
            deadline = self.pacer.deadline(self.k)
            now = time.monotonic()
            if now >= self.motion_end:
                raise _Stop("timeout")
            prefetch_at = self._prefetch_at(deadline) if cfg.prefetch else math.inf
            if now >= prefetch_at:
                await self._start_fetch()
                continue
            if now < deadline:
                await self.interrupt.sleep_until(min(deadline, self.motion_end, prefetch_at))
                continue
            # action k is due
            if len(self.buffer) == 0:
                await self._underrun(deadline)
                continue  # re-check interrupt / bounds before acting on the fresh chunk
            if self.pacer.is_late(self.k, now):
                self.out.late_ticks += 1
                self.pacer.resync(self.k, now)
            await self._step()

    async def _step(self) -> None:
        """Pop, validate and execute action k; then until()."""
        cfg = self.cfg
        row, started = self.buffer.pop(self.k)
        entry = started or self.buffer.current
        if started is not None:
            self._chunk_started(started)
        if self.limits is not None:
            row, clipped = self.limits.apply(row, self.buffer.last_action,
                                             entry.chunk.action_space if entry else None)
            if clipped:
                self.out.clipped += clipped
                self._warn_clipped(entry)
        if cfg.validate is not None and not await _call(cfg.validate, row):
            raise _Stop("validate")
        self._check_interrupt()  # nothing reaches act() once the interrupt is seen
        await _call(cfg.act, row)
        self.buffer.executed(row)
        self.pacer.set_period(self.k, self._period(entry))
        self.k += 1
        if cfg.until is not None and await _call(cfg.until):
            raise _Stop("until")

    async def _underrun(self, deadline: float) -> None:
        """The buffer is empty at a deadline: count it, tell the caller, wait for the chunk."""
        if self.fetch is None:
            await self._start_fetch()
        self.out.underruns += 1
        if self.cfg.on_underrun is not None:
            await _call(self.cfg.on_underrun)
        while not self.fetch.done():
            self._check_interrupt()
            if time.monotonic() >= self.motion_end:
                self.out.underrun_s += time.monotonic() - deadline
                raise _Stop("timeout")
            await self.interrupt.sleep_until(self.motion_end)
        self._check_interrupt()
        self._harvest()
        now = time.monotonic()
        self.out.underrun_s += max(0.0, now - deadline)
        self.pacer.resync(self.k, now)
        if len(self.buffer) == 0:
            raise SequencesError("the policy returned an empty action chunk", code="empty_chunk")

    # ---------------------------------------------------------------- fetch

    def _prefetch_at(self, deadline: float) -> float:
        """When (monotonic s) the next request should start: ``-inf`` for now, ``inf`` for not
        while nothing changes (a request in flight, lookahead full, the buffer outlasting the
        run). With ``lookahead`` N >= 2, now: a free slot in the queue is filled at once.
        With N = 1, the moment the buffer's time left falls to the latency estimate's lead
        (``LatencyEstimate.lead_s``: worst recent turnaround plus one period); the loop wakes
        for it rather than waiting for the next action deadline."""
        if self.fetch is not None:
            return math.inf
        depth = max(1, int(self.cfg.lookahead))
        if self.buffer.chunks_queued >= depth:
            return math.inf
        rows_left = len(self.buffer)
        if self.cfg.max_actions is not None and self.k + rows_left >= self.cfg.max_actions:
            return math.inf  # what is buffered already finishes the run
        period = self.pacer.period_s
        dry_at = deadline + self.buffer.seconds_left(period)  # first deadline it cannot supply
        if dry_at >= self.motion_end:
            return math.inf  # what is buffered already outlasts max_seconds
        if depth > 1:
            return -math.inf  # depth over freshness: fill the free slot now
        lead = self.latency.lead_s(period)
        return -math.inf if lead is None else dry_at - lead

    async def _start_fetch(self) -> None:
        """Observe (on this thread) and start the request in the background."""
        self.fetch_started = time.monotonic()
        observation = await _call(self.cfg.observe)
        instruction, version = self.p._instruction_now()
        wire = self.p._check(observation_to_wire(observation, instruction))
        self.fetch_version = version
        self.requests += 1
        self.fetch = asyncio.ensure_future(
            self.p._request(wire, self.cfg.params, self.episode_id, need_chunk=True))
        self.fetch.add_done_callback(lambda _t: self.interrupt.poke())

    def _harvest(self) -> None:
        """Move a finished fetch's chunk into the buffer; raise its error if it failed."""
        task = self.fetch
        if task is None or not task.done():
            return
        self.fetch = None
        prediction = task.result()  # raises the request's error
        self._refresh_limits()
        self.latency.add(time.monotonic() - self.fetch_started)
        for warning in prediction.warnings:
            self._print.note(f"worker warning: {warning}")
        self.buffer.push(prediction.action_chunk, tag=(self.fetch_version, prediction))

    async def _cancel_fetch(self) -> None:
        task, self.fetch = self.fetch, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        try:
            await task
        except BaseException:  # noqa: BLE001 - cancelled or failed; dropped either way
            pass

    # --------------------------------------------------------------- chunks

    def _chunk_started(self, entry: Entry) -> None:
        self.out.action_space = entry.chunk.action_space
        version = entry.tag[0] if entry.tag else 0
        swaps, lag = self.p._instruction_arrived(version, time.monotonic())
        self.out.instruction_swaps += swaps
        if lag is not None:
            self.out.max_instruction_lag_s = max(self.out.max_instruction_lag_s or 0.0, lag)
        if self.cfg.on_chunk is not None:
            self.cfg.on_chunk(entry.chunk, entry.first_action_index)

    def _warn_clipped(self, entry: Optional[Entry]) -> None:
        """One ``LimitWarning`` per chunk the client had to clip (the seam row, mostly)."""
        key = id(entry)
        if key == self._warned_chunk:
            return
        self._warned_chunk = key
        first = self.buffer.last_action is not None and entry is not None and self.k == entry.first_action_index
        where = "the first action of a chunk (its seam)" if first else f"action {self.k}"
        text = (f"clipped {where} into the declared limits before act(): "
                + "; ".join(self.limits.last_violations[:4]))
        warnings.warn(text, LimitWarning, stacklevel=2)
        self._print(text)

    def _refresh_limits(self) -> None:
        """Rebuild the client-side limits when the handshake's contract changed (a reconnect)."""
        contract = self.p.contract
        if contract is not self._limits_from:
            self._limits_from = contract
            self.limits = Limits.from_contract(Contract.from_wire(contract).action)

    @staticmethod
    def _period(entry: Optional[Entry]) -> float:
        hz = entry.chunk.control_frequency_hz if entry is not None else None
        return 1.0 / (hz if hz and hz > 0 else _DEFAULT_HZ)

    def _check_interrupt(self) -> None:
        if self.interrupt.is_set:
            raise _Stop("interrupted")
