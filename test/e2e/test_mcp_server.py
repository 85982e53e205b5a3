"""``sequence-ai mcp`` through the real MCP client SDK, against the simulated cell.

One gateway process serves the demo policy (examples/pick_place); the MCP server runs in this
process (Python mode: ``sequence_ai.Policy`` + ``SimRobot``) on streamable HTTP on 127.0.0.1, so
the tests can read the robot's journal (every row applied, every hold, with its time) next to
what the MCP client saw. The stdio test starts ``sequence-ai mcp`` itself as a subprocess.
"""
from __future__ import annotations

import asyncio
import base64
import io
import os
import sys
import time

import anyio
import httpx
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

from mcp import Client, StdioServerParameters  # noqa: E402
from PIL import Image as PILImage  # noqa: E402

from _servers import _env  # noqa: E402
from _llm import CHAT_MODEL, llm  # noqa: E402,F401  (the llama.cpp server fixture)
import sequence_ai  # noqa: E402
from sequence_ai_mcp import McpSettings, build_server  # noqa: E402
from sequence_ai_mcp.server import serve_http  # noqa: E402
from _mcp_support import CAP_S, ROOT, TASK, TOOLS, Served, cell, journal_since, run, wait_for_actions  # noqa: E402,F401  (the cell fixture)


def test_lists_the_tools_with_a_required_time_bound(cell):
    _, _, served = cell

    async def go():
        async with Client(served.url) as client:
            return (await client.list_tools()).tools
    tools = {t.name: t for t in run(go())}
    assert set(tools) == TOOLS
    schema = tools["act"].input_schema
    assert set(schema["required"]) == {"instruction", "max_seconds"}
    assert schema["properties"]["max_seconds"]["type"] == "number"
    assert tools["act"].output_schema is not None and "outcome" in tools["act"].output_schema["properties"]


def test_act_on_the_sim_succeeds_with_a_run_outcome(cell):
    _, backend, served = cell
    robot = backend.robot
    robot.reset(0)
    t0 = time.monotonic()

    progress = []

    async def heard(value, total, message):
        progress.append((value, total, message))

    async def go():
        async with Client(served.url) as client:
            return await client.call_tool("act", {"instruction": TASK, "max_seconds": 30.0},
                                          progress_callback=heard)
    res = run(go())
    assert not res.is_error, res.content
    # progress notifications while it ran: elapsed s out of max_seconds, and the actions so far
    assert len(progress) >= 3 and all(total == 30.0 for _, total, _ in progress), progress
    assert [v for v, _, _ in progress] == sorted(v for v, _, _ in progress) and "actions" in progress[-1][2]
    out = res.structured_content
    assert out["status"] == "SUCCEEDED", out
    assert out["outcome"]["reason"] == "until", out       # the sim's own check ended it, not the clock
    assert out["task_done"] is True
    applied = [k for _, k in journal_since(robot, t0)]
    assert out["outcome"]["actions"] == applied.count("act") > 15
    assert out["outcome"]["chunks"] >= 2 and out["outcome"]["action_space"] == "joint_absolute"
    seams = out["outcome"]["seams"]                     # the per-seam telemetry travels too (schema from RunOutcome)
    assert seams["count"] == out["outcome"]["chunks"] - 1 and out["outcome"]["merge"] in ("replace", "aligned"), seams
    assert applied[-1] == "hold"
    assert robot.done(TASK)


def test_second_concurrent_act_is_refused_busy_and_interrupt_cancels(cell):
    _, backend, served = cell
    robot = backend.robot
    robot.reset(3)
    t0 = time.monotonic()

    async def go():
        async with Client(served.url) as first, Client(served.url) as second:
            task = asyncio.ensure_future(first.call_tool("act", {"instruction": TASK, "max_seconds": 30.0}))
            await wait_for_actions(robot, t0, 5)
            st = (await second.call_tool("status", {})).structured_content
            busy = await second.call_tool("act", {"instruction": "put the blue cube on the red pad",
                                                  "max_seconds": 10.0})
            swapped = await second.call_tool("set_instruction", {"text": "put the blue cube on the red pad"})
            stopped = await second.call_tool("interrupt", {})
            return st, busy, swapped, stopped, await task
    st, busy, swapped, stopped, first = run(go())
    assert st["running"] is True and st["instruction"] == TASK and st["max_seconds"] == 30.0
    assert st["since_unix_s"] <= time.time() and st["elapsed_s"] > 0
    assert busy.is_error and busy.structured_content["code"] == "busy", busy
    assert busy.structured_content["retryable"] is True and TASK in busy.structured_content["detail"]
    assert not swapped.is_error and swapped.structured_content["instruction"].startswith("put the blue")
    assert stopped.structured_content["interrupted"] is True
    assert not first.is_error, first.content
    assert first.structured_content["status"] == "CANCELED"
    assert first.structured_content["outcome"]["reason"] == "interrupted"
    kinds = [k for _, k in journal_since(robot, t0)]
    assert kinds[-1] == "hold" and kinds.count("hold") == 1


