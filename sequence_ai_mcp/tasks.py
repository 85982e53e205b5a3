"""``act`` as an MCP task: the Tasks extension (``io.modelcontextprotocol/tasks``, 2026-07-28 wire).

A host that declares the extension in a ``tools/call``'s per-request capabilities gets a task
handle (``resultType: "task"``) for ``act`` at once, instead of a call that blocks for the whole
run; it then polls ``tasks/get`` (status, a progress sentence in ``statusMessage``, the counts in
``_meta["sequence-ai/progress"]``), cancels with ``tasks/cancel`` and reads the final
``CallToolResult`` from the terminal ``tasks/get`` (``result``) or from ``tasks/result``. A host
that does not declare it keeps the plain blocking call, unchanged.

What a task guarantees is what the plain call guarantees: the same argument bounds, the same
one-driver rule (the robot is claimed before the handle is returned, so a second act is refused
``busy``), and the same stop. ``tasks/cancel`` stops the run's own ``StopToken`` (made before the
run starts, so a cancel that races the start stops it before any action) and interrupts the
backend: the robot holds within one control period and the task ends ``cancelled``, its
``statusMessage`` and ``_meta["sequence-ai/outcome"]`` carrying the interrupted outcome, and
``tasks/result`` the full ``CallToolResult`` (status ``CANCELED``, reason ``interrupted``).

Runs live on one event loop of their own (a daemon thread), not on the request that created them:
the 2026-07-28 HTTP wire answers each POST and forgets it, so a task must outlive its request.
Finished tasks are kept :data:`TASK_TTL_MS` and then forgotten (at most :data:`MAX_TASKS`).

The extension also checks every tool call's arguments against the server's bounds table before
anything runs (``server.check_arguments``), so an out-of-envelope argument is refused with a
sentence naming it, on the plain and the task path alike.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional

from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, RequestParams
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

__all__ = ["TASKS_EXTENSION", "TASK_TTL_MS", "POLL_INTERVAL_MS", "MAX_TASKS", "TaskStore", "ActTasks",
           "OUTCOME_META_KEY", "PROGRESS_META_KEY"]

_log = logging.getLogger("sequence_ai_mcp")

#: The extension's identifier (SEP-2663).
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
#: How long a task is kept from its creation (ms): longer than any run the cap allows.
TASK_TTL_MS = 600_000
#: The polling interval hosts are asked to keep (ms).
POLL_INTERVAL_MS = 250
#: Tasks kept at most (finished ones are forgotten first, oldest first).
MAX_TASKS = 256
#: ``_meta`` key of a task's structured progress (``tasks/get`` while working).
PROGRESS_META_KEY = "sequence-ai/progress"
#: ``_meta`` key of a finished task's outcome (``ActOutcome``), cancelled tasks included.
OUTCOME_META_KEY = "sequence-ai/outcome"

_TERMINAL = ("completed", "failed", "cancelled")


def _iso(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.timezone.utc).isoformat(timespec="milliseconds")


class TaskParams(RequestParams):
    """``tasks/get``, ``tasks/cancel`` and ``tasks/result`` params: the task's id."""

    task_id: str


class UpdateParams(RequestParams):
    """``tasks/update`` params (this server never asks for input, so responses are ignored)."""

    task_id: str
    input_responses: Optional[Dict[str, Any]] = None


