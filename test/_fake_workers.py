"""Workers with no process, for in-process tests of the gateway: a :class:`FakeLauncher` whose
:class:`FakeWorker` objects emit the typed launch events of launchers/base.py when the test says
so, and a :class:`Clock` the test moves by hand (a Gateway takes it as ``clock=``)."""
from __future__ import annotations

import signal
import threading
from typing import Optional

import httpx

from sequence_ai_server.launchers.base import EventQueue, Exited, Phase, Placed, Ready, WorkerLaunchSpec

__all__ = ["Clock", "FakeWorker", "FakeLauncher", "play_pings"]


class Clock:
    """Unix seconds the test moves by hand (from threads too: ``advance`` takes a lock)."""

    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> float:
        with self._lock:
            self.t += s
            return self.t


class FakeWorker:
    """A WorkerHandle with no process: the test makes it report a phase, ready, or exit."""

    def __init__(self, spec: WorkerLaunchSpec, pid: int):
        self.spec, self.pid, self.returncode = spec, pid, None
        self.secret, self.activity, self.signals = spec.secret, 0.0, []
        self.exits_on_term = True          # False: a stuck worker that only SIGKILL ends
        self.port: Optional[int] = None    # where it "listens" once ready
        self.cost: Optional[dict] = None   # its /ping "cost": {"batch_ms": {"1": ms, ...}, "calls": n}; None: none
        self.frozen = False                # True: its /ping times out (a SIGSTOPped process)
        self.pings = 0
        self._events = EventQueue()

    # the WorkerHandle interface
    def events(self) -> list:
        return self._events.drain()

    def set_secret(self, secret: str) -> None:
        self.secret = secret

    def last_activity(self) -> float:
        return self.activity

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            self.returncode = -signal.SIGTERM
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if self.returncode is None and (self.exits_on_term or sig == signal.SIGKILL):
            self.returncode = -sig         # exits at once

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    # what the test makes it do
    def placed(self, node: str) -> None:
        """Its launcher put it on the cluster machine ``node`` (as the Ray launcher reports)."""
        self._events.put(Placed(f"node {node}", node=node))

    def loading(self, spec: dict) -> None:
        self._events.put(Phase({"phase": "loading", "spec": spec}))

    def ready(self, spec: dict, port: int) -> None:
        self.port = port
        self._events.put(Ready(f"http://127.0.0.1:{port}", {"port": port, "host": "127.0.0.1", "spec": spec}))

    def crash(self, code: int = 1) -> None:
        self.returncode = code
        self._events.put(Exited(code))

    def ping_body(self) -> dict:
        """What its /ping answers: ready, its pid and, when set, its cost curve."""
        body = {"status": "ready", "pid": self.pid, "oldest_request_s": 0.0}
        if self.cost is not None:
            body["cost"] = self.cost
        return body


def play_pings(gw, launcher: "FakeLauncher", clock: Clock, timeout_s: float = 5.0) -> None:
    """Make ``gw.health``'s pings reach ``launcher``'s running FakeWorkers (by port) instead of
    the network: a worker answers ``ping_body()``; a ``frozen`` one times out after ``timeout_s``
    of the clock; a port no running worker holds refuses the connection."""
    def get_ping(url: str, usage_since: int) -> httpx.Response:
        port = int(url.rsplit(":", 1)[1])
        w = next((x for x in reversed(launcher.started) if x.port == port and x.returncode is None), None)
        if w is None:
            raise httpx.ConnectError("connection refused")
        w.pings += 1
        if w.frozen:
            clock.advance(timeout_s)
            raise httpx.ReadTimeout("timed out")
        return httpx.Response(200, json=w.ping_body())
    gw.health.get_ping = get_ping


class FakeLauncher:
    """Starts FakeWorkers; records each and checks that no service lock is held while it starts."""

    adopts = False
    places_cards = True

    def __init__(self) -> None:
        self.started: list[FakeWorker] = []
        self.locks: list = []          # the locks that must be free at every start

    def start(self, spec: WorkerLaunchSpec, log_handle) -> FakeWorker:
        held = [lock for lock in self.locks if lock._is_owned()]
        assert not held, f"a worker started while a lock was held: {held}"
        w = FakeWorker(spec, pid=10_000 + len(self.started))
        self.started.append(w)
        return w

    def check_image(self, image: dict) -> None:
        pass

    def close(self) -> None:
        pass


_POLICY = '''import seq
@seq.policy()
class P:
    @seq.infer
    def infer(self, inputs):
        return {}
'''


def fake_gateway(tmp_path, lease_ttl_s: float):
    """A Gateway over a FakeLauncher and a hand-moved Clock, in process, with a do-nothing policy
    file to deploy (data dir ``tmp_path/home``; the health check only pings when a test asks).
    Returns (gateway, clock, launcher, policy path); ``gateway.close()`` when done."""
    from sequence_ai_server.common.config import ServerConfig
    from sequence_ai_server.gateway.controller import Gateway
    policy = tmp_path / "policy.py"
    policy.write_text(_POLICY)
    clock, launcher = Clock(), FakeLauncher()
    config = ServerConfig(data_dir=tmp_path / "home", lease_ttl_s=lease_ttl_s, health_interval_s=1e9, cpu_workers=8)
    gw = Gateway(config=config, launcher=launcher, clock=clock)
    launcher.locks = [gw.supervisor._lock, gw.sessions._lock, gw.deployments._lock]
    return gw, clock, launcher, policy
