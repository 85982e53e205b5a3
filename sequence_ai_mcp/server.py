"""The MCP tools over a backend, the one-driver rule, and the stdio / streamable-HTTP runners.

``build_server(backend, settings)`` returns an ``mcp.server.MCPServer`` with the tools
``act``, ``interrupt``, ``set_instruction``, ``status``, ``snapshot`` and ``models``.

Rules the tools keep:

* ``act`` needs ``max_seconds`` (s, > 0, at most ``McpSettings.max_seconds_cap``): a tool call a
  language model can start but nothing bounds is one an arm can be left running by a dropped
  conversation. A missing one is refused by the tool's input schema, an over-cap one with the
  typed error ``max_seconds_over_cap``.
* One driving call at a time per robot: a second ``act`` while one runs gets the typed error
  ``busy`` (retryable) naming what runs; ``interrupt`` and ``set_instruction`` are the way to
  change a running act.
* A plain ``act`` call that asked for progress (a ``progressToken``) gets ``notifications/progress``
  every :data:`PROGRESS_PERIOD_S` (elapsed s of ``max_seconds``, the actions so far).
* A cancelled ``act`` call (``notifications/cancelled``) or a dropped session cancels the
  handler; the backend then interrupts the run (hold within one control period) and the
  handler returns only after the hold, so nothing is sent after.

* Every argument has an envelope (:func:`check_arguments`, the same bounds as the input schemas:
  text 1..500 characters, ``max_seconds`` > 0 and <= the cap, a view name <= 64 characters);
  a call outside it is refused before the tool runs, naming the argument, the bound and what to do.
* Every tool carries MCP tool annotations (:data:`ANNOTATIONS`): ``act`` is destructive and
  open-world, ``status`` / ``snapshot`` / ``models`` are read-only.
* A host that declares the Tasks extension (2026-07-28 wire) gets ``act`` as a task to poll and
  cancel (``tasks.py``), with the same bounds, one-driver rule and hold on cancel.

Typed errors come back as ``is_error`` tool results whose structured content is the platform's
error shape ``{"code", "detail", "retryable", "hint"}`` (and the same sentence as text).

HTTP (``serve_http``): 127.0.0.1 by default; any other bind address needs a bearer token, and a
configured token is checked (constant time) on every request before its body is read.
"""
# no `from __future__ import annotations`: the tools' annotations (act's cap in its schema) are evaluated here

import hmac
import ipaddress
import dataclasses
import math
import time
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Dict, Literal, Optional, Sequence, Tuple

import anyio
import sequence_ai
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, create_model

from .backend import Backend
from .tasks import ActTasks, TaskStore

__all__ = ["McpSettings", "ActOutcome", "RunOutcomeFields", "build_server", "serve_http", "serve_stdio",
           "is_loopback", "DEFAULT_MAX_SECONDS_CAP", "MAX_TEXT_CHARS", "MAX_VIEW_CHARS", "ANNOTATIONS",
           "check_arguments"]

try:
    _ExceptionGroup = BaseExceptionGroup
except NameError:   # Python 3.10: anyio's backport
    from exceptiongroup import BaseExceptionGroup as _ExceptionGroup

#: The longest ``max_seconds`` (s) ``act`` accepts unless the server is told otherwise.
DEFAULT_MAX_SECONDS_CAP = 60.0
#: The longest instruction (``act``'s ``instruction``, ``set_instruction``'s ``text``), in characters.
MAX_TEXT_CHARS = 500
#: The longest camera view name ``snapshot`` accepts, in characters.
MAX_VIEW_CHARS = 64