@dataclass
class _Task:
    task_id: str
    instruction: str
    max_seconds: float
    stop: Any                                   # the run's sequence_ai.StopToken
    progress: Callable[[], Dict[str, Any]]
    created_unix: float = field(default_factory=time.time)
    updated_unix: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    status: str = "working"
    message: str = ""
    result: Optional[Dict[str, Any]] = None     # the CallToolResult, wire form
    outcome: Optional[Dict[str, Any]] = None    # its structured content (ActOutcome), when a run ended
    error: Optional[Dict[str, Any]] = None      # a JSON-RPC error, for "failed"
    #: time.monotonic() (s) of the first tasks/cancel; None before
    cancelled_at: Optional[float] = None
    future: Optional[concurrent.futures.Future] = None
    done: threading.Event = field(default_factory=threading.Event)

    def wire(self) -> Dict[str, Any]:
        """The task as ``tasks/get`` answers it (a ``DetailedTask``)."""
        out: Dict[str, Any] = {"taskId": self.task_id, "status": self.status, "createdAt": _iso(self.created_unix),
                               "lastUpdatedAt": _iso(self.updated_unix), "ttlMs": TASK_TTL_MS,
                               "pollIntervalMs": POLL_INTERVAL_MS}
        meta: Dict[str, Any] = {}
        if self.status == "working":
            elapsed = time.monotonic() - self.started
            progress = {"elapsed_s": round(elapsed, 3), "max_seconds": self.max_seconds,
                        "fraction": round(min(1.0, elapsed / self.max_seconds), 3), "instruction": self.instruction}
            try:
                progress.update(self.progress() or {})
            except Exception:  # noqa: BLE001 - progress is best effort; the poll must answer
                pass
            meta[PROGRESS_META_KEY] = progress
            stopping = " (cancel requested: stopping)" if self.cancelled_at is not None else ""
            actions = progress.get("actions")
            out["statusMessage"] = (f"driving {self.instruction!r}: " + (f"{actions} actions, " if actions is not None
                                                                          else "")
                                    + f"{elapsed:.1f} s of at most {self.max_seconds:g} s{stopping}")
        else:
            out["statusMessage"] = self.message
            if self.outcome is not None:
                meta[OUTCOME_META_KEY] = self.outcome
        if self.status == "completed":
            out["result"] = self.result
        elif self.status == "failed":
            out["error"] = self.error
        if meta:
            out["_meta"] = meta
        return out


class TaskStore:
    """The server's act tasks, and the event loop they run on.

    ``start(...)`` runs a coroutine factory on the loop and returns the task; ``cancel(id)``
    stops it (see the module docstring); ``get(id)`` / ``wait(id)`` read it.
    """

    def __init__(self, interrupt: Callable[[], Any]) -> None:
        self._interrupt = interrupt
        self._tasks: Dict[str, _Task] = {}
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def _runner(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="sequence-ai-mcp-tasks", daemon=True).start()
                self._loop = loop
            return self._loop

    def _forget_old(self) -> None:
        now = time.time()
        with self._lock:
            for tid, t in list(self._tasks.items()):
                if t.status in _TERMINAL and (now - t.created_unix) * 1000.0 > TASK_TTL_MS:
                    del self._tasks[tid]
            finished = sorted((t for t in self._tasks.values() if t.status in _TERMINAL), key=lambda t: t.created_unix)
            while len(self._tasks) >= MAX_TASKS and finished:
                del self._tasks[finished.pop(0).task_id]

    def start(self, instruction: str, max_seconds: float, stop: Any,
              run: Callable[[Any], Awaitable[CallToolResult]], progress: Callable[[], Dict[str, Any]]) -> _Task:
        """Record a task and start ``run(stop)`` on the task loop. The task is readable
        (``get``) before this returns."""
        self._forget_old()
        task = _Task(task_id=str(uuid.uuid4()), instruction=instruction, max_seconds=float(max_seconds), stop=stop,
                     progress=progress)
        with self._lock:
            self._tasks[task.task_id] = task

        async def body() -> None:
            try:
                res = await run(stop)
                wire = res.model_dump(by_alias=True, mode="json", exclude_none=True)
                task.outcome = res.structured_content if not res.is_error else None
                summary = res.content[0].text if res.content else ""
                if task.cancelled_at is not None and (task.outcome or {}).get("outcome", {}).get("reason") \
                        == "interrupted":
                    task.status, task.message = "cancelled", f"cancelled: the robot holds; {summary}"
                else:
                    task.status, task.message = "completed", summary
                task.result = wire
            except BaseException as exc:  # noqa: BLE001 - the task records every ending
                # the run's own coroutine held the robot before anything reached here
                task.status = "failed" if not isinstance(exc, asyncio.CancelledError) else "cancelled"
                task.message = f"the run failed: {type(exc).__name__}: {exc}" if task.status == "failed" \
                    else "cancelled: the robot holds"
                if task.status == "failed":
                    task.error = {"code": -32603, "message": task.message}
                if not isinstance(exc, Exception):
                    raise
            finally:
                task.updated_unix = time.time()
                task.done.set()

        task.future = asyncio.run_coroutine_threadsafe(body(), self._runner())
        return task

    def get(self, task_id: str) -> _Task:
        """The task ``task_id``. Raises MCPError (invalid params) for an unknown or forgotten one."""
        self._forget_old()
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            raise MCPError(code=INVALID_PARAMS, message=f"no task {task_id!r} on this server (unknown, or finished "
                                                        f"more than {TASK_TTL_MS // 1000} s ago)")
        return task

    def cancel(self, task_id: str) -> _Task:
        """Stop the task's run (hold within one control period); returns at once."""
        task = self.get(task_id)
        if task.status not in _TERMINAL and task.cancelled_at is None:
            task.cancelled_at = time.monotonic()
            task.updated_unix = time.time()
            task.stop.stop()          # stops this run even if it has not reached the robot yet
            self._interrupt()         # and whatever the backend has under way for it
            _log.info("task %s (%r): cancel requested; interrupting the run", task_id, task.instruction)
        return task

    def running(self) -> List[_Task]:
        with self._lock:
            return [t for t in self._tasks.values() if t.status not in _TERMINAL]

    def close(self) -> None:
        """Stop every running task and the task loop (waits for their holds, up to 10 s)."""
        for t in self.running():
            self.cancel(t.task_id)
        for t in self.running():
            t.done.wait(10.0)
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


