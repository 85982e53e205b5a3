"""What the MCP tools drive: the backend interface and Python mode (a ``sequence_ai.Policy``).

A backend runs one ``act`` at a time (the server's driving lock sees to that), and must honour
cancellation: when the awaiting task is cancelled (a dropped MCP session, a cancelled tool
call), the run is interrupted, the robot holds within one control period, and the coroutine
waits, shielded, until the run has unwound before re-raising -- so nothing is sent after.

Python mode (:class:`PolicyBackend`) runs ``Policy.act`` on a worker thread, against a
:class:`Robot` (``observe`` / ``apply`` / ``hold``, optionally ``frame`` for snapshots and
``done`` for the run's ``until``). ``sim.SimRobot`` is the simulated cell. The robot is held
after every ending (the engine holds on early endings; this adds the hold after ``completed`` /
``until``), exactly once per act.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, runtime_checkable

import anyio

import sequence_ai

__all__ = ["Backend", "Robot", "PolicyBackend", "outcome_status"]

_log = logging.getLogger("sequence_ai_mcp")


def outcome_status(reason: str, cancelled_by_caller: bool) -> str:
    """The Act goal status a run's ending maps to (as the ROS driver reports it):
    ``completed`` / ``until`` / ``stop_when`` / ``timeout`` -> ``SUCCEEDED``; ``interrupted`` ->
    ``CANCELED`` when the caller asked (interrupt(), a cancelled call), ``ABORTED`` otherwise;
    ``operator`` / ``validate`` / ``error`` -> ``ABORTED``."""
    if reason in ("completed", "until", "stop_when", "timeout"):
        return "SUCCEEDED"
    if reason == "interrupted" and cancelled_by_caller:
        return "CANCELED"
    return "ABORTED"


@runtime_checkable
class Robot(Protocol):
    """The robot a Python-mode server drives (``sim.SimRobot`` is one).

    ``observe()`` returns a ``sequence_ai.Observation`` (cameras + proprioception);
    ``apply(row)`` sends one action row (the policy's action space, e.g. 7 joint targets in rad +
    gripper 0..1); ``hold()`` makes the robot stay where it is (called on every ending);
    ``views`` names the cameras ``frame(view)`` can return (JPEG bytes); ``done(instruction)``
    (optional) says whether the instruction is achieved, used as the run's ``until``.
    """

    views: Sequence[str]

    def observe(self) -> Any: ...

    def apply(self, row: List[float]) -> None: ...

    def hold(self) -> None: ...

    def frame(self, view: str) -> bytes: ...


class Backend:
    """The interface the MCP tools call. Subclasses: :class:`PolicyBackend`, ``ros.RosBackend``."""

    #: what it drives, for status(): e.g. ``"policy pick-place on the simulated cell"``
    description: str = ""
    #: the control period (s), for the hold bound; None when unknown
    period_s: Optional[float] = None
    #: the gateway models() asks; None: $SEQUENCES_GATEWAY_URL or the local default
    gateway_url: Optional[str] = None

    @property
    def views(self) -> List[str]:
        """Camera views ``snapshot`` accepts."""
        return []

    @property
    def stop_conditions(self) -> List[str]:
        """The named stop conditions ``act(stop_when=...)`` may ask for (none by default)."""
        return []

    @property
    def operator_active(self) -> bool:
        """True while a person holds the robot: ``act`` is refused with ``operator``. The ROS
        backend's driver decides for itself (its goal ends ``operator``): False here."""
        return False

    async def act(self, instruction: str, max_seconds: float, stop: Any = None,
                  stop_when: Optional[str] = None) -> Dict[str, Any]:
        """Run one instruction for at most ``max_seconds`` (s). Returns ``{"status", "outcome",
        "task_done", "message"}`` (see ``server.ActOutcome``). Cancellation interrupts the run and
        returns only after the robot holds. ``stop``: the run's ``sequence_ai.StopToken`` (made by
        the caller before the run, so a stop that races the start still stops it, before any
        action); a stopped token ends the run like ``interrupt()``, status ``CANCELED``.
        ``stop_when``: one of :attr:`stop_conditions` (checked by the server first); its success
        ends the run ``stop_when``. Raises ``sequence_ai.SequencesError`` subclasses."""
        raise NotImplementedError

    def progress(self) -> Dict[str, Any]:
        """How the active run is going, for a task's poll: e.g. ``{"actions": 42}``; {} when unknown."""
        return {}

    def interrupt(self) -> bool:
        """Stop the active run within one control period; returns whether one was active."""
        raise NotImplementedError

    def set_instruction(self, text: str) -> None:
        """Change the running instruction without stopping (the next chunk is planned under it)."""
        raise NotImplementedError

    async def snapshot(self, view: str) -> bytes:
        """The current frame of camera ``view`` as JPEG bytes. Raises ValueError for an unknown view."""
        raise NotImplementedError

    async def models(self) -> List[Dict[str, Any]]:
        """The gateway's catalogue rows (deployments), as dicts."""
        rows = await anyio.to_thread.run_sync(lambda: sequence_ai.models(self.gateway_url, kind="model"))
        return [{"name": r.name, "status": r.status, "robot": r.robot, "action_space": r.action_space,
                 "action_dim": r.action_dim, "control_frequency_hz": r.control_frequency_hz,
                 "camera_views": r.camera_views} for r in rows]

    def close(self) -> None:
        """Release what the backend holds (interrupting a run first)."""


