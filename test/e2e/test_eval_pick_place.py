"""`seq eval` end to end: real gateway, real workers, real MuJoCo envs driven through the client.

The demo policy is scored on the shipped ``pick-place`` benchmark (3 tasks x 1 episode, 2 envs);
a policy that never moves shows a missed gate; the test policy with 64x64 frames shows the
contract check. One module-scoped gateway and one demo eval serve every test.
"""
from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import time

import pytest

from _servers import ECHO_POLICY, ROOT, _env, seq_cli

DEMO = str(ROOT / "examples" / "pick_place" / "policy.py")

STILL_POLICY = '''
import numpy as np
import seq

@seq.policy(
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=8, control_frequency_hz=15.0),
    observation=seq.ObservationContract(cameras={"exterior_1": seq.Camera(224, 224),
                                                 "wrist_left": seq.Camera(224, 224)},
                                        proprio={"joint_positions": 7, "gripper": 1}),
)
class Still(seq.Policy):
    """Holds the arm where it is, gripper open: never succeeds."""
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        row = list(obs.joint_positions) + [0.0]
        return seq.ActionChunk(actions=np.array([row] * 8), open_loop_horizon=8)
'''


def seq_process(gw, *args, timeout=300):
    """``seq ARGS`` as its own process (what a user runs)."""
    return subprocess.run([sys.executable, "-m", "seq.cli", *args], env=_env(gw.env()), capture_output=True,
                          text=True, timeout=timeout, cwd=str(ROOT))


def eval_id_of(stdout: str) -> str:
    m = re.search(r"^eval\s+(ev-\S+)", stdout, re.M)
    assert m, stdout
    return m.group(1)


@pytest.fixture(scope="module")
def gw(shared_module_gateway, tmp_path_factory):
    still = tmp_path_factory.mktemp("policies") / "still_policy.py"
    still.write_text(STILL_POLICY)
    names = {"pick-place": DEMO, "still": str(still), "echo": ECHO_POLICY}
    for name, file in names.items():
        shared_module_gateway.deploy(file, name=name, wait=False)
    for name in names:
        d = shared_module_gateway.wait_until(name, timeout=180)
        assert d["status"] == "ready", d
    return shared_module_gateway


@pytest.fixture(scope="module")
def demo_eval(gw):
    out = seq_process(gw, "eval", "run", "pick-place", "--benchmark", "pick-place", "--envs", "2", "--episodes", "1",
                  "--tasks", "3", "--gate", "success>=0.9", "--videos")
    return out, eval_id_of(out.stdout)


def test_eval_run_of_the_demo_policy_prints_a_report_and_passes_its_gate(demo_eval):
    out, eval_id = demo_eval
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "tasks      3 of 6: red-on-green, red-on-blue, green-on-red" in text
    assert re.search(r"^  all\s+3\s+1\.000\s+0\.0[0-2]\d", text, re.M), text   # success 1.0, final distance < 3 cm
    for task in ("red-on-green", "red-on-blue", "green-on-red"):
        assert re.search(rf"^  {task}\s+1\s+1\.000", text, re.M), text
    assert "policy.open_loop_horizon=8 (default)" in text and "benchmark.max_seconds=30.0 (default)" in text
    assert "benchmark.light_jitter=1.0 (default)" in text          # scored under randomised light
    assert "gate success>=0.9 on pick-place: 1.000 PASS" in text
    gifs = re.findall(r"^\s+(\S+\.gif)$", text, re.M)
    assert len(gifs) == 3
    from PIL import Image
    for path in gifs:
        with Image.open(path) as im:
            assert im.size == (224, 224) and im.n_frames > 10