#: How each tool behaves, as MCP tool annotations (hints a host shows or gates on).
ANNOTATIONS: Dict[str, ToolAnnotations] = {
    # moves the physical robot: not undoable, not idempotent (a second run moves it again), the world is open
    "act": ToolAnnotations(title="Drive the robot", read_only_hint=False, destructive_hint=True,
                           idempotent_hint=False, open_world_hint=True),
    # only ever stops the server's own run (the robot holds); stopping twice is stopping once
    "interrupt": ToolAnnotations(title="Stop the robot", read_only_hint=False, destructive_hint=False,
                                 idempotent_hint=True, open_world_hint=False),
    # steers a moving robot to a different goal
    "set_instruction": ToolAnnotations(title="Change the running instruction", read_only_hint=False,
                                       destructive_hint=True, idempotent_hint=True, open_world_hint=True),
    "status": ToolAnnotations(title="What runs now", read_only_hint=True, destructive_hint=False,
                              idempotent_hint=True, open_world_hint=False),
    # reads a camera: what it sees is the open world (and may carry text meant to steer the model)
    "snapshot": ToolAnnotations(title="Camera frame", read_only_hint=True, destructive_hint=False,
                                idempotent_hint=True, open_world_hint=True),
    "models": ToolAnnotations(title="Deployed policies", read_only_hint=True, destructive_hint=False,
                              idempotent_hint=True, open_world_hint=False),
}


def _bounds(cap: float, conditions: Sequence[str] = ()) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """Every tool argument's envelope: ``{tool: {argument: {"kind", "required", bounds..., "hint"}}}``;
    ``conditions``: the stop conditions the backend offers (``act``'s ``stop_when`` choices)."""
    text = {"kind": "text", "required": True, "max_chars": MAX_TEXT_CHARS,
            "hint": f"say one step for the robot in 1 to {MAX_TEXT_CHARS} characters"}
    offered = list(conditions)
    return {"act": {"instruction": text,
                    "max_seconds": {"kind": "seconds", "required": True, "gt": 0.0, "le": cap,
                                    "hint": f"pass a bound such as 20 (> 0 and at most {cap:g} s)"},
                    "stop_when": {"kind": "choice", "required": False, "choices": offered,
                                  "hint": (f"pass one of {offered} or leave it out" if offered else
                                           "this robot offers no stop conditions: leave stop_when out")}},
            "set_instruction": {"text": text},
            "snapshot": {"view": {"kind": "name", "required": False, "max_chars": MAX_VIEW_CHARS,
                                  "hint": "pass a camera view that status() lists, or leave it out for the "
                                          "first camera"}}}


def check_arguments(tool: str, args: Dict[str, Any], cap: float,
                    conditions: Sequence[str] = ()) -> Optional[CallToolResult]:
    """The refusal for ``args`` outside ``tool``'s envelope (an ``is_error`` result naming the
    argument, its bound and what to do), or None when they are within it. Runs before the tool
    does, so nothing has started when it refuses."""
    for name, b in _bounds(cap, conditions).get(tool, {}).items():
        if name not in args or args[name] is None:
            if b["required"]:
                return _error("invalid_request", f"{name} is required", hint=b["hint"])
            continue
        value = args[name]
        if b["kind"] == "choice":
            if not isinstance(value, str) or value not in b["choices"]:
                return _error("unknown_stop_condition", f"{name} {value!r} is not a stop condition this robot "
                                                        f"offers ({', '.join(b['choices']) or 'none'})", hint=b["hint"])
            continue
        if b["kind"] == "seconds":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= b["gt"]:
                return _error("invalid_request", f"{name} must be a number of seconds > 0, not {value!r}",
                              hint=b["hint"])
            if value > b["le"]:
                return _error(f"{name}_over_cap", f"{name} {value:g} s is over this server's cap of {b['le']:g} s",
                              hint=f"pass {name} <= {b['le']:g}, or restart the server with a larger "
                                   "--max-seconds-cap")
        else:
            if not isinstance(value, str):
                return _error("invalid_request", f"{name} must be a string, not {type(value).__name__}",
                              hint=b["hint"])
            if b["kind"] == "text" and not value.strip():
                return _error("invalid_request", f"{name} is empty", hint=b["hint"])
            if len(value) > b["max_chars"]:
                return _error("invalid_request", f"{name} is {len(value)} characters, over the bound of "
                                                 f"{b['max_chars']}", hint=b["hint"])
    return None


@dataclass
class McpSettings:
    """Server settings.

    Attributes:
        max_seconds_cap: the largest ``max_seconds`` (s) ``act`` accepts (default
            :data:`DEFAULT_MAX_SECONDS_CAP`; ``sequence-ai mcp --max-seconds-cap``).
        name: the MCP server name clients see (default ``"sequence-ai"``).
    """

    max_seconds_cap: float = DEFAULT_MAX_SECONDS_CAP
    name: str = "sequence-ai"


