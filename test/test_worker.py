"""The worker on its own: a real ``python -m sequence_ai_server.worker`` process on loopback,
checked the way a robot client would call it."""
from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time

import httpx
import pytest

from _servers import ECHO_POLICY, POLICIES, WorkerProcess, echo_observation, png_b64


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    w = WorkerProcess.start(ECHO_POLICY, tmp_path_factory.mktemp("echo-worker"), name="echo")
    yield w
    w.stop()


def _error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"detail", "code", "retryable", "retry_after_s", "request_id", "hint", "details"}
    assert body["code"] == code
    assert body["request_id"] and r.headers["x-request-id"] == body["request_id"]
    return body


def _policy_file(tmp_path, body: str, name: str = "p.py") -> str:
    path = tmp_path / name
    path.write_text("import os, time\nimport numpy as np\nimport seq\n" + textwrap.dedent(body))
    return str(path)


def test_ready_file_reports_the_bound_port_and_pid(echo):
    assert echo.info["pid"] == echo.proc.pid
    assert echo.info["url"] == f"http://127.0.0.1:{echo.port}"
    assert echo.info["spec"]["contract"]["action"]["action_dim"] == 8
    r = echo.client.get("/ping")
    assert r.status_code == 200 and r.json()["status"] == "ready"


def test_act_returns_a_chunk_filled_from_the_contract(echo):
    r = echo.act({"observation": echo_observation(joint_positions=[0, 1, 2, 3, 4, 5, 6]), "params": {"chunk_len": 4}})
    assert r.status_code == 200, r.text
    body = r.json()
    chunk = body["action_chunk"]
    assert (chunk["action_space"], chunk["robot"], chunk["control_frequency_hz"]) == ("joint_absolute", "panda", 15.0)
    assert len(chunk["actions"]) == 4 and all(len(row) == 8 for row in chunk["actions"])
    assert [row[1] for row in chunk["actions"]] == [0, 1, 2, 3]
    assert chunk["actions"][0][2:7] == [2, 3, 4, 5, 6] and chunk["actions"][0][7] == 0.5
    assert body["warnings"] == [] and body["inference_ms"] >= 0
    assert body["request_id"].startswith("req_") and r.headers["x-request-id"] == body["request_id"]


def test_chunks_carry_the_request_counter(echo):
    ids = [echo.act({"observation": echo_observation()}).json()["action_chunk"]["actions"][0][0] for _ in range(3)]
    assert ids[1] == ids[0] + 1 and ids[2] == ids[1] + 1


def test_jpeg_frames_are_accepted(echo):
    obs = echo_observation(views={"exterior_1": png_b64(fmt="JPEG", color=(200, 10, 10))})
    assert echo.act({"observation": obs}).status_code == 200


def test_wrong_secret_is_401(echo):
    _error(echo.act({"observation": echo_observation()}, secret="not-the-secret"), 401, "unauthorized")
    _error(echo.act({"observation": echo_observation()}, secret=""), 401, "unauthorized")


def test_a_missing_view_is_400_naming_it(echo):
    body = _error(echo.act({"observation": echo_observation(views={"wrist": png_b64()})}), 400, "invalid_request")
    assert "missing view(s) ['exterior_1']" in body["detail"] and "exterior_1 (64x64)" in body["detail"]
    assert body["details"]["missing_views"] == ["exterior_1"]


def test_a_wrong_frame_size_is_400_naming_the_sizes(echo):
    body = _error(echo.act({"observation": echo_observation(views={"exterior_1": png_b64(32, 48)})}), 400, "invalid_request")
    assert "frame is 32x48, this policy reads 64x64" in body["detail"]
    assert "resize" in body["hint"]


def test_a_wrong_proprio_width_is_400_naming_the_field(echo):
    body = _error(echo.act({"observation": echo_observation(joint_positions=[0.0] * 6)}), 400, "invalid_request")
    assert "proprioception.joint_positions has 6 value(s); this policy reads 7" in body["detail"]
    obs = echo_observation()
    del obs["proprioception"]["gripper"]
    body = _error(echo.act({"observation": obs}), 400, "invalid_request")
    assert "missing proprioception.gripper" in body["detail"]


def test_an_empty_instruction_is_400(echo):
    body = _error(echo.act({"observation": echo_observation(instruction="  ")}), 400, "invalid_request")
    assert "instruction is empty" in body["detail"]


