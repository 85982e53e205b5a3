"""The gateway's composed services, in process: a Gateway over a FakeLauncher (workers that are
objects emitting the typed launch events of launchers/base.py, no processes) and an injected
clock, driven by ``Gateway.tick(now)`` with no sleeps. These prove the composition: the
supervisor's events reach the sessions, ops, traffic and health, connect answers warming until a
worker is ready, leases expire on the tick, idle stops and warm floors, builds and a jammed
worker's replacement take over, event handlers run with no supervisor lock held, and no worker
is started while a service holds its lock."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.controller import Gateway
from sequence_ai_server.gateway.events import WorkerCrashed, WorkerStopped, WorkerTookOver
from sequence_ai_server.gateway.schemas import ConnectRequest, DeployRequest, TrafficUpdate
from _fake_workers import FakeWorker, fake_gateway

T0 = 1_800_000_000.0
LEASE_S = 30.0


def _spec(**extra) -> dict:
    return {"contract": {"action": None, "observation": None}, "params": [], **extra}


@pytest.fixture
def env(tmp_path):
    gw, clock, launcher, policy = fake_gateway(tmp_path, lease_ttl_s=LEASE_S)
    events: list = []
    for kind in (WorkerStopped, WorkerCrashed, WorkerTookOver):
        gw.supervisor.on(kind, events.append)
    alerts: list = []
    gw.ops.alerts.emit = lambda event, deployment, details, **kw: alerts.append((event, deployment, details))
    yield gw, clock, launcher, policy, events, alerts
    gw.close()


def _deploy(gw: Gateway, policy: Path, name: str = "echo") -> None:
    gw.deployments.deploy(DeployRequest(name=name, file=str(policy)))


def _warming(gw: Gateway, name: str = "echo") -> ApiError:
    with pytest.raises(ApiError) as exc:
        gw.sessions.connect(ConnectRequest(model=name))
    return exc.value


def _serve(gw, clock, launcher, spec: dict, name: str = "echo", port: int = 9001) -> FakeWorker:
    w = launcher.started[-1]
    w.ready(spec, port)
    gw.tick(clock.advance(0.1))
    assert gw.store.get(name).status == "ready"
    return w


def test_connect_while_warming_is_503_with_retry_after_then_admitted_once_ready(env):
    gw, clock, launcher, policy, _, _ = env
    _deploy(gw, policy)
    assert len(launcher.started) == 1 and gw.store.get("echo").status == "starting"
    err = _warming(gw)
    assert err.code == "warming" and err.status == 503 and err.retry_after_s == 30.0   # no load measured yet: 30 s
    launcher.started[0].loading(_spec())
    clock.advance(12.0)
    gw.tick(clock())
    assert gw.store.get("echo").phase == "loading"
    err = _warming(gw)
    assert err.details["phase"] == "loading" and err.retry_after_s == 18.0       # 30 s estimate, 12 s gone
    _serve(gw, clock, launcher, _spec())
    conn = gw.sessions.connect(ConnectRequest(model="echo"))
    assert conn.worker_url == "http://127.0.0.1:9001" and conn.version == 1
    assert conn.lease.expires_at == clock() + LEASE_S
    assert [s.id for s in gw.sessions.of("echo")] == [conn.session_id]
    assert len(launcher.started) == 1                   # the connects started no second worker


def test_a_lease_expires_on_the_tick_and_its_renewal_is_refused(env):
    gw, clock, launcher, policy, _, _ = env
    _deploy(gw, policy)
    _serve(gw, clock, launcher, _spec(idle_timeout=3600))
    conn = gw.sessions.connect(ConnectRequest(model="echo"))
    clock.advance(LEASE_S - 1)
    renewed = gw.sessions.renew(conn.session_id)
    assert renewed.lease.expires_at == clock() + LEASE_S
    gw.tick(clock.advance(LEASE_S + 1))
    assert gw.sessions.of("echo") == []
    with pytest.raises(ApiError) as exc:
        gw.sessions.renew(conn.session_id)
    assert exc.value.code == "lease_expired"


def test_a_worker_crash_drops_its_sessions_and_raises_an_alert(env):
    gw, clock, launcher, policy, events, alerts = env
    _deploy(gw, policy)
    w = _serve(gw, clock, launcher, _spec())
    gw.sessions.connect(ConnectRequest(model="echo"))
    gw.sessions.connect(ConnectRequest(model="echo"))
    assert len(gw.sessions.of("echo")) == 2
    w.crash(code=3)
    gw.tick(clock.advance(0.1))
    row = gw.store.get("echo")
    assert row.status == "failed" and row.phase == "exited" and "exited with code 3" in row.error
    assert events == [WorkerCrashed("echo", 1, w.pid, 3, row.error)]
    assert gw.sessions.of("echo") == []
    assert [(e, d, x["exit_code"]) for e, d, x in alerts] == [("worker_crashed", "echo", 3)]
    # the next connect starts a fresh worker (a crash after serving is not a failed load)
    assert _warming(gw).code == "warming" and len(launcher.started) == 2


def test_a_renewal_after_a_crash_the_tick_has_not_seen_yet_is_refused(env):
    """A robot whose channel was refused reconnects at once, often before the next control tick:
    its renewal must not hand back the dead worker (the client would give up after a second
    refused connection instead of meeting the cold start)."""
    gw, clock, launcher, policy, events, _ = env
    _deploy(gw, policy)
    w = _serve(gw, clock, launcher, _spec())
    conn = gw.sessions.connect(ConnectRequest(model="echo"))
    w.crash(code=-9)
    with pytest.raises(ApiError) as exc:
        gw.sessions.renew(conn.session_id)                 # no tick in between
    assert exc.value.code == "lease_expired"
    assert [type(e) for e in events] == [WorkerCrashed] and gw.store.get("echo").status == "failed"
    assert _warming(gw).code == "warming" and len(launcher.started) == 2


def test_an_idle_worker_is_stopped_and_its_sessions_dropped(env):
    gw, clock, launcher, policy, events, _ = env
    _deploy(gw, policy)
    _serve(gw, clock, launcher, _spec(idle_timeout=60))
    gw.sessions.connect(ConnectRequest(model="echo"))
    gw.tick(clock.advance(59))
    assert gw.store.get("echo").status == "ready"
    gw.tick(clock.advance(2))
    row = gw.store.get("echo")
    assert (row.status, row.phase) == ("stopped", "idle")
    assert events == [WorkerStopped("echo", "idle")]
    assert gw.sessions.of("echo") == [] and gw.supervisor.get("echo") is None
    assert launcher.started[0].signals == [signal.SIGTERM]
    assert _warming(gw).code == "warming" and len(launcher.started) == 2    # a connect starts it again


def test_min_workers_keeps_a_worker_running_through_idleness_and_a_crash(env):
    gw, clock, launcher, policy, events, _ = env
    _deploy(gw, policy)
    w = _serve(gw, clock, launcher, _spec(idle_timeout=10, min_workers=1))
    gw.tick(clock.advance(3600))
    assert gw.store.get("echo").status == "ready" and events == []          # the floor holds it
    w.crash()
    gw.tick(clock.advance(0.1))       # the crash is noticed ...
    gw.tick(clock.advance(0.1))       # ... and the floor starts a new worker
    assert len(launcher.started) == 2 and gw.store.get("echo").status == "starting"
    _serve(gw, clock, launcher, _spec(idle_timeout=10, min_workers=1), port=9002)
    assert gw.store.get("echo").worker_port == 9002


def test_a_stopped_deployment_refuses_connects_and_starts_nothing_until_started(env):
    gw, clock, launcher, policy, _, _ = env
    _deploy(gw, policy)
    _serve(gw, clock, launcher, _spec(min_workers=1))
    gw.sessions.connect(ConnectRequest(model="echo"))
    gw.deployments.stop("echo")
    assert gw.sessions.of("echo") == []
    gw.tick(clock.advance(1))
    err = _warming(gw)
    assert err.code == "deployment_stopped" and len(launcher.started) == 1
    _deploy(gw, policy)                                    # a redeploy while stopped records only
    assert len(launcher.started) == 1 and gw.store.get("echo").status == "stopped"
    gw.deployments.start("echo")
    assert len(launcher.started) == 2 and gw.store.get("echo").status == "starting"


def test_a_new_version_builds_beside_the_serving_one_and_takes_over_once_ready(env):
    gw, clock, launcher, policy, events, _ = env
    _deploy(gw, policy)
    old = _serve(gw, clock, launcher, _spec())
    before = gw.sessions.connect(ConnectRequest(model="echo"))
    policy.write_text(policy.read_text() + "\n# v2\n")
    _deploy(gw, policy)
    assert len(launcher.started) == 2 and gw.store.get("echo").build["status"] == "building"
    assert gw.sessions.connect(ConnectRequest(model="echo")).version == 1     # v1 serves meanwhile
    build = launcher.started[1]
    build.ready(_spec(), 9002)
    gw.tick(clock.advance(0.1))
    row = gw.store.get("echo")
    assert (row.version, row.worker_port, row.status) == (2, 9002, "ready")
    assert events == [WorkerTookOver("echo", 2, build.pid, old.pid)]
    assert old.signals == [signal.SIGTERM] and old.secret != old.spec.secret    # retired: secret rotated
    with pytest.raises(ApiError) as exc:                  # the old epoch's lease is over
        gw.sessions.renew(before.session_id)
    assert exc.value.code == "lease_expired"
    assert gw.sessions.connect(ConnectRequest(model="echo")).version == 2


def test_a_split_version_gets_a_side_worker_and_its_sessions(env):
    gw, clock, launcher, policy, _, _ = env
    _deploy(gw, policy)
    _serve(gw, clock, launcher, _spec())
    policy.write_text(policy.read_text() + "\n# v2\n")
    _deploy(gw, policy)
    launcher.started[1].ready(_spec(), 9002)
    gw.tick(clock.advance(0.1))
    gw.tick(clock.advance(0.1))
    assert gw.store.get("echo").version == 2
    view = gw.traffic.update("echo", TrafficUpdate(split={"v1": 100, "v2": 0}), gw.sessions.held())
    assert [(s["version"], s["worker"]) for s in view["split"]] == [(2, "serving"), (1, "loading")]
    side = launcher.started[2]
    assert side.spec.role == "side" and side.spec.version == 1
    assert _warming(gw).code == "warming"
    side.ready(_spec(), 9003)
    gw.tick(clock.advance(0.1))
    conn = gw.sessions.connect(ConnectRequest(model="echo"))
    assert conn.version == 1 and conn.worker_url == "http://127.0.0.1:9003"
    assert gw.sessions.held() == {"echo@v1": 1}
    gw.tick(clock.advance(0.1))
    assert gw.supervisor.get("echo@v1") is not None            # a session holds it


def test_the_gpu_cap_refuses_a_second_worker_before_it_starts(env):
    gw, clock, launcher, policy, _, _ = env
    gw.sessions.max_gpus = 1
    _deploy(gw, policy, "one")
    _deploy(gw, policy, "two")         # a deploy is not capped: both start
    _serve(gw, clock, launcher, _spec(idle_timeout=5), name="two", port=9002)
    launcher.started[0].ready(_spec(idle_timeout=5), 9001)
    gw.tick(clock.advance(0.1))
    gw.tick(clock.advance(10))         # both idle out
    assert gw.store.get("one").status == gw.store.get("two").status == "stopped"
    assert _warming(gw, "one").code == "warming"
    err = _warming(gw, "two")
    assert err.code == "gpu_limit_reached" and len(launcher.started) == 3


def test_a_jammed_worker_is_replaced_and_connects_wait_until_its_replacement_takes_over(env):
    gw, clock, launcher, policy, events, _ = env
    _deploy(gw, policy)
    jammed = _serve(gw, clock, launcher, _spec())
    assert gw.health.replace_jammed("echo", {"status": "degraded", "oldest_request_s": 12.0}, port=9001)
    assert not gw.health.replace_jammed("echo", {"status": "degraded"})      # one replacement at a time
    assert len(launcher.started) == 2 and launcher.started[1].spec.role == "build"
    err = _warming(gw)
    assert err.code == "warming" and err.details["phase"] == "replacing"
    fresh = launcher.started[1]
    jammed.exits_on_term = False                        # its stuck replica thread ignores SIGTERM
    fresh.ready(_spec(), 9002)
    gw.tick(clock.advance(0.1))
    assert events == [WorkerTookOver("echo", 1, fresh.pid, jammed.pid)]
    assert gw.health.get("echo")["state"] == "replaced" and gw.health.get("echo")["new_pid"] == fresh.pid
    [old] = gw.supervisor.retiring
    assert old.proc is jammed and old.grace_s == 2.0    # a jammed worker is not waited on for long
    gw.tick(clock.advance(1.0))
    assert gw.supervisor.retiring == [old]
    gw.tick(clock.advance(1.1))
    assert gw.supervisor.retiring == [] and jammed.signals == [signal.SIGTERM, signal.SIGKILL]
    assert gw.sessions.connect(ConnectRequest(model="echo")).worker_url == "http://127.0.0.1:9002"


def test_event_handlers_run_with_no_supervisor_lock_held(env):
    gw, clock, launcher, policy, _, _ = env
    seen = []
    gw.supervisor.on(WorkerCrashed, lambda ev: seen.append(gw.supervisor._lock._is_owned()))
    _deploy(gw, policy)
    w = _serve(gw, clock, launcher, _spec())
    w.crash()
    gw.tick(clock.advance(0.1))
    assert seen == [False]


# -- several workers per deployment: another worker of the serving version starts when every slot
# of the running ones is taken, up to max_gpus (a CPU policy: max_gpus counts workers, capped by
# cpu_workers); each session sticks to its worker; idle ones stop one at a time to the floor

def _fleet_spec(**extra) -> dict:
    """One slot per worker, a CPU policy that may run ``max_gpus`` workers (default 2)."""
    extra.setdefault("resources", {"gpu": "cpu", "max_gpus": extra.pop("max_gpus", 2)})
    return _spec(concurrency={"replicas_per_gpu": 1}, **extra)


def _grow(gw, clock, launcher, spec: dict, port: int) -> FakeWorker:
    """A connect finds every slot taken: another worker starts (warming); it becomes ready."""
    n = len(launcher.started)
    err = _warming(gw)
    assert err.code == "warming" and "another worker is starting" in err.detail
    assert len(launcher.started) == n + 1 and launcher.started[-1].spec.role == "extra"
    w = launcher.started[-1]
    w.ready(spec, port)
    gw.tick(clock.advance(0.1))
    return w


def _workers(gw, name: str = "echo") -> list[tuple]:
    return [(w["worker"], w["slots"]["used"], w["slots"]["total"], len(w["robots"]))
            for w in gw.deployments.status(name).workers]


@pytest.mark.parametrize("on_full", ["reject", "queue"])
def test_every_slot_taken_starts_another_worker_up_to_max_gpus_then_on_full(env, on_full):
    gw, clock, launcher, policy, _, _ = env
    spec = _fleet_spec(on_full=on_full, idle_timeout=3600)
    _deploy(gw, policy)
    _serve(gw, clock, launcher, spec)
    a = gw.sessions.connect(ConnectRequest(model="echo"))
    assert a.worker_url == "http://127.0.0.1:9001" and len(launcher.started) == 1
    second = _grow(gw, clock, launcher, spec, 9002)
    b = gw.sessions.connect(ConnectRequest(model="echo"))
    assert b.worker_url == "http://127.0.0.1:9002"          # the robot lands on the worker with room
    assert _workers(gw) == [("echo", 1, 1, 1), ("echo#2", 1, 1, 1)]
    assert gw.deployments.status("echo").workers[1]["pid"] == second.pid
    err = _warming(gw)                                     # max_gpus=2 reached: no third worker
    assert len(launcher.started) == 2
    if on_full == "reject":
        assert err.code == "deployment_full" and err.details == {"slots": 2, "held": 2}
    else:
        assert err.code == "queued" and err.details["position"] == 1
        gw.sessions.close_session(b.session_id)           # its slot goes to the robot in line
        c = gw.sessions.connect(ConnectRequest(model="echo", ticket=err.details["ticket"]))
        assert c.worker_url == "http://127.0.0.1:9002"
    renewed = gw.sessions.renew(a.session_id)               # a renewal keeps the session on its worker
    assert renewed.worker_url == "http://127.0.0.1:9001"


def test_each_worker_of_a_fleet_shows_the_cluster_node_its_launcher_placed_it_on(env):
    gw, clock, launcher, policy, _, _ = env
    spec = _fleet_spec(idle_timeout=3600)
    _deploy(gw, policy)
    launcher.started[0].placed("node-a")                  # as a Ray launcher reports each actor's node
    _serve(gw, clock, launcher, spec)
    gw.sessions.connect(ConnectRequest(model="echo"))
    n = len(launcher.started)
    assert _warming(gw).code == "warming" and len(launcher.started) == n + 1
    launcher.started[-1].placed("node-b")
    launcher.started[-1].ready(spec, 9002)
    gw.tick(clock.advance(0.1))
    b = gw.sessions.connect(ConnectRequest(model="echo"))   # the robot lands on the worker with room
    assert b.worker_url == "http://127.0.0.1:9002"
    view = gw.deployments.status("echo").workers
    assert [(w["worker"], w["node"], len(w["robots"])) for w in view] == [("echo", "node-a", 1), ("echo#2", "node-b", 1)]


def test_a_launcher_that_refuses_another_worker_as_deployment_full_gets_on_full_not_an_error(env):
    """The Ray launcher counts a deployment's side workers against max_gpus, as the local card pool
    does; the gateway's fleet cap does not: its refusal then answers the robot per on_full."""
    gw, clock, launcher, policy, _, _ = env
    spec = _fleet_spec(on_full="reject", idle_timeout=3600)
    _deploy(gw, policy)
    _serve(gw, clock, launcher, spec)
    gw.sessions.connect(ConnectRequest(model="echo"))
    start = launcher.start

    def full(spec, log_handle):
        if spec.role == "extra":
            raise ApiError("deployment_full", "'echo' already runs 2 worker(s)", details={"reason": "deployment_full"})
        return start(spec, log_handle)
    launcher.start = full
    err = _warming(gw)
    assert err.code == "deployment_full" and len(launcher.started) == 1, (err.code, err.detail)