def test_max_seconds_missing_or_over_the_cap_is_refused_before_anything_moves(cell):
    _, backend, served = cell
    robot = backend.robot
    t0 = time.monotonic()

    async def go():
        async with Client(served.url) as client:
            missing = await client.call_tool("act", {"instruction": TASK})
            over = await client.call_tool("act", {"instruction": TASK, "max_seconds": CAP_S + 1})
            zero = await client.call_tool("act", {"instruction": TASK, "max_seconds": 0})
            return missing, over, zero
    missing, over, zero = run(go())
    assert missing.is_error and "max_seconds" in missing.content[0].text, missing
    assert over.is_error and over.structured_content["code"] == "max_seconds_over_cap", over
    assert f"{CAP_S:g}" in over.structured_content["detail"]
    assert zero.is_error and zero.structured_content["code"] == "invalid_request"
    time.sleep(0.2)
    assert journal_since(robot, t0) == []


def test_dropped_session_mid_act_holds_within_one_period_and_sends_nothing_after(cell):
    _, backend, served = cell
    robot = backend.robot
    robot.reset(7)
    t0 = time.monotonic()
    marks = {}

    async def go():
        async def drive():
            async with Client(served.url) as client:
                await client.call_tool("act", {"instruction": "put the green cube on the blue pad",
                                               "max_seconds": 30.0})
        task = asyncio.ensure_future(drive())
        await wait_for_actions(robot, t0, 10)
        marks["drop"] = time.monotonic()
        task.cancel()                      # the client goes away mid-call: its session ends
        try:
            await task
        except asyncio.CancelledError:
            pass
    run(go())
    deadline = time.monotonic() + 10.0
    while "hold" not in [k for _, k in journal_since(robot, marks["drop"])]:
        assert time.monotonic() < deadline, "no hold within 10 s of the session dropping"
        time.sleep(0.02)
    time.sleep(1.0)                        # anything still coming would arrive now
    after = journal_since(robot, marks["drop"])
    hold_at = next(t for t, k in after if k == "hold")
    cancelled_at = backend.cancelled_at
    assert cancelled_at is not None and marks["drop"] <= cancelled_at <= hold_at
    assert hold_at - cancelled_at <= backend.period_s, (hold_at - cancelled_at, backend.period_s)
    assert [k for t, k in after if t > hold_at] == [], "actions reached the arm after the hold"
    assert sum(1 for t, k in after if k == "act" and t >= cancelled_at) <= 1

    async def status():
        async with Client(served.url) as client:
            return (await client.call_tool("status", {})).structured_content
    st = run(status())
    assert st["running"] is False


def test_snapshot_is_the_current_camera_frame_and_models_lists_the_deployment(cell):
    _, _, served = cell

    async def go():
        async with Client(served.url) as client:
            return (await client.call_tool("snapshot", {"view": "wrist_left"}),
                    await client.call_tool("snapshot", {"view": "nope"}),
                    await client.call_tool("models", {}))
    snap, bad, models = run(go())
    assert not snap.is_error and snap.content[0].type == "image" and snap.content[0].mime_type == "image/jpeg"
    img = PILImage.open(io.BytesIO(base64.b64decode(snap.content[0].data)))
    assert img.format == "JPEG" and img.size == (224, 224)
    assert bad.is_error and bad.structured_content["code"] == "invalid_request" and "exterior_1" in bad.content[0].text
    rows = models.structured_content["models"]
    assert [r["name"] for r in rows] == ["pick-place"] and rows[0]["control_frequency_hz"] == 15.0


def test_the_sim_robot_observes_with_the_instruction_a_predict_needs(cell):
    """``SimRobot.observe(instruction=...)``: what the Python guide's predict() on the sim uses
    (without it the observation's instruction is empty and the pick-place policy refuses it)."""
    _, backend, _ = cell
    task = "put the red cube on the green pad"
    assert backend.robot.observe().instruction == ""
    with pytest.raises(sequence_ai.InvalidRequest, match="instruction is empty"):
        backend.policy.predict(backend.robot.observe())
    obs = backend.robot.observe(instruction=task)
    assert obs.instruction == task and sorted(f.view for f in obs.images) == ["exterior_1", "wrist_left"]
    chunk = backend.policy.predict(obs).action_chunk
    assert len(chunk.actions) > 0 and all(len(row) == 8 for row in chunk.actions)


