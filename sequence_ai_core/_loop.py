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
  interrupt drops them. Under an ``aligned`` merge each answer replaces the whole plan, so no
  chunk ever queues behind another and N counts as 1 (a deeper N asked again the moment each
  answer landed: back-to-back requests, as fast as the worker answered).
- Underrun: an action was due and the buffer was empty. Counted once, ``on_underrun()`` called
  once, and the seconds from the missed deadline to the chunk's arrival added to ``underrun_s``.
  The first chunk of a run is startup, not an underrun.
- Warming: before the first action a 503 warming is waited out (re-observing each attempt) for up
  to ``startup_timeout_s``; after the first action it is raised.
- Endings (``_types.END_REASONS``): ``completed`` (max_actions executed), ``until`` (the
  caller's predicate, after an action) and ``stop_when`` (the caller's predicate on the
  observation) are the endings the caller asked for. ``interrupted``, ``operator``,
  ``validate``, ``timeout`` and any exception are early endings: ``hold()`` is called exactly
  once for them, in a ``finally``, and an exception is re-raised after it (``operator`` before
  any action holds nothing: the operator has the robot). A caller who also wants a hold after
  success calls it after run() returns.
- Control-period checks: with ``stop_when`` or ``max_frame_age_s`` the loop observes once every
  control period, at each action's deadline before the action and, while it waits for a late
  chunk, at each deadline it misses: a stale camera ends the run ``stale_camera`` within its
  age plus one period, ``stop_when(observation)`` true ends it ``stop_when`` before that action.