def test_min_workers_two_keeps_two_warm(env):
    gw, clock, launcher, policy, events, _ = env
    spec = _fleet_spec(min_workers=2, idle_timeout=10)
    _deploy(gw, policy)
    _serve(gw, clock, launcher, spec)
    gw.tick(clock.advance(0.1))                            # the floor starts the second one
    assert [w.spec.role for w in launcher.started] == ["serving", "extra"]
    launcher.started[1].ready(spec, 9002)
    gw.tick(clock.advance(3600))
    assert [k for k, *_ in _workers(gw)] == ["echo", "echo#2"] and events == []
    assert len(launcher.started) == 2
    launcher.started[1].crash()                            # a crash of one is made good by the floor
    gw.tick(clock.advance(0.1))
    gw.tick(clock.advance(0.1))
    assert len(launcher.started) == 3 and launcher.started[2].spec.role == "extra"


def test_a_crash_of_one_worker_drops_only_its_own_sessions(env):
    gw, clock, launcher, policy, events, alerts = env
    spec = _fleet_spec(idle_timeout=3600)
    _deploy(gw, policy)
    first = _serve(gw, clock, launcher, spec)
    a = gw.sessions.connect(ConnectRequest(model="echo"))
    second = _grow(gw, clock, launcher, spec, 9002)
    b = gw.sessions.connect(ConnectRequest(model="echo"))
    second.crash()
    gw.tick(clock.advance(0.1))
    assert [s.id for s in gw.sessions.of("echo")] == [a.session_id]
    assert events == [WorkerCrashed("echo", 1, second.pid, 1, "worker echo#2 exited with code 1 while serving")]
    assert [(e, d) for e, d, _ in alerts] == [("worker_crashed", "echo")]
    with pytest.raises(ApiError) as exc:
        gw.sessions.renew(b.session_id)
    assert exc.value.code == "lease_expired"               # its robot connects again ...
    assert gw.sessions.renew(a.session_id).worker_url == "http://127.0.0.1:9001"
    third = _grow(gw, clock, launcher, spec, 9003)         # ... and its slot comes back on a new worker
    b2 = gw.sessions.connect(ConnectRequest(model="echo"))
    assert b2.worker_url == "http://127.0.0.1:9003"
    first.crash()                                          # the first one's crash spares the others' robots
    gw.tick(clock.advance(0.1))
    assert [s.id for s in gw.sessions.of("echo")] == [b2.session_id]
    assert [(type(e), e.pid) for e in events[1:]] == [(WorkerCrashed, first.pid)]
    assert _warming(gw).code == "warming"                  # no free slot, nor a first worker: it restarts
    assert launcher.started[-1].spec.role == "serving" and len(launcher.started) == 4
    assert third.returncode is None and gw.sessions.renew(b2.session_id).worker_url == "http://127.0.0.1:9003"


