"""AsyncPolicy: the engine's handle on one deployed model, and the only implementation.

``sequence_ai.Policy`` (sync) drives this same object on a private event loop; nothing here
knows which face is in use. It owns the wire (``_wire.py``), the action buffer
(``_buffer.py``), the interrupt (``_interrupt.py``), the refill-latency estimate
(``_prefetch.py``) and the instruction in force, and hands a ``ControlLoop`` (``_loop.py``) to
each ``run()`` / ``act()``.
"""
from __future__ import annotations

import asyncio
import math
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._buffer import ChunkBuffer
from ._clock import MONOTONIC, Clock
from ._config import resolve_api_key, resolve_gateway_url
from ._delay import DelayEstimate
from ._contract import check_expect, check_observation, drop_undeclared_views
from .protocol import Contract
from ._errors import ChunkExhausted, ContractMismatch, SequencesError, Unavailable
from ._interrupt import Interrupt, Operator, StopToken
from ._limits import Limits, LimitWarning
from ._loop import ControlLoop, LoopConfig
from ._options import DEFAULT_BODY_FORMAT, DEFAULT_TIMEOUT_S, ConnectOptions, print_queue_position
from ._prefetch import LatencyEstimate
from ._types import ModelInfo, Prediction, RunOutcome, observation_to_wire
from ._frames import fit_declared_sizes
from ._wire import WorkerLink, fetch_models

__all__ = ["AsyncPolicy", "DEFAULT_TIMEOUT_S", "DEFAULT_BODY_FORMAT", "warn_if_no_validate"]

_warned_no_validate = False


def warn_if_no_validate(validate: Any, stacklevel: int = 3) -> None:
    """Warn once per process that actions go unchecked (validate=None)."""
    global _warned_no_validate
    if validate is None and not _warned_no_validate:
        _warned_no_validate = True
        warnings.warn(
            "run()/act() called with validate=None: actions reach act() unchecked. Fine for "
            "simulation and bench work; pass validate= (your bounds check) on hardware.",
            UserWarning, stacklevel=stacklevel,
        )


def _run_token(max_actions: Optional[int], max_seconds: Optional[float], stop: Any) -> StopToken:
    """Check run()'s bounds (ValueError) and ``stop`` (TypeError); the run's StopToken."""
    if max_actions is None and max_seconds is None:
        raise ValueError("max_actions is required (there is no run_forever())")
    if max_actions is not None and max_actions < 0:
        raise ValueError("max_actions must be >= 0")
    if max_seconds is not None and (not math.isfinite(max_seconds) or max_seconds <= 0):
        raise ValueError(f"max_seconds must be a finite number > 0 (got {max_seconds!r})")
    if stop is not None and not isinstance(stop, StopToken):
        raise TypeError(f"stop must be a StopToken, not {type(stop).__name__}")
    return stop if stop is not None else StopToken()


