"""Client behaviours against the real gateway and worker on loopback: the seam guard (bounds and
max_delta across chunks), errors that come back as the policy raised them, lease renewal,
interrupting a reconnect, the once-per-process validate warning, the progress line, labels,
observation()/encode() and the binary /act body, and ``sequence-ai doctor``."""
from __future__ import annotations

import base64
import io
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

import sequence_ai
from sequence_ai import cli
from sequence_ai_core import BINARY_CONTENT_TYPE, encode_act_body, from_response
from _core_support import ECHO, Recorder, after, connect, observation, unique
from _wait import eventually

POLICIES = Path(__file__).resolve().parents[1] / "policies"
LIMITS = str(POLICIES / "limits_policy.py")
PERIOD = 1 / 15
SLACK = 0.05

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


@pytest.fixture(scope="module")
def echo(shared_module_gateway):
    name = unique("echo-client")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    return name


@pytest.fixture(scope="module")
def ramp(shared_module_gateway):
    name = unique("ramp")
    shared_module_gateway.deploy(LIMITS, name, wait=True, class_name="RampPolicy")
    return name


@pytest.fixture(scope="module")
def flip(shared_module_gateway):
    name = unique("flip")
    shared_module_gateway.deploy(LIMITS, name, wait=True, class_name="FlipPolicy")
    return name


def two_joints():
    return sequence_ai.Observation(images=[], proprioception=sequence_ai.Proprioception([0.0, 0.0]),
                                   instruction="move")


# ------------------------------------------------------------------ the seam guard

def test_max_delta_holds_across_chunk_boundaries(shared_module_gateway, ramp):
    rec = Recorder()
    with connect(shared_module_gateway, ramp, params={"chunk_len": 6, "jump": 0.5}) as policy:
        out = policy.run(two_joints, rec, max_actions=18, progress=False)
    assert out.reason == "completed" and out.chunks == 3
    steps = [max(abs(b[i] - a[i]) for i in range(2)) for a, b in zip(rec.rows, rec.rows[1:])]
    assert max(steps) <= 0.1 + 1e-9
    assert all(-1.0 <= v <= 1.0 for row in rec.rows for v in row)
    # the policy's seams jump ~0.25 (0.5 minus the 0.25 the chunk already climbed): clipped, and
    # measured before clipping
    assert out.clipped > 0
    assert out.max_seam_jump > 0.2


def test_delta_chunks_pass_the_seam_guard_untouched(shared_module_gateway, flip):
    rec = Recorder()
    with connect(shared_module_gateway, flip, params={"chunk_len": 4}) as policy:
        out = policy.run(two_joints, rec, max_actions=16, progress=False, smooth_seam=3)
    assert out.action_space == "joint_delta" and out.clipped == 0 and out.chunks == 4
    # each chunk is 4 rows of +0.05 or -0.05, alternating: every row exactly as the policy sent it,
    # although each seam "moves" 0.1 > max_delta and smoothing was asked for
    first = rec.rows[0][0]
    assert abs(first) == 0.05
    signs = [first, -first, first, -first]
    assert rec.rows == [[s, s] for s in signs for _ in range(4)]


def test_next_action_applies_the_same_guard(shared_module_gateway, ramp):
    with connect(shared_module_gateway, ramp, params={"chunk_len": 3, "jump": 0.9}) as policy:
        rows = [policy.next_action(two_joints()) for _ in range(9)]
    steps = [max(abs(b[i] - a[i]) for i in range(2)) for a, b in zip(rows, rows[1:])]
    assert max(steps) <= 0.1 + 1e-9


# ------------------------------------------------------------------ errors

def test_a_builtin_exception_in_the_policy_comes_back_as_itself(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo, params={"fail": "KeyError"}) as policy:
        with pytest.raises(KeyError) as info:
            policy.predict(observation())
    exc = info.value
    assert isinstance(exc, sequence_ai.PolicyError) and isinstance(exc, sequence_ai.SequencesError)
    assert exc.exception_type == "KeyError" and exc.code == "policy_error"
    assert "asked to fail with KeyError" in exc.remote_traceback
    assert "Traceback" in exc.remote_traceback