class PolicyBackend(Backend):
    """Python mode: ``policy.act()`` on a worker thread against ``robot``.

    Args:
        policy: a connected ``sequence_ai.Policy`` (``sequence_ai.connect(model)``).
        robot: a :class:`Robot`; its ``hold`` is the run's hold, its ``done`` (if any) the until.
        gateway_url: the gateway ``models()`` lists (the one the policy was connected through;
            default ``$SEQUENCES_GATEWAY_URL`` or the local default).
        stop_conditions: ``{name: (observation) -> bool}``, the stop conditions an agent may name
            in ``act(stop_when=name)``; each is the run's ``stop_when``, checked every control
            period on what ``robot.observe()`` returned. The policy's ``operator``
            (``policy.operator.take()``) refuses ``act`` and holds a run under way.
        run_options: extra keywords for ``Policy.act`` (``params``, ``prefetch``, ...);
            ``startup_timeout_s`` defaults to 30 s here (not the engine's 1800 s): a tool call should
            not sit that long waiting for a warming worker before its max_seconds even starts.

    Raises TypeError for ``stop_conditions`` that is not a dict of name -> callable.
    """

    def __init__(self, policy: "sequence_ai.Policy", robot: Robot, *, gateway_url: Optional[str] = None,
                 stop_conditions: Optional[Dict[str, Callable[[Any], Any]]] = None, **run_options: Any) -> None:
        conditions = dict(stop_conditions or {})
        bad = [k for k, v in conditions.items() if not isinstance(k, str) or not k or not callable(v)]
        if bad:
            raise TypeError(f"stop_conditions must map names to callables (observation) -> bool; not {bad!r}")
        self._conditions = conditions
        self.policy = policy
        self.gateway_url = gateway_url
        self.robot = robot
        self.run_options = dict(run_options)
        self.run_options.setdefault("startup_timeout_s", 30.0)
        hz = None
        contract = policy.contract or {}
        if contract.get("action"):
            hz = contract["action"].get("control_frequency_hz")
        self.period_s = 1.0 / float(hz) if hz else None
        self.description = f"policy {policy.model} (Python mode) on {type(robot).__name__}"
        self._cancelled = threading.Event()
        self._stop: Optional[sequence_ai.StopToken] = None
        self._actions = 0
        self._phase = ""
        #: time.monotonic() (s) at which the last act call was cancelled (dropped session or a
        #: cancelled tool call) and the run interrupted; None before any
        self.cancelled_at: Optional[float] = None

    @property
    def views(self) -> List[str]:
        return list(self.robot.views)

    def _validate(self, row: List[float]) -> bool:
        import math
        return all(math.isfinite(float(x)) for x in row)

    def progress(self) -> Dict[str, Any]:
        return {"actions": self._actions, "phase": self._phase}

    @property
    def stop_conditions(self) -> List[str]:
        return sorted(self._conditions)

    @property
    def operator_active(self) -> bool:
        return self.policy.operator.active

    async def act(self, instruction: str, max_seconds: float, stop: Any = None,
                  stop_when: Optional[str] = None) -> Dict[str, Any]:
        finished = threading.Event()
        box: Dict[str, Any] = {}
        self._cancelled.clear()
        token = stop if stop is not None else sequence_ai.StopToken()
        self._stop = token
        self._actions, self._phase = 0, "starting"
        done = getattr(self.robot, "done", None)
        until = (lambda: done(self.policy.instruction or instruction)) if callable(done) else None
        user_status = self.run_options.get("on_status")
        options = {k: v for k, v in self.run_options.items() if k != "on_status"}
        if stop_when:
            options["stop_when"] = self._conditions[stop_when]   # the server checked the name

        def apply(row: List[float]) -> None:
            self.robot.apply(row)
            self._actions += 1

        def on_status(text: str) -> None:
            self._phase = text.split(" ", 1)[0].rstrip(":")   # starting | running | done
            if user_status is not None:
                user_status(text)

        def run() -> None:
            try:
                box["outcome"] = self.policy.act(
                    instruction, observe=self.robot.observe, act=apply, hold=self.robot.hold,
                    validate=self._validate, max_seconds=float(max_seconds), until=until,
                    progress=False, stop=token, on_status=on_status, **options)
                if box["outcome"].reason in ("completed", "until", "stop_when"):
                    # the engine holds on early endings only; a tool call leaves the arm held on
                    # every ending, since the model's next call may be seconds away
                    self.robot.hold()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                box["error"] = exc
            finally:
                finished.set()

        thread = threading.Thread(target=run, name="sequence-ai-mcp-act", daemon=True)
        thread.start()
        try:
            await anyio.to_thread.run_sync(finished.wait, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            # The call was cancelled or the session dropped: stop the arm, and return only once
            # the run has unwound through hold() (so nothing is sent after this call ends).
            self.cancelled_at = time.monotonic()
            self._cancelled.set()
            self.policy.interrupt()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(finished.wait)
            outcome = box.get("outcome")
            _log.warning("act %r: call cancelled or session dropped; the run stopped (%s) %.3f s after the cancel",
                         instruction, outcome.reason if outcome else box.get("error"),
                         time.monotonic() - self.cancelled_at)
            raise
        if "error" in box:
            raise box["error"]
        outcome = box["outcome"]
        task_done = None
        if callable(done):
            task_done = bool(await anyio.to_thread.run_sync(done, instruction))
        # a stopped token is a caller's stop (interrupt(), a cancelled task) like the flag
        return {"status": outcome_status(outcome.reason, self._cancelled.is_set() or token.stopped),
                "outcome": {**dataclasses.asdict(outcome), "fault": str(outcome.fault) if outcome.fault else None},
                "task_done": task_done, "message": ""}

    def interrupt(self) -> bool:
        self._cancelled.set()
        token = self._stop
        if token is not None:
            token.stop()
        self.policy.interrupt()
        return True

    def set_instruction(self, text: str) -> None:
        self.policy.set_instruction(text)

    async def snapshot(self, view: str) -> bytes:
        if view not in self.views:
            raise ValueError(f"no camera view {view!r}: this robot has {self.views}")
        return await anyio.to_thread.run_sync(self.robot.frame, view)

    def close(self) -> None:
        self.policy.interrupt()
        self.policy.close()
        close = getattr(self.robot, "close", None)
        if callable(close):
            close()
