"""Local workers forked from the gateway's fork server (launchers/forked.py, worker/forkserver.py)
are the processes ``python -m sequence_ai_server.worker`` would have been, and a worker the fork
server cannot give that process to is started as one.

The comparison is made by the worker itself: test/policies/process_report_policy.py writes what
its process looks like from inside (argv, sys.path, cwd, environment as Python and as the C
library see it, session, signal dispositions and masks, open fds, umask, its command line) when
it loads, once forked and once started, from the same launch spec.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

import sequence_ai
import sequence_ai_server

from _core_support import observation
from _servers import POLICIES, echo_observation, gateway_on_data_dir
from _wait import eventually
from sequence_ai_server.common.processes import EXIT_UNKNOWN, process_alive, process_cmdline
from sequence_ai_server.launchers import forked, local
from sequence_ai_server.launchers.base import Exited, Ready, WorkerLaunchSpec
from sequence_ai_server.launchers.forked import ForkedProcess, ForkServer
from sequence_ai_server.launchers.local import LocalLauncher

REPORT_POLICY = str(POLICIES / "process_report_policy.py")
FORK_SERVER = "sequence_ai_server.worker.forkserver"


def _spec(tmp: Path, name: str, file: str, env: dict, long_paths: bool = False) -> WorkerLaunchSpec:
    # long_paths: run files and weights ~3,800 bytes deep, 3 such paths on the command line
    run_dir = tmp.joinpath(*(["d" * 200] * 19)) if long_paths else tmp / "run"
    for d in (run_dir, tmp / "logs", tmp / "weights"):
        d.mkdir(parents=True, exist_ok=True)
    return WorkerLaunchSpec(name=name, role="serving", version=1, policy_file=file, class_name=None,
                            cwd=str(Path(file).parent), secret="s3cret-" + name, run_dir=run_dir, run_key=f"{name}.x",
                            weights_dir=(run_dir if long_paths else tmp / "weights") / name, log_path=tmp / "logs" / f"{name}.log", env=env,
                            adoptable=True)


def _ready(handle, timeout: float = 60.0) -> list:
    seen: list = []

    def arrived():
        seen.extend(handle.events())
        return any(isinstance(e, (Ready, Exited)) for e in seen)

    eventually(arrived, timeout, 0.02, what="the worker to be ready", detail=lambda: f"events: {seen}")
    assert any(isinstance(e, Ready) for e in seen), seen
    return seen


def _stop(handle) -> int:
    handle.send_signal(signal.SIGTERM)
    return handle.wait(30)


def _run(launcher: LocalLauncher, spec: WorkerLaunchSpec) -> dict:
    """Start ``spec``'s worker, wait until it serves, read its report, stop it (exit 0)."""
    report = Path(spec.env["SEQ_TEST_PROCESS_REPORT"])
    report.unlink(missing_ok=True)
    with open(spec.log_path, "ab") as log:
        h = launcher.start(spec, log)
        try:
            _ready(h)
            r = httpx.post(f"http://127.0.0.1:{json.loads(spec.ready_file.read_text())['port']}/act", timeout=30,
                           json={"observation": echo_observation()}, headers={"Authorization": f"Bearer {spec.secret}"})
            assert r.status_code == 200, r.text
        finally:
            assert _stop(h) == 0
    return json.loads(report.read_text())


def test_a_forked_worker_is_the_process_a_started_worker_would_be(tmp_path):
    spec = _spec(tmp_path, "report", REPORT_POLICY, {"SEQ_TEST_PROCESS_REPORT": str(tmp_path / "report.json")})
    forking, starting = LocalLauncher(fork=True), LocalLauncher(fork=False)
    try:
        forked = _run(forking, spec)
        started = _run(starting, spec)
    finally:
        forking.close()
    # who the parent is tells them apart: the fork server (a process of its own) or this process
    assert started["ppid"] == os.getpid()
    assert forked["ppid"] != os.getpid() and process_cmdline(forked["ppid"]) == [], \
        "the fork server still runs after close()"
    for key in sorted(set(started) - {"pid", "ppid"}):
        assert forked[key] == started[key], f"{key}: forked {forked[key]!r}\n  started {started[key]!r}"
    # and what they share is what a worker is
    assert started["cmdline"] == spec.command() and started["argv"][1:] == spec.command()[3:]
    assert started["c_environ"] == started["environ"] and started["environ"]["SEQ_WORKER_SECRET"] == spec.secret
    assert started["path"][0] == spec.cwd and started["session_leader"] and started["stdin"] == "/dev/null"
    # the folder holding sequence_ai_server is on the path, never the package's own folder (its
    # planes would import as top-level `common`, `worker`, `ops`... over a policy's own modules)
    package = Path(sequence_ai_server.__file__).resolve().parent
    assert str(package.parent) in started["path"] and str(package) not in started["path"], started["path"]
    assert started["stdout"] == started["stderr"] == str(spec.log_path)
    assert started["signals"]["SIGPIPE"] == "ignore" and started["signals"]["SIGCHLD"] == "default"