def test_undecodable_frames_and_malformed_bodies_are_400(echo):
    body = _error(echo.act({"observation": echo_observation(views={"exterior_1": "%%%"})}), 400, "invalid_request")
    assert "not valid base64" in body["detail"]
    body = _error(echo.act({"observation": echo_observation(views={"exterior_1": "aGVsbG8="})}), 400, "invalid_request")
    assert "not a JPEG or PNG" in body["detail"]
    body = _error(echo.act({"obs": {}}), 400, "invalid_request")
    assert "observation" in body["detail"]


def test_params_are_cast_and_unknown_names_refused(echo):
    r = echo.act({"observation": echo_observation(), "params": {"chunk_len": "3"}})
    assert r.status_code == 200 and len(r.json()["action_chunk"]["actions"]) == 3
    body = _error(echo.act({"observation": echo_observation(), "params": {"chunk_length": 3}}), 400, "invalid_request")
    assert "unknown param(s) ['chunk_length']" in body["detail"] and "chunk_len" in body["detail"]
    body = _error(echo.act({"observation": echo_observation(), "params": {"chunk_len": "many"}}), 400, "invalid_request")
    assert "expects int" in body["detail"]


def test_out_of_bounds_actions_are_clipped_with_warnings(echo):
    r = echo.act({"observation": echo_observation(gripper=[1.5]), "params": {"chunk_len": 2}})
    body = r.json()
    assert r.status_code == 200
    assert [row[7] for row in body["action_chunk"]["actions"]] == [1.0, 1.0]
    assert body["warnings"] == ["clipped step 0 dim 7: 1.5 outside [0, 1]", "clipped step 1 dim 7: 1.5 outside [0, 1]"]


def test_a_policy_exception_is_500_policy_error_with_type_and_traceback(echo):
    body = _error(echo.act({"observation": echo_observation(), "params": {"fail": "KeyError"}}), 500, "policy_error")
    assert body["details"]["exception_type"] == "KeyError"
    assert "echo_policy.py" in body["details"]["remote_traceback"]
    assert "raise exc_type" in body["details"]["remote_traceback"]
    assert body["retryable"] is False


def test_policy_input_error_is_400_with_its_message(echo):
    body = _error(echo.act({"observation": echo_observation(), "params": {"fail": "PolicyInputError"}}), 400, "invalid_request")
    assert body["detail"] == "asked to fail with PolicyInputError"


def test_open_loop_horizon_is_passed_through(echo):
    r = echo.act({"observation": echo_observation(), "params": {"chunk_len": 6, "horizon": 4}})
    assert r.json()["action_chunk"]["open_loop_horizon"] == 4


def test_inference_runs_off_the_event_loop(echo):
    slow = threading.Thread(target=echo.act, args=({"observation": echo_observation(), "params": {"latency_ms": 1500}},))
    slow.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    assert echo.client.get("/ping").status_code == 200
    assert time.monotonic() - t0 < 0.5
    slow.join()