def test_a_non_builtin_policy_exception_stays_a_policy_error(shared_module_gateway, ramp):
    with connect(shared_module_gateway, ramp, params={"jam": True}) as policy:
        with pytest.raises(sequence_ai.PolicyError) as info:
            policy.predict(two_joints())
    assert type(info.value) is sequence_ai.PolicyError and info.value.exception_type == "GripperJam"
    assert "the gripper is jammed" in info.value.remote_traceback


def test_out_of_credit_is_its_own_error():
    req = httpx.Request("POST", "http://127.0.0.1/v1/connect")
    body = {"detail": "quota used up", "code": "out_of_credit", "retryable": False,
            "retry_after_s": None, "request_id": "req_1", "hint": "raise the key's quota", "details": None}
    exc = from_response(httpx.Response(402, json=body, request=req))
    assert isinstance(exc, sequence_ai.OutOfCredit) and not exc.retryable and exc.request_id == "req_1"
    bare = from_response(httpx.Response(402, text="payment required", request=req))
    assert isinstance(bare, sequence_ai.OutOfCredit)


# ------------------------------------------------------------------ lease and reconnect

def test_a_lease_about_to_lapse_is_renewed_before_the_call(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo) as policy:
        wire = policy._engine._wire
        ttl = wire.session.lease["ttl_s"]
        assert wire.session.renew_at - time.monotonic() == pytest.approx(ttl - min(5.0, ttl / 10), abs=2.0)
        wire.session.renew_at = time.monotonic() - 1  # as if ttl_s had gone by
        sid = wire.session.session_id
        pred = policy.predict(observation())
        assert len(pred.action_chunk) == 10
        # with most of the lease left the renewal runs beside the call, on the client's own loop,
        # which a sync Policy drives during its calls: a few more calls let it land under load
        for _ in range(20):
            if wire.renewals + wire.reconnects:
                break
            time.sleep(0.1)
            policy.predict(observation())
        assert (wire.renewals, wire.reconnects) == (1, 0)
        assert wire.session.session_id == sid
        assert wire.session.renew_at > time.monotonic() + 60


def test_lease_renewal_time_comes_from_expires_at_without_ttl():
    from sequence_ai_core._wire import _renew_at
    now = time.monotonic()
    at = _renew_at({"expires_at": time.time() + 100.0}, now)
    assert at - now == pytest.approx(95.0, abs=0.5)
    assert _renew_at({}, now) is None


class StalledGateway:
    """A TCP listener that accepts and never answers: a gateway hung mid-handshake."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self):
        for c in self.accepted:
            c.close()
        self.sock.close()


def test_interrupt_while_reconnecting_stops_within_one_period(shared_module_gateway, echo):
    stalled = StalledGateway()
    rec = Recorder()
    marks = {}
    try:
        with connect(shared_module_gateway, echo, params={"chunk_len": 4}) as policy:
            wire = policy._engine._wire

            def break_the_session():  # the next /act gets 401, the reconnect hangs
                wire.gateway_url = stalled.url
                wire.session.direct_secret = "rotated-away"

            def interrupt():
                marks["interrupt"] = time.monotonic()
                marks["accepted"] = len(stalled.accepted)
                policy.interrupt()

            def interrupt_once_stalled():   # as soon as the reconnect hangs on the stalled gateway
                try:
                    eventually(lambda: stalled.accepted, 30, what="the reconnect reaching the stalled gateway")
                finally:
                    interrupt()

            after(0.2, break_the_session)
            threading.Thread(target=interrupt_once_stalled, daemon=True).start()
            out = policy.run(observation, rec, hold=rec.hold, max_actions=200, progress=False)
    finally:
        stalled.close()
    assert marks["accepted"] >= 1, "the run never reached the reconnect"
    assert out.reason == "interrupted" and rec.holds == 1
    assert rec.hold_times[0] - marks["interrupt"] <= PERIOD + SLACK
    assert all(t <= rec.hold_times[0] for t in rec.times)


# ------------------------------------------------------------------ warnings and progress

def test_validate_none_warns_once_per_process(shared_module_gateway, echo):
    code = f"""