def test_the_fork_server_reports_exit_codes_and_ends_with_its_launcher(tmp_path):
    env = {"SEQ_TEST_PROCESS_REPORT": str(tmp_path / "report.json")}
    launcher = LocalLauncher(fork=True)
    try:
        killed = _spec(tmp_path, "killed", REPORT_POLICY, env)
        with open(killed.log_path, "ab") as log:
            h = launcher.start(killed, log)
            _ready(h)
            server = json.loads(Path(env["SEQ_TEST_PROCESS_REPORT"]).read_text())["ppid"]
            assert FORK_SERVER in process_cmdline(server), process_cmdline(server)
            os.kill(h.pid, signal.SIGKILL)
            assert h.wait(10) == -signal.SIGKILL
            assert [e.code for e in h.events() if isinstance(e, Exited)] == [-signal.SIGKILL]
        broken = _spec(tmp_path, "broken", str(POLICIES / "broken_load_policy.py"), env)
        with open(broken.log_path, "ab") as log:
            h = launcher.start(broken, log)
            assert h.wait(60) == 3                  # the policy failed to start: the worker's own code
        assert "started as a process of its own" not in broken.log_path.read_text()
    finally:
        launcher.close()
    assert not process_alive(server), "the fork server outlived its launcher's close()"


@pytest.mark.parametrize("why", ["PYTHONHASHSEED", "LD_LIBRARY_PATH", "OTEL_PROPAGATORS", "long command line",
                                 "SEQ_WORKER_FORK=0"])
def test_a_worker_forking_cannot_give_its_process_is_started_as_one(tmp_path, monkeypatch, why):
    # OTEL_PROPAGATORS: read when the fork server imports FastAPI (fastapi.telemetry -> opentelemetry.propagate)
    env = {"SEQ_TEST_PROCESS_REPORT": str(tmp_path / "report.json")}
    if why in ("PYTHONHASHSEED", "LD_LIBRARY_PATH", "OTEL_PROPAGATORS"):
        env[why] = {"PYTHONHASHSEED": "7", "OTEL_PROPAGATORS": "tracecontext"}.get(why, str(tmp_path))
    elif why != "long command line":
        monkeypatch.setenv("SEQ_WORKER_FORK", "0")
    spec = _spec(tmp_path, "own", REPORT_POLICY, env, long_paths=why == "long command line")
    if why == "long command line":                        # past the 8 KiB of room
        assert len("\0".join(spec.command())) > 8192
    launcher = LocalLauncher()
    try:
        report = _run(launcher, spec)
    finally:
        launcher.close()
    assert report["ppid"] == os.getpid(), why
    log = spec.log_path.read_text()
    if why == "SEQ_WORKER_FORK=0":
        assert "process of its own" not in log and not (tmp_path / "run" / "forkserver.log").exists()
    else:
        reason = "its command line is longer" if why == "long command line" else f"its environment sets {why}"
        assert f"started as a process of its own: {reason}" in log, log[-2000:]
    if why == "PYTHONHASHSEED":
        assert report["environ"]["PYTHONHASHSEED"] == "7"