def test_episodes_step_one_control_period_of_sim_time_per_row_through_the_worker(gw, demo_eval):
    _, eval_id = demo_eval
    episodes = [json.loads(line) for line in (gw.data_dir / "evals" / eval_id / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 3 and all(e["error"] is None for e in episodes)
    for e in episodes:
        assert e["requests"] >= 5                                  # one /act per 8 steps
        # each row holds 1/15 s (the sim rounds it to 33 physics steps of 2 ms)
        assert e["metrics"]["episode_s"] == pytest.approx(e["steps"] * 0.066, abs=1e-6)
        assert e["infer_ms"] is not None and e["infer_ms"] > 0     # timed by the worker


def test_report_csv_has_overall_and_per_task_rows(gw, demo_eval):
    _, eval_id = demo_eval
    out = seq_cli(gw, "eval", "report", eval_id, "--csv", "-")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["task"] for r in rows] == ["all", "red-on-green", "red-on-blue", "green-on-red"]
    assert rows[0]["episodes"] == "3" and float(rows[0]["success"]) == 1.0
    assert all(r["episodes"] == "1" and float(r["final_distance_m"]) < 0.03 for r in rows[1:])
    assert {r["eval"] for r in rows} == {eval_id} and {r["arm"] for r in rows} == {"pick-place"}


def test_status_and_ls_show_the_finished_eval(gw, demo_eval):
    _, eval_id = demo_eval
    status = seq_cli(gw, "eval", "status", eval_id)
    assert status.returncode == 0 and f"{eval_id}  done  3/3 episodes" in status.stdout, status.stdout
    assert "success>=0.9 PASS" in status.stdout
    ls = seq_cli(gw, "eval", "ls", "pick-place")
    assert eval_id in ls.stdout and "done" in ls.stdout
    assert eval_id not in seq_cli(gw, "eval", "ls", "still").stdout
    missing = seq_cli(gw, "eval", "report", "ev-nope")
    assert missing.returncode == 4 and "error[not_found]" in missing.stderr


def test_a_missed_gate_exits_8_and_compare_runs_the_same_episodes(gw):
    out = seq_process(gw, "eval", "run", "still", "--benchmark", "pick-place", "--compare", "pick-place",
                  "--tasks", "blue-on-red", "--param", "max_seconds=2", "--gate", "success>=0.9")
    assert out.returncode == 8, out.stdout + out.stderr
    assert "error[gate_failed]" in out.stderr and "still: success>=0.9 not met (0.000)" in out.stderr
    assert "gate success>=0.9 on still: 0.000 FAIL" in out.stdout
    assert "arm pick-place (policy pick-place v1)" in out.stdout      # the compare arm is reported, not gated
    assert "on pick-place" not in out.stdout.split("gate success")[-1]
    assert "benchmark.max_seconds=2.0" in out.stdout and "benchmark.max_seconds=2.0 (default)" not in out.stdout
    episodes = [json.loads(x) for x in (gw.data_dir / "evals" / eval_id_of(out.stdout) / "episodes.jsonl")
                .read_text().splitlines()]
    assert sorted((e["arm"], e["task"], e["seed"]) for e in episodes) == [
        ("pick-place", "blue-on-red", 0), ("still", "blue-on-red", 0)]
    assert all(e["metrics"]["episode_s"] == pytest.approx(2.0, abs=0.07) for e in episodes)


def test_an_eval_whose_every_episode_errored_exits_non_zero_naming_the_error(gw):
    out = seq_process(gw, "eval", "run", "still", "--benchmark", "pick-place", "--tasks", "1", "--envs", "1",
                  "--param", "light_jitter=2", "--param", "max_seconds=1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "error[failed]" in out.stderr and "every episode of still errored (1)" in out.stderr, out.stderr
    assert "light_jitter must be in [0, 1]" in out.stderr


def test_dry_run_prints_the_layout_and_an_estimate_and_starts_nothing(gw):
    before = set((gw.data_dir / "evals").iterdir()) if (gw.data_dir / "evals").exists() else set()
    out = seq_cli(gw, "eval", "run", "pick-place", "--benchmark", "pick-place", "--envs", "2", "--episodes", "2",
                  "--tasks", "3", "--sweep", "open_loop_horizon=4,8", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("dry run: nothing started")
    assert "pick-place[open_loop_horizon=4] (policy pick-place v1): policy.open_loop_horizon=4," in out.stdout
    assert "pick-place[open_loop_horizon=8]" in out.stdout
    assert "12 episodes over 2 env process(es)" in out.stdout
    assert re.search(r"estimate   ~\d+ s wall-clock", out.stdout)
    after = set((gw.data_dir / "evals").iterdir()) if (gw.data_dir / "evals").exists() else set()
    assert after == before


def test_a_contract_mismatch_is_refused_up_front_with_the_reason(gw):
    out = seq_cli(gw, "eval", "run", "echo", "--benchmark", "pick-place", "--dry-run")
    assert out.returncode == 5, out.stdout + out.stderr
    assert "error[contract_mismatch]" in out.stderr
    assert "camera 'exterior_1': the policy wants 64x64, pick-place renders 224x224" in out.stderr
    assert "adapter" in out.stderr


def test_unknown_parameters_and_metrics_are_refused_before_anything_runs(gw):
    out = seq_cli(gw, "eval", "run", "pick-place", "--benchmark", "pick-place", "--param", "replan=3")
    assert out.returncode == 5 and "unknown parameter 'replan'" in out.stderr
    assert "policy.open_loop_horizon" in out.stderr and "benchmark.max_seconds" in out.stderr
    out = seq_cli(gw, "eval", "run", "pick-place", "--benchmark", "pick-place", "--gate", "accuracy>=0.5")
    assert out.returncode == 5 and "reports no metric 'accuracy'" in out.stderr
    out = seq_cli(gw, "eval", "run", "pick-place", "--benchmark", "no-such-bench")
    assert out.returncode == 4 and "unknown benchmark" in out.stderr


def test_cancel_stops_a_running_eval_and_keeps_what_finished(gw):
    earlier = {rec.parent.name for rec in (gw.data_dir / "evals").glob("*/eval.json")}   # the gateway is shared
    proc = subprocess.Popen([sys.executable, "-m", "seq.cli", "eval", "run", "still", "--benchmark", "pick-place",
                             "--envs", "1", "--episodes", "30", "--tasks", "1", "--param", "max_seconds=1"],
                            env=_env(gw.env()), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        deadline = time.monotonic() + 90
        eval_id = None
        while time.monotonic() < deadline:
            for rec in (gw.data_dir / "evals").glob("*/eval.json"):
                if rec.parent.name in earlier:
                    continue
                r = json.loads(rec.read_text())
                if r["policy"] == "still" and r["status"] == "running" and r["done_episodes"] >= 1:
                    eval_id = r["id"]
            if eval_id:
                break
            time.sleep(0.2)
        assert eval_id, "the eval did not start"
        out = seq_cli(gw, "eval", "cancel", eval_id)
        assert out.returncode == 0 and f"{eval_id}: canceled" in out.stdout, out.stdout + out.stderr
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 1 and "error[canceled]" in stderr, stdout + stderr
        r = json.loads((gw.data_dir / "evals" / eval_id / "eval.json").read_text())
        assert r["status"] == "canceled" and 1 <= r["done_episodes"] < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
