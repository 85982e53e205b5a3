"""Admission at the deadline (gateway/admission.py), in process: a Gateway over a FakeLauncher
whose FakeWorkers report a cost curve in their /ping (test/_fake_workers.py ``play_pings``),
driven by ``tick(now)`` and the health check's ``ping_round`` with a hand-moved clock. A robot
is admitted while the predicted worst round trip of its worker's robots stays within their
deadline share; past it the connect goes to another worker (one starts), waits in line or is
refused with deployment_full and the numbers; ``max_inputs`` is the robot cap; before a worker
has measured its cost, robots are counted against the cap alone. The health check pings every
worker of a fleet, and a frozen ``NAME#2`` is retired alone."""
from __future__ import annotations

import math

import pytest

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.admission import DEADLINE_SHARE, CostCurve, predict, request_hz
from sequence_ai_server.gateway.schemas import ConnectRequest, DeployRequest
from _fake_workers import FakeWorker, fake_gateway, play_pings

GPU_LIKE = {"batch_ms": {str(b): 40.0 + 2.0 * b for b in (1, 2, 4, 8, 16)}, "calls": 50}   # 40 ms + 2 ms per item
SLOW_HZ = 15.0 / 8            # 15 Hz, replanning every 8 rows: a chunk every 533 ms


@pytest.fixture
def env(tmp_path):
    gw, clock, launcher, policy = fake_gateway(tmp_path, lease_ttl_s=3600.0)
    play_pings(gw, launcher, clock)
    gw.deployments.deploy(DeployRequest(name="echo", file=str(policy)))
    yield gw, clock, launcher
    gw.close()


def _spec(max_inputs=None, batch=None, max_gpus=1, on_full="reject", **conc) -> dict:
    spec = {"contract": {"action": {"robot": "panda", "action_space": "joint_absolute", "action_dim": 7,
                                    "control_frequency_hz": 15.0}, "observation": None},
            "params": [], "resources": {"gpu": "cpu", "max_gpus": max_gpus}, "on_full": on_full,
            "idle_timeout": 3600, "concurrency": {"replicas_per_gpu": 1, "max_inputs": max_inputs, **conc}}
    if batch:
        spec["batching"] = {"max_batch_size": batch, "eval_wait_ms": 20.0, "serve_wait_ms": 5.0}
    return spec


def _ready(gw, clock, w: FakeWorker, spec: dict, port: int, cost=None) -> FakeWorker:
    w.cost = cost
    w.ready(spec, port)
    gw.tick(clock.advance(0.1))
    gw.health.ping_round()
    return w


def _refused(gw, **kw) -> ApiError:
    with pytest.raises(ApiError) as exc:
        gw.sessions.connect(ConnectRequest(model="echo", **kw))
    return exc.value


def _fill(gw, limit: int = 400, **kw) -> tuple[list, ApiError]:
    """Connect robots until one is refused: (the admitted connects, the refusal)."""
    admitted = []
    for _ in range(limit):
        try:
            admitted.append(gw.sessions.connect(ConnectRequest(model="echo", **kw)))
        except ApiError as exc:
            return admitted, exc
    raise AssertionError(f"{limit} robots admitted, none refused")


def test_the_model_predicts_the_worst_round_trip_of_robots_asking_at_once():
    curve = CostCurve.from_ping(GPU_LIKE)
    assert curve.measured and curve.ms(16) == 72.0 and curve.ms(3) == 46.0 and curve.ms(32) == 104.0
    load = predict(curve, [SLOW_HZ] * 96, copies=1, batch=16)
    assert (load.worst_ms, round(load.deadline_ms, 1), load.fits) == (6 * 72.0, 533.3, True)
    assert not predict(curve, [SLOW_HZ] * 97, copies=1, batch=16).fits       # 432 + 42 ms > 85 % of 533 ms
    assert predict(curve, [SLOW_HZ] * 10, copies=1, batch=1).fits            # one at a time: 420 ms
    assert not predict(curve, [SLOW_HZ] * 11, copies=1, batch=1).fits        # 462 ms
    assert predict(curve, [SLOW_HZ] * 20, copies=2, batch=1).fits            # two copies share them
    assert predict(curve, [100.0], copies=1, batch=1).fits                   # a robot alone is always admitted
    assert CostCurve.from_ping({"batch_ms": {"0": 1, "x": 2, "3": math.nan}, "calls": 9}) is None
    assert not CostCurve.from_ping({"batch_ms": {"1": 5.0}, "calls": 2}).measured   # too few calls to trust


