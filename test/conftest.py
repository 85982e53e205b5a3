"""Shared fixtures: real gateway / worker processes on loopback (see test/_servers.py).

    gateway         a fresh gateway (temp data dir) for one test; .url, .api_key, .deploy(file, name, wait=True)
    shared_gateway  the session's one gateway (one per xdist worker), for a test that needs a real
                    gateway but not a fresh one; what the test deployed is removed when it ends
    shared_module_gateway  the same, for a whole test module; what the module deployed is removed at its end
    module_gateway  a gateway process of its own for a whole test module
    echo_policy  path of test/policies/echo_policy.py

and, from test/_schedule.py, the ros / e2e / slow markers on every collected test and the order the
files run in (heaviest first). Waiting for something in a test: test/_wait.py's eventually().
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Ctrl-C is a behaviour under test (the blocking channel's interrupt, SIGINT to ros2 launch and to
# each node). A shell without job control starts a background command with SIGINT ignored, Python
# then keeps it ignored instead of raising KeyboardInterrupt, and every process the tests start
# inherits that: a signal test would then wait out its deadline. Each test process (the xdist
# controller and its workers import this file) puts Python's own handler back, so SIGINT reaches
# the tests and, reset to its default by exec, every process they start, however the suite was run.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Under pytest-xdist (scripts/test.sh runs four workers) each worker gets its own DDS domain, so two
# test files that both start a sim robot and a driver never hear each other's topics. The base is
# ROS_DOMAIN_ID, except that scripts/env.sh's default (the checkout's domain, the same in every
# shell: what `ros2 launch` in another terminal uses) is swapped for one drawn per run (xdist's run
# id, shared by its workers). Worker k takes the base plus k steps of 100 // (number of workers),
# and the draw stays under one step, so no worker lands on the checkout's domain; domains stay 1..101.
_base = int(os.environ.get("ROS_DOMAIN_ID", "1"))
_workers = max(1, min(100, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)))
_step = 100 // _workers
if os.environ.get("SEQAI_ROS_DOMAIN_DEFAULT") == str(_base):
    _draw = int(os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex, 16) % max(1, _step - 1) + 1
    _base = (_base - 1 + _draw) % 101 + 1
    os.environ["ROS_DOMAIN_ID"] = str(_base)
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and _worker[2:].isdigit():
    os.environ["ROS_DOMAIN_ID"] = str((_base + _step * int(_worker[2:]) - 1) % 101 + 1)

# xdist's workers run with COLUMNS=80 and LINES=24 in their environment. rich fixes a console's
# size at construction when they are set, so the seq CLI's module-level consoles, run in-process
# (test/_servers.seq_cli), would print 80 columns whatever COLUMNS a test gives the call. Without
# them, a console measures at each print, from the environment of the moment, as in a process of
# its own; the processes the tests start lose nothing (no terminal: 80 columns is rich's default).
# rich also picks its colours once, at construction: under `pytest -s` in a terminal the consoles
# would colour what the CLI prints into CliRunner's buffer. TTY_COMPATIBLE=0 (rich >= 14) says no
# terminal, as the pipes of a process of its own would.
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)
os.environ["TTY_COMPATIBLE"] = "0"

import _schedule  # noqa: E402
from _servers import ECHO_POLICY, GatewayProcess, WorkerProcess  # noqa: E402

pytest_plugins = ["_cpu_report"]    # SEQ_TEST_CPU_REPORT=DIR: CPU seconds per file (test/_cpu_report.py)


#: pytest-timeout (pytest.ini: 600 s) stops a test from a Python signal handler, which cannot run while
#: C code holds the GIL: Fast DDS 2.14 destroying a participant can spin there for good
#: (sequence_ai_ros._spin.TEARDOWN_LIMIT_S). faulthandler's watchdog is a C thread: past this limit it
#: prints every thread's stack and ends the worker (xdist reports the test as crashed and goes on), so
#: such a hang costs one run 11 minutes, not the 90 of CI's own limit.
GIL_HANG_LIMIT_S = 660


_STDERR: list = []      # fd 2 as the run has it, not a test's captured one (see pytest_configure)


def pytest_configure(config):
    # pytest's output capture is suspended while plugins configure (pytest's own faulthandler plugin
    # takes its copy of stderr here too): the stacks must reach the run's log, not a test's capture
    _STDERR.append(os.dup(2))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    faulthandler.dump_traceback_later(GIL_HANG_LIMIT_S, exit=True, file=_STDERR[0] if _STDERR else 2)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(tryfirst=True)          # before -m deselects by the markers added here
def pytest_collection_modifyitems(config, items):
    _schedule.apply(items)


@pytest.fixture
def gateway(tmp_path):
    gw = GatewayProcess.start(tmp_path)
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture(scope="session")
def _session_gateway(tmp_path_factory):
    holder = {"gw": GatewayProcess.start(tmp_path_factory.mktemp("session-gateway"))}
    try:
        yield holder
    finally:
        holder["gw"].close()


def _deployment_names(gw: GatewayProcess) -> set:
    return {d["name"] for d in gw.client.get("/v1/deployments").raise_for_status().json()["deployments"]}


@contextlib.contextmanager
def _borrowed(holder: dict, tmp_path_factory):
    """The session's gateway, given back with no deployments but those it had: every deployment
    made meanwhile is removed (``/remove?force=true``: its workers stopped, its sessions dropped,
    its versions and captures deleted) and its worker log deleted, whatever the outcome. A
    gateway found dead (a test that killed it) is replaced by a new one."""
    gw = holder["gw"]
    if gw.proc.poll() is not None:
        gw = holder["gw"] = GatewayProcess.start(tmp_path_factory.mktemp("session-gateway"))
    before = _deployment_names(gw)
    try:
        yield gw
    finally:
        if gw.proc.poll() is None:
            for name in sorted(_deployment_names(gw) - before):
                gw.client.post(f"/v1/deployments/{name}/remove", params={"force": "true"}).raise_for_status()
                for log in (gw.data_dir / "logs").glob(f"{name}.log*"):
                    log.unlink(missing_ok=True)


@pytest.fixture
def shared_gateway(_session_gateway, tmp_path_factory):
    """The session's gateway process (one per xdist worker: a gateway start is ~1.5 s of CPU, and a
    stop another 0.5 s) for one test. It finds no deployments (a test that deploys uses names of
    its own) and what it deployed is removed when it ends. Keys, secrets and volumes a test
    creates stay: a test that needs a pristine gateway (a listing of keys, settings of its own)
    uses ``gateway`` or starts one."""
    with _borrowed(_session_gateway, tmp_path_factory) as gw:
        yield gw


@pytest.fixture(scope="module")
def shared_module_gateway(_session_gateway, tmp_path_factory):
    """The session's gateway for a whole test module (its tests use distinct deployment names);
    what the module deployed is removed when its last test ends, as with ``shared_gateway``. Not
    for a module that reads gateway-wide figures (``/metrics`` totals, the gateway's own log, the
    account's usage): other modules' requests are in them; that is ``module_gateway``."""
    with _borrowed(_session_gateway, tmp_path_factory) as gw:
        yield gw


@pytest.fixture(scope="module")
def module_gateway(tmp_path_factory):
    """One gateway process for a whole test module (faster when tests use distinct deployment names)."""
    gw = GatewayProcess.start(tmp_path_factory.mktemp("gateway"))
    try:
        yield gw
    finally:
        gw.close()


def _echo_worker(tmp_path_factory, name: str, env=None):
    w = WorkerProcess.start(ECHO_POLICY, tmp_path_factory.mktemp(name), name=name, env=env)
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """One echo worker process (no gateway) for a test module, on loopback."""
    yield from _echo_worker(tmp_path_factory, "echo")


@pytest.fixture(scope="module")
def small_body_worker(tmp_path_factory):
    """One echo worker process for a test module, taking bodies up to 200 kB
    (``SEQ_WORKER_MAX_BODY_BYTES``), so over-limit bodies stay cheap to send."""
    yield from _echo_worker(tmp_path_factory, "small", {"SEQ_WORKER_MAX_BODY_BYTES": "200000"})


@pytest.fixture
def echo_policy() -> str:
    return ECHO_POLICY
