"""The MCP tests' cell (test/e2e/test_mcp_server.py, test_mcp_tasks.py): one gateway process serving
the demo policy (examples/pick_place), a ``SimRobot`` and the MCP server on streamable HTTP on
127.0.0.1 on a thread of its own, so a test reads the robot's journal (every row applied, every
hold, with its time) next to what the MCP client saw."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import anyio
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

import sequence_ai  # noqa: E402
from _servers import GatewayProcess  # noqa: E402
from sequence_ai_mcp import McpSettings, PolicyBackend, build_server  # noqa: E402
from sequence_ai_mcp.server import serve_http  # noqa: E402
from sequence_ai_mcp.sim import SimRobot  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "examples" / "pick_place" / "policy.py"
CAP_S = 40.0
TASK = "put the red cube on the green pad"
TOOLS = {"act", "interrupt", "set_instruction", "status", "snapshot", "models"}


class Served:
    """The MCP server on a thread of its own (its own event loop), bound to a free port."""

    def __init__(self, backend, settings, token=None):
        self.backend, self.mcp = backend, build_server(backend, settings)
        self.url = None
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=anyio.run, args=(self._main, token), daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the MCP HTTP server did not start"

    async def _main(self, token):
        def ready(url):
            self.url = url
            self._ready.set()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: serve_http(self.mcp, host="127.0.0.1", port=0, token=token, on_ready=ready))
            while not self._stop.is_set():
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    def close(self):
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """(gateway, policy backend, served MCP server) for the module."""
    gw = GatewayProcess.start(tmp_path_factory.mktemp("mcp-gw"))
    robot = policy = None
    try:
        dep = gw.deploy(str(POLICY), name="pick-place", timeout=180.0)
        assert dep["status"] == "ready", dep
        robot = SimRobot(seed=0)
        policy = sequence_ai.connect("pick-place", api_key=gw.api_key, gateway_url=gw.url)
        policy.wait_until_ready(120.0)
        backend = PolicyBackend(policy, robot, gateway_url=gw.url)
        served = Served(backend, McpSettings(max_seconds_cap=CAP_S))
        yield gw, backend, served
        served.close()
    finally:
        if policy is not None:
            policy.close()
        if robot is not None:
            robot.close()
        gw.close()


def run(coro):
    return asyncio.run(coro)


def journal_since(robot, t0):
    return [(t, kind) for t, kind, _ in list(robot.journal) if t >= t0]


async def wait_for_actions(robot, since, n, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while sum(1 for _, k in journal_since(robot, since) if k == "act") < n:
        assert time.monotonic() < deadline, f"fewer than {n} actions reached the arm within {timeout_s} s"
        await asyncio.sleep(0.02)