def test_a_robots_rate_comes_from_its_declaration_else_the_contract():
    spec = _spec()
    assert request_hz(spec, {}, None) == SLOW_HZ
    assert request_hz(spec, {"replan_steps": 5}, None) == 3.0
    assert request_hz(spec, {"replan_steps": 10 ** 400}, None) == SLOW_HZ   # no float: the default rows, not a 500
    assert request_hz(spec, {}, 6.25) == 6.25
    assert request_hz({"contract": {"action": None}}, {}, None) is None      # no control rate: slot counting
    for bad in (0.0, -1.0, math.nan, math.inf, 2000.0, 10 ** 400):   # 10**400: no float
        with pytest.raises(ApiError) as exc:
            request_hz(spec, {}, bad)
        assert exc.value.code == "invalid_request" and exc.value.details == {"field": "request_hz"}


def test_max_inputs_admits_that_many_robots_by_count_before_any_cost_is_measured(env):
    gw, clock, launcher = env
    spec = _spec(max_inputs=4, batch=16)
    _ready(gw, clock, launcher.started[0], spec, 9001)                       # no "cost" in its ping
    admitted, err = _fill(gw)
    assert len(admitted) == 4 and {c.worker_url for c in admitted} == {"http://127.0.0.1:9001"}
    assert err.code == "deployment_full" and err.details == {"slots": 4, "held": 4}
    assert "every slot of 'echo' is taken (4 of 4)" in err.detail and len(launcher.started) == 1
    [w] = gw.deployments.status("echo").workers
    assert w["admission"] == {"robots": 4, "rate_hz": 7.5, "measured": False, "cap": 4} and w["cost"] is None


@pytest.mark.parametrize("batch, robots", [(16, 96), (None, 10)])
def test_a_measured_worker_admits_robots_while_their_deadlines_hold_then_refuses_with_the_numbers(env, batch, robots):
    gw, clock, launcher = env
    spec = _spec(max_inputs=256, batch=batch)
    _ready(gw, clock, launcher.started[0], spec, 9001, cost=GPU_LIKE)
    admitted, err = _fill(gw)
    assert len(admitted) == robots
    assert err.code == "deployment_full" and err.status == 503
    adm = err.details["admission"]
    assert adm["robots"] == robots + 1 and adm["fits"] is False and adm["worst_ms"] > adm["budget_ms"]
    assert adm["budget_ms"] == round(DEADLINE_SHARE * 1000 / SLOW_HZ, 1) and err.details["held"] == robots
    assert f"with it {robots + 1} robots ask" in err.detail and "predicted worst round trip" in err.detail
    assert "requests/s" in err.detail and "utilisation" in err.detail
    [w] = gw.deployments.status("echo").workers
    view = w["admission"]
    assert view["measured"] and view["robots"] == robots and view["fits"] and view["worst_ms"] <= view["budget_ms"]
    assert view["rate_hz"] == round(robots * SLOW_HZ, 3) and 0 < view["utilisation"] < 1
    assert w["cost"] == {"batch_ms": GPU_LIKE["batch_ms"], "calls": 50}


def test_an_admitted_robot_is_never_made_late_by_a_faster_one_arriving_later(env):
    gw, clock, launcher = env
    _ready(gw, clock, launcher.started[0], _spec(max_inputs=256, batch=16, on_full="queue"), 9001, cost=GPU_LIKE)
    for _ in range(90):
        gw.sessions.connect(ConnectRequest(model="echo"))
    err = _refused(gw, request_hz=6.25)                     # 50 Hz every 8 rows: its 160 ms deadline fails
    assert err.code == "queued" and err.details["admission"]["deadline_ms"] == 160.0
    assert "would make the robots of worker echo late" in err.detail
    gw.sessions.close_session(err.details["ticket"])       # it gives up its place in line
    assert gw.sessions.connect(ConnectRequest(model="echo")).worker_url == "http://127.0.0.1:9001"   # a slow one fits
    assert gw.deployments.status("echo").workers[0]["admission"]["fits"]


