"""What the client reference and the authoring guide promise a new user, checked as that user
would meet it: real gateway and worker processes on loopback, the `seq` / `sequence-ai` command
lines, the spec's own call shapes.

- deployment default params reach every new session's requests, and a connected robot picks
  them up at its next lease renewal and switches at its next episode; `seq policy status` lists
  what each robot runs with;
- `seq policy stop` is an emergency stop: workers end now, connects are refused (typed, naming
  the command that undoes it) until `seq policy start`;
- predict() on a policy with no contract returns exactly what its infer() returned;
- sequence_ai.observation() without a model, and with contract=policy.contract;
- `seq init pi05-droid` writes the policy, the robot's client.py and a README;
- the progress line on a terminal is one line, rewritten in place;
- catalogue rows carry the per-model fields, templates are listed, kind=/endpoint= filter;
- every sync API works from inside a run() callback;
- `python -m seq` and `python -m sequence_ai`;
- sequence_ai.account() / `seq account`: usage and limits, no invented balance.
"""
from __future__ import annotations

import io
import os
import py_compile
import select
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

import sequence_ai
from _core_support import ECHO, Recorder, connect, observation, unique
from _servers import ROOT, GatewayProcess, _env, seq_cli

TOY = str(ROOT / "seq" / "templates" / "toy-policy" / "policy.py")
SEQ_MAIN = "from seq.cli import main; main()"


def _chunk_lengths(policy, max_actions: int, **kw) -> list[int]:
    seen: list[int] = []
    policy.run(observation, Recorder(), max_actions=max_actions, validate=lambda row: True, progress=False,
               on_chunk=lambda chunk, first: seen.append(len(chunk)), **kw)
    return seen


@pytest.fixture(scope="module")
def echo(shared_module_gateway):
    name = unique("promise-echo")
    assert shared_module_gateway.deploy(ECHO, name)["status"] == "ready"
    return name


# ------------------------------------------------------------------ 1. deployment default params

def test_deployment_defaults_reach_predict_and_run_of_every_new_session_unless_it_names_its_own(shared_module_gateway):
    gw = shared_module_gateway
    name = unique("defaults")
    assert gw.deploy(ECHO, name)["status"] == "ready"
    r = seq_cli(gw, "policy", "params", name, "chunk_len=4")
    assert r.returncode == 0, r.stderr
    with connect(gw, name) as policy:
        assert policy._engine._wire.session.params == {"chunk_len": 4}
        assert len(policy.predict(observation()).action_chunk) == 4          # the echo policy's own default: 10
        assert set(_chunk_lengths(policy, 9)) == {4}
    with connect(gw, name, params={"chunk_len": 6}) as policy:                 # a session's own value wins
        assert len(policy.predict(observation()).action_chunk) == 6
        assert len(policy.predict(observation(), params={"chunk_len": 3}).action_chunk) == 3   # and a call's
        r = seq_cli(gw, "policy", "status", name)                                # what each robot runs with
        assert r.returncode == 0, r.stderr
        sid = policy._engine._wire.session.session_id
        assert "robots    1 connected" in r.stdout and f"{sid}  key key_1  v1  params {{\"chunk_len\": 6}}" in r.stdout
    r = seq_cli(gw, "policy", "params", name, "--clear", "chunk_len")
    assert r.returncode == 0, r.stderr
    with connect(gw, name) as policy:
        assert len(policy.predict(observation()).action_chunk) == 10


def test_a_connected_robot_learns_new_defaults_at_lease_renewal_and_switches_at_its_next_episode(tmp_path):
    gw = GatewayProcess.start(tmp_path, env={"SEQ_LEASE_TTL_S": "2"})
    try:
        assert gw.deploy(ECHO, "live")["status"] == "ready"
        changed = []

        def change_defaults_once(chunk, first):
            if not changed:    # mid-episode: the first chunk is playing
                r = gw.client.post("/v1/deployments/live/params", json={"set": {"chunk_len": 4}})
                changed.append(r.status_code)

        with connect(gw, "live") as policy:
            wire = policy._engine._wire
            seen: list[int] = []
            t0 = time.monotonic()
            policy.run(observation, Recorder(), max_actions=45, validate=lambda row: True, progress=False,
                       on_chunk=lambda c, i: (seen.append(len(c)), change_defaults_once(c, i)))
            assert changed == [200] and time.monotonic() - t0 > 2.0
            assert wire.renewals >= 1 and wire.session.params == {"chunk_len": 4}   # learnt at the renewal
            assert set(seen) == {10}                                                 # the episode kept its own
            assert set(_chunk_lengths(policy, 8)) == {4}                             # the next episode switched
            sessions = gw.status("live")["sessions"]                                 # what `seq policy status` lists
            assert [(x["session_id"], x["params"]) for x in sessions] == [(wire.session.session_id, {"chunk_len": 4})]
    finally:
        gw.close()


