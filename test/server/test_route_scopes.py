"""Who may call what: every gateway route has a stated scope in docs/design.md's table, and the
real gateway enforces it.

- The app's routes (walked in this process, ``create_app``) and the table's rows must be the same
  set: a new route without a row (or a row whose route is gone) fails here.
- Against a real gateway process: a robot key gets 401 ``key_bound`` on every ``account`` route,
  even for its own deployment; on every ``robot`` route that names a deployment it gets 401
  ``key_bound`` for another one; ``worker secret`` routes refuse API keys; ``none`` routes answer
  without a key.
"""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from _servers import ECHO_POLICY, ROOT, GatewayProcess

DESIGN = ROOT / "docs" / "design.md"
SCOPES = ("none", "robot", "account", "worker secret")
_ROW = re.compile(r"^\| (GET|POST|PUT|DELETE|PATCH) \| (/\S*) \| ([a-z ]+?) \|")
# values for path parameters: {name} is the robot key's own deployment unless a test says otherwise
_PARAMS = {"version": "1", "ref": "nobody", "session_id": "sess_0000", "episode_id": "ep-1"}
ROBOT_DEPLOYMENT = "echo"


def doc_routes() -> dict[tuple[str, str], str]:
    """``{(method, path): scope}`` from the table in docs/design.md."""
    rows = {}
    for line in DESIGN.read_text().splitlines():
        m = _ROW.match(line)
        if m:
            key = (m.group(1), m.group(2))
            assert key not in rows, f"{key} is in the table twice"
            rows[key] = m.group(3).strip()
    return rows


DOC = doc_routes()


def _url(path: str, name: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: name if m.group(1) == "name" else _PARAMS[m.group(1)], path)


def test_the_table_lists_routes_with_a_known_scope():
    assert len(DOC) >= 40, "the route table in docs/design.md was not found"
    unknown = {k: v for k, v in DOC.items() if v not in SCOPES}
    assert not unknown, f"scopes must be one of {SCOPES}: {unknown}"


def _walk(routes, prefix: str = ""):
    """Every (method, path) under ``routes``; included routers are followed whether FastAPI copied
    their routes into the app (older releases) or keeps them as an included-router node (newer)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            context = getattr(route, "include_context", None)
            yield from _walk(inner.routes, prefix + (getattr(context, "prefix", "") or ""))
        elif hasattr(route, "routes") and not hasattr(route, "methods"):    # a Mount
            yield from _walk(route.routes, prefix + getattr(route, "path", ""))
        else:
            for method in getattr(route, "methods", None) or ():
                if method != "HEAD":
                    yield method, prefix + route.path


def test_every_gateway_route_is_in_the_docs_table_with_a_scope(tmp_path):
    from sequence_ai_server.gateway.app import create_app

    app = create_app(tmp_path / "home")
    try:
        routes = set(_walk(app.routes))
    finally:
        app.state.gateway.close()
    assert ("POST", "/v1/deployments/{name}/capture/export") in routes   # the walk sees every router
    missing = sorted(routes - set(DOC))
    stale = sorted(set(DOC) - routes)
    assert not missing, (f"gateway routes without a row in docs/design.md's scope table: {missing}; "
                         "add `| METHOD | PATH | none|robot|account|worker secret | rule |`")
    assert not stale, f"rows in docs/design.md's scope table for routes the gateway no longer has: {stale}"


# ---------------------------------------------------------------- the real gateway

@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    g = GatewayProcess.start(tmp_path_factory.mktemp("scopes"))
    try:
        assert g.deploy(ECHO_POLICY, ROBOT_DEPLOYMENT)["status"] == "ready"
        r = g.client.post("/v1/keys", json={"name": "arm-1", "deployment": ROBOT_DEPLOYMENT})
        r.raise_for_status()
        g.robot_key = r.json()["key"]
        yield g
    finally:
        g.close()


def _call(gw, method: str, path: str, key, body: bytes = b"{}") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    kw = {} if method == "GET" else {"content": body, "headers": {**headers, "Content-Type": "application/json"}}
    if path == "/v1/volumes/{name}/uploads/{version}":
        kw = {"content": b"x", "params": {"path": "a.bin", "offset": 0}}
    headers = kw.pop("headers", headers)
    name = ROBOT_DEPLOYMENT
    return httpx.request(method, gw.url + _url(path, name), headers=headers, timeout=30, **kw)


ACCOUNT = sorted(k for k, v in DOC.items() if v == "account")


@pytest.mark.parametrize("method,path", ACCOUNT, ids=[f"{m} {p}" for m, p in ACCOUNT])
def test_a_robot_key_gets_401_key_bound_on_every_account_route(gw, method, path):
    """Its own deployment in the path, a well-formed body and a malformed one: 401 key_bound
    each time (the scope is checked before the body is read)."""
    for body in (b"{}", b"{not json"):
        r = _call(gw, method, path, gw.robot_key, body)
        assert r.status_code == 401, f"{method} {path} with a robot key: {r.status_code} {r.text[:300]}"
        err = r.json()
        assert err["code"] == "unauthorized" and err["details"]["reason"] == "key_bound", err
        assert err["details"]["deployment"] == ROBOT_DEPLOYMENT and "account key" in err["hint"]
        assert r.headers["X-Request-ID"] == err["request_id"]


KEYED = sorted(k for k, v in DOC.items() if v in ("robot", "account"))


@pytest.mark.parametrize("method,path", KEYED, ids=[f"{m} {p}" for m, p in KEYED])
def test_credentials_are_checked_before_the_body_is_read(gw, method, path):
    """No key, or an unknown one, with a malformed body: 401, never the body's 400."""
    for key in (None, "seq_local_not-a-key"):
        r = _call(gw, method, path, key, b"{not json")
        assert r.status_code == 401 and r.json()["code"] == "unauthorized", (key, r.status_code, r.text[:300])