import warnings, sys
sys.path.insert(0, {str(Path(__file__).parents[1])!r})
import sequence_ai
from _core_support import observation
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as seen:
    with sequence_ai.connect({echo!r}, api_key={shared_module_gateway.api_key!r}, gateway_url={shared_module_gateway.url!r}) as p:
        for _ in range(3):
            p.run(observation, lambda row: None, max_actions=2, progress=False)
        p.run(observation, lambda row: None, max_actions=2, validate=lambda row: True, progress=False)
print(sum("validate=None" in str(w.message) for w in seen))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "1"


def test_progress_goes_to_stderr_only_when_it_is_a_terminal(shared_module_gateway, echo, capsys):
    with connect(shared_module_gateway, echo) as policy:
        policy.run(observation, Recorder(), max_actions=3)  # progress="auto", stderr is a pipe
        assert capsys.readouterr().err == ""
        master, slave = os.openpty()
        tty = os.fdopen(slave, "w")
        saved, sys.stderr = sys.stderr, tty
        try:
            out = policy.run(observation, Recorder(), max_actions=3)
        finally:
            sys.stderr = saved
            tty.close()
        text = ""
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            text += chunk.decode()
        os.close(master)
    lines = [line for line in text.splitlines() if line.strip()]
    assert any("starting" in line for line in lines)
    assert any("running" in line for line in lines)
    assert lines[-1].endswith(f"done: {out!r}")


def test_on_status_gets_the_same_lines(shared_module_gateway, echo):
    seen = []
    with connect(shared_module_gateway, echo) as policy:
        policy.run(observation, Recorder(), max_actions=3, on_status=seen.append, progress=False)
    assert seen[0].startswith("starting") and seen[1].startswith("running") and seen[-1].startswith("done")


# ------------------------------------------------------------------ labels

def test_label_needs_an_episode_and_defaults_to_the_last_run(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo) as policy:
        with pytest.raises(sequence_ai.SequencesError) as info:
            policy.label(success=True)
        assert info.value.code == "no_episode"
        policy.run(observation, Recorder(), max_actions=2, progress=False)
        first = policy.last_episode_id
        policy.run(observation, Recorder(), max_actions=2, progress=False)
        assert first.startswith("ep_") and policy.last_episode_id != first


# ------------------------------------------------------------------ observations and frames

def test_observation_sizes_frames_for_the_model_and_the_worker_accepts_them(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo) as policy:
        row = policy.spec()
        with pytest.warns(UserWarning, match="wrist_left"):
            obs = sequence_ai.observation(
                row, images={"exterior_1": np.full((256, 256, 3), 200, np.uint8),
                             "wrist_left": np.zeros((64, 64, 3), np.uint8)},
                joints=[0.0] * 7, gripper=[0.25], instruction="pick")
        assert [f.view for f in obs.images] == ["exterior_1"]
        decoded = np.asarray(Image.open(io.BytesIO(obs.images[0].data)))
        assert decoded.shape == (64, 64, 3) and abs(int(decoded.mean()) - 200) <= 2
        pred = policy.predict(obs)
    assert pred.action_chunk.actions[0][7] == pytest.approx(0.25)


def test_observation_refuses_what_the_model_cannot_read(shared_module_gateway, echo):
    row = [m for m in sequence_ai.models(shared_module_gateway.url) if m.name == echo][0]
    frame = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(sequence_ai.ContractMismatch, match="missing view"):
        sequence_ai.observation(row, images={"wrist": frame}, joints=[0.0] * 7, gripper=[0.0])
    with pytest.raises(sequence_ai.ContractMismatch, match="joint_positions has 8"):
        sequence_ai.observation(row, images={"exterior_1": frame}, joints=[0.0] * 8, gripper=[0.0])
    with pytest.raises(ValueError, match="aspect"):
        sequence_ai.observation(row, images={"exterior_1": np.zeros((48, 64, 3), np.uint8)},
                                joints=[0.0] * 7, gripper=[0.0])