# ------------------------------------------------------------------ 2. seq policy stop

def test_policy_stop_is_an_emergency_stop_until_policy_start(shared_module_gateway):
    gw = shared_module_gateway
    name = unique("estop")
    assert gw.deploy(ECHO, name)["status"] == "ready"
    pid = gw.status(name)["pid"]
    with connect(gw, name) as robot:
        assert len(robot.predict(observation()).action_chunk) == 10
        r = seq_cli(gw, "policy", "stop", name)
        assert r.returncode == 0, r.stderr
        assert f"seq policy start {name}" in r.stdout
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists()                     # the worker ended now
        with pytest.raises(sequence_ai.Unavailable) as info:          # the connected robot gets no action
            robot.predict(observation())
        assert info.value.code == "deployment_stopped"
    for _ in range(2):                                                # every connect is refused, typed
        with pytest.raises(sequence_ai.Unavailable) as info:
            connect(gw, name)
        exc = info.value
        assert exc.code == "deployment_stopped" and exc.warming is False and exc.retryable is False
        assert "stopped" in str(exc) and f"seq policy start {name}" in exc.hint
    time.sleep(0.3)
    d = gw.status(name)
    assert d["status"] == "stopped" and d["pid"] is None and d["stopped_at"] > 0   # nothing restarted it
    r = seq_cli(gw, "policy", "status", name)
    assert f"connects are refused until `seq policy start {name}`" in r.stdout
    d = gw.deploy(ECHO, name, wait=False)                             # a redeploy does not lift the stop
    assert d["status"] == "stopped" and d["pid"] is None, d           # and starts no worker while stopped
    with pytest.raises(sequence_ai.Unavailable, match="was stopped"):
        connect(gw, name)
    r = seq_cli(gw, "policy", "start", name)
    assert r.returncode == 0, r.stderr
    with connect(gw, name) as robot:
        robot.wait_until_ready(timeout_s=60)
        assert len(robot.predict(observation()).action_chunk) == 10


# ------------------------------------------------------------------ 3. own inputs and outputs

def test_predict_on_a_policy_without_a_contract_returns_exactly_what_infer_returned(shared_module_gateway):
    gw = shared_module_gateway
    name = unique("toy")
    assert gw.deploy(TOY, name)["status"] == "ready"
    with connect(gw, name) as policy:
        assert policy.predict({"state": [0.0], "target": [0.5]}) == {"delta": [0.1]}
        assert policy.predict({"state": [0.45], "target": [0.5]}, params={"max_step": 0.2}) == {"delta": [pytest.approx(0.05)]}
        with pytest.raises(sequence_ai.SequencesError) as info:      # no chunk to drive a loop with
            policy.next_action({"state": [0.0], "target": [0.5]})
        assert info.value.code == "no_action_chunk" and "predict" in info.value.hint


# ------------------------------------------------------------------ 4. observation() forms

def test_observation_builds_without_a_model_and_checks_against_contract_before_sending(shared_module_gateway, echo):
    wide = np.full((720, 1280, 3), 90, np.uint8)
    obs = sequence_ai.observation(images={"front": wide}, joints=[0.1] * 3, gripper=[0.5],
                                  instruction="pick up the cup")       # no model: nothing to check against
    assert [f.view for f in obs.images] == ["front"] and obs.instruction == "pick up the cup"
    assert Image.open(io.BytesIO(obs.images[0].data)).size == (640, 360)   # long edge capped, aspect kept
    frame = np.full((128, 128, 3), 200, np.uint8)
    with connect(shared_module_gateway, echo) as policy:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            obs = sequence_ai.observation(images={"exterior_1": frame, "wrist_left": frame}, joints=[0.0] * 7,
                                          gripper=[0.25], instruction="pick", contract=policy.contract)
        assert [str(w.message) for w in caught if "wrist_left" in str(w.message)], [str(w.message) for w in caught]
        assert [f.view for f in obs.images] == ["exterior_1"]              # the undeclared camera is not sent
        assert Image.open(io.BytesIO(obs.images[0].data)).size == (64, 64)
        with warnings.catch_warnings():
            warnings.simplefilter("error")                                   # predict() finds nothing to warn about
            assert policy.predict(obs).action_chunk.actions[0][7] == pytest.approx(0.25)
        refused = {
            "missing view": dict(images={"wrist_left": frame}, joints=[0.0] * 7, gripper=[0.0]),
            "gripper has no": dict(images={"exterior_1": frame}, joints=[0.0] * 7),
            "joint_positions has 8": dict(images={"exterior_1": frame}, joints=[0.0] * 8, gripper=[0.0]),
            "NaN or infinity": dict(images={"exterior_1": frame}, joints=[0.0] * 6 + [float("nan")], gripper=[0.0]),
        }
        for match, kw in refused.items():
            with pytest.raises(sequence_ai.ContractMismatch, match=match):
                sequence_ai.observation(instruction="pick", contract=policy.contract, **kw)
        with pytest.raises(TypeError, match="not both"):
            sequence_ai.observation(policy, images={"exterior_1": frame}, joints=[0.0] * 7, gripper=[0.0],
                                    contract=policy.contract)