def test_idle_workers_stop_one_at_a_time_down_to_the_floor(env):
    gw, clock, launcher, policy, events, _ = env
    spec = _fleet_spec(max_gpus=3, min_workers=1, idle_timeout=10)
    _deploy(gw, policy)
    _serve(gw, clock, launcher, spec)
    conns = [gw.sessions.connect(ConnectRequest(model="echo"))]
    for port in (9002, 9003):
        _grow(gw, clock, launcher, spec, port)
        conns.append(gw.sessions.connect(ConnectRequest(model="echo")))
    assert [k for k, *_ in _workers(gw)] == ["echo", "echo#2", "echo#3"]
    gw.tick(clock.advance(11))
    assert len(_workers(gw)) == 3                          # each holds a robot: none is idle
    for c in conns:
        gw.sessions.close_session(c.session_id)
    gw.tick(clock.advance(11))
    assert [k for k, *_ in _workers(gw)] == ["echo", "echo#2"]      # the last started goes first
    gw.tick(clock.advance(0.1))
    assert [k for k, *_ in _workers(gw)] == ["echo"]
    gw.tick(clock.advance(3600))
    assert [k for k, *_ in _workers(gw)] == ["echo"] and events == []   # the floor keeps one
    assert [w.signals for w in launcher.started] == [[], [signal.SIGTERM], [signal.SIGTERM]]