def test_a_full_worker_sends_the_robot_to_another_that_starts_for_it_then_the_line(env):
    gw, clock, launcher = env
    spec = _spec(max_inputs=64, target_inputs=64, max_gpus=2, on_full="queue")
    _ready(gw, clock, launcher.started[0], spec, 9001, cost=GPU_LIKE)       # one at a time: 10 robots fit
    admitted, err = _fill(gw)
    assert len(admitted) == 10 and err.code == "warming" and "another worker is starting" in err.detail
    assert len(launcher.started) == 2 and launcher.started[1].spec.role == "extra"
    _ready(gw, clock, launcher.started[1], spec, 9002)      # not measured yet: predicted with echo's curve
    more, err = _fill(gw)
    assert len(more) == 10 and {c.worker_url for c in more} == {"http://127.0.0.1:9002"}
    assert err.code == "queued" and err.details["position"] == 1 and "late" in err.detail   # max_gpus=2: the line
    assert [(w["worker"], w["admission"]["robots"]) for w in gw.deployments.status("echo").workers] == [
        ("echo", 10), ("echo#2", 10)]
    launcher.started[1].cost = GPU_LIKE
    gw.health.ping_round()                                 # every worker is pinged: #2's own curve arrives
    assert gw.deployments.status("echo").workers[1]["cost"]["calls"] == 50


def test_max_inputs_admits_beside_a_starting_worker_once_target_inputs_are_held(env):
    gw, clock, launcher = env
    spec = _spec(max_inputs=3, max_gpus=2)                 # target_inputs defaults to the slots (1)
    _ready(gw, clock, launcher.started[0], spec, 9001)
    first = [gw.sessions.connect(ConnectRequest(model="echo")) for _ in range(2)]
    assert {c.worker_url for c in first} == {"http://127.0.0.1:9001"}           # admitted, not warming
    assert [w.spec.role for w in launcher.started] == ["serving", "extra"]       # the next one boots meanwhile


def test_the_health_check_pings_every_worker_and_retires_a_frozen_other_one_alone(env):
    gw, clock, launcher = env
    spec = _spec(max_gpus=2)
    first = _ready(gw, clock, launcher.started[0], spec, 9001)
    a = gw.sessions.connect(ConnectRequest(model="echo"))
    assert _refused(gw).code == "warming"
    second = _ready(gw, clock, launcher.started[1], spec, 9002)
    b = gw.sessions.connect(ConnectRequest(model="echo"))
    assert b.worker_url == "http://127.0.0.1:9002" and second.pings == 1 and first.pings == 2
    second.frozen, second.exits_on_term = True, False      # SIGSTOPped: answers nothing, ignores SIGTERM
    gw.health.ping_round()                                 # silent 5 s: not yet
    assert gw.supervisor.retiring == []
    gw.health.ping_round()                                 # silent 10 s over two pings: jammed
    [old] = gw.supervisor.retiring
    assert old.proc is second and gw.health.get("echo") is None       # the first worker is not jammed
    assert [w.spec.role for w in launcher.started] == ["serving", "extra", "extra"]   # one starts in its place
    gw.tick(clock.advance(0.1))
    assert [s.id for s in gw.sessions.of("echo")] == [a.session_id]   # only the frozen worker's robot goes
    with pytest.raises(ApiError) as exc:
        gw.sessions.renew(b.session_id)
    assert exc.value.code == "lease_expired"
    assert gw.sessions.renew(a.session_id).worker_url == "http://127.0.0.1:9001"
    gw.tick(clock.advance(2.1))                            # past the jam grace: SIGKILL
    assert gw.supervisor.retiring == [] and second.signals[-1] == 9
    fresh = _ready(gw, clock, launcher.started[2], spec, 9003)
    assert gw.sessions.connect(ConnectRequest(model="echo")).worker_url == "http://127.0.0.1:9003"
    view = {w["worker"]: w for w in gw.deployments.status("echo").workers}
    assert view["echo#2"]["jammed"]["pid"] == second.pid and fresh.pings >= 1



