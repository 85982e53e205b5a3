"""The gateway: keys, deployments, connect and worker supervision, plus the seq CLI against it.
Real processes on loopback: a gateway subprocess that spawns real worker subprocesses. ``gateway``
here is the session's gateway (conftest.py's ``shared_gateway``: it removes what a test deployed
when the test ends), so each test uses deployment names no other test of the file uses; the
gateway's own start and shutdown are proved on a gateway of their own."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from _servers import ECHO_POLICY, POLICIES, ROOT, GatewayProcess, _env, echo_observation, seq_cli


@pytest.fixture
def gateway(shared_gateway):
    return shared_gateway


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by the gateway) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _slow_copy(tmp_path: Path, load_s: float) -> str:
    path = tmp_path / "slow_echo_policy.py"
    path.write_text(f"import os\nos.environ['ECHO_LOAD_S'] = '{load_s}'\n" + Path(ECHO_POLICY).read_text())
    return str(path)


def test_first_start_creates_a_key_file_readable_only_by_its_owner(gateway):
    key_file = gateway.data_dir / "api_key"
    assert gateway.api_key.startswith("seq_local_") and len(gateway.api_key) > 30
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert (gateway.data_dir / "state.db").exists()
    assert gateway.api_key not in (gateway.data_dir / "state.db").read_bytes().decode(errors="replace")


def test_requests_without_a_valid_key_are_401(gateway):
    for headers in ({}, {"Authorization": "Bearer seq_local_wrong"}):
        r = httpx.post(gateway.url + "/v1/connect", json={"model": "x"}, headers=headers)
        assert r.status_code == 401
        body = r.json()
        assert body["code"] == "unauthorized" and "api_key" in body["hint"]
    assert httpx.get(gateway.url + "/v1/deployments").status_code == 401
    assert httpx.get(gateway.url + "/v1/models").status_code == 200   # the catalogue needs no key


def test_deploy_then_connect_then_act_directly_on_the_worker(gateway):
    d = gateway.deploy(ECHO_POLICY, "echo")
    assert d["status"] == "ready", d
    assert d["version"] == 1 and d["worker_url"].startswith("http://127.0.0.1:") and d["load_s"] > 0
    assert d["contract"]["action"]["action_dim"] == 8
    c = gateway.connect_ready("echo", params={"chunk_len": "5"})
    assert c["worker_url"] == d["worker_url"] and c["params"] == {"chunk_len": 5}
    assert c["session_id"].startswith("sess_") and len(c["direct_secret"]) >= 32
    assert c["lease"]["ttl_s"] == 300 and c["lease"]["expires_at"] > time.time() and c["lease"]["epoch"] == 1
    assert c["contract"]["observation"]["cameras"] == {"exterior_1": {"width": 64, "height": 64, "depth": False}}
    r = httpx.post(c["worker_url"] + "/act", json={"observation": echo_observation(), "params": c["params"]},
                   headers={"Authorization": f"Bearer {c['direct_secret']}"})
    assert r.status_code == 200 and len(r.json()["action_chunk"]["actions"]) == 5
    r = httpx.post(c["worker_url"] + "/act", json={"observation": echo_observation()},
                   headers={"Authorization": f"Bearer {gateway.api_key}"})
    assert r.status_code == 401   # the API key is not the direct secret
    models = httpx.get(gateway.url + "/v1/models", params={"kind": "model"}).json()["models"]
    assert [(m["name"], m["status"]) for m in models] == [("echo", "ready")]
    assert {p["name"] for p in models[0]["params"]} == {"chunk_len", "latency_ms", "fail", "horizon"}


def test_connect_to_an_unknown_model_is_404(gateway):
    r = gateway.connect("nope")
    assert r.status_code == 404 and r.json()["code"] == "not_found" and "'nope'" in r.json()["detail"]


def test_connect_with_an_unknown_param_is_400_naming_the_declared_ones(gateway):
    gateway.deploy(ECHO_POLICY, "echo-params")
    r = gateway.connect("echo-params", params={"replan_steps": 3})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    assert "replan_steps" in r.json()["detail"] and "chunk_len" in r.json()["detail"]


def test_a_form_encoded_body_is_400_naming_the_content_type_and_the_json_header(gateway):
    # what `curl -d '{"model":"pick-place"}'` sends: JSON text as application/x-www-form-urlencoded
    form = gateway.client.post("/v1/connect", content=b'{"model":"pick-place"}',
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
    body = form.json()
    assert form.status_code == 400 and body["code"] == "invalid_request", body
    assert body["detail"].startswith("request body does not match the schema: ")
    assert "Content-Type is 'application/x-www-form-urlencoded', not application/json" in body["detail"]
    assert '-H "Content-Type: application/json"' in body["hint"]
    # a JSON body with a schema error says nothing about the content type
    wrong = gateway.client.post("/v1/connect", json={"modle": "pick-place"})
    assert wrong.status_code == 400 and "Content-Type" not in wrong.json()["detail"] + wrong.json()["hint"]
    # and the same bytes sent as JSON are read (an unknown model, not a schema error)
    sent = gateway.client.post("/v1/connect", content=b'{"model":"pick-place"}',
                               headers={"Content-Type": "application/json"})
    assert sent.status_code == 404 and sent.json()["code"] == "not_found"


def test_cold_start_answers_503_warming_with_retry_after_then_ready(gateway, tmp_path):
    gateway.deploy(_slow_copy(tmp_path, 1.0), "slow", wait=False)
    r = gateway.connect("slow")
    assert r.status_code == 503
    body = r.json()
    assert body["code"] == "warming" and body["retryable"] is True
    assert 1 <= body["retry_after_s"] <= 30 and int(r.headers["retry-after"]) >= 1
    c = gateway.connect_ready("slow", timeout=30)
    assert c["worker_url"]
    d = gateway.status("slow")
    assert d["status"] == "ready" and d["load_s"] >= 1.0
    # the next cold start estimates from the measured load time, not the 30 s default
    gateway.stop("slow")
    assert gateway.client.post("/v1/deployments/slow/start").json()["status"] == "starting"
    r = gateway.connect("slow")
    assert r.status_code == 503 and r.json()["retry_after_s"] <= d["load_s"] + 0.5


def test_a_deploy_whose_load_fails_is_failed_with_the_reason(gateway):
    d = gateway.deploy(str(POLICIES / "broken_load_policy.py"), "broken")
    assert d["status"] == "failed"
    assert "while loading" in d["error"] and "FileNotFoundError: checkpoint missing" in d["error"]
    assert d["details"]["exception_type"] == "FileNotFoundError"
    r = gateway.connect("broken")
    assert r.status_code == 503
    assert r.json()["code"] == "worker_failed" and r.json()["retryable"] is False
    assert "checkpoint missing" in r.json()["detail"]


def test_a_malformed_declaration_is_failed_with_the_declaration_error(gateway):
    d = gateway.deploy(str(POLICIES / "bad_declaration_policy.py"), "baddecl")
    assert d["status"] == "failed" and "while importing" in d["error"]
    assert "DeclarationError: ActionContract.action_dim: 0 is out of range" in d["error"]


def test_deploy_refuses_a_missing_file_and_a_bad_name(gateway):
    r = gateway.client.post("/v1/deployments", json={"name": "x", "file": "/no/such/policy.py"})
    assert r.status_code == 400 and "not found" in r.json()["detail"]
    r = gateway.client.post("/v1/deployments", json={"name": "Bad Name", "file": ECHO_POLICY})
    assert r.status_code == 400 and "name" in r.json()["detail"]
    r = gateway.client.post("/v1/deployments", json={"file": ECHO_POLICY})
    assert r.status_code == 400 and "name" in r.json()["detail"]


def test_a_killed_worker_is_reported_and_the_next_connect_restarts_it(gateway):
    d = gateway.deploy(ECHO_POLICY, "echo-killed")
    os.kill(d["pid"], signal.SIGKILL)
    d2 = gateway.wait_until("echo-killed", ("failed",), timeout=10)
    assert "killed by signal SIGKILL" in d2["error"] and d2["worker_url"] is None
    r = gateway.connect("echo-killed")
    assert r.status_code == 503 and r.json()["code"] == "warming"
    c = gateway.connect_ready("echo-killed")
    assert c["lease"]["epoch"] == 2 and c["direct_secret"] != d.get("direct_secret")
    assert gateway.status("echo-killed")["status"] == "ready"


def test_delete_stops_the_worker_and_connects_are_refused_until_start(gateway):
    d = gateway.deploy(ECHO_POLICY, "echo-deleted")
    s = gateway.stop("echo-deleted")
    assert s["status"] == "stopped" and not _pid_alive(d["pid"])
    r = gateway.connect("echo-deleted")
    assert r.status_code == 503 and r.json()["code"] == "deployment_stopped" and r.json()["retryable"] is False
    assert gateway.status("echo-deleted")["pid"] is None                     # the refused connect started nothing
    assert gateway.client.post("/v1/deployments/echo-deleted/start").status_code == 200
    assert gateway.connect_ready("echo-deleted")["worker_url"]


def test_redeploying_a_changed_file_bumps_the_version(gateway, tmp_path):
    f = tmp_path / "echo_copy.py"
    f.write_text(Path(ECHO_POLICY).read_text())
    assert gateway.deploy(str(f), "copy")["version"] == 1
    assert gateway.deploy(str(f), "copy")["version"] == 1
    f.write_text(Path(ECHO_POLICY).read_text() + "\n# changed\n")
    d = gateway.deploy(str(f), "copy")
    assert d["version"] == 2 and d["status"] == "ready"


def test_gateway_shutdown_terminates_its_workers(tmp_path):
    gw = GatewayProcess.start(tmp_path)
    try:
        pid = gw.deploy(ECHO_POLICY, "echo")["pid"]
        assert _pid_alive(pid)
    finally:
        assert gw.close() == 0
    deadline = time.monotonic() + 5
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(pid)
    assert "calling @seq.shutdown" in (gw.data_dir / "logs" / "echo.log").read_text()


# ---------------------------------------------------------------- the seq CLI

def test_cli_deploy_waits_and_prints_the_phase_and_load_time(gateway):
    r = seq_cli(gateway, "deploy", ECHO_POLICY, "--name", "echo-cli")
    assert r.returncode == 0, r.stderr
    assert "spawning" in r.stdout and "ready: echo-cli v1 at http://127.0.0.1:" in r.stdout and "(load " in r.stdout
    r = seq_cli(gateway, "policy", "ls")
    assert r.returncode == 0 and "echo-cli" in r.stdout and "ready" in r.stdout
    r = seq_cli(gateway, "policy", "status", "echo-cli")
    assert r.returncode == 0 and "panda joint_absolute x8 @ 15 Hz" in r.stdout and "chunk_len: int = 10" in r.stdout
    r = seq_cli(gateway, "policy", "stop", "echo-cli")
    assert r.returncode == 0 and "stopped echo-cli" in r.stdout
    assert gateway.status("echo-cli")["status"] == "stopped"


def test_seq_init_names_the_deployment_and_its_client_connects_to_what_the_next_line_deploys(gateway, tmp_path):
    def seq_(*args):
        return seq_cli(gateway, *args, cwd=tmp_path)

    r = seq_("init", "toy-policy", "my_policy")                   # the README's own line
    assert r.returncode == 0, r.stderr
    next_line = r.stdout.splitlines()[-1]
    assert next_line == ("next: seq validate my_policy/policy.py   "
                         "then: seq deploy my_policy/policy.py --name my-policy"), r.stdout
    client = (tmp_path / "my_policy" / "client.py").read_text()
    assert 'sequence_ai.connect("my-policy")' in client and '"toy-policy"' not in client
    r = seq_(*next_line.split("then: seq ", 1)[1].split())         # run the "then:" command as printed
    assert r.returncode == 0 and "ready: my-policy v1" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "client.py"], capture_output=True, text=True, env=_env(gateway.env()),
                       timeout=60, cwd=str(tmp_path / "my_policy"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "x = 0.500", r.stdout   # toy-policy's steps reach the target
    # the shipped template itself is unchanged
    assert 'connect("toy-policy")' in (ROOT / "seq" / "templates" / "toy-policy" / "client.py").read_text()


def test_cli_deploy_of_a_broken_policy_exits_non_zero_with_its_error(gateway):
    r = seq_cli(gateway, "deploy", str(POLICIES / "broken_load_policy.py"))
    assert r.returncode == 6
    assert "error[worker_failed]:" in r.stderr and "checkpoint missing" in r.stderr and "hint:" in r.stderr
    assert gateway.status("broken-load-policy")["status"] == "failed"


_NEEDS_MODULE = """import sys