def _outcome_model() -> type:
    """``sequence_ai.RunOutcome`` as a pydantic model for the act tool's output schema, made from
    the dataclass's own fields (so the schema follows it); ``fault`` travels as its message."""
    # its annotations are strings, spelled in the module that defined the dataclass
    hints = typing.get_type_hints(sequence_ai.RunOutcome, globalns=sequence_ai.RunOutcome.__init__.__globals__)
    spec: Dict[str, Any] = {}
    for f in dataclasses.fields(sequence_ai.RunOutcome):
        if f.name == "fault":
            spec[f.name] = (Optional[str], None)
        elif f.default is not dataclasses.MISSING:
            spec[f.name] = (hints[f.name], f.default)
        elif f.default_factory is not dataclasses.MISSING:
            spec[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        else:
            spec[f.name] = (hints[f.name], Field(description="completed | until | timeout | interrupted | "
                                                             "validate | error | delay_exceeded | stale_camera"))
    return create_model("RunOutcomeFields", __doc__="``sequence_ai.RunOutcome`` as structured content "
                        "(units: s; jumps in action-space units).", **spec)


RunOutcomeFields = _outcome_model()


class ActOutcome(BaseModel):
    """What ``act`` returns: the goal status, the run's outcome, and the task check when known."""

    status: str = Field(description="SUCCEEDED (completed/until/timeout) | CANCELED (interrupted by "
                                    "the caller) | ABORTED (validate, error, or ended by the robot side)")
    outcome: RunOutcomeFields
    task_done: Optional[bool] = Field(None, description="the robot's own success check for the "
                                                        "instruction, when it has one")
    message: str = ""


def _ok(text: str, data: Dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def _error(code: str, detail: str, *, hint: Optional[str] = None, retryable: bool = False) -> CallToolResult:
    text = detail + (f" (hint: {hint})" if hint else "")
    return CallToolResult(content=[TextContent(type="text", text=f"error[{code}]: {text}")],
                          structured_content={"code": code, "detail": detail, "retryable": retryable,
                                              "hint": hint},
                          is_error=True)


class _Driving:
    """What runs now (one at a time)."""

    def __init__(self) -> None:
        self.instruction: Optional[str] = None
        self.since_unix: Optional[float] = None
        self.started: Optional[float] = None
        self.max_seconds: Optional[float] = None
        self.last: Optional[Dict[str, Any]] = None

    @property
    def active(self) -> bool:
        return self.started is not None


def build_server(backend: Backend, settings: Optional[McpSettings] = None) -> MCPServer:
    """The MCP server (tools over ``backend``); run it with :func:`serve_stdio` /
    :func:`serve_http`, or hand it to ``mcp.Client`` in-process.

    Args:
        backend: a ``backend.PolicyBackend`` (Python mode) or ``ros.RosBackend`` (``--ros``).
        settings: :class:`McpSettings` (default: a cap of 60 s).
    """
    settings = settings or McpSettings()
    cap = float(settings.max_seconds_cap)
    driving = _Driving()
    store = TaskStore(backend.interrupt)
    start_task: Dict[str, Callable] = {}
    extension = ActTasks(store, lambda tool, args: check_arguments(tool, args, cap, backend.stop_conditions),
                         lambda instruction, max_seconds, stop_when=None: start_task["act"](
                             instruction, max_seconds, stop_when))
    mcp = MCPServer(settings.name, log_level="WARNING", extensions=[extension], instructions=(
        "Drive a robot with a deployed action-chunk policy. act(instruction, max_seconds) runs one "
        f"instruction for at most max_seconds (s, at most {cap:g}); look with snapshot(view) first and "
        "after. One act at a time; interrupt() stops it, set_instruction(text) changes it mid-run."))

    start_task["act"] = _add_act_tool(mcp, backend, driving, cap, store)
    _add_control_tools(mcp, backend, driving, cap, store)
    mcp.driving = driving   # type: ignore[attr-defined]   status for embedders and tests
    mcp.tasks = store       # type: ignore[attr-defined]   the act tasks, for embedders and tests
    return mcp


def _act_refusal(backend: Backend, driving: "_Driving", cap: float, instruction: Any, max_seconds: Any,
                 stop_when: Any) -> Optional[CallToolResult]:
    """The checks every act passes before anything moves (plain call and task alike): the
    arguments' envelope, the operator, one act at a time."""
    bad = check_arguments("act", {"instruction": instruction, "max_seconds": max_seconds, "stop_when": stop_when},
                          cap, backend.stop_conditions)
    if bad is not None:
        return bad
    if backend.operator_active:
        return _error("operator", "a person (the operator) holds the robot: act is refused until they release it",
                      hint="wait for the operator; status() says when the robot is free", retryable=True)
    if driving.active:
        return _error("busy", f"the robot is already driving {driving.instruction!r} "
                              f"(for {time.monotonic() - driving.started:.1f} s of at most "
                              f"{driving.max_seconds:g} s)",
                      hint="wait for that act to end, or call interrupt() first", retryable=True)
    return None


def _stop_when_schema(backend: Backend) -> Tuple[Any, str]:
    """``act``'s ``stop_when`` type (an enum of the offered names) and its description."""
    offered = list(backend.stop_conditions)
    kind = Optional[Literal[tuple(offered)]] if offered else Optional[str]   # type: ignore[valid-type]
    text = (f"optional stop condition: one of {offered}; the run ends stop_when once it says done"
            if offered else "optional stop condition; this robot offers none, leave it out")
    return kind, text


def _add_act_tool(mcp: MCPServer, backend: Backend, driving: "_Driving", cap: float, store: TaskStore) -> Callable:
    """Register ``act``: the one driving call (bounded by ``max_seconds`` <= ``cap`` s; one at a time).
    Returns ``start_task(instruction, max_seconds)``, the task path's start (see ``tasks.py``)."""

    def refuse(instruction: Any, max_seconds: Any, stop_when: Any = None) -> Optional[CallToolResult]:
        return _act_refusal(backend, driving, cap, instruction, max_seconds, stop_when)

    def claim(instruction: str, max_seconds: float) -> None:
        driving.instruction, driving.max_seconds = instruction, float(max_seconds)
        driving.since_unix, driving.started = time.time(), time.monotonic()

    async def drive(instruction: str, max_seconds: float, stop: Any = None,
                    stop_when: Optional[str] = None) -> CallToolResult:
        """Run the claimed act to its end; the robot is released (and held) when this returns."""
        try:
            result = await backend.act(instruction, float(max_seconds), stop=stop,
                                       **({"stop_when": stop_when} if stop_when else {}))
        except sequence_ai.SequencesError as exc:
            driving.last = {"error": exc.code, "detail": str(exc)}
            return _error(exc.code, exc.message, hint=exc.hint, retryable=exc.retryable)
        except anyio.get_cancelled_exc_class():
            driving.last = {"status": "CANCELED", "message": "the act call was cancelled or its session dropped: "
                                                              "the robot was stopped (hold)"}
            raise
        finally:
            driving.started = None
        out = ActOutcome.model_validate(result)
        driving.last = out.model_dump(mode="json")
        text = (f"{out.status}: {out.outcome.reason} after {out.outcome.actions} actions in "
                f"{out.outcome.seconds:.1f} s" + ("" if out.task_done is None else f"; task done: {out.task_done}")
                + (f" ({out.message})" if out.message else ""))
        return _ok(text, driving.last)

    def start_task(instruction: Any, max_seconds: Any, stop_when: Any = None) -> Any:
        refused = refuse(instruction, max_seconds, stop_when)
        if refused is not None:
            return refused
        claim(instruction, max_seconds)      # the robot is ours before the handle goes out
        try:
            return store.start(instruction, float(max_seconds), sequence_ai.StopToken(),
                               lambda stop: drive(instruction, float(max_seconds), stop, stop_when), backend.progress)
        except BaseException:
            driving.started = None
            raise

    stop_type, stop_text = _stop_when_schema(backend)

    @mcp.tool(annotations=ANNOTATIONS["act"])
    async def act(
        instruction: Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS,
                                          description='one step for the robot, e.g. "put the red cube on the '
                                                      f'green pad" (1 to {MAX_TEXT_CHARS} characters)')],
        max_seconds: Annotated[float, Field(gt=0, le=cap, description=f"time bound of the run in seconds: "
                                                                      f"required, > 0, at most {cap:g}")],
        stop_when: Annotated[stop_type, Field(description=stop_text)] = None,
        ctx: Context = None,  # type: ignore[assignment]   the SDK's request context (not an argument)
    ) -> Annotated[CallToolResult, ActOutcome]:
        """Drive the robot with the policy for one instruction, e.g. "put the red cube on the green
        pad", for at most max_seconds seconds (required). Returns when the task is done, the time is
        up, or it was interrupted: the status and the run's outcome (actions, chunks, seconds).
        Moves the physical robot. stop_when names a stop condition the robot offers (status()
        lists them): the run ends stop_when once it says done. Refused while a person (the
        operator) holds the robot. Hosts with the MCP Tasks extension get a task to poll and cancel."""
        refused = refuse(instruction, max_seconds, stop_when)
        if refused is not None:
            return refused
        claim(instruction, max_seconds)
        if ctx is None:
            return await drive(instruction, float(max_seconds), stop_when=stop_when)
        return await _with_progress(ctx, backend, driving, float(max_seconds),
                                    lambda: drive(instruction, float(max_seconds), stop_when=stop_when))

    return start_task