def test_a_frozen_first_worker_is_replaced_alone_and_the_others_serve_on(env):
    gw, clock, launcher = env
    spec = _spec(max_gpus=2)
    first = _ready(gw, clock, launcher.started[0], spec, 9001)
    a = gw.sessions.connect(ConnectRequest(model="echo"))
    assert _refused(gw).code == "warming"
    second = _ready(gw, clock, launcher.started[1], spec, 9002)
    b = gw.sessions.connect(ConnectRequest(model="echo"))
    first.frozen, first.exits_on_term = True, False         # the first worker SIGSTOPped
    gw.health.ping_round()
    gw.health.ping_round()                                  # silent 10 s: jammed, a replacement builds
    gw.tick(clock.advance(0.1))
    replacement = launcher.started[-1]
    assert replacement is not second and replacement.spec.role != "extra"
    _ready(gw, clock, replacement, spec, 9003)
    gw.tick(clock.advance(0.1))
    assert [w.proc for w in gw.supervisor.retiring] == [first]         # echo#2 is not retired with it
    assert gw.sessions.renew(b.session_id).worker_url == "http://127.0.0.1:9002"
    with pytest.raises(ApiError) as exc:
        gw.sessions.renew(a.session_id)
    assert exc.value.code == "lease_expired"                          # only the frozen worker's robot goes
    assert gw.sessions.connect(ConnectRequest(model="echo")).worker_url == "http://127.0.0.1:9003"

def test_seq_policy_status_prints_each_workers_admission_numbers(env):
    from seq.cli.policy import _admission_line
    gw, clock, launcher = env
    _ready(gw, clock, launcher.started[0], _spec(max_inputs=256, batch=16), 9001, cost=GPU_LIKE)
    for _ in range(32):
        gw.sessions.connect(ConnectRequest(model="echo"))
    [w] = gw.deployments.status("echo").workers
    line = _admission_line(w)
    assert "admitted 32 of at most 256 robots asking 60 requests/s" in line, line
    assert f"predicted worst round trip {2 * 72:g} ms of {w['admission']['budget_ms']:g} ms allowed" in line
    assert "utilisation 27%" in line and "/act p99 -" in line
    assert "by slot count (no cost measured yet)" in _admission_line({**w, "admission": {"robots": 2, "cap": 4}})
    for c in gw.sessions.of("echo"):
        gw.sessions.close_session(c.id)
    [idle] = gw.deployments.status("echo").workers           # measured, no robot: nothing predicted
    assert idle["admission"] == {"robots": 0, "rate_hz": 0, "measured": True, "cap": 256}
    assert "admitted 0 of at most 256 robots (cost measured)" in _admission_line(idle)
    gw.admission.observe("echo", launcher.started[0].pid, {"deadlines": {"requests": 40, "late": 1}})
    [w] = gw.deployments.status("echo").workers
    assert w["deadlines"] == {"requests": 40, "late": 1} and "late 1 of 40 requests" in _admission_line(w)
    pid = launcher.started[0].pid                         # mean batch: answered /acts per call between pings
    gw.admission.observe("echo", pid, {"cost": {**GPU_LIKE, "calls": 60}, "usage": {"requests": 100, "errors": 4}})
    gw.admission.observe("echo", pid, {"cost": {**GPU_LIKE, "calls": 80}, "usage": {"requests": 262, "errors": 6}})
    assert gw.deployments.status("echo").workers[0]["mean_batch"] == 8.0
    held = [gw.sessions.connect(ConnectRequest(model="echo")).session_id for _ in range(2)]
    gw.admission.observe("echo", pid, {"robots": {held[0]: {"p99_ms": 120.5, "requests": 9}, "sess_gone": {
        "p99_ms": 999.0, "requests": 1}, held[1]: {"p99_ms": 80.0, "requests": 9}, "bad": {"p99_ms": "x"}}})
    [w] = gw.deployments.status("echo").workers           # each robot's own p99, for the robots it holds
    assert w["robot_p99_ms"] == {held[0]: 120.5, held[1]: 80.0}
    assert f"robot p99 worst 120.5 ms ({held[0]}), median 120.5 ms over 2 robots" in _admission_line(w)


def test_a_policy_without_concurrent_counts_no_robots_even_once_measured(env):
    gw, clock, launcher = env
    spec = {**_spec(), "concurrency": None}
    _ready(gw, clock, launcher.started[0], spec, 9001, cost={"batch_ms": {"1": 400.0}, "calls": 20})
    conns = [gw.sessions.connect(ConnectRequest(model="echo")) for _ in range(5)]      # 5 x 400 ms: all admitted
    assert len({c.session_id for c in conns}) == 5 and len(launcher.started) == 1