# ------------------------------------------------------------------ 6. seq init pi05-droid

def test_seq_init_pi05_droid_writes_the_policy_the_robots_client_and_a_readme(tmp_path):
    from typer.testing import CliRunner

    from seq.cli import app
    target = tmp_path / "my-pi05"
    r = CliRunner().invoke(app, ["init", "pi05-droid", str(target)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in target.iterdir()) == ["README.md", "client.py", "policy.py"]
    py_compile.compile(str(target / "client.py"), doraise=True)
    client = (target / "client.py").read_text()
    assert "sequence_ai.connect(" in client and "contract=policy.contract" in client and "policy.act(" in client
    readme = (target / "README.md").read_text()
    assert "client.py" in readme and "policy.py" in readme
    r = CliRunner().invoke(app, ["validate", str(target / "policy.py")], env={"COLUMNS": "300"})
    assert r.exit_code == 0 and "code        1 file(s)" in r.stdout       # only policy.py is deployed


# ------------------------------------------------------------------ 8. the progress line

def test_progress_on_a_terminal_is_a_single_line_rewritten_in_place(shared_module_gateway, echo):
    script = (
        "import sequence_ai, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from _core_support import observation\n"
        f"with sequence_ai.connect({echo!r}) as p:\n"
        "    p.run(observation, lambda row: None, max_actions=4, validate=lambda row: True)\n"
    )
    master, slave = os.openpty()
    env = _env({**shared_module_gateway.env(), "PYTHONWARNINGS": "ignore"})
    proc = subprocess.Popen([sys.executable, "-c", script, str(ROOT / "test")], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env=env, cwd=str(ROOT))
    os.close(slave)
    raw = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:           # EIO: the process closed its end and everything was read
                break
            if not chunk:
                break
            raw += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    assert proc.wait(timeout=30) == 0, raw.decode(errors="replace")
    text = raw.decode()
    assert text.count("\n") == 1 and text.endswith("\n"), repr(text)     # one line, ended once
    shown = [part.replace("\x1b[K", "").strip() for part in text.split("\r") if part.replace("\x1b[K", "").strip()]
    assert [s.split()[1] for s in shown] == ["starting", "running", "done:"], shown
    assert shown[-1].startswith("[sequences] done: RunOutcome(4 actions")


# ------------------------------------------------------------------ 9. the catalogue

def test_catalogue_rows_carry_the_per_model_fields_and_list_templates(shared_module_gateway, echo):
    rows = sequence_ai.models(shared_module_gateway.url)
    by_id = {m.short_id: m for m in rows}
    m = by_id[echo]
    assert (m.kind, m.template_kind, m.endpoint, m.status) == ("model", None, "act", "ready")
    assert m.camera_views == ["exterior_1"]
    assert m.state_dim == 8 and m.state_layout == {"joint_positions": 7, "gripper": 1}
    assert m.action_dim == 8 and m.action_space == "joint_absolute" and m.action_semantics == "joint_absolute"
    assert m.robot == "panda" and m.control_frequency_hz == 15.0
    assert m.client_resize == {"size": [64, 64], "filter": "bilinear"} and m.input_aspect_ratio == 1.0
    pi = by_id["pi05-droid"]
    assert (pi.kind, pi.template_kind, pi.endpoint) == ("template", "policy", None)
    assert pi.camera_views == ["exterior_1", "wrist_left"] and pi.state_dim == 8
    assert pi.action_space == "joint_velocity" and pi.control_frequency_hz == 15.0
    assert pi.client_resize["size"] == [224, 224] and pi.input_aspect_ratio == 1.0
    toy = by_id["toy-policy"]
    assert toy.kind == "template" and toy.camera_views is None and toy.action_dim is None   # its own I/O
    assert {"toy-policy", "pick-place", "pi05-droid"} <= {r.short_id for r in rows if r.kind == "template"}
    assert all(r.kind == "model" for r in sequence_ai.models(shared_module_gateway.url, kind="model"))
    assert echo in {r.short_id for r in sequence_ai.models(shared_module_gateway.url, endpoint="act")}
    assert all(r.endpoint == "act" for r in sequence_ai.models(shared_module_gateway.url, endpoint="act"))
    assert {r.short_id for r in sequence_ai.models(shared_module_gateway.url, kind="template")} >= {"pi05-droid"}
    with pytest.raises(ValueError, match="kind"):
        sequence_ai.models(shared_module_gateway.url, kind="robot")
    wire = httpx.get(shared_module_gateway.url + "/v1/models", params={"kind": "template"}).json()["models"]
    assert wire and all(r["kind"] == "template" for r in wire)
    r = subprocess.run([sys.executable, "-m", "sequence_ai", "models", "--gateway", shared_module_gateway.url],
                       capture_output=True, text=True, env=_env(), timeout=60, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr
    assert "seq init pi05-droid" in r.stdout and echo in r.stdout


# ------------------------------------------------------------------ 10. sync calls in callbacks

def test_every_sync_api_works_from_inside_run_callbacks(shared_module_gateway, echo):
    got: dict = {}

    def observe():
        if not got:
            got["models"] = [m.name for m in sequence_ai.models(shared_module_gateway.url)]
            got["account"] = sequence_ai.account(api_key=shared_module_gateway.api_key, gateway_url=shared_module_gateway.url)
            with connect(shared_module_gateway, echo) as other:      # another Policy, driven from this callback
                got["chunk"] = len(other.predict(observation()).action_chunk)
        return observation()

    def act(row):
        got.setdefault("act_models", len(sequence_ai.models(shared_module_gateway.url)))
        got.setdefault("spec", policy.spec())                  # the driving Policy's own catalogue row

    with connect(shared_module_gateway, echo) as policy:
        out = policy.run(observe, act, max_actions=3, validate=lambda row: True, progress=False)
    assert out.reason == "completed" and out.actions == 3
    assert echo in got["models"] and got["account"]["usage"]["policies"] >= 1
    assert got["chunk"] == 10 and got["act_models"] >= 1 and got["spec"].short_id == echo


# ------------------------------------------------------------------ 11. python -m

def test_python_dash_m_runs_both_command_lines(shared_module_gateway, echo):
    r = subprocess.run([sys.executable, "-m", "seq", "policy", "ls"], capture_output=True, text=True,
                       env=_env({**shared_module_gateway.env(), "COLUMNS": "250"}), timeout=60, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr
    assert echo in r.stdout
    r = subprocess.run([sys.executable, "-m", "sequence_ai", "version"], capture_output=True, text=True,
                       env=_env(), timeout=60, cwd=str(ROOT))
    assert r.returncode == 0 and r.stdout.strip() == f"sequence-ai {sequence_ai.__version__}", r.stderr


# ------------------------------------------------------------------ 15. account

def test_account_reports_usage_and_configured_limits_and_no_balance_self_hosted(shared_module_gateway, echo):
    gw = shared_module_gateway
    a = sequence_ai.account(api_key=gw.api_key, gateway_url=gw.url)
    deployed = len(httpx.get(gw.url + "/v1/deployments", headers={"Authorization": f"Bearer {gw.api_key}"})
                   .json()["deployments"])
    assert a["balance"] is None and a["self_hosted"] is True
    assert a["usage"]["policies"] == deployed >= 1 and a["usage"]["benchmarks"] == 1
    assert a["usage"]["evals_running"] == 0
    assert a["limits"]["lease_ttl_s"] == 300 and a["limits"]["max_gpus"] is None
    assert a["limits"]["max_body_bytes"] == 32 * 1024 * 1024
    with pytest.raises(sequence_ai.AuthError):
        sequence_ai.account(api_key="seq_wrong", gateway_url=gw.url)
    for cmd in ([sys.executable, "-c", SEQ_MAIN, "account"], [sys.executable, "-m", "sequence_ai", "account"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=_env({**gw.env(), "COLUMNS": "250"}),
                           timeout=60, cwd=str(ROOT))
        assert r.returncode == 0, r.stderr
        assert "balance     none: a self-hosted gateway meters nothing in money" in r.stdout
        assert f"policies    {deployed} deployed" in r.stdout and "benchmarks  1 available" in r.stdout
        assert "workers no cap (SEQ_MAX_GPUS), lease 300 s, request body 32 MiB" in r.stdout