def test_encode_is_jpeg_q95_at_the_model_size_or_640_long_edge():
    contract = {"observation": {"cameras": {"a": {"width": 32, "height": 24}}}}
    img = Image.open(io.BytesIO(base64.b64decode(sequence_ai.encode(np.zeros((480, 640, 3), np.uint8), contract))))
    assert img.format == "JPEG" and img.size == (32, 24)
    img = Image.open(io.BytesIO(base64.b64decode(sequence_ai.encode(np.zeros((960, 1280, 3), np.uint8)))))
    assert img.size == (640, 480)
    pil = Image.fromarray(np.zeros((100, 50, 3), np.uint8))
    assert Image.open(io.BytesIO(base64.b64decode(sequence_ai.encode(pil)))).size == (50, 100)


def test_depth_goes_as_16_bit_png_of_millimetres():
    contract = {"observation": {"cameras": {"wrist": {"width": 4, "height": 2, "depth": True}},
                                "proprio": {"joint_positions": 1}}}
    depth_m = np.array([[0.5, 1.0, 1.2345, np.nan], [0.0, 2.0, 65.0, 70.0]])
    obs = sequence_ai.observation(contract, images={"wrist": np.zeros((2, 4, 3), np.uint8)},
                                  joints=[0.0], depth={"wrist": depth_m}, instruction="x")
    png = Image.open(io.BytesIO(obs.depth[0]["data"]))
    assert png.format == "PNG"
    assert np.asarray(png).astype(int).tolist() == [[500, 1000, 1234, 0], [0, 2000, 65000, 65535]]
    with pytest.raises(sequence_ai.ContractMismatch, match="depth"):
        sequence_ai.observation(contract, images={"wrist": np.zeros((2, 4, 3), np.uint8)}, joints=[0.0])