def test_a_new_version_takes_over_from_every_serving_worker(env):
    gw, clock, launcher, policy, events, _ = env
    spec = _fleet_spec(idle_timeout=3600)
    _deploy(gw, policy)
    old = _serve(gw, clock, launcher, spec)
    gw.sessions.connect(ConnectRequest(model="echo"))
    second = _grow(gw, clock, launcher, spec, 9002)
    b = gw.sessions.connect(ConnectRequest(model="echo"))
    policy.write_text(policy.read_text() + "\n# v2\n")
    _deploy(gw, policy)
    build = launcher.started[-1]
    assert build.spec.role == "build"
    build.ready(spec, 9003)
    gw.tick(clock.advance(0.1))
    assert events == [WorkerTookOver("echo", 2, build.pid, old.pid)]
    assert second.signals == [signal.SIGTERM] and second.secret != second.spec.secret   # retired with the first
    with pytest.raises(ApiError) as exc:
        gw.sessions.renew(b.session_id)
    assert exc.value.code == "lease_expired"
    conn = gw.sessions.connect(ConnectRequest(model="echo"))
    assert (conn.version, conn.worker_url) == (2, "http://127.0.0.1:9003")
    assert _workers(gw) == [("echo", 1, 1, 1)]
    err = _warming(gw)                                     # the fleet grows back on the new version
    assert err.code == "warming" and launcher.started[-1].spec.version == 2


