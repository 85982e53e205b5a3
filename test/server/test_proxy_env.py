"""A site proxy in the environment never carries the hops between a gateway and its workers.

A robot or workstation behind a site proxy has ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY``
set, and httpx sends even a request for 127.0.0.1 through it unless ``NO_PROXY`` names the
address. Every hop between a gateway and its workers (``common/plain_http.client_options``) must
go direct: the act proxy, the health pings, a worker's secrets fetch (it carries the worker
secret), the revocation push to a worker and the worker's revocation poll (a revoked session is
refused at once, not when its lease runs out), a Ray group's fan-out front to its members; so must
the ``seq`` CLI's gateway client. Here the proxy variables point at a listener that counts what
reaches it and answers nothing; a real gateway and its workers run with them, and the group front
(``launchers/ray_node.GroupFront``, no Ray needed) in this process.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from _servers import ECHO_POLICY, GatewayProcess, _env, echo_observation, send_json

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


class _Trap:
    """A listener on 127.0.0.1 that records the first line of each connection and closes it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.seen: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(1.0)
                try:
                    self.seen.append(conn.recv(200).split(b"\r\n")[0])
                except OSError:
                    self.seen.append(b"(nothing read)")

    def close(self) -> None:
        self.sock.close()


def _declares_a_secret(tmp_path: Path) -> str:
    """The echo policy, declaring secret ``site`` and refusing to load without its value."""
    src = Path(ECHO_POLICY).read_text()
    marker = "    def load(self, weights_dir):\n"
    assert src.count(marker) == 1 and src.count("@seq.policy(\n") == 1
    check = "        assert os.environ.get('SITE_TOKEN') == 'abc123', 'SITE_TOKEN not injected'\n"
    src = src.replace(marker, marker + check)
    src = src.replace("@seq.policy(\n", '@seq.policy(secrets=[seq.Secret.from_name("site")],\n')
    path = tmp_path / "declares_secret.py"
    path.write_text("import os\n" + src)
    return str(path)


def test_a_proxy_in_the_environment_carries_none_of_the_gateway_worker_hops(tmp_path):
    trap = _Trap()
    env = {name: trap.url for name in PROXY_VARIABLES}
    env.update(NO_PROXY="", no_proxy="", SEQ_REVOCATION_POLL_S="0.2")
    (tmp_path / "gw").mkdir()
    gw = GatewayProcess.start(tmp_path / "gw", env=env)
    try:
        assert gw.client.put("/v1/secrets/site", json={"env": {"SITE_TOKEN": "abc123"}}).status_code == 200
        d = gw.deploy(_declares_a_secret(tmp_path), "site")        # the worker fetches its secret
        assert d["status"] == "ready", d.get("error")

        r = gw.client.post("/v1/act", json={"model": "site", "observation": echo_observation()})
        assert r.status_code == 200 and r.json()["action_chunk"], r.text          # the act proxy

        # the seq CLI's gateway client (seq/gateway_client.py), run with the same environment
        shown = subprocess.run([sys.executable, "-c", "from seq.cli import main; main()", "policy", "status", "site"],
                               capture_output=True, text=True, env=_env({**env, **gw.env()}), timeout=60)
        assert shown.returncode == 0 and "ready" in shown.stdout, shown.stdout + shown.stderr

        c = gw.connect_ready("site")
        act = {"observation": echo_observation()}
        auth = {"Authorization": f"Bearer {c['direct_secret']}"}
        assert httpx.post(c["worker_url"] + "/act", json=act, headers=auth, timeout=30).status_code == 200
        assert gw.client.delete(f"/v1/sessions/{c['session_id']}").status_code == 200
        r = httpx.post(c["worker_url"] + "/act", json=act, headers=auth, timeout=30)   # the push, at once
        assert r.status_code == 401 and r.json()["details"]["reason"] == "session_ended", r.text

        # an absence needs a window: 1 s is five of the worker's revocation polls (0.2 s here) and
        # the gateway's health pings; without client_options each would have reached the trap
        time.sleep(1.0)
        assert trap.seen == [], trap.seen
    finally:
        gw.close()
        trap.close()



class _Member(BaseHTTPRequestHandler):
    """A group member's worker: every POST answers ``{"rank": RANK}``."""
    rank = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        send_json(self, 200, {"rank": self.rank})

    def log_message(self, *args) -> None:
        pass


def test_a_ray_groups_front_reaches_its_members_past_a_proxy_in_the_environment(monkeypatch):
    from sequence_ai_server.launchers.ray_node import GroupFront
    trap = _Trap()
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, trap.url)
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("no_proxy", "")
    members = [ThreadingHTTPServer(("127.0.0.1", 0), type("M", (_Member,), {"rank": r})) for r in (0, 1)]
    for m in members:
        threading.Thread(target=m.serve_forever, daemon=True).start()
    front = GroupFront("127.0.0.1", [f"http://127.0.0.1:{m.server_address[1]}" for m in members])
    try:
        with httpx.Client(trust_env=False) as client:      # this test's own client goes direct
            r = client.post(front.url + "/act", json={"observation": {}}, timeout=30)
        assert r.status_code == 200 and r.json() == {"rank": 0}, r.text      # rank 0's answer, sent to both
        assert trap.seen == [], trap.seen
    finally:
        front.close()
        front.thread.join(10)
        for m in members:
            m.shutdown()
            m.server_close()
        trap.close()