def test_binary_act_body_frames_raw_jpeg_after_a_json_header():
    jpeg = base64.b64decode(sequence_ai.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    obs = sequence_ai.Observation(
        images=[sequence_ai.ImageFrame("a", jpeg, timestamp_ms=5), sequence_ai.ImageFrame("b", base64.b64encode(b"xyz").decode())],
        proprioception=sequence_ai.Proprioception([1.0]), instruction="go")
    from sequence_ai_core._types import observation_to_wire
    body, ctype = encode_act_body({"observation": observation_to_wire(obs), "params": {"k": 1}}, True)
    assert ctype == BINARY_CONTENT_TYPE == "application/vnd.sequence-ai.act+bin"
    n = int.from_bytes(body[:4], "big")
    head = json.loads(body[4:4 + n])
    blobs = body[4 + n:]
    a, b = head["observation"]["images"]
    assert "data" not in a and a["timestamp_ms"] == 5 and head["params"] == {"k": 1}
    assert blobs[a["blob"][0]:a["blob"][0] + a["blob"][1]] == jpeg
    assert blobs[b["blob"][0]:b["blob"][0] + b["blob"][1]] == b"xyz"
    assert len(blobs) == len(jpeg) + 3
    as_json, jtype = encode_act_body({"observation": observation_to_wire(obs), "params": {}}, False)
    assert jtype == "application/json"
    assert base64.b64decode(json.loads(as_json)["observation"]["images"][0]["data"]) == jpeg


# ------------------------------------------------------------------ the CLI

def test_doctor_checks_key_gateway_connect_and_connection_reuse(shared_module_gateway, echo, capsys):
    rc = cli.main(["doctor", "--gateway", shared_module_gateway.url, "--model", echo, "--calls", "3",
                   "--api-key", shared_module_gateway.api_key])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "key valid     yes" in out and f"connect       {echo}" in out
    new = float(out.split("new connection each call")[1].split("ms")[0])
    reused = float(out.split("one reused connection")[1].split("ms")[0])
    assert new > 0 and reused > 0 and "POST /act" in out
    assert out.rstrip().endswith("ready")


def _sessions_of(gw, name: str, expect: int, timeout: float = 15.0) -> int:
    """How many sessions ``name`` holds, polled until it is ``expect`` or ``timeout`` s passed."""
    deadline = time.monotonic() + timeout
    while True:
        n = len(gw.status(name).get("sessions") or [])
        if n == expect or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


@pytest.fixture(scope="module")
def pick_place(shared_module_gateway):
    """examples/pick_place/policy.py deployed (a contract: one camera, joints, gripper)."""
    name = unique("pick-place-doctor")
    shared_module_gateway.deploy(str(Path(__file__).resolve().parents[2] / "examples" / "pick_place" / "policy.py"),
                          name, wait=True, timeout=120)
    return name


def test_doctor_closes_its_session_when_the_policy_refuses_its_observation(shared_module_gateway, pick_place, capsys):
    """pick-place refuses doctor's synthetic observation (its instruction names no colours); doctor
    times those refusals, a fresh connection each, and still ends its session: the deployment holds
    none after each run (it held one more per run, until the 300 s lease expired: the last call went
    by the sync client's blocking path after the pooled connections were closed, and the DELETE
    was skipped for want of them)."""
    for _ in range(2):
        rc = cli.main(["doctor", "--gateway", shared_module_gateway.url, "--model", pick_place, "--calls", "2",
                       "--api-key", shared_module_gateway.api_key])
        out = capsys.readouterr().out
        assert rc == 0 and "refused doctor's synthetic observation" in out and "POST /act" in out, out
        assert _sessions_of(shared_module_gateway, pick_place, 0) == 0, out


def test_doctor_without_the_image_extra_says_so_for_a_policy_with_a_contract(shared_module_gateway, pick_place,
                                                                             monkeypatch, capsys):
    """A client-only install (no numpy, Pillow or simplejpeg) cannot build pick-place's synthetic
    observation: doctor says the image extra is missing and how to install it (not "no contract"),
    times GET /ping instead, and closes its session."""
    for module in ("numpy", "PIL", "simplejpeg"):
        monkeypatch.setitem(sys.modules, module, None)     # import numpy -> ModuleNotFoundError
    rc = cli.main(["doctor", "--gateway", shared_module_gateway.url, "--model", pick_place, "--calls", "2",
                   "--api-key", shared_module_gateway.api_key])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "no contract" not in out, out
    assert ("note          it has a contract, but doctor's synthetic observation for it needs the image extra "
            "(numpy is not installed): timing its worker's GET /ping, not /act\n"
            "  hint          pip install 'sequence-ai[image]'") in out, out
    assert "(median of 2, GET /ping)" in out and out.rstrip().endswith("ready"), out
    assert _sessions_of(shared_module_gateway, pick_place, 0) == 0, out


def test_doctor_with_several_deployments_lists_them_and_asks_for_model(shared_module_gateway, echo, capsys):
    """No --model and more than one deployment: doctor names them and asks, never guesses (exit 2);
    with --model it says which it checked, and a contract-less policy gets its /ping timed, not a
    synthetic /act it would refuse."""
    raw = unique("raw-doctor")
    shared_module_gateway.deploy(str(POLICIES / "raw_policy.py"), raw, wait=True)
    rc = cli.main(["doctor", "--gateway", shared_module_gateway.url, "--calls", "1", "--api-key", shared_module_gateway.api_key])
    out = capsys.readouterr().out
    assert rc == 2, out
    assert "pick one with --model NAME" in out and f"                {echo}  v1" in out and f"{raw}  v1" in out
    assert "connect       " not in out
    rc = cli.main(["doctor", "--gateway", shared_module_gateway.url, "--model", raw, "--calls", "2",
                   "--api-key", shared_module_gateway.api_key])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"model         {raw}\n" in out and "GET /ping" in out and "no contract" in out
    assert out.rstrip().endswith("ready")


def test_doctor_reports_a_wrong_key(shared_module_gateway, echo, capsys):
    rc = cli.main(["doctor", "--gateway", shared_module_gateway.url, "--model", echo, "--calls", "1",
                   "--api-key", "seq_local_wrong"])
    assert rc == 1 and "key valid     NO (HTTP 401)" in capsys.readouterr().out
