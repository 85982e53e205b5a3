"""Policy: the synchronous face of the engine. Not a second implementation.

A Policy owns a private asyncio event loop and drives ``sequence_ai_core.AsyncPolicy`` with
``loop.run_until_complete`` on the *calling* thread. So observe, act, validate, until and hold
run on the thread that called ``run()``; the HTTP call is a task on that same loop and makes
progress while the loop sleeps between actions. ``predict()`` -- one request, nothing to overlap --
is one engine call (``AsyncPolicy.predict_blocking``): a session's steady state goes out over a
websocket driven on this thread, with no event loop, and the loop is entered only for what needs
it (joining, a lease renewal, a reconnect, HTTP /act).

Every sync call also works from inside a callback of another ``run()`` (or any code already
running an event loop on this thread): that loop is blocked while the callback runs, so this
one runs to completion meanwhile (``run_blocking``).

One thread drives a Policy at a time (its own callbacks may read its properties, call
``interrupt()``, ``set_instruction()`` and ``spec()``, but not drive it again): a call from a second thread while one is active raises
``SequencesError`` (code ``busy``) instead of interleaving two robots' plans. ``interrupt()`` and
``set_instruction()`` are the exceptions: they are safe from any thread at any time; ``close()``
from another thread interrupts the driving call and waits for it to end before closing.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Optional, Tuple

from sequence_ai_core import (
    AsyncPolicy,
    ModelInfo,
    Operator,
    RunOutcome,
    SequencesError,
    warn_if_no_validate,
)

__all__ = ["Policy", "run_blocking"]


@contextlib.contextmanager
def _outer_loop_set_aside() -> Iterator[None]:
    """Let a private loop run on a thread whose own loop is mid-callback.

    A sync call made from inside an ``observe()`` / ``act()`` callback (or any code running on an
    event loop) finds that loop marked running on this thread, and asyncio refuses to start a
    second one. That loop is blocked for as long as the callback runs, so nothing is lost by
    running ours to completion meanwhile: the running-loop mark is set aside and put back after.
    The callback stays on the calling thread.
    """
    outer = asyncio._get_running_loop()
    if outer is None:
        yield
        return
    asyncio._set_running_loop(None)
    try:
        yield
    finally:
        asyncio._set_running_loop(outer)


def run_blocking(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` to completion on a fresh event loop and return its result.

    Unlike ``asyncio.run()`` this also works where an event loop is already running on this
    thread (a callback of ``run()``/``act()``, a Jupyter cell): see ``_outer_loop_set_aside``.
    Exceptions of ``coro`` propagate.
    """
    loop = asyncio.new_event_loop()
    try:
        with _outer_loop_set_aside():
            return loop.run_until_complete(coro)
    finally:
        with _outer_loop_set_aside():
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class Policy:
    """A connection to one deployed model; drives one control loop. Use ``sequence_ai.connect()``.

    A context manager: ``with sequence_ai.connect("my-model") as policy: ...`` closes it even
    when the loop raises.
    """

    def __init__(self, engine: AsyncPolicy) -> None:
        self._engine = engine
        self._loop = asyncio.new_event_loop()
        self._busy = threading.Lock()
        self._owner: Optional[int] = None     # the thread inside _call (close() from another waits)
        self._closed = False

    @contextlib.contextmanager
    def _driving(self) -> Iterator[None]:
        """The one-driver rule: this thread drives the Policy for the block, else ``busy``/``closed``."""
        if self._closed:
            raise SequencesError("this Policy is closed", code="closed")
        if not self._busy.acquire(blocking=False):
            raise SequencesError(
                "this Policy is already driving on another thread (or re-entered from a callback)",
                code="busy", hint="one Policy per control loop: connect() once per robot")
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            self._owner = None
            self._busy.release()

    def _call(self, coro: Awaitable[Any]) -> Any:
        try:
            with self._driving():
                return self._run(coro)
        finally:
            coro.close()  # type: ignore[union-attr]   # a no-op once run; a refused call never starts it

    def _run(self, coro: Awaitable[Any]) -> Any:
        """Run ``coro`` to completion on the private loop (the caller drives the Policy)."""
        task = self._loop.create_task(coro)  # type: ignore[arg-type]
        try:
            with _outer_loop_set_aside():   # called from another Policy's callback
                return self._loop.run_until_complete(task)
        except KeyboardInterrupt:
            # Ctrl-C landed in the event loop itself: unwind the run through its finally
            # (hold) before letting the KeyboardInterrupt through.
            if not task.done():
                task.cancel()
                try:
                    with _outer_loop_set_aside():
                        self._loop.run_until_complete(task)
                except BaseException:  # noqa: BLE001
                    pass
            raise

    def _call_now(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a blocking engine method (no event loop) under the same one-driver rule as ``_call``."""
        with self._driving():
            return fn(*args, **kwargs)

    # ------------------------------------------------------------ lifecycle

    def _connect(self) -> "Policy":
        self._call(self._engine.connect())
        return self

    def close(self) -> None:
        """Stop any run, close the connections and the private event loop. Idempotent.

        Safe from another thread: a call driving there is interrupted (a run holds and returns
        within one control period; a request in flight is cancelled) and close() waits for it,
        at most the connection's ``timeout_s``. Raises SequencesError (code ``busy``), leaving the
        Policy open, when that call has not ended by then or when close() is called from inside
        one of its own callbacks."""
        if self._closed:
            return
        self._engine.interrupt()
        owner = self._owner
        if owner is not None and owner != threading.get_ident():
            if self._busy.acquire(timeout=self._engine.options.timeout_s):
                self._busy.release()
        busy = False
        try:
            self._call(self._engine.aclose())
        except SequencesError as exc:
            busy = exc.code == "busy"
            if busy:      # the loop still runs that call: closing it now would raise RuntimeError
                raise SequencesError(
                    "close() while a call on this Policy is still running (on another thread, or close() "
                    "was called from one of its callbacks); it was interrupted but the Policy stays open",
                    code="busy", hint="call close() after run()/predict() returns, or from the thread that drives it") from None
            raise
        finally:
            if not busy:
                self._closed = True
                self._loop.close()

    def __enter__(self) -> "Policy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Policy(model={self._engine.model!r}, gateway={self._engine.gateway_url!r})"

    # ------------------------------------------------------------- reading

    @property
    def model(self) -> str:
        """The deployment name."""
        return self._engine.model

    @property
    def contract(self) -> Optional[Dict[str, Any]]:
        """The model's declaration ``{"action": {...}, "observation": {...}}`` from the handshake."""
        return self._engine.contract

    @property
    def operator(self) -> "Operator":
        """The robot's ``Operator`` (``connect(operator=...)``, else this Policy's own): ``take()``
        it from any thread and run()/act() are refused (``operator``), a run under way holds."""
        return self._engine.operator

    @property
    def buffered(self) -> int:
        """Actions left in the local buffer; 0 means the next call is a round trip."""
        return self._engine.buffered

    @property
    def instruction(self) -> Optional[str]:
        """The instruction in force, or None (the observation's own is used)."""
        return self._engine.instruction

    @property
    def reconnects(self) -> int:
        """Times the client went back through the gateway (rotated secret, expired lease, drop)."""
        return self._engine.reconnects

    def ready(self) -> Tuple[bool, Optional[float]]:
        """``(True, None)`` when the model can serve, ``(False, eta_s)`` while it warms. Non-blocking."""
        return self._call(self._engine.ready())

    def wait_until_ready(self, timeout_s: float = 300.0) -> float:
        """Block until the model can serve; returns the seconds waited. Raises Unavailable on timeout."""
        return self._call(self._engine.wait_until_ready(timeout_s))

    def spec(self) -> Optional[ModelInfo]:
        """This model's catalogue row, fetched once. Also from inside this Policy's own callbacks
        (it uses a connection of its own, not the Policy's)."""
        if self._owner == threading.get_ident() and not self._closed:
            return run_blocking(self._engine.spec())
        return self._call(self._engine.spec())

    @property
    def last_episode_id(self) -> Optional[str]:
        """The episode the last run()/act() drove (sent with each of its requests), or None."""
        return self._engine.last_episode_id

    def label(self, success: bool, notes: str = "", episode_id: Optional[str] = None) -> Dict[str, Any]:
        """Mark how the last run's episode went (or ``episode_id``'s). See AsyncPolicy.label."""
        return self._call(self._engine.label(success, notes, episode_id))

    # ------------------------------------------------------------- driving

    def interrupt(self) -> None:
        """Stop the active run()/act() within one control period; thread-safe, returns at once.

        The run unwinds through ``hold()`` and returns ``reason="interrupted"``; it is not raised.
        """
        self._engine.interrupt()

    def set_instruction(self, instruction: str) -> None:
        """Change the instruction for the next request without stopping; thread-safe."""
        self._engine.set_instruction(instruction)

    def predict(self, observation: Any, *, params: Optional[Dict[str, Any]] = None) -> Any:
        """One request: the whole action chunk for ``observation`` (a ``Prediction``); for a policy
        with no contract, exactly what its infer() returned. See AsyncPolicy.predict (the same errors)."""
        return self._call_now(self._engine.predict_blocking, observation, self._run, params=params)

    def next_action(self, observation: Any = None) -> List[float]:
        """The next buffered action, refilled from ``observation`` when empty. See AsyncPolicy.next_action.

        Raises ChunkExhausted when the buffer is empty and no observation is given.
        """
        return self._call(self._engine.next_action(observation))

    def run(self, observe: Callable[[], Any], act: Callable[[List[float]], Any], *,
            max_actions: int, **options: Any) -> RunOutcome:
        """Drive the robot: observe, fetch, pace and act until an ending. Returns a RunOutcome.

        Same keywords as ``AsyncPolicy.run`` (validate, hold, on_underrun, until, prefetch,
        lookahead, smooth_seam, startup_timeout_s, on_status, on_chunk, progress, params,
        max_seconds, merge, delay_mode, blend_dims, max_frame_age_s, stop: a StopToken made
        before the call, whose ``stop()`` from any thread ends this run ``interrupted`` with one
        hold and no action after it; stop_when: ``(observation) -> bool`` checked every control
        period, true ends it ``stop_when``). While ``operator`` is active it returns
        ``operator`` without moving, and taking it mid-run holds and ends the run ``operator``.
        Raises what it raises, ``DelayUnsupported`` before motion included.
        observe/act/validate/until/stop_when/hold run on this thread.
        """
        warn_if_no_validate(options.get("validate"))
        return self._call(self._engine.run(observe, act, max_actions=max_actions, **options))

    def act(self, instruction: str, observe: Callable[[], Any], act: Callable[[List[float]], Any],
            *, max_seconds: float, until: Optional[Callable[[], Any]] = None,
            **options: Any) -> RunOutcome:
        """``run()`` with ``instruction`` pinned and a required time bound ``max_seconds`` (s).

        Ends ``until`` / ``stop_when`` / ``timeout`` / ``interrupted`` / ``operator`` / ``validate``
        (``sequence_ai.END_REASONS``). Takes ``run()``'s keywords, ``stop=`` (a StopToken) and
        ``stop_when=`` included. See AsyncPolicy.act.
        """
        warn_if_no_validate(options.get("validate"))
        return self._call(self._engine.act(instruction, observe, act, max_seconds=max_seconds,
                                           until=until, **options))
