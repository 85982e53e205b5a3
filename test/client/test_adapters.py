"""Adapters: ``@seq.adapter`` declarations with labelled steps, registration as versions on the
real gateway (``seq deploy adapter.py``), ``seq adapter ls | show | pull | check``, and
``seq eval run --adapter`` end to end on the real MuJoCo ``pick-place`` benchmark: a policy
that reads one camera named ``scene`` and one 8-wide ``state`` vector
(``examples/pick_place_adapter``), refused without the adapter, scored through it; and the
shipped ``toy-adapter`` template (``policy_io="own"``) driving ``toy-policy``.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

import seq
from _servers import ROOT, _env, seq_cli

FUSED_POLICY = ROOT / "examples" / "pick_place_adapter" / "policy.py"
FUSED_ADAPTER = ROOT / "examples" / "pick_place_adapter" / "adapter.py"


def seq_process(gw, *args, timeout=400):
    """``seq ARGS`` as its own process (the eval spawns env processes)."""
    return subprocess.run([sys.executable, "-m", "seq.cli", *map(str, args)], env=_env(gw.env()),
                          capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))


# --------------------------------------------------------------------------- declarations

def test_every_adapter_step_must_say_whether_it_loses_information():
    with pytest.raises(seq.DeclarationError, match=r"does not say whether it loses information"):
        @seq.adapter(name="bad")
        class Bad(seq.Adapter):
            @seq.observation_step
            def obs(self, o):
                return o
    with pytest.raises(seq.DeclarationError, match=r"lossy= needs the reason"):
        seq.observation_step(lossy="  ")(lambda self, o: o)
    with pytest.raises(seq.DeclarationError, match=r"no method is marked @seq.action_step"):
        @seq.adapter(name="half")
        class Half(seq.Adapter):
            @seq.observation_step(lossless=True)
            def obs(self, o):
                return o
    with pytest.raises(seq.DeclarationError, match=r"unknown value 'mine'"):
        seq.adapter(name="x", policy_io="mine")


def test_lossy_steps_are_listed_with_their_reasons_in_written_order():
    @seq.adapter(name="two-steps", policy_io="own")
    class Two(seq.Adapter):
        """Two steps."""

        def __init__(self, *, scale: float = 2.0):
            self.scale = scale

        @seq.action_step(lossy="rows past the eighth are cut")
        def cut(self, rows):
            return rows[:8]

        @seq.observation_step(lossless=True)
        def first(self, o):
            return o

        @seq.observation_step(lossy="images are dropped")
        def second(self, o):
            return {"x": o["x"] * self.scale}

    spec = seq.get_adapter_spec(Two)
    assert spec.policy_io == "own" and [(p.name, p.default) for p in spec.params] == [("scale", 2.0)]
    assert [(s.kind, s.method, s.lossy) for s in spec.steps] == [
        ("observation", "first", False), ("observation", "second", True), ("action", "cut", True)]
    assert spec.lossy == [{"kind": "observation", "method": "second", "reason": "images are dropped"},
                          {"kind": "action", "method": "cut", "reason": "rows past the eighth are cut"}]
    from seq._adapter import AdapterRuntime
    rt = AdapterRuntime(Two, {"scale": 3.0})
    assert rt.to_policy({"x": 2}) == {"x": 6}
    assert rt.to_benchmark([[i] for i in range(10)]) == [[float(i)] for i in range(8)]


# --------------------------------------------------------------------------- the registry

@pytest.fixture(scope="module")
def gw(shared_module_gateway):
    shared_module_gateway.deploy(str(FUSED_POLICY), name="fused", wait=True)
    return shared_module_gateway


def test_seq_deploy_registers_an_adapter_and_the_same_file_stays_its_version(gw, tmp_path):
    src = tmp_path / "adapter.py"
    shutil.copyfile(FUSED_ADAPTER, src)
    out = seq_cli(gw, "deploy", src)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "registered pick-place-fused@v1" in out.stdout and "nothing builds" in out.stdout
    assert "lossy      yes: 1 step(s)" in out.stdout
    out = seq_cli(gw, "deploy", src)
    assert out.returncode == 0 and "is unchanged since it was registered, so it stays pick-place-fused@v1" in out.stdout
    # no worker, no deployment: an adapter has no machine
    names = [d["name"] for d in gw.client.get("/v1/deployments").json()["deployments"]]
    assert "pick-place-fused" not in names and "adapter" not in names
    src.write_text(src.read_text() + "\n# a comment makes it another file\n")
    out = seq_cli(gw, "deploy", src)
    assert "registered pick-place-fused@v2" in out.stdout, out.stdout + out.stderr

    out = seq_cli(gw, "adapter", "ls")
    assert re.search(r"pick-place-fused\s+v2\s+2\s+contract\s+yes", out.stdout), out.stdout
    out = seq_cli(gw, "adapter", "show", "pick-place-fused@v1")
    assert out.returncode == 0, out.stderr
    assert "lossy      yes" in out.stdout
    assert "- observation step one_camera: the wrist camera (wrist_left) is dropped: the policy reads one view" in out.stdout
    assert re.search(r"observation\s+fused_state\s+lossless", out.stdout)
    assert "params     adapter.view='exterior_1'" in out.stdout

    pulled = tmp_path / "pulled.py"
    out = seq_cli(gw, "adapter", "pull", "pick-place-fused@v1", "--out", pulled)
    assert out.returncode == 0, out.stderr
    assert pulled.read_bytes() == FUSED_ADAPTER.read_bytes()
    out = seq_cli(gw, "adapter", "pull", "pick-place-fused@v1", "--out", pulled)
    assert out.returncode == 5 and "exists" in out.stderr and pulled.read_bytes() == FUSED_ADAPTER.read_bytes()
    assert seq.adapter_source("pick-place-fused", 2, gateway_url=gw.url, api_key=gw.api_key) == src.read_text()
    with pytest.raises(LookupError, match="has no v9"):
        seq.adapter_source("pick-place-fused", 9, gateway_url=gw.url, api_key=gw.api_key)
    out = seq_cli(gw, "adapter", "show", "no-such-adapter")
    assert out.returncode == 4 and "no adapter named 'no-such-adapter'" in out.stderr


def test_registering_an_adapter_needs_an_account_key(gw):
    import httpx
    body = {"name": "x", "class_name": "X", "filename": "x.py", "source": "", "spec": {}}
    r = httpx.post(f"{gw.url}/v1/adapters", json=body)
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    robot = gw.client.post("/v1/keys", json={"name": "robot-adapters", "deployment": "fused"}).json()["key"]
    r = httpx.get(f"{gw.url}/v1/adapters", headers={"Authorization": f"Bearer {robot}"})
    assert r.status_code == 401
    r = gw.client.post("/v1/adapters", json={**body, "filename": "../evil.py"})
    assert r.status_code == 400 and "not a plain .py file name" in r.json()["detail"]


def test_adapter_check_classifies_steps_and_runs_a_sample_of_each_side(gw, tmp_path):
    out = seq_cli(gw, "adapter", "check", FUSED_ADAPTER)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"observation\s+one_camera\s+lossy: the wrist camera", out.stdout)
    assert "sample     not run" in out.stdout
    out = seq_cli(gw, "adapter", "check", FUSED_ADAPTER, "--benchmark", "pick-place", "--policy", "fused")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sample     fits" in out.stdout
    # an adapter that forgets to fuse the state: named, exit 5, nothing sent anywhere
    broken = tmp_path / "broken.py"
    broken.write_text(FUSED_ADAPTER.read_text().replace('"proprio": {"state": state}', '"proprio": {"state": state[:7]}'))
    out = seq_cli(gw, "adapter", "check", broken, "--benchmark", "pick-place", "--policy", "fused")
    assert out.returncode == 5, out.stdout + out.stderr
    assert "misfit     proprio 'state': the policy wants 8 values, the adapter gives 7" in out.stdout


# --------------------------------------------------------------------------- evals

def test_an_eval_of_a_mismatched_pair_without_an_adapter_is_refused_up_front(gw):
    out = seq_cli(gw, "eval", "run", "fused", "--benchmark", "pick-place", "--dry-run")
    assert out.returncode == 5, out.stdout + out.stderr
    assert "error[contract_mismatch]" in out.stderr
    assert "camera 'scene': the policy reads it, pick-place renders only ['exterior_1', 'wrist_left']" in out.stderr
    assert "proprio 'state': the policy reads it" in out.stderr
    assert "--adapter" in out.stderr


def test_an_adapter_that_does_not_fit_is_refused_before_any_episode(gw, tmp_path):
    broken = tmp_path / "adapter.py"
    broken.write_text(FUSED_ADAPTER.read_text().replace('{"scene": images[self.view]}', '{"front": images[self.view]}')
                      .replace('name="pick-place-fused"', 'name="pick-place-front"'))
    out = seq_cli(gw, "eval", "run", "fused", "--benchmark", "pick-place", "--adapter", f"{broken}:PickPlaceFused",
                   "--dry-run")
    assert out.returncode == 5, out.stdout + out.stderr
    assert "through pick-place-front@v1" in out.stderr
    assert "camera 'scene': the policy reads it, the adapter gives only ['front']" in out.stderr


def test_seq_eval_run_with_an_adapter_scores_the_policy_end_to_end(gw):
    seq_cli(gw, "deploy", FUSED_ADAPTER)
    out = seq_process(gw, "eval", "run", "fused", "--benchmark", "pick-place", "--adapter", "pick-place-fused@v1",
                  "--tasks", "red-on-green", "--episodes", "1", "--envs", "1", "--param", "light_jitter=0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "adapter    pick-place-fused@v1 (contract), lossy: 1 step(s)" in out.stdout
    assert "adapter pick-place-fused@v1: lossy (1 step(s))" in out.stdout
    m = re.search(r"^eval\s+(ev-\S+)", out.stdout, re.M)
    report = json.loads(seq_cli(gw, "eval", "report", m.group(1), "--json").stdout)
    assert report["adapter"] == {"name": "pick-place-fused", "version": 1, "policy_io": "contract"}
    assert report["adapter_lossy"] == [{"kind": "observation", "method": "one_camera",
                                        "reason": "the wrist camera (wrist_left) is dropped: the policy reads one view"}]
    arm = report["arms"][0]
    assert arm["errors"] == 0 and arm["episodes"] == 1 and arm["requests"] >= 2
    assert arm["params"]["adapter"] == {"view": "exterior_1"}
    # the demo controller, fed through the adapter, places the cube
    assert arm["metrics"]["success"]["overall"] == 1.0, report
    assert arm["metrics"]["final_distance_m"]["overall"] < 0.03


def test_the_toy_adapter_template_drives_toy_policy_with_its_own_inputs(gw, tmp_path):
    out = seq_cli(gw, "init", "toy-adapter", tmp_path / "toy-adapter")
    assert out.returncode == 0 and "adapter.py" in out.stdout, out.stdout + out.stderr
    assert seq_cli(gw, "init", "toy-policy", tmp_path / "toy-policy").returncode == 0
    d = gw.deploy(str(tmp_path / "toy-policy" / "policy.py"), name="toy-policy", wait=True)
    assert d["status"] == "ready", d
    out = seq_process(gw, "eval", "run", "toy-policy", "--benchmark", "pick-place", "--adapter",
                  tmp_path / "toy-adapter" / "adapter.py", "--tasks", "1", "--envs", "1",
                  "--param", "benchmark.max_seconds=1", "--param", "adapter.target=0.3",
                  "--param", "policy.max_step=0.05")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "adapter    toy-adapter@v1 (own), lossy: 1 step(s)" in out.stdout
    assert "lossy    observation step to_toy_inputs: the policy sees joint 1 only" in out.stdout
    m = re.search(r"^eval\s+(ev-\S+)", out.stdout, re.M)
    report = json.loads(seq_cli(gw, "eval", "report", m.group(1), "--json").stdout)
    arm = report["arms"][0]
    assert arm["errors"] == 0 and arm["params"]["adapter"] == {"target": 0.3}
    # the adapter turns each answer into one row: one request per 1/15 s step, for >= 1 s of sim time
    episode_s = arm["metrics"]["episode_s"]["overall"]
    assert 1.0 - 1e-6 <= episode_s <= 1.0 + 2 / 15
    assert arm["requests"] == round(episode_s * 15) >= 15
