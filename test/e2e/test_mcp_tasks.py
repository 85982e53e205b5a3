"""``act`` as an MCP task (the Tasks extension), tool annotations and argument bounds, through the
real MCP client SDK over streamable HTTP against the simulated cell (test_mcp_server.py's cell:
one gateway with the demo policy, the MCP server in this process so the robot's journal is
readable next to what the client saw).

The client side of the extension is written here on the SDK's extension interface (a
``ResultClaim`` for ``resultType: "task"`` and typed ``tasks/*`` requests), the way a host that
supports tasks would: declaring it is what makes the server answer ``act`` with a task handle.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, Literal, Optional

import pytest
from mcp import Client
from mcp.client.extension import ClientExtension, ResultClaim
from mcp.types import CallToolResult, Request, RequestParams, Result

from sequence_ai_mcp.tasks import OUTCOME_META_KEY, PROGRESS_META_KEY, TASKS_EXTENSION
from _mcp_support import CAP_S, TASK, TOOLS, cell, journal_since, run  # noqa: F401  (the cell fixture)


class TaskHandle(Result):
    """``CreateTaskResult``: what a task-aware ``tools/call`` may answer."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: Optional[str] = None
    created_at: str
    last_updated_at: str
    ttl_ms: Optional[int] = None
    poll_interval_ms: Optional[int] = None


class TaskState(Result):
    """``tasks/get``'s answer (a ``DetailedTask``)."""

    task_id: str
    status: str
    status_message: Optional[str] = None
    poll_interval_ms: Optional[int] = None
    result: Optional[Dict[str, Any]] = None
    error: Optional[Dict[str, Any]] = None


class _Id(RequestParams):
    task_id: str