- Operator (``_interrupt.Operator``, the policy's): active when the run starts, it returns
  ``operator`` at once; taken mid-run, it wakes the loop like an interrupt and the run holds and
  ends ``operator``.
- ``max_seconds`` (``act()``) bounds motion: its clock starts at the first action; the startup
  wait is bounded by ``startup_timeout_s`` instead.
- Limits: each row is clipped into the declared bounds / max_delta (``_limits.py``) right
  before validate and act, against the last executed row, so they hold across seams; a chunk
  that needed it raises one ``LimitWarning``; ``on_violation="refuse"`` ends the run instead
  (``PolicyError``, reason ``bounds``, after ``hold``).
- Progress: "starting …", "running …", "done: RunOutcome(...)" go to ``on_status`` and, with
  ``progress="auto"``, to stderr only when it is a terminal, as one line rewritten in place
  (``_progress.py``).
- Interrupt: each run watches a ``StopToken`` of its own (``_interrupt.py``), made before the
  run starts (``run(stop=...)``, else on entry to ``run()``) and never cleared: one stopped
  before the first chunk ends the run before anything is observed or acted, and one stopped
  for an earlier run cannot reach this one. It is checked at every wake and immediately before
  every ``act``; in-flight requests are cancelled and buffered rows dropped.
- Episode: every request of one run carries the run's ``episode_id``; when the run ends, however
  it ends (exception included), after ``hold()``, the worker is told the episode is over
  (``POST /episode/end``) so the policy's ``@seq.on_episode`` frees its state at once. The
  answer is awaited for half a control period at most (the worker answers only after the
  episode's queued acts), so run() still returns within one period of an interrupt.
- Delay (``_delay.py``): every request carries the committed prefix (the rows the buffer will
  play from its observation on), the delay in control steps (the most actions consumed while
  one of the run's recent requests was in flight), the capture time, a request id and the run's
  generation. An answer whose echoed generation or request id is not this run's current one is
  dropped, never played (``stale_answers``).
- Negotiation, before the first action: the delay mode asked for (``delay_mode``) must be one
  the contract declares, else ``DelayUnsupported``; the merge defaults to ``aligned`` for a
  policy that declares ``guided`` / ``trained``, else ``replace``. With a declared
  ``max_delay_steps`` the start-up delay (turnaround x the declared control frequency; the
  connection's cold first request is re-measured) beyond it raises ``DelayUnsupported``; mid-run
  a delay beyond it holds and ends with ``delay_exceeded`` (``RunOutcome.fault``).
- Merge: ``replace`` queues the chunk behind the buffer; ``aligned`` / ``aligned_blend`` make it
  the plan from the row due now (``ChunkBuffer.merge_aligned``).
- Cameras (``_freshness.py``): with ``max_frame_age_s``, an observation whose stream has not
  advanced for longer than its age is not sent; the run holds and ends with ``stale_camera``.
  The streams are checked every control period (above), not only when a request is built.
"""
from __future__ import annotations

import asyncio
import inspect
import math
import time
import uuid
import warnings
from typing import Any, Callable, Dict, Optional

from ._buffer import ChunkBuffer, Entry
from ._delay import committed_prefix, steps_for
from ._errors import DelayUnsupported, SequencesError, StaleCamera, Unavailable
from ._freshness import CameraWatch
from ._interrupt import StopToken
from ._seam import SeamSummary, _quantile
from ._limits import Limits, LimitWarning
from ._pacing import Pacer
from ._run_options import MERGES, LoopConfig  # noqa: F401 - LoopConfig is part of this module's face
from ._progress import progress_line
from ._types import RunOutcome, observation_to_wire
from .protocol import Contract

__all__ = ["LoopConfig", "ControlLoop", "EARLY_ENDINGS"]

EARLY_ENDINGS = frozenset({"interrupted", "operator", "validate", "timeout", "delay_exceeded", "stale_camera"})
_DEFAULT_HZ = 15.0
#: Rows an ``aligned_blend`` cross-fades when ``smooth_seam`` does not say.
BLEND_STEPS = 4


def _p50_p99(values: list) -> tuple:
    """(median, 99th percentile) of ``values`` (s), (None, None) when there are none."""
    return (_quantile(values, 0.5), _quantile(values, 0.99)) if values else (None, None)


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async callable on the loop's thread; await the result if it is awaitable."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class _Stop(Exception):
    def __init__(self, reason: str, fault: Optional[Exception] = None) -> None:
        self.reason = reason
        self.fault = fault


class ControlLoop:
    """One run of the loop. Built by AsyncPolicy for each run()/act(); not reused.

    Args:
        policy: the AsyncPolicy (its wire, interrupt, latency estimate and instruction state).
        config: what the caller asked for.
        stop: this run's StopToken (made before the run; a fresh one when None).
    """

    def __init__(self, policy: Any, config: LoopConfig, stop: Optional[StopToken] = None) -> None:
        self.p = policy
        self.cfg = config
        self.buffer: ChunkBuffer = policy._buffer
        self.interrupt = policy._interrupt
        self.stop = stop if stop is not None else StopToken()
        self.latency = policy._latency
        self.now = policy._clock.now     # monotonic s (``_clock.py``); the interrupt waits on the same clock
        self.episode_id = f"ep_{uuid.uuid4().hex[:12]}"
        self.fetch: Optional[asyncio.Task] = None
        self.fetch_started = 0.0
        self.fetch_version = 0
        self.fetch_obs_at = 0.0          # when the request in flight's observation was taken (loop clock)
        self.fetch_observation: Any = None   # the observation the request in flight carries (observe()'s own object)
        self.obs_to_action: list = []    # s from an observation to the first action played from its chunk
        self.fetch_k = 0                 # actions executed when the request in flight observed
        self.fetch_info: Dict[str, Any] = {}
        self.requests = 0
        self.delay = policy._delay
        self.delay.new_run()
        policy._generation += 1
        self.generation = policy._generation
        self.watch = CameraWatch(config.max_frame_age_s)
        self.operator = policy.operator          # bound for the run: a replacement applies from the next run
        self._operator_took = False              # latched: a take-and-release between two checks still ends it
        self._ticking = config.stop_when is not None or self.watch.enabled   # observe every period
        self.merge = config.merge or "replace"
        self.max_delay: Optional[int] = None
        self.startup_steps = 0
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
        t_start = self.now()
        self.interrupt.bind(self.stop)   # never clears it: a stop that came first is seen below
        unwatch_operator = self.operator.watch(self._operator_takes)
        self.buffer.reset()
        self.buffer.smooth_seam = max(0, int(self.cfg.smooth_seam))
        reason: Optional[str] = None
        self._status(f"starting {self.p.model}…")
        try:
            try:
                if self._operator_took or self.operator.active:
                    raise _Stop("operator")
                await self._startup()
                self._status(f"running {self.p.model}")
                await self._drive()
            except _Stop as stop:
                reason = stop.reason
                self.out.fault = stop.fault
        finally:
            await self._cancel_fetch()
            self.buffer.clear()
            if reason is None:          # an exception: end the progress line before it surfaces
                self._print.end()
            unwatch_operator()
            self.interrupt.unbind()
            self.out.seconds = self.now() - t_start
            held = reason is None or (reason in EARLY_ENDINGS and not (reason == "operator" and self.k == 0))
            try:
                if self.cfg.hold is not None and held:
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
        self.out.seams = SeamSummary.of(self.buffer.seams)
        self.out.obs_to_action_p50_s, self.out.obs_to_action_p99_s = _p50_p99(self.obs_to_action)
        self.out.merge = self.merge
        self._status(f"done: {self.out!r}")
        self._print.end()
        return self.out

    # -------------------------------------------------------------- startup

    async def _startup(self) -> None:
        """Fetch the first chunk (waiting out warming for up to startup_timeout_s), negotiate
        the delay mode and check the start-up delay, all before the first action."""
        if self.cfg.max_actions == 0:
            raise _Stop("completed")
        cold = self.delay.cold is None
        self._check_watched_views()
        await self._first_chunk()
        self._check_watched_views()      # the handshake of the first request brought the contract
        self._negotiate()
        if self.max_delay is not None and cold:   # the cold request says little: measure a warm one
            self.buffer.clear()
            await self._first_chunk()
        if self.max_delay is not None and self.startup_steps > self.max_delay:
            raise DelayUnsupported(
                f"{self.p.model} declares it handles {self.max_delay} control steps of inference delay; "
                f"the delay measured before motion is {self.startup_steps} steps", code="delay_exceeded",
                delay_steps=self.startup_steps, max_delay_steps=self.max_delay,
                hint="bring the worker closer (or unload it), or use a policy trained for longer delays")
        now = self.now()
        self.pacer = Pacer(now, self._period(self.buffer.queued[0]))
        if self.cfg.max_seconds is not None:
            self.motion_end = now + float(self.cfg.max_seconds)

    def _check_watched_views(self) -> None:
        """InvalidRequest (before any motion) when max_frame_age_s names a view the contract lacks."""
        if self.p.contract is not None:
            observation = Contract.from_wire(self.p.contract).observation
            self.watch.check_views(list(observation.cameras) if observation is not None else None)

    def _negotiate(self) -> None:
        """The delay mode and merge for this run, from the contract; DelayUnsupported on a mismatch."""
        action = Contract.from_wire(self.p.contract).action
        modes = action.delay_modes if action is not None else ("chunk",)
        mode = self.cfg.delay_mode or next((m for m in ("trained", "guided") if m in modes), "chunk")
        if mode not in modes:
            raise DelayUnsupported(
                f"delay_mode={mode!r} was asked for, but {self.p.model} declares {list(modes)}",
                code="delay_mode_unsupported", details={"declared": list(modes), "asked": mode},
                hint=f"pass delay_mode= one of {list(modes)}, or deploy a policy that supports {mode!r}")
        self.out.delay_mode = mode
        self.merge = self.cfg.merge or ("aligned" if set(modes) - {"chunk"} else "replace")
        self.max_delay = action.max_delay_steps if action is not None else None

    async def _first_chunk(self) -> None:
        """Fetch a chunk into the empty buffer before motion, waiting out warming."""
        t0 = self.now()
        limit = max(0.0, float(self.cfg.startup_timeout_s or 0.0))
        while True:
            self._check_interrupt()
            await self._start_fetch()
            while not self.fetch.done():
                self._check_interrupt()
                await self.interrupt.sleep_until(math.inf)
            self._check_interrupt()
            try:
                if self._harvest():
                    break
                continue   # an answer of an older generation: ask again
            except Unavailable as exc:
                waited = self.now() - t0
                if not exc.warming or limit <= 0 or waited >= limit:
                    raise
                self._warming(waited, exc.retry_after_s)
                pause = min(max(exc.retry_after_s or 1.0, 0.25), 2.0, limit - waited)
                await self.interrupt.sleep_until(self.now() + pause)
        if len(self.buffer) == 0:
            raise SequencesError("the policy returned an empty action chunk", code="empty_chunk")

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
            now = self.now()
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
            if self._ticking:
                await self._tick()
            await self._step()

    async def _tick(self) -> None:
        """This control period's observation: camera freshness, then ``stop_when``."""
        observation = await _call(self.cfg.observe)
        if self.watch.enabled:
            try:
                self.watch.check(observation_to_wire(observation), self.now())
            except StaleCamera as exc:
                raise _Stop("stale_camera", exc) from None
        if self.cfg.stop_when is not None and await _call(self.cfg.stop_when, observation):
            raise _Stop("stop_when")
        self._check_interrupt()

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
        if started is not None and started.tag:      # the first action from this observation's chunk
            self.obs_to_action.append(self.now() - started.tag[2])
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
        period = self.pacer.period_s
        next_tick = deadline if self._ticking else math.inf   # the missed deadline is a control period too
        while True:
            while not self.fetch.done():
                self._check_interrupt()
                now = self.now()
                if now >= self.motion_end:
                    self.out.underrun_s += now - deadline
                    raise _Stop("timeout")
                if now >= next_tick:   # a missed deadline is still a control period: look again
                    await self._tick()
                    next_tick += period
                    if next_tick <= now:        # the look itself overran: next period from now
                        next_tick = now + period
                    continue
                await self.interrupt.sleep_until(min(self.motion_end, next_tick))
            self._check_interrupt()
            if self._harvest():
                break
            await self._start_fetch()   # the answer was stale: ask again
        now = self.now()
        self.out.underrun_s += max(0.0, now - deadline)
        self.pacer.resync(self.k, now)
        if len(self.buffer) == 0:
            raise SequencesError("the policy returned an empty action chunk", code="empty_chunk")

    # ---------------------------------------------------------------- fetch

    def _prefetch_at(self, deadline: float) -> float:
        """When (monotonic s) the next request should start: ``-inf`` for now, ``inf`` for not
        while nothing changes (a request in flight, lookahead full, the buffer outlasting the
        run). With ``lookahead`` N >= 2 (``replace`` merges only), now: a free slot in the queue
        is filled at once.
        With N = 1, the moment the buffer's time left falls to the latency estimate's lead
        (``LatencyEstimate.lead_s``: worst recent turnaround plus one period); the loop wakes
        for it rather than waiting for the next action deadline."""
        if self.fetch is not None:
            return math.inf
        # an aligned merge makes each answer the whole plan (nothing queues behind it): a depth
        # over 1 could never fill and would ask again the moment each answer lands
        depth = max(1, int(self.cfg.lookahead)) if self.merge == "replace" else 1
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
        self.fetch_started = self.now()
        observation = await _call(self.cfg.observe)
        obs_time, self.fetch_obs_at = time.time(), self.now()
        self.fetch_observation = observation
        instruction, version = self.p._instruction_now()
        wire = self.p._check(observation_to_wire(observation, instruction))
        try:
            self.watch.check(wire, self.now())
        except StaleCamera as exc:   # nothing is sent with a stale frame
            raise _Stop("stale_camera", exc) from None
        self.fetch_version = version
        self.fetch_k = self.k
        self.requests += 1
        steps = self.delay.steps or 0
        entry = self.buffer.current
        space = entry.chunk.action_space if entry is not None else None
        delay = {"prefix": committed_prefix(self.buffer.upcoming(), steps, space, self.buffer.last_action),
                 "delay_steps": steps, "obs_time": obs_time,
                 "request_id": f"{self.episode_id}-{self.requests}", "generation": self.generation}
        if self.pacer is not None:   # playback left as it is sent: the wire turns it into the deadline_ms
            delay["playback_left_s"] = (self.pacer.deadline(self.k) - self.now()
                                        + self.buffer.seconds_left(self.pacer.period_s))
        self.fetch_info = delay
        self.fetch = asyncio.ensure_future(
            self.p._request(wire, self.cfg.params, self.episode_id, need_chunk=True, delay=delay))
        self.fetch.add_done_callback(lambda _t: self.interrupt.poke())

    def _harvest(self) -> bool:
        """Move a finished fetch's chunk into the buffer (merged per ``merge``); raise its error
        if it failed. False when there was none to move, or the answer was dropped: an older
        generation or request, or (aligned) every row's time already passed."""
        task = self.fetch
        if task is None or not task.done():
            return False
        self.fetch = None
        prediction = task.result()  # raises the request's error
        turnaround = self.now() - self.fetch_started
        sent = self.fetch_info
        echoed = prediction.extra.get("generation")
        if echoed is not None and (echoed != sent.get("generation") or prediction.request_id != sent.get("request_id")):
            self.out.stale_answers += 1
            return False
        self._refresh_limits()
        self.latency.add(turnaround)
        chunk = prediction.action_chunk
        consumed = self.k - self.fetch_k
        if self.pacer is None:   # before motion nothing is consumed: the turnaround at the declared rate
            hz = chunk.control_frequency_hz or _DEFAULT_HZ
            self.startup_steps = steps_for(turnaround, hz)
            self.delay.add(self.startup_steps)
        else:
            self.delay.add(consumed)
            if self.max_delay is not None and consumed > self.max_delay:
                raise _Stop("delay_exceeded", DelayUnsupported(
                    f"the inference delay reached {consumed} control steps; {self.p.model} declares it handles "
                    f"{self.max_delay}", code="delay_exceeded", delay_steps=consumed, max_delay_steps=self.max_delay,
                    hint="the run held; bring the worker closer (or unload it) before running again"))
        for warning in prediction.warnings:
            self._print.note(f"worker warning: {warning}")
        info = dict(delay_steps=sent.get("delay_steps") or 0, arrival_left_s=self.buffer.seconds_left(
            self.pacer.period_s if self.pacer is not None else 1.0 / _DEFAULT_HZ))
        # (instruction version, answer, when its observation was taken, that observation): a
        # chunk carries the observation it was computed on (the ROS driver pairs its camera stamps)
        tag = (self.fetch_version, prediction, self.fetch_obs_at, self.fetch_observation)
        if self.merge == "replace":
            self.buffer.push(chunk, tag=tag, consumed=consumed, **info)
            return True
        steps = max(0, int(self.cfg.smooth_seam)) or BLEND_STEPS
        dims = list(self.cfg.blend_dims or []) if self.merge == "aligned_blend" else []
        if self.buffer.merge_aligned(chunk, tag, consumed=consumed, blend_dims=dims, blend_steps=steps, **info):
            return True
        self.out.stale_answers += 1
        return False

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
        swaps, lag = self.p._instruction_arrived(version, self.now())
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

    def _operator_takes(self) -> None:
        """The operator's watcher (any thread): latch the take for this run and wake the loop."""
        self._operator_took = True
        self.interrupt._wake_from_any_thread()

    def _check_interrupt(self) -> None:
        if self._operator_took or self.operator.active:
            raise _Stop("operator")
        if self.interrupt.is_set:
            raise _Stop("interrupted")