def test_bearer_token_is_checked_and_required_off_loopback(cell):
    _, backend, _ = cell
    with pytest.raises(ValueError, match="bearer token"):
        anyio.run(lambda: serve_http(build_server(backend), host="0.0.0.0", port=0))
    served = Served(backend, McpSettings(), token="s3cret-token")
    close_served = served.close
    r = httpx.post(served.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    r = httpx.post(served.url, json={}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401

    async def go():
        async with httpx.AsyncClient(headers={"Authorization": "Bearer s3cret-token"}) as http:
            from mcp.client.streamable_http import streamable_http_client
            async with Client(streamable_http_client(served.url, http_client=http)) as client:
                return {t.name for t in (await client.list_tools()).tools}
    try:
        assert run(go()) == TOOLS
    finally:
        close_served()


def test_cli_serves_stdio_and_refuses_an_open_bind_without_a_token(cell):
    gw, _, _ = cell
    env = _env(gw.env())
    env.pop("SEQUENCES_MCP_TOKEN", None)
    import subprocess
    out = subprocess.run([sys.executable, "-m", "sequence_ai", "mcp", "--model", "pick-place", "--http",
                          "--host", "0.0.0.0"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "SEQUENCES_MCP_TOKEN" in out.stderr

    async def go():
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "sequence_ai", "mcp", "--model", "pick-place", "--seed", "1"],
                                       env=env, cwd=str(ROOT))
        async with Client(params) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            st = (await client.call_tool("status", {})).structured_content
            return names, st
    names, st = run(go())
    assert names == TOOLS
    assert st["running"] is False and st["max_seconds_cap"] == 60.0 and "pick-place" in st["backend"]


def test_vlm_agent_example_runs_its_loop_against_a_local_model(cell, llm):
    """examples/vlm_agent/agent.py with the tiny fixed model (test_chat_decide's llama.cpp server):
    it snapshots, chats with the MCP tools, prints each tool call and makes it. The model plans
    nothing: asked for an act (forced; greedy), it writes a nonsense instruction (empty before the
    schema said minLength 1; now a stray character), which is refused (by the server's bounds or
    the policy's own instruction check), and nothing moves."""
    import subprocess
    _, backend, served = cell
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "vlm_agent" / "agent.py"), "--mcp", served.url,
                          "--model", CHAT_MODEL, "--base-url", llm, "--no-image", "--max-turns", "1",
                          "--tool-choice", "act", "--temperature", "0"],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("[turn 1] tool call: act(") and '"max_seconds"' in lines[0], out.stdout
    assert "error: " in lines[1] and "instruction" in lines[1], out.stdout
    assert lines[-1].endswith("refused")
    # no action reached the arm (a refusal by the policy's check comes after the run began, so
    # the engine's hold on that early ending is there)
    assert [k for _, k in journal_since(backend.robot, t0)] in ([], ["hold"])


def test_stdio_client_killed_mid_act_stops_the_run_and_the_server(cell):
    """The hardest drop: the process holding the stdio session is SIGKILLed mid-act. The server
    (``sequence-ai mcp`` over stdio) sees its input close, interrupts the run -- which holds --
    within one control period of the cancel, says so on stderr, and exits cleanly."""
    import re
    import subprocess
    gw, backend, _ = cell
    env = _env(gw.env())
    client = ("import asyncio, os, sys\n"
              "from mcp import Client, StdioServerParameters\n"
              "async def main():\n"
              "    p = StdioServerParameters(command=sys.executable, args=['-m', 'sequence_ai', 'mcp', '--model',\n"
              "                              'pick-place', '--seed', '2'], env=dict(os.environ))\n"
              "    async with Client(p) as c:\n"
              "        print('calling act', flush=True)\n"
              "        await c.call_tool('act', {'instruction': 'put the blue cube on the red pad', 'max_seconds': 30})\n"
              "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", client], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "calling act", proc.stderr.read()
        time.sleep(4.0)                      # the run is under way (a pick-and-place takes ~8 s)
        server = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(server) == 1
        proc.kill()
        t_kill = time.monotonic()
        while os.path.exists(f"/proc/{server[0]}") and \
                open(f"/proc/{server[0]}/stat").read().split()[2] != "Z":
            assert time.monotonic() - t_kill < 15.0, "the server still runs 15 s after its client died"
            time.sleep(0.05)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    found = re.search(r"the run stopped \((\w+)\) ([\d.]+) s after the cancel", err)
    assert found, err[-3000:]
    assert found.group(1) == "interrupted"                      # interrupted: the engine held
    assert float(found.group(2)) <= backend.period_s
    assert "the client closed stdio; stopped" in err and "Traceback" not in err, err[-3000:]