def test_the_scopes_the_code_enforces_are_the_documented_ones(tmp_path):
    """Scopes read off each route's own dependencies (what CredentialsFirst enforces) = the table."""
    from sequence_ai_server.gateway.app import create_app
    from sequence_ai_server.gateway.middleware import route_scopes

    app = create_app(tmp_path / "home")
    try:
        mw = next(m for m in app.user_middleware if m.cls.__name__ == "CredentialsFirst")
        enforced = {(m, p): sc for m, p, sc in route_scopes(app.routes, mw.kwargs["markers"])}
    finally:
        app.state.gateway.close()
    as_doc = {"key": "robot", "account": "account", "worker": "worker secret", "none": "none"}
    differ = {k: (as_doc[v], DOC.get(k)) for k, v in enforced.items() if as_doc[v] != DOC.get(k)}
    assert not differ, f"(enforced, documented) scopes differ: {differ}"
    assert len(enforced) == len(DOC)


ROBOT_NAMED = sorted(k for k, v in DOC.items() if v == "robot" and "{name}" in k[1])


@pytest.mark.parametrize("method,path", ROBOT_NAMED, ids=[f"{m} {p}" for m, p in ROBOT_NAMED])
def test_a_robot_key_gets_401_key_bound_on_another_deployment(gw, method, path):
    headers = {"Authorization": f"Bearer {gw.robot_key}"}
    r = httpx.request(method, gw.url + _url(path, "other"), headers=headers, timeout=30,
                      **({} if method == "GET" else {"json": {}}))
    assert r.status_code == 401 and r.json()["details"]["reason"] == "key_bound", r.text[:300]
    own = httpx.request(method, gw.url + _url(path, ROBOT_DEPLOYMENT), headers=headers, timeout=30,
                        **({} if method == "GET" else {"json": {}}))
    assert own.status_code == 200, f"{method} {path} on its own deployment: {own.status_code} {own.text[:300]}"


