"""Traffic between versions (issue 5): `seq policy traffic NAME v2=30 v1=70` splits new sessions
between versions in that proportion, a session keeps its version for its lease renewals, a robot
key pinned to a version gets every new session there, --unpin/--clear/rollback send sessions
back to the split/the serving version, and the request body limit answers 413. Real gateway,
real worker processes per version, real `seq` CLI."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from _servers import ECHO_POLICY, echo_observation, seq_cli


def _variant(tmp: Path, tag: str) -> str:
    """The echo policy with a comment appended: a new version of the same deployment."""
    path = tmp / "echo_traffic.py"
    path.write_text(Path(ECHO_POLICY).read_text() + f"\n# variant {tag}\n")
    return str(path)


def _session(gw, name: str, key: str | None = None, timeout: float = 60.0) -> dict:
    """Connect (waiting out 503 warming, e.g. a split's version still loading) and return the body."""
    headers = {"Authorization": f"Bearer {key or gw.api_key}"}
    deadline = time.monotonic() + timeout
    while True:
        r = gw.client.post("/v1/connect", json={"model": name, "params": {}}, headers=headers)
        if r.status_code == 200:
            return r.json()
        assert r.status_code == 503 and r.json()["code"] == "warming" and time.monotonic() < deadline, r.text
        time.sleep(0.1)


def _close(gw, conn: dict, key: str | None = None) -> None:
    r = gw.client.delete(f"/v1/sessions/{conn['session_id']}", headers={"Authorization": f"Bearer {key or gw.api_key}"})
    assert r.status_code == 200 and r.json()["closed"] is True


def _traffic(gw, **body) -> dict:
    """POST /v1/deployments/canary/traffic (what `seq policy traffic` sends)."""
    r = gw.client.post("/v1/deployments/canary/traffic", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _versions_of(gw, name: str, n: int, key: str | None = None) -> list[int]:
    """The versions of ``n`` sessions opened (and closed) one after another."""
    out = []
    for _ in range(n):
        conn = _session(gw, name, key)
        out.append(conn["version"])
        _close(gw, conn, key)
    return out


@pytest.fixture(scope="module")
def two_versions(shared_module_gateway, tmp_path_factory):
    """Deployment "canary" with v1 kept and v2 serving."""
    gw = shared_module_gateway
    tmp = tmp_path_factory.mktemp("traffic")
    assert gw.deploy(_variant(tmp, "one"), "canary")["version"] == 1
    d = gw.deploy(_variant(tmp, "two"), "canary")
    assert d["version"] == 2 and d["status"] == "ready"
    return gw


def test_the_router_keeps_200_picks_of_a_split_on_its_share_at_every_step():
    """The smooth weighted round robin the gateway picks versions with, in process: 30/70 over 200
    sessions is never more than one session off its share, and 60/140 at the end; a new split
    counts afresh. (The real gateway below proves the same picks over 40 sessions.)"""
    from sequence_ai_server.gateway.traffic import TrafficRouter

    router, split = TrafficRouter(), {1: 30.0, 2: 70.0}
    for n in range(1, 201):
        router.admitted("canary", split, router.pick("canary", split))
        assert abs(router.counts("canary", split)[1] - 0.3 * n) <= 1, (n, router.counts("canary", split))
    assert router.counts("canary", split) == {1: 60, 2: 140}
    assert router.counts("canary", {1: 50.0, 2: 50.0}) == {1: 0, 2: 0}


def test_a_canary_split_over_40_sessions_lands_within_5_percent_of_the_asked_share(two_versions):
    gw = two_versions
    r = seq_cli(gw, "policy", "traffic", "canary", "v1=30", "v2=70")
    assert r.returncode == 0, r.stderr
    assert "v1" in r.stdout and "30 %" in r.stdout and "70 %" in r.stdout
    first = _session(gw, "canary")          # waits while v1's worker loads beside the serving v2
    _close(gw, first)
    versions = [first["version"]] + _versions_of(gw, "canary", 39)
    share_v1 = versions.count(1) / len(versions)
    assert set(versions) == {1, 2}
    assert abs(share_v1 - 0.30) <= 0.05, share_v1
    t = gw.client.get("/v1/deployments/canary/traffic").json()
    assert {s["version"]: s["sessions"] for s in t["split"]} == {1: versions.count(1), 2: versions.count(2)}
    assert {s["version"]: s["worker"] for s in t["split"]} == {1: "ready", 2: "serving"}
    assert [(w["version"], w["worker"], w["sessions"]) for w in t["side_workers"]] == [(1, "ready", 0)]
    r = seq_cli(gw, "policy", "traffic", "canary")
    assert r.returncode == 0 and f"{versions.count(1)}" in r.stdout and "ready" in r.stdout


def test_a_session_keeps_its_version_and_worker_through_lease_renewals(two_versions):
    gw = two_versions
    _traffic(gw, split={"v1": 50, "v2": 50})
    conns = [_session(gw, "canary") for _ in range(4)]
    by_version = {c["version"]: c for c in conns}
    assert set(by_version) == {1, 2}
    assert by_version[1]["worker_url"] != by_version[2]["worker_url"]
    _traffic(gw, split={"v2": 100})                                      # the split moves on
    for c in conns:
        renewed = gw.client.post(f"/v1/sessions/{c['session_id']}/renew")
        assert renewed.status_code == 200, renewed.text
        body = renewed.json()
        assert (body["version"], body["worker_url"]) == (c["version"], c["worker_url"])
        act = httpx.post(body["worker_url"] + "/act", json={"observation": echo_observation(), "params": {}},
                         headers={"Authorization": f"Bearer {body['direct_secret']}"}, timeout=30)
        assert act.status_code == 200 and len(act.json()["action_chunk"]["actions"]) == 10
    for c in conns:
        _close(gw, c)
    assert _versions_of(gw, "canary", 5) == [2] * 5


def test_a_pinned_robot_key_gets_every_new_session_on_its_version_until_unpinned(two_versions):
    gw = two_versions
    robot_key = gw.client.post("/v1/keys", json={"name": "arm-7", "deployment": "canary"}).json()["key"]
    _traffic(gw, split={"v2": 100})
    r = seq_cli(gw, "policy", "traffic", "canary", "--pin", "arm-7", "v1")
    assert r.returncode == 0, r.stderr
    assert "arm-7 -> v1" in r.stdout
    assert _versions_of(gw, "canary", 10, key=robot_key) == [1] * 10
    assert _versions_of(gw, "canary", 5) == [2] * 5            # other keys follow the split
    r = seq_cli(gw, "policy", "traffic", "canary", "--unpin", "arm-7")
    assert r.returncode == 0 and "arm-7" not in r.stdout
    assert _versions_of(gw, "canary", 5, key=robot_key) == [2] * 5
    # only a key bound to this deployment can be pinned, to a kept version
    r = seq_cli(gw, "policy", "traffic", "canary", "--pin", "local", "v1")
    assert r.returncode == 5 and "error[invalid_request]" in r.stderr and "not bound to canary" in r.stderr
    r = seq_cli(gw, "policy", "traffic", "canary", "--pin", "arm-7", "v9")
    assert r.returncode == 4 and "error[not_found]: canary has no serving or kept version v9" in r.stderr


def test_clear_and_rollback_send_every_new_session_to_the_serving_version(two_versions):
    gw = two_versions
    robot_key = gw.client.post("/v1/keys", json={"name": "arm-8", "deployment": "canary"}).json()["key"]
    _traffic(gw, split={"v1": 50, "v2": 50})
    _traffic(gw, pin="arm-8", version="v1")
    assert set(_versions_of(gw, "canary", 6)) == {1, 2}
    r = seq_cli(gw, "policy", "traffic", "canary", "--clear")
    assert r.returncode == 0 and "100 %" in r.stdout and "pinned" not in r.stdout
    assert _versions_of(gw, "canary", 6) == [2] * 6
    assert _versions_of(gw, "canary", 3, key=robot_key) == [2] * 3
    deadline = time.monotonic() + 20    # no split or pin needs v1 any more: its side worker stops
    while gw.client.get("/v1/deployments/canary/traffic").json()["side_workers"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # a rollback takes over every new session and drops a split set before it
    _traffic(gw, split={"v1": 10, "v2": 90})
    r = seq_cli(gw, "policy", "rollback", "canary", "--to", "1")
    assert r.returncode == 0, r.stderr
    assert gw.client.get("/v1/deployments/canary/traffic").json()["split"] == []
    assert _versions_of(gw, "canary", 6) == [1] * 6
    r = seq_cli(gw, "policy", "traffic", "canary", "v1=abc")
    assert r.returncode == 5 and "error[invalid_request]: the share of v1 ('abc') is not a number" in r.stderr


def test_a_body_over_the_gateway_limit_is_refused_with_413_in_the_common_error_shape(shared_module_gateway):
    gw = shared_module_gateway
    big = b"x" * (32 * 1024 * 1024 + 1)
    r = gw.client.post("/v1/act", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    body = r.json()
    assert body["code"] == "payload_too_large" and body["retryable"] is False
    assert "at most 33554432 bytes" in body["detail"] and body["request_id"].startswith("req_") and body["hint"]
    assert gw.client.get("/healthz").status_code == 200    # the gateway serves on


def test_a_chunked_body_over_the_gateway_limit_is_refused_with_413_not_a_parse_error(shared_module_gateway):
    """No Content-Length: the body is counted as it streams; a JSON route and the raw volume
    upload route both answer 413 payload_too_large (not 400 'error parsing the body' or 500)."""
    gw = shared_module_gateway

    def chunks():
        for _ in range(33):
            yield b" " * (1024 * 1024)

    for method, path, params in (("POST", "/v1/connect", None),
                                 ("PUT", "/v1/volumes/big/uploads/1", {"path": "a", "offset": 0})):
        r = gw.client.request(method, path, content=chunks(), params=params, headers={"Content-Type": "application/json"})
        assert r.status_code == 413, (path, r.text)
        assert r.json()["code"] == "payload_too_large" and "at most 33554432 bytes" in r.json()["detail"]
    assert gw.client.get("/healthz").status_code == 200


def test_shares_whose_sum_overflows_a_float_are_refused_naming_the_fix():
    """Each 1e308 is finite but two add up to inf, which would show every version as 0 %."""
    from sequence_ai_server.gateway.traffic import TrafficError, parse_split

    with pytest.raises(TrafficError, match="more than a float holds; give percentages"):
        parse_split({"v1": 1e308, "v2": 1e308})
    assert parse_split({"v1": 1e308}) == {1: 1e308}
    assert parse_split({"v2": "30", "1": 30}) == {2: 30.0, 1: 30.0}     # weights need not sum to 100


def test_a_split_that_needs_a_worker_past_seq_max_gpus_is_refused_and_changes_nothing(tmp_path):
    """One card (SEQ_MAX_GPUS=1) and v2 serving: a split naming v1 would start a second worker.
    It is refused with gpu_limit_reached before anything is stored (it used to start v1 anyway)."""
    from _servers import GatewayProcess

    gw = GatewayProcess.start(tmp_path, env={"SEQ_MAX_GPUS": "1"})
    try:
        gw.deploy(_variant(tmp_path, "one"), "capped")
        assert gw.deploy(_variant(tmp_path, "two"), "capped")["version"] == 2
        r = gw.client.post("/v1/deployments/capped/traffic", json={"split": {"v1": 10, "v2": 90}})
        assert r.status_code != 200 and r.json()["code"] == "gpu_limit_reached", r.text
        assert "SEQ_MAX_GPUS" in r.json()["detail"] and "traffic unchanged" in r.json()["detail"] and r.json()["hint"]
        view = gw.client.get("/v1/deployments/capped/traffic").json()
        assert view["split"] == [] and view["side_workers"] == []
        assert _versions_of(gw, "capped", 3) == [2, 2, 2]
    finally:
        gw.close()