async def _with_progress(ctx: Any, backend: Backend, driving: "_Driving", max_seconds: float,
                         run: Callable[[], Any]) -> CallToolResult:
    """``await run()`` with :func:`_report_progress` beside it; the run's own exception (or
    cancellation) comes out as itself."""
    box: Dict[str, CallToolResult] = {}
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_report_progress, ctx, backend, driving, max_seconds)
            try:
                box["result"] = await run()
            finally:
                tg.cancel_scope.cancel()
    except _ExceptionGroup as group:   # the reporter never raises: this is the run's own error
        raise group.exceptions[0] from None
    return box["result"]


#: How often a plain act call hears of its progress (s; sent only when the call asked for it, with
#: a progressToken).
PROGRESS_PERIOD_S = 0.5


async def _report_progress(ctx: Any, backend: Backend, driving: "_Driving", max_seconds: float) -> None:
    """``notifications/progress`` for a plain act every :data:`PROGRESS_PERIOD_S`: progress is the
    elapsed time out of ``max_seconds`` (s), the message the actions so far. Never raises (a
    failed notification must not end the run)."""
    while True:
        await anyio.sleep(PROGRESS_PERIOD_S)
        started = driving.started
        if started is None:
            return
        elapsed = time.monotonic() - started
        try:
            actions = backend.progress().get("actions")
            await ctx.report_progress(min(elapsed, max_seconds), max_seconds,
                                      f"driving {driving.instruction!r}: "
                                      + (f"{actions} actions, " if actions is not None else "")
                                      + f"{elapsed:.1f} s of at most {max_seconds:g} s")
        except Exception:  # noqa: BLE001
            return


