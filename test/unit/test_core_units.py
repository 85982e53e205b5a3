"""Pure units of the engine, no server: buffer, seam, prefetch math, pacing, errors, types."""
from __future__ import annotations

import json
import re
import sys

import httpx
import pytest

import sequence_ai
from sequence_ai_core._buffer import ChunkBuffer
from sequence_ai_core._pacing import Pacer
from sequence_ai_core._prefetch import LatencyEstimate
from sequence_ai_core._seam import seam_jump, smooth
from sequence_ai_core._errors import from_response


def chunk(rows, space="joint_absolute", hz=15.0, horizon=None):
    return sequence_ai.ActionChunk(actions=[list(map(float, r)) for r in rows], action_space=space,
                                   robot="panda", control_frequency_hz=hz, open_loop_horizon=horizon)


# ------------------------------------------------------------------ buffer

def test_buffer_plays_open_loop_horizon_rows_then_next_chunk():
    buf = ChunkBuffer()
    buf.push(chunk([[1, i] for i in range(10)], horizon=4))
    buf.push(chunk([[2, i] for i in range(10)], horizon=4))
    assert len(buf) == 8
    played = [buf.pop(k)[0] for k in range(8)]
    assert [(r[0], r[1]) for r in played] == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)]
    with pytest.raises(IndexError):
        buf.pop(8)


def test_buffer_plays_whole_chunk_without_horizon():
    buf = ChunkBuffer()
    buf.push(chunk([[0]] * 6))
    assert len(buf) == 6


def test_buffer_reports_chunk_start_with_first_action_index():
    buf = ChunkBuffer()
    buf.push(chunk([[0]] * 3))
    buf.push(chunk([[1]] * 3))
    starts = [(k, e.first_action_index) for k in range(6) if (e := buf.pop(k)[1]) is not None]
    assert starts == [(0, 0), (3, 3)]
    assert buf.chunks_started == 2


# ------------------------------------------------------------------ seam

def test_max_seam_jump_is_largest_per_dimension_distance():
    buf = ChunkBuffer()
    buf.push(chunk([[0.0, 0.0, 0.0], [0.1, 0.2, 0.3]]))
    buf.push(chunk([[0.5, -0.6, 0.3], [0.5, -0.6, 0.3]]))
    for k in range(4):
        row, _ = buf.pop(k)
        buf.executed(row)
    # last executed (0.1, 0.2, 0.3) vs first of next (0.5, -0.6, 0.3): max(|0.4|, |-0.8|, 0) = 0.8
    assert buf.max_seam_jump == pytest.approx(0.8)


def test_seam_jump_measured_before_smoothing():
    buf = ChunkBuffer(smooth_seam=3)
    buf.push(chunk([[0.0]]))
    buf.push(chunk([[4.0], [4.0], [4.0], [4.0]]))
    rows = []
    for k in range(5):
        row, _ = buf.pop(k)
        buf.executed(row)
        rows.append(row[0])
    assert buf.max_seam_jump == pytest.approx(4.0)  # not the blended 1.0
    assert rows == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])  # ramp 1/4, 2/4, 3/4, then the model's row


def test_smooth_seam_never_touches_the_first_chunk():
    buf = ChunkBuffer(smooth_seam=3)
    buf.executed([100.0])  # even with a previous action on record (e.g. next_action before)
    buf.chunks_started = 0
    buf.push(chunk([[4.0], [4.0], [4.0]]))
    assert [buf.pop(k)[0][0] for k in range(3)] == [4.0, 4.0, 4.0]


@pytest.mark.parametrize("space", ["joint_delta", "ee_delta", "joint_velocity", None])
def test_smooth_seam_never_touches_delta_chunks(space):
    buf = ChunkBuffer(smooth_seam=3)
    buf.push(chunk([[0.0]], space=space))
    buf.executed(buf.pop(0)[0])
    buf.push(chunk([[4.0], [4.0], [4.0]], space=space))
    assert [buf.pop(k)[0][0] for k in range(1, 4)] == [4.0, 4.0, 4.0]
    assert buf.max_seam_jump == pytest.approx(4.0)  # still measured


def test_smooth_is_a_linear_ramp_out_of_the_last_action():
    assert smooth([[10.0, 0.0]] * 4, [0.0, 0.0], 1) == [[5.0, 0.0], [10.0, 0.0], [10.0, 0.0], [10.0, 0.0]]
    assert seam_jump(None, [1.0]) == 0.0


# ------------------------------------------------------------------ prefetch

def test_prefetch_starts_at_once_before_any_measurement():
    assert LatencyEstimate().should_start(time_left_s=10.0, period_s=1 / 15)


def test_prefetch_starts_when_time_left_falls_to_latency_plus_a_period():
    est = LatencyEstimate()
    for s in (0.2, 0.2, 0.2):
        est.add(s)
    assert est.mean_s == pytest.approx(0.2)
    assert not est.should_start(time_left_s=0.40, period_s=0.1)
    assert est.should_start(time_left_s=0.30, period_s=0.1)


