"""The MCP ``act`` tool's stop conditions and the operator, through the real MCP client SDK against
the simulated cell (the gateway serving the demo policy, ``SimRobot``, the MCP server on HTTP).

- the backend offers named stop conditions; ``act``'s schema lists them (an enum), one of them
  ends the run ``stop_when`` (SUCCEEDED, the arm held), a name it does not offer is refused
  before anything moves, naming the argument and the names offered;
- while the operator (``policy.operator``) holds the robot, ``act`` is refused with ``operator``
  and nothing moves; taken mid-run, the arm holds within one control period, no row after, and
  the outcome says ``operator`` (ABORTED).
"""
from __future__ import annotations

import os
import threading
import time

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

from mcp import Client  # noqa: E402

from _mcp_support import CAP_S, TASK, Served, cell, journal_since, run, wait_for_actions  # noqa: E402,F401
from sequence_ai_mcp import McpSettings, PolicyBackend  # noqa: E402


@pytest.fixture(scope="module")
def offered(cell):
    """A second MCP server over the cell's policy and robot, offering two stop conditions."""
    _, backend, _ = cell
    seen = {"n": 0}

    def after_ten_periods(observation):
        seen["n"] += 1
        return seen["n"] % 10 == 0

    conditions = {"after_ten_periods": after_ten_periods, "never": lambda observation: False}
    served = Served(PolicyBackend(backend.policy, backend.robot, gateway_url=cell[0].url,
                                  stop_conditions=conditions), McpSettings(max_seconds_cap=CAP_S))
    yield served
    served.close()


def _call(url, arguments):
    async def go():
        async with Client(url) as client:
            return await client.call_tool("act", arguments)
    return run(go())


def test_the_schema_lists_the_conditions_and_one_ends_the_run_stop_when(offered):
    async def tools():
        async with Client(offered.url) as client:
            return {t.name: t for t in (await client.list_tools()).tools}
    schema = run(tools())["act"].input_schema["properties"]["stop_when"]
    assert "after_ten_periods" in str(schema) and "never" in str(schema)
    robot = offered.backend.robot
    robot.reset(0)
    t0 = time.monotonic()
    res = _call(offered.url, {"instruction": TASK, "max_seconds": 20.0, "stop_when": "after_ten_periods"})
    assert not res.is_error, res.content
    out = res.structured_content
    assert out["status"] == "SUCCEEDED" and out["outcome"]["reason"] == "stop_when", out
    applied = [k for _, k in journal_since(robot, t0)]
    assert applied.count("act") == out["outcome"]["actions"] == 9     # the tenth period's row never went out
    assert applied[-1] == "hold"


def test_a_condition_the_robot_does_not_offer_is_refused_before_anything_moves(offered):
    robot = offered.backend.robot
    t0 = time.monotonic()
    res = _call(offered.url, {"instruction": TASK, "max_seconds": 5.0, "stop_when": "cube_on_pad"})
    assert res.is_error
    text = res.content[0].text
    assert "stop_when" in text and "cube_on_pad" in text and "after_ten_periods" in text, text
    assert journal_since(robot, t0) == []


def test_while_the_operator_holds_the_robot_act_is_refused_and_taken_mid_run_it_holds(offered):
    backend = offered.backend
    robot = backend.robot
    backend.policy.operator.take()
    try:
        t0 = time.monotonic()
        res = _call(offered.url, {"instruction": TASK, "max_seconds": 5.0})
        assert res.is_error and "operator" in res.content[0].text, res.content
        assert journal_since(robot, t0) == []
    finally:
        backend.policy.operator.release()
    robot.reset(0)
    t0 = time.monotonic()
    taken = {}

    def take_after_actions():
        run(wait_for_actions(robot, t0, 10))
        taken["t"] = time.monotonic()
        backend.policy.operator.take()

    thread = threading.Thread(target=take_after_actions, daemon=True)
    thread.start()
    try:
        res = _call(offered.url, {"instruction": TASK, "max_seconds": 30.0, "stop_when": "never"})
    finally:
        thread.join(timeout=30)
        backend.policy.operator.release()
    out = res.structured_content
    assert out["status"] == "ABORTED" and out["outcome"]["reason"] == "operator", out
    events = journal_since(robot, t0)
    holds = [t for t, k in events if k == "hold"]
    assert holds and all(t < holds[0] for t, k in events if k == "act")   # nothing after the hold
    period = backend.period_s or 1.0 / 15.0
    print(f"held {(holds[0] - taken['t']) * 1000:.1f} ms after the operator took the robot "
          f"(period {period * 1000:.0f} ms)")
    assert holds[0] - taken["t"] <= period + 0.1