def test_one_inference_at_a_time(echo):
    results = []

    def call():
        results.append(echo.act({"observation": echo_observation(), "params": {"latency_ms": 300}}).json())
    t0 = time.monotonic()
    threads = [threading.Thread(target=call) for _ in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert time.monotonic() - t0 >= 0.85
    assert sorted(r["action_chunk"]["actions"][0][0] for r in results) == \
        list(range(int(min(r["action_chunk"]["actions"][0][0] for r in results)), int(min(r["action_chunk"]["actions"][0][0] for r in results)) + 3))


def test_refuse_on_violation_answers_policy_error_reason_bounds(tmp_path):
    f = _policy_file(tmp_path, '''
        @seq.policy(action=seq.ActionContract("arm", "joint_delta", 2, 10.0, bounds=[(-0.1, 0.1)] * 2,
                                              on_violation="refuse"))
        class P:
            @seq.load
            def load(self, weights_dir): pass
            @seq.infer
            def infer(self, obs, *, big: bool = False) -> seq.ActionChunk:
                return seq.ActionChunk([[0.5 if big else 0.0, 0.0]])
        ''')
    w = WorkerProcess.start(f, tmp_path)
    try:
        obs = {"proprioception": {}, "instruction": "x"}
        assert w.act({"observation": obs}).status_code == 200
        body = _error(w.act({"observation": obs, "params": {"big": True}}), 500, "policy_error")
        assert body["details"]["reason"] == "bounds"
        assert "step 0 dim 0" in body["detail"]
    finally:
        w.stop()


def test_max_delta_is_clipped_within_a_chunk(tmp_path):
    f = _policy_file(tmp_path, '''
        @seq.policy(action=seq.ActionContract("arm", "joint_absolute", 1, 10.0, max_delta=0.1))
        class P:
            @seq.load
            def load(self, weights_dir): pass
            @seq.infer
            def infer(self, obs: seq.Observation) -> seq.ActionChunk:
                return seq.ActionChunk([[0.0], [1.0], [1.0]])
        ''')
    w = WorkerProcess.start(f, tmp_path)
    try:
        body = w.act({"observation": {"instruction": "x"}}).json()
        assert body["action_chunk"]["actions"] == [[0.0], [0.1], [0.2]]
        assert body["warnings"][0].startswith("clipped step 1 dim 0: moves 1")
    finally:
        w.stop()


def test_a_chunk_of_the_wrong_width_or_with_nan_is_policy_error(tmp_path):
    f = _policy_file(tmp_path, '''
        @seq.policy(action=seq.ActionContract("arm", "joint_absolute", 3, 10.0))
        class P:
            @seq.load
            def load(self, weights_dir): pass
            @seq.infer
            def infer(self, obs: seq.Observation, *, kind: str = "ok") -> seq.ActionChunk:
                if kind == "wide":
                    return seq.ActionChunk(np.zeros((2, 4)))
                if kind == "nan":
                    return seq.ActionChunk([[0.0, float("nan"), 0.0]])
                return seq.ActionChunk(np.zeros((2, 3)))
        ''')
    w = WorkerProcess.start(f, tmp_path)
    try:
        obs = {"instruction": "x"}
        assert w.act({"observation": obs}).status_code == 200
        body = _error(w.act({"observation": obs, "params": {"kind": "wide"}}), 500, "policy_error")
        assert "4 values; the contract declares action_dim=3" in body["detail"]
        body = _error(w.act({"observation": obs, "params": {"kind": "nan"}}), 500, "policy_error")
        assert body["details"]["reason"] == "non_finite"
    finally:
        w.stop()


def test_load_failure_exits_non_zero_with_the_policys_error(tmp_path):
    w = WorkerProcess.start(str(POLICIES / "broken_load_policy.py"), tmp_path, wait=False)
    assert w.proc.wait(timeout=30) == 3
    err = json.loads((tmp_path / "w.ready.json.error").read_text())
    assert err["phase"] == "loading" and err["exception_type"] == "FileNotFoundError"
    assert "checkpoint missing" in err["detail"]
    assert not (tmp_path / "w.ready.json").exists()


def test_sigterm_calls_shutdown_and_exits_cleanly(tmp_path):
    marker = tmp_path / "shutdown.txt"
    f = _policy_file(tmp_path, f'''
        @seq.policy
        class P:
            @seq.load
            def load(self, weights_dir):
                self.weights_dir = weights_dir
            @seq.infer
            def infer(self, inputs):
                return {{"echo": inputs, "weights_dir": self.weights_dir}}
            @seq.shutdown
            def bye(self):
                open({str(marker)!r}, "w").write("bye")
        ''')
    w = WorkerProcess.start(f, tmp_path)
    r = w.act({"observation": {"state": [1.0]}})
    assert r.status_code == 200
    assert r.json()["action_chunk"] is None and r.json()["outputs"]["echo"] == {"state": [1.0]}
    assert r.json()["outputs"]["weights_dir"] == str(tmp_path / "w-weights")
    assert w.stop() == 0
    assert marker.read_text() == "bye"


def test_on_episode_runs_at_each_new_episode(tmp_path):
    f = _policy_file(tmp_path, '''
        @seq.policy(action=seq.ActionContract("arm", "joint_absolute", 1, 10.0), streaming=True)
        class P:
            @seq.load
            def load(self, weights_dir):
                self.episodes = []
            @seq.on_episode
            def new_episode(self, episode_id):
                self.episodes.append(episode_id)
            @seq.infer
            def infer(self, obs: seq.Observation) -> seq.ActionChunk:
                return seq.ActionChunk([[float(len(self.episodes))]])
        ''')
    w = WorkerProcess.start(f, tmp_path)
    try:
        seen = [w.act({"observation": {"instruction": "x"}, "episode_id": e}).json()["action_chunk"]["actions"][0][0]
                for e in ("a", "a", "b", "b", "c")]
        assert seen == [1.0, 1.0, 2.0, 2.0, 3.0]
    finally:
        w.stop()