def test_a_cpu_policy_runs_at_most_cpu_workers(env):
    gw, clock, launcher, policy, _, _ = env
    gw.supervisor.cpu_workers = 1
    spec = _fleet_spec(on_full="reject", max_gpus=4)
    _deploy(gw, policy)
    _serve(gw, clock, launcher, spec)
    gw.sessions.connect(ConnectRequest(model="echo"))
    assert _warming(gw).code == "deployment_full" and len(launcher.started) == 1
    assert gw.deployments.status("echo").workers[0]["max_workers"] == 1


def test_scale_min_two_keeps_two_warm_and_buffer_workers_keeps_a_spare_while_robots_are_connected(env):
    gw, clock, launcher, policy, _, _ = env
    spec = _fleet_spec(max_gpus=3, idle_timeout=10, buffer_workers=1)
    _deploy(gw, policy)
    _serve(gw, clock, launcher, spec)
    gw.tick(clock.advance(0.1))
    assert len(launcher.started) == 1                      # no robot, no floor: no spare
    gw.ops.scales.set("echo", 2, None, None)               # seq policy scale echo --min 2
    gw.tick(clock.advance(0.1))
    assert [w.spec.role for w in launcher.started] == ["serving", "extra"]
    launcher.started[1].ready(spec, 9002)
    gw.tick(clock.advance(60))
    assert [k for k, *_ in _workers(gw)] == ["echo", "echo#2"]
    gw.ops.scales.clear("echo")
    gw.tick(clock.advance(0.1))
    assert [k for k, *_ in _workers(gw)] == ["echo"]       # idle past idle_timeout once the floor is gone
    a = gw.sessions.connect(ConnectRequest(model="echo"))
    gw.tick(clock.advance(0.1))                            # one robot on one worker: buffer_workers=1 adds a spare
    assert len(launcher.started) == 3 and launcher.started[2].spec.role == "extra"
    launcher.started[2].ready(spec, 9003)
    gw.tick(clock.advance(0.1))
    assert gw.sessions.connect(ConnectRequest(model="echo")).worker_url == "http://127.0.0.1:9003"   # no wait
    gw.tick(clock.advance(0.1))                            # two busy: the spare is a third (max_gpus=3)
    assert len(launcher.started) == 4
    gw.sessions.close_session(a.session_id)
