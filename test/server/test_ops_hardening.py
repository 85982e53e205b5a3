"""Operations, image environments and the delay fields under bad input and races: numbers the
state database cannot hold and long window strings are 400s (not a 500 or a stalled gateway),
two connects at a worker limit start one worker, an image cannot smuggle installer options or
override the platform's environment, a prefix of strings or booleans is refused naming the
field. Real gateway and worker processes on loopback where a route is involved."""
from __future__ import annotations

import threading
import time

import pytest

from _servers import POLICIES, GatewayProcess
from sequence_ai_server.launchers.envs import EnvBuilder, ImageStepRefused, image_from_source
from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.worker.act_body import _prefix
from sequence_ai_server.ops.schedule import MAX_WINDOW_CHARS, parse_window

OPS = str(POLICIES / "ops_policy.py")


@pytest.fixture(scope="module")
def _module_gateway(tmp_path_factory):
    gw = GatewayProcess.start(tmp_path_factory.mktemp("ops-hardening"))
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture
def gateway(_module_gateway):
    """One gateway process for the module (the tests here read no gateway-wide figure but the
    limits, which each test finds cleared): what a test deployed is removed and the account's
    limits cleared when it ends."""
    gw = _module_gateway
    names = lambda: {d["name"] for d in gw.client.get("/v1/deployments").json()["deployments"]}  # noqa: E731
    before = names()
    try:
        yield gw
    finally:
        for name in sorted(names() - before):
            gw.client.post(f"/v1/deployments/{name}/remove", params={"force": "true"}).raise_for_status()
        gw.client.post("/v1/account/limits", json={"clear": ["all"]}).raise_for_status()


def test_a_long_window_is_refused_before_the_pattern_runs():
    with pytest.raises(ValueError, match=f"at most {MAX_WINDOW_CHARS} characters"):
        parse_window("Mon" + " " * 3000 + "x")
    assert parse_window("Mon-Fri 08:00-18:00").start == 8 * 60


def test_a_prefix_of_strings_booleans_or_nulls_is_refused_naming_the_field():
    for bad in ([["1.0", "2.0"]], [[True, False]], [[1.0, None]], [[10 ** 400, 1.0]], [[1.0], [1.0, 2.0]]):
        with pytest.raises(ApiError) as err:
            _prefix(bad, None)
        assert err.value.code == "invalid_request" and err.value.details["field"] == "prefix", bad
    assert _prefix([[1, 2.5]], None).tolist() == [[1.0, 2.5]]


@pytest.mark.parametrize("step, what", [
    ({"kind": "pip_install", "args": ["tomli==2.4.0", "--target=/tmp/elsewhere"]}, "installer option"),
    ({"kind": "uv_pip_install", "args": ["-r/etc/passwd"]}, "installer option"),
    ({"kind": "env", "args": [], "env": {"PYTHONPATH": "/tmp/x"}}, "set by the platform"),
    ({"kind": "env", "args": [], "env": {"SEQ_WORKER_SECRET": "x"}}, "set by the platform"),
    ({"kind": "env", "args": [], "env": {"UV_PYTHON_DOWNLOADS": "automatic"}}, "set by the platform"),
])
def test_an_image_cannot_pass_installer_options_or_override_the_platforms_environment(tmp_path, step, what):
    with pytest.raises(ImageStepRefused, match=what) as err:
        EnvBuilder(tmp_path).prepare({"base": "debian_slim", "python": "3.11", "steps": [step]}, "p", 1)
    assert err.value.status == 400 and err.value.details["step"] == 1
    assert not (tmp_path / "envs").exists()


def test_an_option_written_in_a_policy_file_is_refused_at_deploy(tmp_path):
    f = tmp_path / "p.py"
    f.write_text("import seq\n@seq.policy(image=seq.Image.debian_slim().pip_install('--index-url=http://127.0.0.1:9/x'))\n"
                 "class P(seq.Policy):\n    pass\n")
    with pytest.raises(ImageStepRefused, match="installer option"):
        EnvBuilder(tmp_path).prepare(image_from_source(str(f)), "p", 1)