import seq

sys.modules[{module!r}] = None      # absent in the worker's Python, whatever this venv holds


@seq.policy(action=seq.ActionContract(robot="panda", action_space="joint_absolute", action_dim=8,
                                      control_frequency_hz=15.0){image})
class NeedsModule(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        import {module}  # noqa: F401

    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        return seq.ActionChunk([[0.0] * 8])
"""


def test_cli_deploy_of_a_policy_missing_a_module_says_what_to_install_where(gateway, tmp_path):
    """A load that raised ModuleNotFoundError: the hint names the module and installs it into the
    Python the worker runs in (the gateway's here: its interpreter, our extra for torch, the module
    itself otherwise), not "fix the policy"."""
    def deploy(module: str, name: str) -> str:
        file = tmp_path / f"{name}.py"
        file.write_text(_NEEDS_MODULE.format(module=module, image=""))
        r = seq_cli(gateway, "deploy", str(file), "--name", name)
        assert r.returncode == 6, r.stdout + r.stderr
        assert "error[worker_failed]: worker failed while loading: ModuleNotFoundError" in r.stderr, r.stderr
        assert "fix the policy" not in r.stderr, r.stderr
        return " ".join(r.stderr.split())    # rich wraps the hint
    text = deploy("torch", "needs-torch")
    hint = text[text.index("hint:"):]
    assert "which has no torch" in hint and "-m pip install 'sequence-ai[train]'" in hint, text
    python = gateway.status("needs-torch")["details"]["python"]
    assert Path(python).name.startswith("python"), python         # the worker's interpreter
    squeezed = hint.replace(" ", "")
    assert f"({python})" in squeezed and f"`{python}-mpipinstall'sequence-ai[train]'`" in squeezed, text
    text = deploy("no_such_module_here.sub", "needs-other")
    hint = text[text.index("hint:"):]
    assert "which has no no_such_module_here" in hint and "-m pip install no_such_module_here`" in hint, text
    assert gateway.status("needs-other")["details"]["missing_module"] == "no_such_module_here.sub"


def test_missing_module_hint_for_an_image_environment_and_an_older_gateway():
    from seq.cli.deploy import missing_module_hint

    hint = missing_module_hint({"missing_module": "cv2", "python": "/env/bin/python", "image": True})
    assert "image environment has no cv2" in hint and 'pip_install("cv2")' in hint
    old = missing_module_hint({}, "worker failed while loading: ModuleNotFoundError: No module named 'torch'")
    assert "`python -m pip install 'sequence-ai[train]'`" in old
    assert missing_module_hint({"missing_module": "rclpy"}) is None          # ROS 2, not pip
    assert missing_module_hint({"missing_module": "sequence_ai_server.x"}) is None   # a broken install
    assert missing_module_hint({}, "worker failed while loading: FileNotFoundError: x") is None


def test_cli_errors_print_code_and_hint(gateway):
    r = seq_cli(gateway, "policy", "status", "nope")
    assert r.returncode == 4 and "error[not_found]: no deployment named 'nope'" in r.stderr and "hint:" in r.stderr
    r = seq_cli(gateway, "policy", "ls", env={"SEQUENCES_API_KEY": "seq_local_wrong"})
    assert r.returncode == 3 and "error[unauthorized]" in r.stderr
    r = seq_cli(gateway, "policy", "ls", "--gateway", "http://127.0.0.1:9")
    assert r.returncode == 6 and "error[unreachable]" in r.stderr and "seq serve" in r.stderr