def test_prefetch_budgets_for_the_worst_recent_refill():
    est = LatencyEstimate()
    for s in (0.1, 0.1, 0.3):  # the first is the cold one
        est.add(s)
    assert est.budget_s == pytest.approx(0.3)


# ------------------------------------------------------------------ pacing

def test_pacing_deadlines_are_computed_not_accumulated():
    p = Pacer(100.0, 1 / 15)
    assert p.deadline(15) == pytest.approx(101.0)
    assert p.deadline(1500) == pytest.approx(200.0)


def test_pacing_rate_change_keeps_the_previous_deadline():
    p = Pacer(0.0, 0.1)
    p.set_period(10, 0.05)  # from action 10 on, 20 Hz
    assert p.deadline(10) == pytest.approx(1.0)
    assert p.deadline(12) == pytest.approx(1.1)


def test_pacing_resyncs_instead_of_bursting():
    p = Pacer(0.0, 0.1)
    assert p.is_late(3, now=0.45)
    p.resync(3, 0.45)
    assert p.deadline(4) == pytest.approx(0.55)


# ------------------------------------------------------------------ errors

def _response(status, body, headers=None):
    return httpx.Response(status, content=json.dumps(body).encode(), headers=headers or {})


def _err(code, **kw):
    body = {"detail": "x", "code": code, "retryable": False, "retry_after_s": None,
            "request_id": "req_1", "hint": "h", "details": None}
    body.update(kw)
    return body


def test_errors_map_the_server_shape():
    e = from_response(_response(503, _err("warming", retryable=True, retry_after_s=12.5)))
    assert isinstance(e, sequence_ai.Unavailable) and e.warming and e.retry_after_s == 12.5 and e.retryable
    e = from_response(_response(503, _err("worker_failed")))
    assert isinstance(e, sequence_ai.Unavailable) and not e.warming
    e = from_response(_response(500, _err("policy_error", details={"exception_type": "KeyError",
                                                                   "remote_traceback": "tb"})))
    assert isinstance(e, sequence_ai.PolicyError) and e.exception_type == "KeyError"
    assert e.remote_traceback == "tb" and e.request_id == "req_1" and e.hint == "h"
    assert isinstance(from_response(_response(401, _err("unauthorized"))), sequence_ai.AuthError)
    assert isinstance(from_response(_response(404, _err("not_found"))), sequence_ai.InvalidRequest)
    assert isinstance(from_response(_response(400, _err("invalid_request"))), sequence_ai.InvalidRequest)


def test_errors_retry_after_header_and_non_json_body():
    e = from_response(httpx.Response(503, content=b"busy", headers={"Retry-After": "7"}))
    assert isinstance(e, sequence_ai.Unavailable) and e.retry_after_s == 7.0
    assert isinstance(e, sequence_ai.SequencesError)


def test_every_error_is_a_sequences_error():
    for name in ("AuthError", "InvalidRequest", "ContractMismatch", "Unavailable", "PolicyError",
                 "ChunkExhausted", "TransportError", "ConnectionLost"):
        assert issubclass(getattr(sequence_ai, name), sequence_ai.SequencesError)


def test_no_api_key_is_an_auth_error_naming_the_key_file(monkeypatch, tmp_path):
    monkeypatch.delenv("SEQUENCES_API_KEY", raising=False)
    monkeypatch.setenv("SEQUENCES_HOME", str(tmp_path))
    with pytest.raises(sequence_ai.AuthError) as info:
        sequence_ai.connect("anything", gateway_url="http://127.0.0.1:9")
    assert str(tmp_path / "api_key") in info.value.hint


def test_the_key_file_is_not_read_and_the_hint_says_so_and_names_the_mcp_host_env(monkeypatch, tmp_path):
    monkeypatch.delenv("SEQUENCES_API_KEY", raising=False)
    monkeypatch.setenv("SEQUENCES_HOME", str(tmp_path))
    (tmp_path / "api_key").write_text("seq_live_from_file\n")
    from sequence_ai_core import resolve_api_key
    with pytest.raises(sequence_ai.AuthError) as info:
        resolve_api_key()                     # api_key= then $SEQUENCES_API_KEY only, as the hint says
    assert info.value.code == "no_api_key"
    assert "does not read that file" in info.value.hint
    assert "SEQUENCES_API_KEY (and SEQUENCES_GATEWAY_URL) in the host's server env entry" in info.value.hint
    assert resolve_api_key("seq_live_arg") == "seq_live_arg"


# ------------------------------------------------------------------ types

def test_action_chunk_reads_like_the_spec():
    c = chunk([[0.0] * 8] * 16, horizon=8)
    assert repr(c) == "ActionChunk(16 steps x 8 dims, joint_absolute, panda, 15 Hz, covers 1.07s, replan after 8)"
    assert len(c) == 16 and c.covers_seconds == pytest.approx(1.067) and c.rows is c.actions