def test_numbers_the_database_cannot_hold_and_long_windows_are_400s(gateway):
    gw = gateway
    assert gw.deploy(OPS, "big")["status"] == "ready"
    for path, body in (("/v1/account/limits", {"max_workers": 2 ** 70}),
                       ("/v1/account/limits", {"max_cards": 2 ** 63}),
                       ("/v1/account/limits", '{"worker_hours_per_day": NaN}'),
                       ("/v1/deployments/big/scale", {"min": 2 ** 64}),
                       ("/v1/deployments/big/scale", {"min": 1, "during": "Mon" + " " * 40000 + "x"}),
                       ("/v1/alerts", '{"url": "http://127.0.0.1:9/h", "p95_ms": Infinity}')):
        t0 = time.monotonic()
        if isinstance(body, str):           # Python's JSON reader takes NaN / Infinity
            r = gw.client.post(path, content=body, headers={"Content-Type": "application/json"}, timeout=120)
        else:
            r = gw.client.post(path, json=body, timeout=120)
        assert r.status_code == 400 and r.json()["code"] == "invalid_request", (path, r.status_code, r.text[:300])
        assert time.monotonic() - t0 < 30, path
    assert gw.client.get("/v1/account/limits").json()["limits"] == []
    assert gw.client.get("/v1/deployments/big/scale").json()["scale"] is None


def test_connects_at_the_worker_limit_at_once_start_one_worker(gateway):
    gw = gateway
    names = ("ra", "rb", "rc", "rd")
    for name in names:
        assert gw.deploy(OPS, name)["status"] == "ready"
    r = gw.client.post("/v1/account/limits", json={"max_workers": 1})
    assert r.status_code == 200, r.text
    for _ in range(2):
        deadline = time.monotonic() + 60
        while any(gw.status(n)["status"] != "stopped" for n in names):     # all idle out (2 s)
            assert time.monotonic() < deadline, [gw.status(n) for n in names]
            time.sleep(0.2)
        barrier, out = threading.Barrier(len(names)), {}

        def go(name):
            barrier.wait()
            out[name] = gw.connect(name)
        threads = [threading.Thread(target=go, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        refused = [r.json() for r in out.values() if r.status_code == 402]
        admitted = [r.status_code for r in out.values() if r.status_code != 402]
        assert len(admitted) == 1 and admitted[0] in (200, 503), {n: r.text[:200] for n, r in out.items()}
        assert all(b["details"]["limit"] == "max_workers" for b in refused)
        for r in out.values():
            if r.status_code == 200:
                gw.client.delete(f"/v1/sessions/{r.json()['session_id']}")


class _Hang:
    """A loopback TCP server that accepts connections and never answers (a hung webhook receiver)."""

    def __init__(self):
        import socket
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


def test_a_hanging_webhook_receiver_does_not_stall_the_gateway(gateway):
    gw = gateway
    hang = _Hang()
    try:
        hook = gw.client.post("/v1/alerts", json={"url": f"http://127.0.0.1:{hang.port}/hook"}).json()
        import httpx

        def test_delivery():
            try:
                httpx.post(f"{gw.url}/v1/alerts/{hook['id']}/test", headers=gw.client.headers, timeout=120)
            except httpx.HTTPError:
                pass
        for _ in range(8):
            threading.Thread(target=test_delivery, daemon=True).start()
        deadline = time.monotonic() + 10
        while len(hang.held) < 4:                        # the deliveries hang in the receiver
            assert time.monotonic() < deadline, len(hang.held)
            time.sleep(0.05)
        t0 = time.monotonic()
        assert gw.client.get("/v1/account/limits", timeout=30).status_code == 200       # a pooled-thread route
        r = gw.client.post("/v1/connect", json={"model": "nothing-here"}, timeout=30)    # connect runs on the pool
        assert r.status_code == 404 and time.monotonic() - t0 < 8.0
    finally:
        hang.close()