def _add_control_tools(mcp: MCPServer, backend: Backend, driving: "_Driving", cap: float, store: TaskStore) -> None:
    """Register interrupt, set_instruction, status, snapshot and models (none of them drives)."""

    @mcp.tool(annotations=ANNOTATIONS["interrupt"])
    async def interrupt() -> CallToolResult:
        """Stop the running act within one control period (the robot holds). Returns whether one ran."""
        was = driving.active
        if was:
            backend.interrupt()
        return _ok("interrupted the running act" if was else "nothing was running",
                   {"interrupted": was, "instruction": driving.instruction if was else None})

    @mcp.tool(annotations=ANNOTATIONS["set_instruction"])
    async def set_instruction(
        text: Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS,
                                   description=f"the new instruction (1 to {MAX_TEXT_CHARS} characters)")],
    ) -> CallToolResult:
        """Change the instruction of the running act without stopping the robot; the next action
        chunk is planned under it."""
        if not text or not text.strip():
            return _error("invalid_request", "text is empty", hint="say what the robot should do")
        if not driving.active:
            return _error("not_running", "no act is running, so there is no instruction to change",
                          hint="call act(instruction, max_seconds) with the new instruction")
        backend.set_instruction(text)
        driving.instruction = text
        return _ok(f"instruction now {text!r}", {"instruction": text, "running": True})

    @mcp.tool(annotations=ANNOTATIONS["status"])
    async def status() -> CallToolResult:
        """What runs now: whether an act is driving, under which instruction, since when (unix s)
        and for how long (and its task id when it runs as an MCP task); the camera views; the
        max_seconds cap; and how the last act ended."""
        now = {"running": driving.active, "instruction": driving.instruction if driving.active else None,
               "since_unix_s": driving.since_unix if driving.active else None,
               "elapsed_s": (time.monotonic() - driving.started) if driving.active else None,
               "max_seconds": driving.max_seconds if driving.active else None,
               "max_seconds_cap": cap, "backend": backend.description, "views": backend.views,
               "stop_conditions": list(backend.stop_conditions), "operator_active": backend.operator_active,
               "task_id": next((t.task_id for t in store.running()), None) if driving.active else None,
               "last": driving.last}
        text = (f"running {now['instruction']!r} for {now['elapsed_s']:.1f} s" if driving.active else "idle")
        return _ok(text, now)

    @mcp.tool(annotations=ANNOTATIONS["snapshot"])
    async def snapshot(
        view: Annotated[str, Field(max_length=MAX_VIEW_CHARS, description=f"camera view, one of "
                                   f"{list(backend.views)}; empty: the first")] = "",
    ) -> Any:
        """The current camera frame of view (default: the first camera) as a JPEG image."""
        views = backend.views
        name = view or (views[0] if views else "")
        try:
            data = await backend.snapshot(name)
        except ValueError as exc:
            return _error("invalid_request", str(exc), hint=f"views: {views}")
        return Image(data=data, format="jpeg")

    @mcp.tool(annotations=ANNOTATIONS["models"])
    async def models() -> CallToolResult:
        """The deployed policies the gateway serves (name, status, robot, action space, Hz, cameras)."""
        try:
            rows = await backend.models()
        except sequence_ai.SequencesError as exc:
            return _error(exc.code, exc.message, hint=exc.hint, retryable=exc.retryable)
        return _ok(", ".join(r["name"] for r in rows) or "none", {"models": rows})


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _BearerAuth:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer <token>``; checked before
    the body is read (401 with the platform's error shape otherwise)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self._token = app, token.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            given = b""
            for name, value in scope.get("headers") or ():
                if name.lower() == b"authorization" and value[:7].lower() == b"bearer ":
                    given = value[7:].strip()
            if not hmac.compare_digest(given, self._token):
                import json
                body = json.dumps({"detail": "missing or wrong bearer token", "code": "unauthorized",
                                   "retryable": False, "retry_after_s": None, "request_id": None,
                                   "hint": "send Authorization: Bearer <the server's token>", "details": None}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def serve_http(mcp: MCPServer, *, host: str = "127.0.0.1", port: int = 8471, token: Optional[str] = None,
                     on_ready: Optional[Callable[[str], Any]] = None, path: str = "/mcp") -> None:
    """Serve ``mcp`` over streamable HTTP until cancelled.

    Args:
        host: bind address (default 127.0.0.1). Anything but loopback needs ``token``.
        port: TCP port (default 8471; 0 picks a free one).
        token: bearer token every request must carry; None for none (loopback only).
        on_ready: called with the URL (``http://host:port/mcp``) once the socket listens.

    Raises:
        ValueError: a non-loopback ``host`` without a token.
    """
    import anyio
    import uvicorn

    if not is_loopback(host) and not token:
        raise ValueError(f"binding {host} (not loopback) needs a bearer token: set SEQUENCES_MCP_TOKEN "
                         "(clients send Authorization: Bearer <token>), or bind 127.0.0.1")
    # On loopback the SDK checks Host / Origin (DNS rebinding); elsewhere the bearer token, which a
    # browser never sends on its own, guards every request
    app = mcp.streamable_http_app(streamable_http_path=path, host=host)
    asgi = _BearerAuth(app, token) if token else app
    server = uvicorn.Server(uvicorn.Config(asgi, host=host, port=port, log_level="warning", lifespan="on"))

    async def announce() -> None:
        while not server.started:
            await anyio.sleep(0.02)
        bound = server.servers[0].sockets[0].getsockname()[1]
        if on_ready is not None:
            on_ready(f"http://{host}:{bound}{path}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await server.serve()
        tg.cancel_scope.cancel()


async def serve_stdio(mcp: MCPServer) -> None:
    """Serve ``mcp`` on this process's stdin/stdout until the client closes it."""
    await mcp.run_stdio_async()