def test_run_outcome_reads_like_the_spec():
    out = sequence_ai.RunOutcome(reason="completed", actions=250, chunks=17, seconds=16.8)
    assert repr(out) == "RunOutcome(250 actions over 17 chunks in 16.8s, completed)"


def test_observation_wire_form_omits_unreported_fields():
    obs = sequence_ai.Observation(
        images=[sequence_ai.ImageFrame("exterior_1", b"\xff\xd8")],
        proprioception=sequence_ai.Proprioception(joint_positions=[1, 2]), instruction="go")
    wire = obs.to_wire()
    assert wire["proprioception"] == {"joint_positions": [1.0, 2.0]}
    assert wire["images"][0] == {"view": "exterior_1", "data": "/9g="}


def test_encode_jpeg_gives_base64_jpeg():
    import base64

    import numpy as np

    data = base64.b64decode(sequence_ai.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    assert data[:2] == b"\xff\xd8"


def test_a_missing_image_library_is_named_for_what_was_asked(monkeypatch):
    import numpy as np

    from sequence_ai import _image

    frame = np.zeros((8, 8, 3), np.uint8)
    hint = "pip install 'sequence-ai[image]'"
    monkeypatch.setitem(sys.modules, "PIL", None)          # Pillow absent, simplejpeg present
    assert sequence_ai.encode_jpeg(frame)                  # no resize asked: simplejpeg alone encodes
    with pytest.raises(ImportError, match=r"^resizing a 8x8 frame to 4x4 needs Pillow \(it is not installed\): "
                                          + re.escape(hint)):
        sequence_ai.encode_jpeg_bytes(frame, size=(4, 4))
    with pytest.raises(ImportError, match=r"^a depth PNG needs Pillow"):
        _image.encode_depth_png(np.zeros((4, 4)))
    monkeypatch.setitem(sys.modules, "simplejpeg", None)   # neither codec
    with pytest.raises(ImportError) as exc:
        sequence_ai.encode_jpeg(frame)
    assert str(exc.value) == f"JPEG encoding needs simplejpeg or Pillow (neither is installed): {hint}"


def test_public_namespace_is_flat():
    for name in sequence_ai.__all__:
        assert hasattr(sequence_ai, name)


# ------------------------------------------------------------------ connect options

def test_connect_and_aconnect_take_the_same_options_declared_once():
    import dataclasses
    import inspect

    from sequence_ai_core import ConnectOptions

    names = [f.name for f in dataclasses.fields(ConnectOptions)]
    for fn in (sequence_ai.connect, sequence_ai.aconnect):
        params = inspect.signature(fn).parameters
        assert list(params) == ["model", *names]
        assert params["validate"].default == "warn" and params["body_format"].default == "auto"
        assert params["timeout_s"].default == 60.0
    policy = sequence_ai.aconnect("m", gateway_url="http://127.0.0.1:9", api_key="k", params={"a": 1},
                                  timeout_s=5.0)
    assert policy.options == ConnectOptions(gateway_url="http://127.0.0.1:9", api_key="k", params={"a": 1},
                                            timeout_s=5.0)
    assert policy._wire.timeout_s == 5.0 and policy._wire.params == {"a": 1}
    assert sequence_ai.aconnect("m", api_key="k", request_hz=1.875)._wire.request_hz == 1.875


def test_bad_connect_options_are_refused_with_what_to_pass():
    with pytest.raises(TypeError, match="aconnect.*'on_queued'.*on_queue"):
        sequence_ai.aconnect("m", api_key="k", on_queued=print)
    with pytest.raises(ValueError, match='validate must be "warn", "strict" or "off"'):
        sequence_ai.aconnect("m", api_key="k", validate="loud")
    with pytest.raises(ValueError, match="body_format"):
        sequence_ai.aconnect("m", api_key="k", body_format="xml")
    for bad in (0, float("nan"), float("inf"), 10 ** 400):
        with pytest.raises(ValueError, match="timeout_s"):
            sequence_ai.aconnect("m", api_key="k", timeout_s=bad)
    for bad in (0, -1.0, float("nan"), 5000.0, True, "2", 10 ** 400):
        with pytest.raises(ValueError, match="request_hz must be a number of chunks per second"):
            sequence_ai.aconnect("m", api_key="k", request_hz=bad)
    with pytest.raises(TypeError, match="on_queue must be a callable"):
        sequence_ai.aconnect("m", api_key="k", on_queue="print")
    with pytest.raises(TypeError, match="connect\\(\\) got unexpected"):
        sequence_ai.connect("m", api_key="k", gateway="http://x")


def test_the_default_queue_line_prints_when_the_position_changes(capsys):
    from sequence_ai_core._options import print_queue_position

    line = print_queue_position()
    for position, eta in ((3, 90.0), (3, 88.0), (2, 61.4), (1, None)):
        line(position, eta)
    assert capsys.readouterr().err.splitlines() == [
        "[sequences] queued for a GPU slot: position 3, about 90s …",
        "[sequences] queued for a GPU slot: position 2, about 61s …",
        "[sequences] queued for a GPU slot: position 1 …",
    ]