def test_robot_routes_with_the_deployment_in_the_body_refuse_another_one(gw):
    headers = {"Authorization": f"Bearer {gw.robot_key}"}
    for path, body in (("/v1/connect", {"model": "other"}), ("/v1/act", {"model": "other", "observation": {}}),
                       ("/v1/episodes/ep-1/label", {"model": "other", "success": True})):
        r = httpx.post(gw.url + path, json=body, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["details"]["reason"] == "key_bound", (path, r.text[:300])


def test_a_robot_key_closes_and_renews_only_the_sessions_it_opened(gw):
    """Two robot keys of one deployment: neither may renew or close the other's session."""
    r = gw.client.post("/v1/keys", json={"name": "arm-2", "deployment": ROBOT_DEPLOYMENT})
    r.raise_for_status()
    mine, theirs = gw.robot_key, r.json()["key"]
    c = httpx.post(gw.url + "/v1/connect", json={"model": ROBOT_DEPLOYMENT},
                   headers={"Authorization": f"Bearer {theirs}"}, timeout=30)
    assert c.status_code == 200, c.text
    sid = c.json()["session_id"]
    h = {"Authorization": f"Bearer {mine}"}
    assert httpx.post(f"{gw.url}/v1/sessions/{sid}/renew", headers=h, timeout=30).status_code == 404
    assert httpx.delete(f"{gw.url}/v1/sessions/{sid}", headers=h, timeout=30).status_code == 404
    again = httpx.post(f"{gw.url}/v1/sessions/{sid}/renew", headers={"Authorization": f"Bearer {theirs}"}, timeout=30)
    assert again.status_code == 200 and again.json()["session_id"] == sid      # still open, still theirs
    closed = httpx.delete(f"{gw.url}/v1/sessions/{sid}", headers={"Authorization": f"Bearer {theirs}"}, timeout=30)
    assert closed.json() == {"session_id": sid, "closed": True}


WORKER = sorted(k for k, v in DOC.items() if v == "worker secret")


@pytest.mark.parametrize("method,path", WORKER, ids=[f"{m} {p}" for m, p in WORKER])
def test_worker_secret_routes_refuse_api_keys(gw, method, path):
    for key in (gw.robot_key, gw.api_key, None):
        r = _call(gw, method, path, key)
        assert r.status_code == 401 and r.json()["code"] == "unauthorized", (key and key[:12], r.text[:300])


NONE = sorted(k for k, v in DOC.items() if v == "none")


@pytest.mark.parametrize("method,path", NONE, ids=[f"{m} {p}" for m, p in NONE])
def test_open_routes_answer_without_a_key(gw, method, path):
    r = _call(gw, method, path, None)
    assert r.status_code == 200, r.text[:300]


def test_the_refused_calls_changed_nothing(gw):
    """After every refusal above: the deployment still serves, the keys are all there."""
    d = gw.status(ROBOT_DEPLOYMENT)
    assert d["status"] == "ready" and d["version"] == 1
    names = {k["name"] for k in gw.client.get("/v1/keys").json()["keys"] if k["revoked_at"] is None}
    assert {"local", "arm-1", "arm-2"} <= names
    assert (gw.data_dir / "state.db").exists() and (gw.data_dir / "api_key").exists()


# ---------------------------------------------------------------- the worker's own routes

_WORKER_ROW = re.compile(r"^\| worker (GET|POST|PUT|DELETE|PATCH|WS) \| (/\S*) \| ([a-z ]+?) \|")
WORKER_SCOPES = ("none", "direct secret", "worker secret")


def test_every_worker_route_is_in_the_worker_table_with_a_scope(tmp_path, monkeypatch):
    """HTTP and websocket routes of the worker app = the "Worker routes" rows of docs/design.md."""
    from starlette.routing import WebSocketRoute

    from sequence_ai_server.worker.asgi import WorkerState, create_app

    for name in ("SEQ_CAPTURE_DIR", "SEQ_WORKER_SECRET_FILE", "SEQ_WORKER_ACTIVITY_FILE"):
        monkeypatch.delenv(name, raising=False)
    app = create_app(WorkerState("w"), "s3cret")
    routes = set()
    for route in app.routes:
        if isinstance(route, WebSocketRoute):
            routes.add(("WS", route.path))
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                routes.add((method, route.path))
    doc = {}
    for line in DESIGN.read_text().splitlines():
        m = _WORKER_ROW.match(line)
        if m:
            doc[(m.group(1), m.group(2))] = m.group(3).strip()
    assert ("WS", "/act/ws") in routes and ("POST", "/act") in routes
    assert {v for v in doc.values()} <= set(WORKER_SCOPES), doc
    assert sorted(routes - set(doc)) == [], "worker routes without a row in docs/design.md's Worker routes table"
    assert sorted(set(doc) - routes) == [], "Worker routes rows for routes the worker no longer has"