class AsyncPolicy:
    """A connection to one deployed model, for asyncio code (``async with aconnect(...)``).

    Construct with ``sequence_ai.aconnect()`` (or ``AsyncPolicy(model, **options)``); the
    options are ``ConnectOptions``' fields, documented there. One AsyncPolicy holds one action
    buffer: one control loop drives it at a time. Its ``operator`` (``Operator``) outranks every run:
    while active, run()/act() return ``operator`` without moving, and a run under way holds.

    Raises TypeError for an unknown option, ValueError for a bad value (see ConnectOptions).
    """

    def __init__(self, model: str, options: Optional[ConnectOptions] = None, **kwargs: Any) -> None:
        if options is None:
            options = ConnectOptions.from_kwargs("AsyncPolicy", kwargs)
        elif kwargs:
            raise TypeError("pass either a ConnectOptions or keyword options, not both")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a deployment name (a non-empty str), not {model!r}")
        self.model = model
        self.options = options
        self.gateway_url = resolve_gateway_url(options.gateway_url)
        self._on_queue = options.on_queue if options.on_queue is not None else print_queue_position()
        self._wire = WorkerLink(self.gateway_url, resolve_api_key(options.api_key), model, options.params,
                                options.timeout_s, body_format=options.body_format, on_queue=self._on_queue,
                                transport=options.transport, request_hz=options.request_hz)
        self.last_episode_id: Optional[str] = None
        self._expect = dict(options.expect) if options.expect else None
        self._validate_mode = options.validate
        self._on_warming = options.on_warming
        self._buffer = ChunkBuffer()
        self._clock: Clock = MONOTONIC   # the engine's time (``_clock.py``); tests swap in a LoopClock
        self._interrupt = Interrupt(self._clock)
        #: the robot's Operator (``ConnectOptions.operator``, else a fresh inactive one): while it is
        #: active run()/act() return ``operator`` without moving, and a run under way holds and ends
        self.operator: Operator = options.operator if options.operator is not None else Operator()
        self._stops: set = set()        # the StopTokens of the run / wait in line under way
        self._latency = LatencyEstimate()
        self._delay = DelayEstimate()
        self._generation = 0            # one per run: a late answer of an older one is dropped
        self._driving = threading.Lock()
        self._instr_lock = threading.Lock()
        self._instruction: Optional[str] = None
        self._instr_version = 0
        self._instr_set_at: Dict[int, float] = {}
        self._warned_views: set = set()
        self._catalogue_row: Optional[ModelInfo] = None
        self._episode_params: Tuple[Optional[str], Dict[str, Any]] = (None, {})

    def _use_clock(self, clock: Clock) -> None:
        """Time every later run on ``clock`` (``_clock.py``; tests: a ``LoopClock`` of a virtual-time
        event loop). Call between runs, never during one. Raises TypeError for a non-Clock."""
        if not isinstance(clock, Clock):
            raise TypeError(f"clock must be a sequence_ai_core._clock.Clock, not {type(clock).__name__}")
        self._clock = clock
        self._interrupt.clock = clock

    # ------------------------------------------------------------ lifecycle

    async def connect(self) -> "AsyncPolicy":
        """Handshake with the gateway now, so a wrong key or model fails here.

        A warming worker is not an error here: ``run()``/``act()``/``wait_until_ready()`` wait it
        out, ``predict()`` raises ``Unavailable(warming=True)``. A deployment whose every slot is
        taken puts the robot in line here, before any control loop: ``on_queue(position,
        estimate_s)`` is called for each answer and the connect asks again (Retry-After) until
        a slot frees. ``interrupt()`` (from any thread or task) stops that wait within one
        control period and gives the place in line up.

        Raises:
            AuthError, InvalidRequest (unknown model), ContractMismatch (``expect=``),
            TransportError (gateway unreachable), Unavailable (code ``queue_timeout``: waited the
            deployment's ``queue_timeout_s`` in line; ``deployment_full`` under on_full="reject"),
            SequencesError (code ``interrupted``: interrupt() during the wait in line).
        """
        try:
            await self._interruptible(self._wire.join(), "waiting in line for a slot")
        except Unavailable as exc:
            if not exc.warming:
                raise
            return self
        self._check_expect()
        return self

    async def _interruptible(self, coro: Any, doing: str) -> Any:
        """Await ``coro`` as a task that ``interrupt()`` cancels (within one control period).

        The wait has a StopToken of its own (an interrupt() before it began stops nothing) and a
        wait point of its own (a run's is left alone). Raises SequencesError (code
        ``interrupted``) when interrupted; a cancellation from outside cancels the task too.
        """
        waiting = Interrupt(self._clock)
        token = waiting.bind()
        self._stops.add(token)
        task = asyncio.ensure_future(coro)
        task.add_done_callback(lambda _t: waiting.poke())
        try:
            while not task.done():
                if waiting.is_set:
                    raise SequencesError(f"interrupted while {doing}", code="interrupted", retryable=True,
                                         hint="connect again (or run()) when you want the robot to go on")
                await waiting.sleep_until(math.inf)
            return task.result()
        finally:
            self._stops.discard(token)
            waiting.unbind()
            if not task.done():
                task.cancel()
                try:
                    await task
                except BaseException:  # noqa: BLE001 - cancelled; its own cleanup ran
                    pass

    async def aclose(self) -> None:
        """Stop any run (interrupt), close the session (its slot frees at once) or give up a
        place in line, and close the connections."""
        self.interrupt()
        await self._wire.aclose()

    async def __aenter__(self) -> "AsyncPolicy":
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # ------------------------------------------------------------- reading

    @property
    def contract(self) -> Optional[Dict[str, Any]]:
        """The model's declaration from the last handshake (``{"action": .., "observation": ..}``), or None."""
        session = self._wire.session
        return session.contract if session is not None else None

    @property
    def contract_spec(self) -> Contract:
        """Typed view of ``contract`` (``protocol.Contract``): ``.observation`` and ``.action``,
        each None when the model declares none. Rebuilt when a handshake brings a new contract."""
        raw = self.contract
        cached = getattr(self, "_contract_view", None)
        if cached is None or cached[0] is not raw:
            cached = self._contract_view = (raw, Contract.from_wire(raw))
        return cached[1]

    @property
    def buffered(self) -> int:
        """Actions left in the local buffer; 0 means the next call is a round trip."""
        return len(self._buffer)

    @property
    def instruction(self) -> Optional[str]:
        """The instruction in force (``act()`` or ``set_instruction()``), or None: the observation's own."""
        return self._instruction

    @property
    def reconnects(self) -> int:
        """Times the wire went back through the gateway (rotated secret, lease, dropped connection)."""
        return self._wire.reconnects

    async def ready(self) -> Tuple[bool, Optional[float]]:
        """``(True, None)`` when the model can serve now, ``(False, eta_s)`` while it warms or
        waits in line for a slot (eta: the gateway's estimate, s). Does not block: one attempt;
        a queued robot keeps its place for the next call (and gives it up on close)."""
        if self._wire.session is not None and await self._wire.ping():
            return True, None
        try:
            await self._wire.handshake()
        except Unavailable as exc:
            if exc.warming:
                return False, exc.retry_after_s
            if exc.code == "queued":
                details = exc.details or {}
                self._on_queue(int(details.get("position") or 0), details.get("estimate_s"))
                return False, details.get("estimate_s", exc.retry_after_s)
            raise
        self._check_expect()
        return True, None

    async def wait_until_ready(self, timeout_s: float = 300.0) -> float:
        """Block until the model can serve; returns the seconds waited (s).

        Raises:
            Unavailable: still warming after ``timeout_s`` (``.warming`` True), or it failed.
        """
        t0 = self._clock.now()
        while True:
            ok, eta = await self.ready()
            waited = self._clock.now() - t0
            if ok:
                return waited
            if waited >= timeout_s:
                raise Unavailable(f"{self.model} still warming after {waited:.0f}s",
                                  warming=True, retry_after_s=eta)
            if self._on_warming is not None:
                self._on_warming(waited, eta)
            await asyncio.sleep(min(max(eta or 1.0, 0.25), 2.0, max(0.0, timeout_s - waited)))

    async def spec(self) -> Optional[ModelInfo]:
        """This model's catalogue row (contract, params, status), fetched once."""
        if self._catalogue_row is None:
            for row in await fetch_models(self.gateway_url):
                if row.name == self.model and row.kind == "model":   # not a template of that name
                    self._catalogue_row = row
        return self._catalogue_row

    # ----------------------------------------------------------- instruction

    def set_instruction(self, instruction: str) -> None:
        """Change the instruction without stopping; thread-safe, returns at once.

        Takes effect on the next request (the arm keeps moving); setting the same string again
        is ignored. The first action computed under it arrives at most lookahead + 1 chunks
        later; ``RunOutcome.instruction_swaps`` and ``max_instruction_lag_s`` report it.
        """
        with self._instr_lock:
            if instruction == self._instruction:
                return
            self._instruction = instruction
            self._instr_version += 1
            self._instr_set_at[self._instr_version] = self._clock.now()

    def _pin_instruction(self, instruction: Optional[str]) -> None:
        """Set the instruction without counting a swap (the start of act())."""
        with self._instr_lock:
            self._instruction = instruction
            self._instr_version += 1

    def _instruction_now(self) -> Tuple[Optional[str], int]:
        with self._instr_lock:
            return self._instruction, self._instr_version

    def _instruction_arrived(self, version: int, now: float) -> Tuple[int, Optional[float]]:
        """A chunk built under ``version`` started playing: swaps resolved by it and the worst lag."""
        with self._instr_lock:
            done = [v for v in self._instr_set_at if v <= version]
            lags = [now - self._instr_set_at.pop(v) for v in done]
        return len(lags), (max(lags) if lags else None)

    # -------------------------------------------------------------- driving

    def interrupt(self) -> None:
        """Stop the active run()/act() within one control period. Thread-safe, returns at once.

        Wakes the loop whether it is sleeping to the next tick, blocked on a stalled fetch or
        waiting out warming; the in-flight request is cancelled, buffered rows are dropped,
        ``hold()`` runs, and the run returns ``reason="interrupted"`` (not raised). Once the loop
        has seen the interrupt it calls ``act`` no more.

        It stops the run under way (from the moment run()/act() is entered), or the wait in line
        of connect(); with neither, it stops nothing: each run has a ``StopToken`` of its own, so
        an interrupt meant for one run never reaches the next. To stop a run that may not have
        started yet (a cancel racing the start), make the token first and pass it: ``token =
        StopToken(); run(..., stop=token)``, then ``token.stop()`` from anywhere.
        """
        for token in list(self._stops):
            token.stop()

    async def predict(self, observation: Any, *, params: Optional[Dict[str, Any]] = None) -> Any:
        """One request: the whole chunk for ``observation``; you do everything else.

        ``observation`` is an ``Observation`` (or its wire dict). An instruction in force
        (``set_instruction``) replaces the observation's. The request runs with the session's
        inference parameters (the deployment's defaults under the ones connect() named, as of
        the last lease renewal), with ``params`` over them.

        Returns a ``Prediction`` (``.action_chunk``, ``.warnings``, ``.inference_ms``, ...). For a
        policy that declares no contract (its own inputs and outputs), returns exactly what its
        infer() returned, e.g. ``predict({"state": [0.0], "target": [0.5]})`` -> ``{"delta": [0.1]}``.

        Raises:
            Unavailable (``.warming`` while the worker loads), PolicyError, InvalidRequest,
            TransportError.
        """
        instruction, _ = self._instruction_now()
        wire = self._check(observation_to_wire(observation, instruction))
        prediction = await self._request(wire, params)
        return prediction.outputs if prediction.own_io else prediction

    def predict_blocking(self, observation: Any, run: Callable[[Any], Any], *,
                         params: Optional[Dict[str, Any]] = None) -> Any:
        """``predict()`` on this thread, for the sync face: the steady state of a session goes out
        over a blocking websocket without an event loop; joining, a lease renewal, a reconnect
        or HTTP /act go through ``run`` (``coroutine -> its result`` on the event loop this
        policy lives on; ``WorkerLink.act_blocking``). Returns and raises what ``predict()`` does."""
        instruction, _ = self._instruction_now()
        wire = self._check(observation_to_wire(observation, instruction))
        if self._wire.session is None:
            run(self._wire.join())
        prediction = self._wire.act_blocking(wire, run, params=self._params_for(params, None))
        return prediction.outputs if prediction.own_io else prediction

    def _params_for(self, params: Optional[Dict[str, Any]], episode_id: Optional[str]) -> Dict[str, Any]:
        """The inference parameters of one request: the session's (the deployment's defaults under
        the ones connect() named, as the gateway last handed them out), then ``params``.

        Within an episode (``episode_id``) the session's are read once, at its first request, so a
        change learnt at a lease renewal mid-episode takes effect at the next episode."""
        session = self._wire.session
        current = dict(session.params) if session is not None and session.params else {}
        if episode_id is not None:
            if self._episode_params[0] != episode_id:
                self._episode_params = (episode_id, current)
            current = self._episode_params[1]
        return {**current, **(params or {})}

    async def _request(self, wire: Dict[str, Any], params: Optional[Dict[str, Any]] = None,
                       episode_id: Optional[str] = None, need_chunk: bool = False,
                       delay: Optional[Dict[str, Any]] = None) -> Prediction:
        """One ``/act`` with the parameters in force (``_params_for``); a handshake first when
        there is no session yet (waiting in line if need be), so the first request of a session
        already carries the deployment's defaults.

        Raises what the wire raises, and SequencesError (code ``no_action_chunk``) when
        ``need_chunk`` and the policy answered with its own outputs instead of a chunk."""
        if self._wire.session is None:
            await self._wire.join()
        prediction = await self._wire.act(wire, params=self._params_for(params, episode_id),
                                          episode_id=episode_id, delay=delay)
        if need_chunk and prediction.own_io:
            raise SequencesError(
                f"{self.model} declares no action contract: it answers with its own outputs, not an "
                "action chunk", code="no_action_chunk",
                hint="call predict(inputs) for its outputs; run(), act() and next_action() need a "
                     "policy that returns an ActionChunk")
        return prediction

    async def next_action(self, observation: Any = None) -> List[float]:
        """The next action from the local buffer; refilled from ``observation`` when empty.

        Pass an observation on every call: it is ignored while the buffer holds actions. You own
        the cadence; the buffer honours ``open_loop_horizon``.

        Raises:
            ChunkExhausted: the buffer is empty and ``observation`` is None.
        """
        if len(self._buffer) == 0:
            if observation is None:
                raise ChunkExhausted(
                    "the action buffer is empty and no observation was given",
                    hint="pass observation= on every next_action() call")
            instruction, _ = self._instruction_now()
            wire = self._check(observation_to_wire(observation, instruction))
            prediction = await self._request(wire, need_chunk=True)
            self._buffer.push(prediction.action_chunk)
            if len(self._buffer) == 0:
                raise SequencesError("the policy returned an empty action chunk", code="empty_chunk")
        row, started = self._buffer.pop(0)
        entry = started or self._buffer.current
        limits = Limits.from_contract(self.contract_spec.action)
        if limits is not None:
            row, clipped = limits.apply(row, self._buffer.last_action,
                                        entry.chunk.action_space if entry else None)
            if clipped:
                warnings.warn("clipped an action into the declared limits before returning it: "
                              + "; ".join(limits.last_violations[:4]), LimitWarning, stacklevel=3)
        self._buffer.executed(row)
        return row

    async def label(self, success: bool, notes: str = "", episode_id: Optional[str] = None) -> Dict[str, Any]:
        """Mark how an episode went, for captured field data (``next.success`` on export).

        Args:
            success: did the episode achieve its goal.
            notes: free text kept with the label.
            episode_id: the episode to label; default the one the last ``run()``/``act()`` drove.

        Returns the gateway's answer (a dict). Raises:
            SequencesError (code ``no_episode``): no run has been driven and no episode_id given.
            InvalidRequest: the gateway does not know the episode; AuthError, TransportError.
        """
        episode = episode_id or self.last_episode_id
        if not episode:
            raise SequencesError("no episode to label: run() or act() first, or pass episode_id=",
                                 code="no_episode")
        return await self._wire.label(episode, success, notes)

    async def run(
        self,
        observe: Callable[[], Any],
        act: Callable[[List[float]], Any],
        *,
        max_actions: int,
        validate: Optional[Callable[[List[float]], Any]] = None,
        hold: Optional[Callable[[], Any]] = None,
        on_underrun: Optional[Callable[[], Any]] = None,
        until: Optional[Callable[[], Any]] = None,
        prefetch: bool = True,
        lookahead: int = 1,
        smooth_seam: int = 0,
        startup_timeout_s: float = 1800.0,
        on_status: Optional[Callable[[str], Any]] = None,
        on_chunk: Optional[Callable[[Any, int], Any]] = None,
        progress: Any = "auto",
        params: Optional[Dict[str, Any]] = None,
        max_seconds: Optional[float] = None,
        merge: Optional[str] = None,
        delay_mode: Optional[str] = None,
        blend_dims: Optional[List[int]] = None,
        max_frame_age_s: Any = None,
        stop: Optional[StopToken] = None,
        stop_when: Optional[Callable[[Any], Any]] = None,
    ) -> RunOutcome:
        """Own the loop: observe, fetch, pace and act until an ending; return a RunOutcome.

        Args:
            observe: ``() -> Observation``; called on this thread when a request is built.
            act: ``(row: list[float]) -> None``; one action, called at the chunk's
                control_frequency_hz (Hz) on a drift-free monotonic schedule.
            max_actions: stop with ``completed`` after this many actions. Required.
            validate: ``(row) -> bool``; False stops the run (``validate``) before that row is
                acted. None warns once per process.
            hold: ``() -> None``; called exactly once on an early ending (interrupted, operator,
                validate, timeout, delay_exceeded, stale_camera) or an exception, in a finally.
            on_underrun: ``() -> None``; once each time an action is due and the buffer is empty.
            until: ``() -> bool``; checked after each action, True stops with ``until``.
            prefetch: request the next chunk while one plays (default True); False: closed loop.
            lookahead: chunks kept queued behind the playing one (default 1; below 1, or with an
                aligned merge, counts as 1). N >= 2 requests as soon as fewer than N are queued:
                more turnaround tolerated, each chunk planned from an observation N chunks older.
            smooth_seam: ramp each later chunk's first N rows out of the last executed action
                (absolute spaces only; 0, the default: off).
            startup_timeout_s: how long to wait out a warming worker before motion (s).
            on_status / on_chunk / progress: ``(message)`` for progress lines; ``(chunk,
                first_action_index)`` when a chunk starts playing; "auto" prints status lines
                to stderr when it is a terminal, True/False force.
            params: inference parameters for this run, over the session's (read at its start).
            max_seconds: also stop with ``timeout`` after this many seconds of motion (s).
            merge, delay_mode, blend_dims, max_frame_age_s, stop_when: the delay-aware merge,
                the delay mode, the dims ``aligned_blend`` may blend, each camera's maximum frame
                age (s) and ``(observation) -> bool`` ending the run ``stop_when``, the last two
                checked every control period; see ``LoopConfig``.
            stop: this run's ``StopToken``, made before the call: ``stop.stop()`` (any thread,
                any time, also before the run starts) ends it like ``interrupt()``, before any
                action when none was sent yet. None: a fresh one, which ``interrupt()`` stops.

        Raises:
            SequencesError: already driving (``busy``), and any error of the requests
            (PolicyError, Unavailable mid-run, ...) after hold() has run. DelayUnsupported:
            the delay mode or the start-up delay is outside the contract (before any action).
            ValueError / TypeError: a bad argument. Exceptions from your callables propagate after hold().
        """
        token = _run_token(max_actions, max_seconds, stop)
        warn_if_no_validate(validate)
        config = LoopConfig(**{k: v for k, v in dict(locals()).items() if k in LoopConfig.__dataclass_fields__})
        config.check()
        if not self._driving.acquire(blocking=False):
            raise SequencesError("this Policy is already driving a control loop", code="busy",
                                 hint="one Policy per control loop: connect() once per robot")
        self._stops.add(token)
        try:
            loop = ControlLoop(self, config, token)
            self.last_episode_id = loop.episode_id
            return await loop.run()
        finally:
            self._stops.discard(token)
            self._driving.release()

    async def act(
        self,
        instruction: str,
        observe: Callable[[], Any],
        act: Callable[[List[float]], Any],
        *,
        max_seconds: float,
        until: Optional[Callable[[], Any]] = None,
        max_actions: Optional[int] = None,
        **options: Any,
    ) -> RunOutcome:
        """``run()`` with the instruction pinned and a time bound required.

        ``instruction`` overwrites the observation's on every request (``set_instruction``
        may change it mid-call). ``max_seconds`` (s) is required: the run ends with ``timeout``
        that long after the first action; the startup wait is bounded by ``startup_timeout_s``.
        Every other keyword of ``run()`` is accepted.
        """
        if max_seconds is None or not math.isfinite(max_seconds) or max_seconds <= 0:
            raise ValueError(f"max_seconds is required and must be a finite number > 0 (got {max_seconds!r}): "
                             "act() drives hardware")
        previous = self._instruction
        self._pin_instruction(instruction)
        try:
            return await self.run(observe, act, max_actions=max_actions, max_seconds=max_seconds,
                                  until=until, **options)
        finally:
            self._pin_instruction(previous)

    # ------------------------------------------------------------ contracts

    def _check_expect(self) -> None:
        if self._expect:
            problems = check_expect(self._expect, self.contract_spec.action)
            if problems:
                raise ContractMismatch(
                    f"{self.model} does not declare what expect= asked for: " + "; ".join(problems),
                    details={"problems": problems, "contract": self.contract})

    def _check(self, wire: Dict[str, Any]) -> Dict[str, Any]:
        """Check an observation against the contract (validate="warn"/"strict"/"off"); frames that
        carry their native pixels are first encoded at their declared size (``_frames``)."""
        if self.contract:
            fit_declared_sizes(wire, self.contract_spec.observation)
        if self._validate_mode == "off" or not self.contract:
            return wire
        dropped = drop_undeclared_views(wire, self.contract_spec.observation)
        if dropped and tuple(dropped) not in self._warned_views:
            self._warned_views.add(tuple(dropped))
            warnings.warn(f"dropping view(s) {dropped}: {self.model} does not declare them "
                          f"(they would be uploaded and ignored)", UserWarning, stacklevel=3)
        problems = check_observation(wire, self.contract_spec.observation)
        if problems:
            message = f"observation does not match {self.model}'s contract: " + "; ".join(problems)
            if self._validate_mode == "strict":
                raise ContractMismatch(message, details={"problems": problems})
            key = tuple(problems)
            if key not in self._warned_views:
                self._warned_views.add(key)
                warnings.warn(message, UserWarning, stacklevel=3)
        return wire
