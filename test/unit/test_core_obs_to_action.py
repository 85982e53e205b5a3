"""Observation-to-action latency in RunOutcome, on virtual time (the engine of
test_core_loop_logic.py with its in-process echo worker): from observe() returning the frame a
request was built from to act() returning on the first action played from that frame's chunk."""
from __future__ import annotations

import pytest

from sequence_ai_core import RunOutcome
from test_core_loop_logic import PERIOD, recorder, run

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


def test_without_prefetch_each_chunk_plays_its_first_action_one_turnaround_after_its_frame():
    out, _ = run(recorder(), {"chunk_len": 10, "horizon": 5, "latency_ms": 100}, max_actions=20, prefetch=False)
    assert out.chunks == 4
    assert out.obs_to_action_p50_s == pytest.approx(0.1) and out.obs_to_action_p99_s == pytest.approx(0.1)


def test_a_prefetched_chunk_counts_its_wait_in_the_buffer_too():
    """Prefetched one turnaround plus a period ahead of need (the loop's lead), a chunk lands a
    period before its turn and waits it: its frame is 150 ms + one period old when its first action
    plays. The second chunk, asked for before any turnaround was measured, waits longer (the p99)."""
    out, _ = run(recorder(), {"chunk_len": 10, "horizon": 8, "latency_ms": 150}, max_actions=40)
    assert out.underruns == 0 and out.chunks == 5
    assert out.obs_to_action_p50_s == pytest.approx(0.15 + PERIOD)
    assert out.obs_to_action_p99_s > 0.15 + 2 * PERIOD


def test_a_run_that_played_no_chunk_reports_none():
    empty = RunOutcome(reason="interrupted")
    assert empty.obs_to_action_p50_s is None and empty.obs_to_action_p99_s is None