class ActTasks(Extension):
    """The Tasks extension for ``act``, plus the bounds check of every tool call.

    Args:
        store: the :class:`TaskStore`.
        check: ``(tool, arguments) -> CallToolResult | None``: a refusal for arguments outside
            the bounds table, None when they are within it.
        start_act: ``(instruction, max_seconds, stop_when) -> CallToolResult | _Task``: refuses (busy, operator, ...)
            or claims the robot and starts the task.
    """

    identifier = TASKS_EXTENSION

    def __init__(self, store: TaskStore, check: Callable[[str, Dict[str, Any]], Optional[CallToolResult]],
                 start_act: Callable[..., Any]) -> None:
        self.store, self._check, self._start_act = store, check, start_act

    async def intercept_tool_call(self, params, ctx, call_next):
        args = params.arguments or {}
        refused = self._check(params.name, args)
        if refused is not None:
            return refused
        if params.name != "act" or not _declares_tasks(ctx):
            return await call_next(ctx)
        started = self._start_act(args["instruction"], float(args["max_seconds"]), args.get("stop_when"))
        if isinstance(started, CallToolResult):
            return started
        return {"resultType": "task", **{k: v for k, v in started.wire().items() if k not in ("result", "error")}}

    def methods(self):
        async def get(_ctx, p: TaskParams) -> Dict[str, Any]:
            return self.store.get(p.task_id).wire()

        async def cancel(_ctx, p: TaskParams) -> Dict[str, Any]:
            self.store.cancel(p.task_id)
            return {}

        async def update(_ctx, p: UpdateParams) -> Dict[str, Any]:
            self.store.get(p.task_id)     # known task: nothing is ever asked of the client, so ack
            return {}

        async def result(_ctx, p: TaskParams) -> Dict[str, Any]:
            # The 2025-11-25 experimental method, kept for hosts that fetch a result this way:
            # waits for the end (the run is bounded by its max_seconds) and answers the CallToolResult.
            task = self.store.get(p.task_id)
            import anyio
            await anyio.to_thread.run_sync(task.done.wait, task.max_seconds + 60.0, abandon_on_cancel=True)
            if task.result is None:
                raise MCPError(code=-32603, message=task.message or "the task has no result yet")
            return dict(task.result)

        return [MethodBinding("tasks/get", TaskParams, get), MethodBinding("tasks/cancel", TaskParams, cancel),
                MethodBinding("tasks/update", UpdateParams, update), MethodBinding("tasks/result", TaskParams, result)]


def _declares_tasks(ctx: Any) -> bool:
    """Whether this request may get a task handle: the 2026-07-28 wire (where ``resultType``
    shapes exist) and the extension in the request's client capabilities."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = ctx.session.client_capabilities
    return bool(caps is not None and caps.extensions and TASKS_EXTENSION in caps.extensions)
