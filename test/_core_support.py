"""Shared helpers for the client tests (test_core_*.py): observations for the echo policy, a
recorder for what act() received, a tiny thread timer, and ``InProcessWire``, the base of the
in-process stand-ins for ``_wire.Wire`` that tests of timing and of generated runs use (where a
real server's round trip would blur the point on a loaded machine). Every test that talks to a
server talks to the real gateway and worker on loopback (the ``gateway`` fixture)."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import numpy as np

import sequence_ai
from sequence_ai_core import Prediction
from sequence_ai_core._wire import Session

ECHO = str(Path(__file__).resolve().parent / "policies" / "echo_policy.py")
_FRAME = None


def frame() -> str:
    global _FRAME
    if _FRAME is None:
        _FRAME = sequence_ai.encode_jpeg(np.zeros((64, 64, 3), np.uint8))
    return _FRAME


def observation(instruction: str = "put the red cube on the green pad", gripper: float = 0.5):
    """An observation the echo policy accepts (one 64x64 exterior_1 frame, 7 joints, 1 gripper)."""
    return sequence_ai.Observation(
        images=[sequence_ai.ImageFrame(view="exterior_1", data=frame())],
        proprioception=sequence_ai.Proprioception(joint_positions=[0.0] * 7, gripper=[gripper]),
        instruction=instruction,
    )


class Recorder:
    """act() target: keeps (time, row) for every action it is given; ``now`` reads the time (s):
    ``time.monotonic`` unless given (a virtual-time test passes its loop's ``time``)."""

    def __init__(self, now=time.monotonic):
        self.now = now
        self.times: list[float] = []
        self.rows: list[list[float]] = []
        self.holds = 0
        self.hold_times: list[float] = []

    def __call__(self, row):
        self.times.append(self.now())
        self.rows.append(list(row))

    def hold(self):
        self.holds += 1
        self.hold_times.append(self.now())

    @property
    def chunk_ids(self):
        return [int(r[0]) for r in self.rows]

    @property
    def row_indices(self):
        return [int(r[1]) for r in self.rows]


def after(seconds: float, fn) -> threading.Thread:
    """Call ``fn`` on another thread after ``seconds``; returns the (started) thread."""
    t = threading.Timer(seconds, fn)
    t.daemon = True
    t.start()
    return t


def slow_loading_copy(tmp_path: Path, load_s: float) -> str:
    """A copy of the echo policy whose load() sleeps ``load_s`` seconds (a cold start)."""
    src = Path(ECHO).read_text()
    path = tmp_path / "slow_echo_policy.py"
    path.write_text(f"import os\nos.environ['ECHO_LOAD_S'] = '{load_s}'\n" + src)
    return str(path)


def connect(gateway, model: str, **kwargs) -> sequence_ai.Policy:
    return sequence_ai.connect(model, api_key=gateway.api_key, gateway_url=gateway.url, **kwargs)


def unique(name: str) -> str:
    return f"{name}-{os.getpid()}-{int(time.time() * 1000) % 100000}"


class InProcessWire:
    """An in-process stand-in for ``sequence_ai_core._wire.Wire``: ``act`` answers request ``i``
    (0 = the connection's first) with ``answer(i)``'s chunk after its delay (s), as the worker
    would (on the event loop's clock: under test/_vclock.py the delay is virtual). Records ``calls``,
    the loop time (s) each request ``started``, the requests
    ``in_flight`` and their maximum, and the episode ``ended`` last. Subclasses define ``answer``."""

    def __init__(self, contract=None) -> None:
        self.calls = 0
        self.started: list = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.ended = None
        self.session = Session(session_id="s", worker_url="http://in-process", direct_secret="x",
                               contract=contract if contract is not None else {"action": {"action_space": "joint_absolute"}})

    def answer(self, i: int):
        """``(delay_s, ActionChunk)`` for request ``i``."""
        raise NotImplementedError

    async def act(self, observation, *, params=None, episode_id=None, delay=None):
        i = self.calls
        self.calls += 1
        self.started.append(asyncio.get_running_loop().time())  # the loop's clock: virtual or monotonic
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        delay_s, chunk = self.answer(i)
        try:
            await asyncio.sleep(delay_s)
        finally:
            self.in_flight -= 1
        return Prediction(action_chunk=chunk, latency_s=0.0)

    def end_episode_soon(self, episode_id):
        self.ended = episode_id

    async def settle(self, wait_s):
        pass

    async def aclose(self):
        pass