def test_a_gateways_workers_are_forked_and_outlive_it_with_their_fork_server_gone(tmp_path):
    gw = gateway_on_data_dir(tmp_path)
    try:
        pid = gw.deploy(str(POLICIES / "echo_policy.py"), "echo")["pid"]
        server = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert FORK_SERVER in process_cmdline(server)
        assert process_cmdline(pid)[1:3] == ["-m", "sequence_ai_server.worker"]
        gw.proc.send_signal(signal.SIGKILL)           # a crashed gateway: its fork server goes, the worker stays
        gw.proc.wait(10)
        eventually(lambda: not process_alive(server), 10, 0.05, what="the fork server to end with its gateway")
        assert process_alive(pid)
        again = gateway_on_data_dir(tmp_path)         # the next gateway on the data dir adopts it
        try:
            d = again.wait_until("echo", ("ready",), 30)
            assert d["pid"] == pid, d
            with sequence_ai.connect("echo", api_key=again.api_key, gateway_url=again.url) as policy:
                assert len(policy.predict(observation()).action_chunk.actions[0]) == 8
        finally:
            again.close()
    finally:
        gw.close()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_workers_started_at_once_share_one_fork_server(tmp_path, monkeypatch):
    # the supervisor starts workers from several threads: the first starts of a launcher must not
    # each make a fork server (the others would run, unclosed, for as long as the gateway does)
    made: list = []

    class SlowToMake(ForkServer):          # a thread switch between "none yet" and keeping the new one
        def __init__(self, *args, **kwargs):
            time.sleep(0.3)
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(local, "ForkServer", SlowToMake)
    launcher = LocalLauncher(fork=True)
    specs = [_spec(tmp_path, f"w{i}", str(POLICIES / "echo_policy.py"), {}) for i in range(2)]
    handles: dict = {}
    logs = [open(s.log_path, "ab") for s in specs]
    try:
        threads = [threading.Thread(target=lambda i=i: handles.__setitem__(i, launcher.start(specs[i], logs[i])))
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for h in handles.values():
            _ready(h)
        servers = {_parent(h.pid) for h in handles.values()}
        assert len(made) == 1 and len(servers) == 1, f"{len(made)} fork servers made, workers forked by {servers}"
    finally:
        assert [_stop(h) for h in handles.values()] == [0] * len(handles)
        launcher.close()
        for f in logs:
            f.close()
    for fs in made:
        assert fs._proc is None or fs._proc.poll() is not None, "a fork server outlived its launcher's close()"


def test_a_worker_whose_command_line_the_fork_server_cannot_write_is_started_as_one(tmp_path, monkeypatch):
    # the fork server itself refuses what it cannot title (whatever the gateway's own check said, e.g.
    # where /proc gives it no argument area to measure): forked, the worker would show the fork
    # server's command line, and neither adoption nor the stray sweep would know it
    env = {"SEQ_TEST_PROCESS_REPORT": str(tmp_path / "report.json")}
    spec = _spec(tmp_path, "own", REPORT_POLICY, env, long_paths=True)
    monkeypatch.setattr(ForkServer, "refusal", lambda self, env, command: None)
    launcher = LocalLauncher(fork=True)
    try:
        report = _run(launcher, spec)
    finally:
        launcher.close()
    assert report["cmdline"] == spec.command(), report["cmdline"][:6]
    assert report["ppid"] == os.getpid()
    assert "started as a process of its own: its command line does not fit" in spec.log_path.read_text()


def test_an_exit_reported_for_a_pid_is_not_read_as_a_later_workers(tmp_path):
    # the fork server reports every exit; one no handle takes (a worker whose spawn had timed out,
    # killed when its answer came late) must not be read as the exit of a later worker the kernel
    # gave the same pid (pid_max is 32768 on many machines)
    forks = ForkServer(tmp_path / "forkserver.log")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        threading.Thread(target=forks._read, args=(ours,), daemon=True).start()
        theirs.send(json.dumps({"exit": 4242, "code": -9}).encode())
        theirs.send(json.dumps({"id": 7, "pid": 4242}).encode())        # a later spawn, the same pid
        eventually(lambda: 7 in forks._replies, 10, 0.01, what="the spawn's answer")
        assert ForkedProcess(forks, 4242, None).poll() is None
        theirs.send(json.dumps({"exit": 4242, "code": 0}).encode())     # and its own exit is its own
        eventually(lambda: ForkedProcess(forks, 4242, None).poll() == 0, 10, 0.01, what="its exit")
    finally:
        theirs.close()
        ours.close()


def test_a_killed_fork_server_is_reaped_and_its_workers_and_later_ones_go_on(tmp_path):
    # killed within FORK_RESTART_AFTER_S of its start (a crash loop's shape): not started again
    launcher = LocalLauncher(fork=True)
    echo = str(POLICIES / "echo_policy.py")
    h = None
    try:
        first = _spec(tmp_path, "first", echo, {})
        with open(first.log_path, "ab") as log:
            h = launcher.start(first, log)
            _ready(h)
        server = _parent(h.pid)
        assert FORK_SERVER in process_cmdline(server)
        os.kill(server, signal.SIGKILL)
        # the launcher's child: reaped, not left a zombie for the rest of the gateway's run
        eventually(lambda: not Path(f"/proc/{server}").exists(), 10, 0.05, what="the killed fork server to be reaped")
        assert h.poll() is None                              # its worker runs on, watched by pid and start time
        later = _spec(tmp_path, "later", echo, {})
        with open(later.log_path, "ab") as log:
            h2 = launcher.start(later, log)
            _ready(h2)
            assert _parent(h2.pid) == os.getpid()            # started as a process of its own
            assert _stop(h2) == 0
        assert "started as a process of its own: the fork server exited" in later.log_path.read_text()
        assert _stop(h) == EXIT_UNKNOWN                      # it went, its exit status with the fork server
    finally:
        if h is not None and h.poll() is None:
            _stop(h)
        launcher.close()


def test_a_fork_server_that_went_after_serving_a_while_is_replaced_and_the_next_worker_forked(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "FORK_RESTART_AFTER_S", 0.0)     # "a while": every served second counts
    launcher = LocalLauncher(fork=True)
    echo = str(POLICIES / "echo_policy.py")
    handles: list = []
    try:
        first = _spec(tmp_path, "first", echo, {})
        with open(first.log_path, "ab") as log:
            handles.append(launcher.start(first, log))
            _ready(handles[0])
        server = _parent(handles[0].pid)
        assert FORK_SERVER in process_cmdline(server)
        os.kill(server, signal.SIGKILL)
        eventually(lambda: not Path(f"/proc/{server}").exists(), 10, 0.05, what="the killed fork server to be reaped")
        later = _spec(tmp_path, "later", echo, {})
        with open(later.log_path, "ab") as log:
            handles.append(launcher.start(later, log))
            _ready(handles[1])
        again = _parent(handles[1].pid)
        assert again not in (server, os.getpid()) and FORK_SERVER in process_cmdline(again), again
        assert "process of its own" not in later.log_path.read_text()
        assert handles[0].poll() is None                    # the first one's worker runs on
        assert [_stop(h) for h in handles] == [EXIT_UNKNOWN, 0]   # its exit went with its fork server
        handles.clear()
    finally:
        for h in handles:
            if h.poll() is None:
                _stop(h)
        launcher.close()
    eventually(lambda: not process_alive(again), 10, 0.05, what="the new fork server to end with its launcher")


def test_a_fork_server_that_stops_answering_is_not_waited_on_again(tmp_path, monkeypatch):
    # stopped (SIGSTOP, a frozen cgroup) or stuck, it neither answers nor closes its end: one start
    # waits SPAWN_TIMEOUT_S for it, the later ones start as processes at once (before, each waited,
    # and from about the 14th request on the pair was full and a start blocked for good, with
    # every other start behind it)
    monkeypatch.setattr(forked, "SPAWN_TIMEOUT_S", 1.0)
    launcher = LocalLauncher(fork=True)
    echo = str(POLICIES / "echo_policy.py")
    handles: list = []
    server = 0
    try:
        first = _spec(tmp_path, "first", echo, {})
        with open(first.log_path, "ab") as log:
            handles.append(launcher.start(first, log))
            _ready(handles[-1])
        server = _parent(handles[0].pid)
        os.kill(server, signal.SIGSTOP)
        specs = [_spec(tmp_path, name, echo, {}) for name in ("waited", "after")]
        for spec in specs:
            with open(spec.log_path, "ab") as log:
                handles.append(launcher.start(spec, log))
        assert "started as a process of its own: no answer from the fork server" in specs[0].log_path.read_text()
        assert "started as a process of its own: the fork server did not answer a spawn within 1 s" \
            in specs[1].log_path.read_text()
        os.kill(server, signal.SIGCONT)          # it forks the request it had; that late worker is killed
        for spec, h in zip(specs, handles[1:]):
            _ready(h)
            assert _parent(h.pid) == os.getpid()
            eventually(lambda: [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
                                if str(spec.ready_file) in process_cmdline(p)] == [h.pid], 10, 0.05,
                       what=f"{spec.name}'s one worker process")
    finally:
        if server:
            os.kill(server, signal.SIGCONT)
        assert [_stop(h) for h in handles] == [0] * len(handles)
        launcher.close()


def test_a_worker_that_cannot_be_made_while_the_fork_server_starts_exits(tmp_path):
    # the first start runs on a thread while the fork server imports: when no process can be made
    # there (here its cwd is gone and its environment rules out a fork; a pids limit, ENOMEM), the
    # start must end as an exit, as the same error ends a start made on the caller's thread
    env = {"PYTHONHASHSEED": "7"}
    spec = dataclasses.replace(_spec(tmp_path, "gone", str(POLICIES / "echo_policy.py"), env),
                               cwd=str(tmp_path / "no-such-folder"))
    launcher = LocalLauncher(fork=True)
    try:
        with open(spec.log_path, "ab") as log:
            h = launcher.start(spec, log)
            assert h.pid == 0                          # on the thread: the fork server is starting
            assert h.wait(30) == 1
            assert [e.code for e in h.events() if isinstance(e, Exited)] == [1]
        assert "the worker did not start: FileNotFoundError" in spec.log_path.read_text()
    finally:
        launcher.close()
