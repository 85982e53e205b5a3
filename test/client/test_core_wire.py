"""The wire against the real gateway and worker: handshake, direct /act, transparent reconnect,
typed errors, and the non-loop ways to drive (predict, next_action)."""
from __future__ import annotations

import importlib.abc
import os
import signal
import sys
import time

import pytest

import sequence_ai
from _core_support import ECHO, Recorder, after, connect, observation, slow_loading_copy, unique

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


@pytest.fixture(scope="module")
def echo(shared_module_gateway):
    name = unique("echo-wire")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    return name


def test_predict_returns_a_typed_chunk(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo, params={"chunk_len": 16, "horizon": 8}) as policy:
        pred = policy.predict(observation())
        assert policy.contract["action"]["action_space"] == "joint_absolute"
    chunk = pred.action_chunk
    assert len(chunk) == 16 and chunk.action_dim == 8
    assert (chunk.action_space, chunk.robot, chunk.control_frequency_hz, chunk.open_loop_horizon) == \
        ("joint_absolute", "panda", 15.0, 8)
    assert repr(chunk) == "ActionChunk(16 steps x 8 dims, joint_absolute, panda, 15 Hz, covers 1.07s, replan after 8)"
    assert pred.request_id and pred.inference_ms is not None and pred.latency_s > 0


def test_a_rotated_secret_is_a_transparent_reconnect(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo) as policy:
        policy.predict(observation())
        policy._engine._wire.session.direct_secret = "rotated-away"  # the worker now answers 401
        pred = policy.predict(observation())
        assert len(pred.action_chunk) == 10
        assert policy.reconnects == 1


def test_a_restarted_worker_is_a_transparent_reconnect(shared_module_gateway):
    name = unique("echo-restart")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    with connect(shared_module_gateway, name) as policy:
        old = policy._engine._wire.session.worker_url
        policy.predict(observation())
        shared_module_gateway.deploy(ECHO, name, wait=True)  # new worker: new port, new secret
        pred = policy.predict(observation())
        assert len(pred.action_chunk) == 10
        assert policy.reconnects == 1 and policy._engine._wire.session.worker_url != old


def test_warming_met_mid_run_is_raised_and_holds(shared_module_gateway, tmp_path):
    name = unique("echo-midrun")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    rec = Recorder()
    pid = shared_module_gateway.status(name)["pid"]
    with connect(shared_module_gateway, name, params={"chunk_len": 5}) as policy:
        # Kill the serving worker: the robot's reconnect makes the gateway start a new one, so the
        # next /act meets a cold start. (`seq policy stop` would refuse the reconnect instead:
        # it is an emergency stop.)
        after(0.5, lambda: os.kill(pid, signal.SIGKILL))
        with pytest.raises(sequence_ai.Unavailable) as info:
            policy.run(observation, rec, hold=rec.hold, max_actions=500, progress=False)
    assert info.value.warming and rec.holds == 1 and len(rec.rows) > 0


def test_a_policy_exception_is_a_policy_error_with_its_type(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo, params={"fail": "KeyError"}) as policy:
        with pytest.raises(sequence_ai.PolicyError) as info:
            policy.predict(observation())
    assert info.value.exception_type == "KeyError"
    assert "KeyError" in (info.value.remote_traceback or "")
    assert info.value.request_id


def test_a_policy_error_in_run_holds_and_is_raised(shared_module_gateway, echo):
    rec = Recorder()
    with connect(shared_module_gateway, echo, params={"fail": "RuntimeError"}) as policy:
        with pytest.raises(sequence_ai.PolicyError) as info:
            policy.run(observation, rec, hold=rec.hold, max_actions=10, progress=False)
    assert info.value.exception_type == "RuntimeError" and rec.holds == 1 and rec.rows == []


def test_policy_input_error_is_an_invalid_request(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo, params={"fail": "PolicyInputError"}) as policy:
        with pytest.raises(sequence_ai.InvalidRequest):
            policy.predict(observation())


def test_unknown_model_is_an_invalid_request(shared_module_gateway):
    with pytest.raises(sequence_ai.InvalidRequest) as info:
        connect(shared_module_gateway, "no-such-model")
    assert info.value.code == "not_found"


def test_a_wrong_key_is_an_auth_error(shared_module_gateway, echo):
    with pytest.raises(sequence_ai.AuthError):
        sequence_ai.connect(echo, api_key="seq_wrong", gateway_url=shared_module_gateway.url)


def test_models_needs_no_key(shared_module_gateway, echo, monkeypatch):
    monkeypatch.delenv("SEQUENCES_API_KEY", raising=False)
    names = [m.name for m in sequence_ai.models(shared_module_gateway.url)]
    assert echo in names


def test_expect_mismatch_is_a_contract_mismatch(shared_module_gateway, echo):
    with pytest.raises(sequence_ai.ContractMismatch):
        connect(shared_module_gateway, echo, expect={"action_space": "joint_delta"})
    with connect(shared_module_gateway, echo, expect={"robot": "panda", "action_dim": 8}) as policy:
        assert policy.contract["action"]["robot"] == "panda"


def test_strict_validation_refuses_a_missing_view_before_sending(shared_module_gateway, echo):
    bad = observation()
    bad.images[0].view = "wrist_left"
    with connect(shared_module_gateway, echo, validate="strict") as policy:
        with pytest.raises(sequence_ai.ContractMismatch, match="exterior_1"):
            policy.predict(bad)
    with connect(shared_module_gateway, echo, validate="warn") as policy:
        with pytest.warns(UserWarning, match="exterior_1"):
            with pytest.raises(sequence_ai.InvalidRequest):  # the worker refuses it too
                policy.predict(bad)


def test_next_action_walks_the_buffer_and_refills(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo, params={"chunk_len": 6, "horizon": 3}) as policy:
        with pytest.raises(sequence_ai.ChunkExhausted):
            policy.next_action()
        rows = [policy.next_action(observation()) for _ in range(6)]
        assert policy.buffered == 0
    assert [int(r[1]) for r in rows] == [0, 1, 2, 0, 1, 2]
    assert int(rows[0][0]) != int(rows[3][0])


def test_ready_and_wait_until_ready_on_a_cold_deployment(shared_module_gateway, tmp_path):
    name = unique("echo-ready")
    shared_module_gateway.deploy(slow_loading_copy(tmp_path, 2), name, wait=False)
    with connect(shared_module_gateway, name) as policy:
        ok, eta = policy.ready()
        assert ok is False and eta is not None
        with pytest.raises(sequence_ai.Unavailable) as info:
            policy.predict(observation())
        assert info.value.warming
        waited = policy.wait_until_ready(timeout_s=60)
        assert waited > 0 and policy.ready() == (True, None)
        assert len(policy.predict(observation()).action_chunk) == 10


class _ImportSpy(importlib.abc.MetaPathFinder):
    """Records every module lookup that reaches the import system (a module not yet imported)."""

    def __init__(self):
        self.names = []

    def find_spec(self, name, path, target=None):
        self.names.append(name)
        return None


def test_a_request_on_the_hot_path_looks_up_no_module(shared_module_gateway, echo):
    # httpcore imports sniffio on every request; were it missing, each /act would search
    # sys.path for it again (setup.py installs it with the client)
    with connect(shared_module_gateway, echo) as policy:
        obs = observation()
        policy.predict(obs)
        policy.predict(obs)
        spy = _ImportSpy()
        sys.meta_path.insert(0, spy)
        try:
            for _ in range(5):
                assert len(policy.predict(obs).action_chunk.actions) == 10
        finally:
            sys.meta_path.remove(spy)
    assert spy.names == []
