"""The client's half of deadlines, in process: the deadline_ms / period_ms each /act carries
(``_prefetch.DeadlineEstimate``) and where the wire puts them in the body."""
from __future__ import annotations

import json

import pytest

import sequence_ai
from sequence_ai_core._prefetch import DeadlineEstimate
from sequence_ai_core._wire import _act_body, _deadline
from sequence_ai_core.protocol import BINARY_CONTENT_TYPE, MAX_DEADLINE_MS, encode_act_body


def test_deadline_is_playback_left_less_the_median_network_round_trip():
    est = DeadlineEstimate()
    assert est.fields(0.5, []) == {"deadline_ms": 500.0}            # no answer yet: no round trip known
    est.note_answer(0.060, 50.0)          # 10 ms of network
    est.note_answer(0.100, 70.0)          # 30 ms
    est.note_answer(0.320, 70.0)          # 250 ms: a stall of the client's own loop, not planned for
    est.note_answer(0.080, None)          # a worker that reports no server_ms: not a sample
    assert est.network_s == pytest.approx(0.030)
    assert est.fields(0.5, [0.5, 0.6, 0.55]) == {"deadline_ms": pytest.approx(470.0), "period_ms": 550.0}


def test_a_declared_rate_is_the_period_sent_from_the_first_request():
    est = DeadlineEstimate(period_s=1 / 1.875)                        # connect(..., request_hz=1.875)
    assert est.fields(0.0, []) == {"deadline_ms": 1.0, "period_ms": pytest.approx(533.333, abs=1e-3)}
    assert est.fields(0.3, [0.05, 0.9])["period_ms"] == pytest.approx(533.333, abs=1e-3)   # not the gaps
    assert sequence_ai.aconnect("m", api_key="k", request_hz=6.25)._wire.deadlines.period_s == 0.16


def test_deadline_is_bounded_to_what_the_worker_accepts():
    est = DeadlineEstimate()
    assert est.fields(-2.0, [])["deadline_ms"] == 1.0                # out of actions: the soonest answer
    assert est.fields(1e6, [])["deadline_ms"] == MAX_DEADLINE_MS
    assert "period_ms" not in est.fields(1.0, [1e6])                 # an absurd gap is not declared


def test_the_deadline_goes_first_in_the_body_and_the_loop_field_is_not_sent():
    est = DeadlineEstimate()
    delay, deadline = _deadline({"playback_left_s": 0.4, "delay_steps": 2}, est, [0.5])
    assert delay == {"delay_steps": 2} and deadline == {"deadline_ms": 400.0, "period_ms": 500.0}
    body = _act_body({}, {"images": [{"view": "a", "data": b"\xff\xd8xx"}]}, None, None, delay, deadline)
    raw, ctype = encode_act_body(body, binary=True)
    assert ctype == BINARY_CONTENT_TYPE
    head = raw[4:4 + int.from_bytes(raw[:4], "big")]
    assert head.startswith(b'{"deadline_ms":400.0,"period_ms":500.0,')
    assert json.loads(head)["delay_steps"] == 2


def test_a_runs_first_request_asks_for_the_soonest_answer_and_none_without_a_loop():
    assert _deadline(None, DeadlineEstimate(), []) == (None, None)          # predict(): as before
    delay, deadline = _deadline({"delay_steps": 0}, DeadlineEstimate(), [])  # no playback yet
    assert deadline == {"deadline_ms": 1.0}
    assert list(_act_body({"k": 1}, {}, None, "ep", delay, deadline)) == ["deadline_ms", "observation", "params",
                                                                          "episode_id", "delay_steps"]
    assert _deadline({}, DeadlineEstimate(period_s=0.5), [])[1] == {"deadline_ms": 1.0, "period_ms": 500.0}
