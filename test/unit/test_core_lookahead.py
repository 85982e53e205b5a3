"""``lookahead=N`` holds N chunks queued behind the playing one, at a realistic refill latency.

At 300 ms turnarounds against 8-row chunks at 15 Hz (533 ms each) the refill lead alone (the
worst turnaround plus one period, about 0.37 s) never asks for a second queued chunk, so a
lookahead that only capped the queue would leave it at one chunk whatever N was. These tests
drive the real engine (AsyncPolicy, ControlLoop, ChunkBuffer, LatencyEstimate, pacing) against
``LatencyWire``, an in-process stand-in for ``_wire.Wire.act`` (as in test_core_properties.py
and test_core_refill.py) that answers after a scripted delay: the point is the depth of the
queue at a known turnaround, which a real server's round trip would blur on a loaded machine.
test_core_loop.py runs lookahead against the real worker.
"""
from __future__ import annotations

import pytest

import _vclock

from _core_support import InProcessWire
from sequence_ai_core import ActionChunk, AsyncPolicy

HZ = 15.0          # Hz: the pick-place control frequency
ROWS = 8           # rows per chunk: 533 ms of motion at 15 Hz
LATENCY_S = 0.30   # s: every request's turnaround, unless scripted otherwise


class LatencyWire(InProcessWire):
    """Answers /act after ``delays.get(i, LATENCY_S)`` seconds for request ``i`` (0 = the
    connection's first) with an 8-row absolute chunk at 15 Hz whose rows are ``[i, row]``, so
    what act() received says which chunk and which row it came from. Counts requests in flight."""

    def __init__(self, delays=None) -> None:
        super().__init__()
        self.delays = dict(delays or {})

    def answer(self, i):
        chunk = ActionChunk(actions=[[float(i), float(r)] for r in range(ROWS)],
                            action_space="joint_absolute", robot="r", control_frequency_hz=HZ)
        return self.delays.get(i, LATENCY_S), chunk


def drive(lookahead: int, max_actions: int, delays=None):
    """One run of the real loop against ``LatencyWire``: (RunOutcome, the wire, rows acted,
    chunks queued behind the playing one as seen at every act())."""
    policy = AsyncPolicy("scripted", api_key="k", gateway_url="http://127.0.0.1:9", validate="off")
    policy._wire = wire = LatencyWire(delays)
    acted, queued = [], []

    def act(row):
        acted.append(list(row))
        queued.append(policy._buffer.chunks_queued)

    async def main():
        return await policy.run(lambda: {"images": [], "proprioception": {"joint_positions": [0.0, 0.0]}},
                                act, max_actions=max_actions, lookahead=lookahead,
                                validate=lambda row: True, progress=False)

    return _vclock.drive(policy, main), wire, acted, queued


@pytest.mark.parametrize("lookahead", [1, 2, 3])
def test_lookahead_n_holds_n_chunks_queued_behind_the_playing_one(lookahead):
    out, wire, acted, queued = drive(lookahead, max_actions=64)
    assert out.reason == "completed" and out.actions == 64
    # the queue fills to N chunks, never beyond, with one request in flight at a time
    assert max(queued) == lookahead, queued
    assert wire.max_in_flight == 1
    # queued chunks play in the order they arrived, every playable row of each, none dropped
    assert [int(r[0]) for r in acted] == [i for i in range(8) for _ in range(ROWS)]
    assert [int(r[1]) for r in acted] == list(range(ROWS)) * 8
    assert out.chunks == 8
    # each boundary is a seam measured against the last executed action: row 7 -> 0, chunk +1
    assert out.max_seam_jump == pytest.approx(7.0)


def test_lookahead_two_rides_out_a_latency_spike_that_underruns_lookahead_one():
    """Request 5 takes 0.6 s instead of 0.3 s. With N = 1 it starts about 0.37 s before the
    buffer runs dry (the worst recent turnaround plus a period) and lands about 0.23 s late;
    with N = 2 it starts as the chunk ahead of it starts playing, 1.07 s before the buffer runs
    dry, and lands with about 0.45 s to spare."""
    spike = {5: 0.60}
    one, _, _, _ = drive(1, max_actions=64, delays=spike)
    two, wire, acted, _ = drive(2, max_actions=64, delays=spike)
    assert one.reason == "completed" and two.reason == "completed"
    assert one.underruns >= 1 and one.underrun_s > 0.1, one
    assert two.underruns == 0 and two.underrun_s == 0.0, two
    assert wire.max_in_flight == 1
    assert [int(r[0]) for r in acted] == [i for i in range(8) for _ in range(ROWS)]