class GetTask(Request[_Id, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _Id
    name_param = "taskId"


class CancelTask(Request[_Id, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: _Id
    name_param = "taskId"


class TaskResult(Request[_Id, Literal["tasks/result"]]):
    method: Literal["tasks/result"] = "tasks/result"
    params: _Id
    name_param = "taskId"


class Tasks(ClientExtension):
    """The host side: declares the extension; a plain ``call_tool`` polls a task to its end."""

    identifier = TASKS_EXTENSION

    def claims(self):
        async def resolve(handle: TaskHandle, ctx) -> CallToolResult:
            while True:
                state = await get(ctx.session, handle.task_id)
                if state.status in ("completed", "cancelled", "failed"):
                    return CallToolResult.model_validate(state.result or {"content": [], "isError": True})
                await asyncio.sleep((state.poll_interval_ms or 250) / 1000.0)
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=resolve)]


async def start(client: Client, args: Dict[str, Any]):
    return await client.session.call_tool("act", args, allow_claimed=True)


async def get(session, task_id: str) -> TaskState:
    return await session.send_request(GetTask(params=_Id(task_id=task_id)), TaskState)


def _meta(state: Result) -> Dict[str, Any]:
    return state.meta or {}


def test_tools_carry_annotations_and_every_argument_its_bounds(cell):
    _, _, served = cell

    async def go():
        async with Client(served.url, extensions=[Tasks()]) as client:
            return client.server_capabilities, (await client.list_tools()).tools
    caps, tools = run(go())
    assert TASKS_EXTENSION in (caps.extensions or {})
    tools = {t.name: t for t in tools}
    assert set(tools) == TOOLS
    act = tools["act"].annotations
    assert (act.destructive_hint, act.open_world_hint, act.read_only_hint, act.idempotent_hint) == (True, True, False,
                                                                                                      False)
    for name in ("status", "snapshot", "models"):
        assert tools[name].annotations.read_only_hint is True, name
    assert tools["interrupt"].annotations.destructive_hint is False
    assert tools["set_instruction"].annotations.destructive_hint is True
    assert all(t.annotations is not None and t.annotations.title for t in tools.values())
    props = tools["act"].input_schema["properties"]
    assert props["max_seconds"]["exclusiveMinimum"] == 0 and props["max_seconds"]["maximum"] == CAP_S
    assert props["instruction"]["minLength"] == 1 and props["instruction"]["maxLength"] == 500
    assert tools["set_instruction"].input_schema["properties"]["text"]["maxLength"] == 500
    assert tools["snapshot"].input_schema["properties"]["view"]["maxLength"] == 64


@pytest.mark.parametrize("tasks", [False, True], ids=["plain", "task-aware"])
def test_out_of_envelope_arguments_are_refused_naming_them_before_anything_moves(cell, tasks):
    _, backend, served = cell
    t0 = time.monotonic()

    async def go():
        async with Client(served.url, extensions=[Tasks()] if tasks else None) as client:
            calls = [("act", {"instruction": "x" * 501, "max_seconds": 5.0}),
                     ("act", {"instruction": TASK, "max_seconds": CAP_S + 0.5}),
                     ("act", {"instruction": TASK, "max_seconds": -1}),
                     ("act", {"instruction": TASK, "max_seconds": "ten"}),
                     ("act", {"instruction": "   ", "max_seconds": 5.0}),
                     ("act", {"max_seconds": 5.0}),
                     ("set_instruction", {"text": "y" * 900}),
                     ("snapshot", {"view": "v" * 65})]
            return [(name, args, await client.session.call_tool(name, args, allow_claimed=True))
                    for name, args in calls]
    results = run(go())
    named = ["instruction", "max_seconds", "max_seconds", "max_seconds", "instruction", "instruction", "text", "view"]
    for (tool, args, res), arg in zip(results, named):
        assert isinstance(res, CallToolResult), (tool, args, res)     # a refusal, never a task handle
        text = res.content[0].text
        assert res.is_error and text.startswith("error[") and "hint: " in text, (tool, args, text)
        assert arg in text and "Traceback" not in text and "pydantic" not in text, (tool, args, text)
    assert "500" in results[0][2].content[0].text
    assert results[1][2].structured_content["code"] == "max_seconds_over_cap"
    assert f"{CAP_S:g}" in results[1][2].content[0].text
    assert "required" in results[5][2].content[0].text
    assert "64" in results[7][2].content[0].text
    time.sleep(0.2)
    assert journal_since(backend.robot, t0) == [], "a refused call moved the arm"
    assert served.mcp.tasks.running() == [] and not served.mcp.driving.active


def test_task_polled_running_then_cancelled_holds_within_one_period(cell):
    _, backend, served = cell
    robot = backend.robot
    robot.reset(5)
    t0 = time.monotonic()

    async def go():
        async with Client(served.url, extensions=[Tasks()]) as client, Client(served.url) as plain:
            handle = await start(client, {"instruction": TASK, "max_seconds": 30.0})
            assert isinstance(handle, TaskHandle), handle
            busy = await plain.call_tool("act", {"instruction": TASK, "max_seconds": 5.0})
            st = (await plain.call_tool("status", {})).structured_content
            assert st["running"] is True and st["task_id"] == handle.task_id, st
            polls = []
            deadline = time.monotonic() + 60.0
            while True:                                   # poll until the arm is moving
                state = await get(client.session, handle.task_id)
                polls.append(state)
                if state.status == "working" and _meta(state).get(PROGRESS_META_KEY, {}).get("actions", 0) >= 8:
                    break
                assert state.status == "working" and time.monotonic() < deadline, state
                await asyncio.sleep((state.poll_interval_ms or 250) / 1000.0)
            sent = time.monotonic()
            await client.session.send_request(CancelTask(params=_Id(task_id=handle.task_id)), Result)
            acked = time.monotonic()
            while True:
                state = await get(client.session, handle.task_id)
                if state.status != "working":
                    break
                await asyncio.sleep(0.05)
            fetched = await client.session.send_request(TaskResult(params=_Id(task_id=handle.task_id)),
                                                        CallToolResult)
            return handle, busy, polls, state, fetched, sent, acked
    handle, busy, polls, final, fetched, sent, acked = run(go())
    assert handle.status == "working" and handle.poll_interval_ms and handle.ttl_ms
    assert busy.is_error and busy.structured_content["code"] == "busy", busy   # the task holds the robot
    assert "actions" in polls[-1].status_message and "of at most 30 s" in polls[-1].status_message
    assert final.status == "cancelled", final
    outcome = _meta(final)[OUTCOME_META_KEY]
    assert outcome["status"] == "CANCELED" and outcome["outcome"]["reason"] == "interrupted", outcome
    assert "interrupted" in final.status_message
    assert not fetched.is_error and fetched.structured_content["outcome"]["reason"] == "interrupted"
    time.sleep(1.0)                                       # anything still coming would arrive now
    task = served.mcp.tasks.get(handle.task_id)
    cancelled_at = task.cancelled_at
    assert cancelled_at is not None and sent <= cancelled_at <= acked
    after = journal_since(robot, cancelled_at)
    holds = [t for t, k in after if k == "hold"]
    assert len(holds) == 1, after
    latency = holds[0] - cancelled_at
    print(f"\nhold {latency * 1000:.1f} ms after tasks/cancel reached the server "
          f"(control period {backend.period_s * 1000:.1f} ms)")
    assert latency <= backend.period_s, (latency, backend.period_s)
    assert [k for t, k in after if t > holds[0]] == [], "actions reached the arm after the hold"
    assert sum(1 for _, k in after if k == "act") <= 1
    assert fetched.structured_content["outcome"]["actions"] == sum(1 for _, k in journal_since(robot, t0)
                                                                   if k == "act")
    assert not served.mcp.driving.active


def test_task_run_to_completion_returns_the_outcome(cell):
    _, backend, served = cell
    robot = backend.robot
    robot.reset(0)
    t0 = time.monotonic()

    async def go():
        async with Client(served.url, extensions=[Tasks()]) as client:
            handle = await start(client, {"instruction": TASK, "max_seconds": 30.0})
            assert isinstance(handle, TaskHandle), handle
            while True:
                state = await get(client.session, handle.task_id)
                if state.status != "working":
                    return handle, state
                await asyncio.sleep((state.poll_interval_ms or 250) / 1000.0)
    handle, state = run(go())
    assert state.status == "completed", state
    res = CallToolResult.model_validate(state.result)
    out = res.structured_content
    assert not res.is_error and out["status"] == "SUCCEEDED" and out["outcome"]["reason"] == "until", out
    assert out["task_done"] is True and robot.done(TASK)
    applied = [k for _, k in journal_since(robot, t0)]
    assert out["outcome"]["actions"] == applied.count("act") > 15 and applied[-1] == "hold"
    assert _meta(state)[OUTCOME_META_KEY] == out


def test_host_without_tasks_keeps_the_plain_call_on_either_wire(cell):
    """No extension declared: act blocks and returns the outcome, on the stateless 2026-07-28 wire
    and on a 2025-11-25 session alike (both served on the same URL); a session-era host that
    declares the extension still gets the plain call (task handles exist on the new wire only)."""
    _, backend, served = cell
    robot = backend.robot

    async def go():
        out = {}
        for label, kwargs in (("stateless", {}), ("session", {"mode": "legacy"}),
                              ("session+tasks", {"mode": "legacy", "extensions": [Tasks()]})):
            async with Client(served.url, **kwargs) as client:
                res = await client.session.call_tool("act", {"instruction": TASK, "max_seconds": 1.0},
                                                     allow_claimed=True)
                out[label] = (client.protocol_version, res)
        return out
    robot.reset(1)
    got = run(go())
    assert got["stateless"][0] == "2026-07-28" and got["session"][0] == "2025-11-25"
    for label, (_, res) in got.items():
        assert isinstance(res, CallToolResult) and not res.is_error, (label, res)
        assert res.structured_content["outcome"]["reason"] in ("timeout", "until"), (label, res.structured_content)


def test_cancel_right_after_the_start_is_not_lost(cell):
    """tasks/cancel as soon as the handle arrives (the run is still connecting or planning its
    first chunk): the run's own stop token carries it, so the run ends interrupted at once instead
    of driving its 30 s, holds once, and nothing follows the hold."""
    _, backend, served = cell
    robot = backend.robot
    robot.reset(2)
    t0 = time.monotonic()

    async def go():
        async with Client(served.url, extensions=[Tasks()]) as client:
            handle = await start(client, {"instruction": TASK, "max_seconds": 30.0})
            await client.session.send_request(CancelTask(params=_Id(task_id=handle.task_id)), Result)
            while True:
                state = await get(client.session, handle.task_id)
                if state.status != "working":
                    return state
                await asyncio.sleep(0.05)
    state = run(go())
    ended = time.monotonic()
    assert state.status == "cancelled", state
    outcome = _meta(state)[OUTCOME_META_KEY]
    assert outcome["status"] == "CANCELED" and outcome["outcome"]["reason"] == "interrupted", outcome
    assert ended - t0 < 10.0
    time.sleep(0.5)
    kinds = [k for _, k in journal_since(robot, t0)]
    assert kinds.count("hold") == 1 and kinds[-1] == "hold", kinds
    assert outcome["outcome"]["actions"] == kinds.count("act")
    print(f"\ncancel right after the start: {kinds.count('act')} actions before the hold")
