"""Delay-aware chunks over the real wire, on loopback: the worker hands ``prefix`` /
``delay_steps`` to an infer() that declares them (and nothing to one that does not), echoes
``request_id`` / ``generation`` and refuses malformed delay fields; the robot client negotiates
the mode, merges aligned by default for a guided policy, refuses or ends typed outside the
declared delay, and stops on a frozen camera; ``seq validate`` and the catalogue show the delay
modes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import sequence_ai
from sequence_ai_core import from_response
from _core_support import ECHO, Recorder, connect, observation, unique
from _servers import ROOT, WorkerProcess, echo_observation

DELAY = str(Path(__file__).resolve().parents[1] / "policies" / "delay_policy.py")

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


def joints(values=(0.0, 0.0, 0.0)):
    return sequence_ai.Observation(images=[], proprioception=sequence_ai.Proprioception(joint_positions=list(values)),
                                   instruction="move")


@pytest.fixture(scope="module")
def delay_worker(tmp_path_factory):
    worker = WorkerProcess.start(DELAY, tmp_path_factory.mktemp("delay-worker"))
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def delay_model(shared_module_gateway):
    name = unique("delay")
    shared_module_gateway.deploy(DELAY, name, wait=True)
    return name


def act_body(**fields):
    return {"observation": {"images": [], "proprioception": {"joint_positions": [0.0, 0.0, 0.0]},
                            "instruction": "move"}, **fields}


# ------------------------------------------------------------------ the worker

def test_the_worker_hands_the_prefix_and_delay_to_infer_and_echoes_the_ids(delay_worker):
    prefix = [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.4, 0.5, 0.6]]
    r = delay_worker.act(act_body(prefix=prefix, delay_steps=2, obs_time=1.7e9, request_id="ep-7", generation=3))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["request_id"] == "ep-7" and body["generation"] == 3
    rows = body["action_chunk"]["actions"]
    assert rows[0] == pytest.approx(prefix[0]) and rows[1] == pytest.approx(prefix[1])   # float32 on the way
    assert rows[2][1:] == [2.0, 2.0]                   # the continuation: row 2, delay_steps 2
    cold = delay_worker.act(act_body()).json()          # no delay fields: prefix None, delay_steps 0
    assert cold["action_chunk"]["actions"][0][1:] == [0.0, 0.0] and cold.get("generation") is None


@pytest.mark.parametrize("fields, needle", [
    ({"prefix": [[0.0, 0.0]]}, "prefix has shape"),
    ({"prefix": [[0.0, 0.0, 0.0]], "delay_steps": 3}, "fewer than delay_steps"),
    ({"delay_steps": -1}, "delay_steps must be"),
    ({"generation": "2"}, "generation must be"),
    ({"request_id": ""}, "request_id must be"),
    ({"obs_time": "now"}, "obs_time must be"),
])
def test_the_worker_refuses_malformed_delay_fields(delay_worker, fields, needle):
    r = delay_worker.act(act_body(**fields))
    assert r.status_code == 400 and needle in r.json()["detail"], r.text


def test_the_worker_refuses_a_delay_beyond_the_declared_maximum(delay_worker):
    r = delay_worker.act(act_body(prefix=[[0.0, 0.0, 0.0]] * 5, delay_steps=5))
    assert r.status_code == 400
    assert r.json()["details"] == {"reason": "delay_exceeded", "delay_steps": 5, "max_delay_steps": 4}
    err = from_response(r)
    assert isinstance(err, sequence_ai.DelayUnsupported) and err.max_delay_steps == 4


def test_a_policy_that_does_not_declare_them_gets_neither(tmp_path):
    worker = WorkerProcess.start(ECHO, tmp_path)
    try:
        r = worker.act({"observation": echo_observation(), "prefix": [[0.0] * 8], "delay_steps": 1,
                        "request_id": "r-1", "generation": 1})
        assert r.status_code == 200, r.text
        assert r.json()["request_id"] == "r-1" and r.json()["generation"] == 1
    finally:
        worker.stop()


# ------------------------------------------------------------------ the robot client

def test_a_guided_policy_runs_aligned_with_the_prefix_and_the_delay_on_the_wire(shared_module_gateway, delay_model):
    rec = Recorder()
    with connect(shared_module_gateway, delay_model) as policy:
        out = policy.run(joints, rec, max_actions=25, hold=rec.hold, params={"latency_s": 0.25}, progress=False)
    assert out.reason == "completed" and (out.merge, out.delay_mode) == ("aligned", "guided")
    assert out.seams.count >= 2 and out.stale_answers == 0
    keys = [(int(r[0]), int(r[1])) for r in rec.rows if r[0] >= 1 and r[0] == int(r[0]) and r[2] == int(r[2])]
    assert len(keys) == len(set(keys))                 # no row played twice
    for record in out.seams.records:                    # each new chunk started at the row due now
        assert record.trimmed == record.consumed >= 1
        assert 1 <= record.delay_steps <= 4
    assert out.seams.max_delay_steps <= 4


def test_a_mode_the_policy_does_not_declare_is_refused_at_connect_before_any_action(shared_module_gateway, delay_model):
    rec = Recorder()
    with connect(shared_module_gateway, delay_model) as policy:
        with pytest.raises(sequence_ai.DelayUnsupported, match="trained"):
            policy.run(joints, rec, max_actions=10, hold=rec.hold, delay_mode="trained", progress=False)
    assert rec.rows == [] and rec.holds == 1


def test_a_delay_beyond_the_maximum_before_motion_is_refused(shared_module_gateway, delay_model):
    rec = Recorder()
    with connect(shared_module_gateway, delay_model) as policy:
        with pytest.raises(sequence_ai.DelayUnsupported) as err:
            policy.run(joints, rec, max_actions=10, hold=rec.hold, params={"latency_s": 0.8}, progress=False)
    assert rec.rows == [] and err.value.delay_steps > 4


def test_a_delay_growing_beyond_the_maximum_mid_run_holds_and_ends_typed(shared_module_gateway, delay_model):
    rec = Recorder()
    with connect(shared_module_gateway, delay_model) as policy:
        out = policy.run(joints, rec, max_actions=200, hold=rec.hold, progress=False,
                         params={"latency_s": 0.05, "slow_after": 2, "slow_s": 1.5})
    assert out.reason == "delay_exceeded" and isinstance(out.fault, sequence_ai.DelayUnsupported)
    assert rec.holds == 1 and rec.hold_times[0] >= rec.times[-1] and 0 < len(rec.rows) < 200


def test_a_frozen_camera_ends_the_run_naming_the_stream(shared_module_gateway):
    name = unique("echo-fresh")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    rec = Recorder()
    with connect(shared_module_gateway, name) as policy:
        out = policy.run(observation, rec, max_actions=300, hold=rec.hold, max_frame_age_s={"exterior_1": 0.3},
                         progress=False)
    assert out.reason == "stale_camera" and out.fault.stream == "exterior_1"
    assert rec.holds == 1 and len(rec.rows) < 300


# ------------------------------------------------------------------ declaration, validate, catalogue

def test_seq_validate_and_the_catalogue_show_the_delay_modes(shared_module_gateway, delay_model):
    out = subprocess.run([sys.executable, "-m", "seq", "validate", DELAY], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "modes chunk, guided · max 4 steps · infer takes prefix, delay_steps" in out.stdout
    rows = shared_module_gateway.client.get(f"{shared_module_gateway.url}/v1/models").json()
    row = next(r for r in (rows["models"] if isinstance(rows, dict) else rows) if r["name"] == delay_model)
    assert row["delay_modes"] == ["chunk", "guided"] and row["max_delay_steps"] == 4
    assert row["contract"]["action"]["delay"] == {"modes": ["chunk", "guided"], "max_delay_steps": 4}


def test_a_delay_aware_contract_needs_a_limit_and_an_infer_that_reads_the_prefix():
    import seq
    with pytest.raises(seq.DeclarationError, match="max_delay_steps"):
        seq.ActionContract(robot="r", action_space="joint_absolute", action_dim=2, control_frequency_hz=10.0,
                           delay_modes=("guided",))
    with pytest.raises(seq.DeclarationError, match="unknown or missing mode"):
        seq.ActionContract(robot="r", action_space="joint_absolute", action_dim=2, control_frequency_hz=10.0,
                           delay_modes=("rtc",), max_delay_steps=3)
    action = seq.ActionContract(robot="r", action_space="joint_absolute", action_dim=2, control_frequency_hz=10.0,
                                delay_modes=("trained",), max_delay_steps=12)
    assert seq.ActionContract.from_dict(action.to_dict()) == action
    old = {k: v for k, v in action.to_dict().items() if k != "delay"}
    assert seq.ActionContract.from_dict(old).delay_modes == ("chunk",)

    with pytest.raises(seq.DeclarationError, match="takes no prefix"):
        @seq.policy(action=action)
        class Blind(seq.Policy):
            @seq.load
            def load(self, weights_dir):
                pass

            @seq.infer
            def infer(self, obs, *, speed: float = 1.0):
                return seq.ActionChunk([[0.0, 0.0]])

    @seq.policy(action=action)
    class Aware(seq.Policy):
        @seq.load
        def load(self, weights_dir):
            pass

        @seq.infer
        def infer(self, obs, *, speed: float = 1.0, prefix=None, delay_steps: int = 0):
            return seq.ActionChunk([[0.0, 0.0]])

    spec = seq.get_spec(Aware)
    assert [p.name for p in spec.params] == ["speed"] and spec.delay_inputs == ["prefix", "delay_steps"]
