"""CPU seconds per test file, for finding what the suite spends its cores on (opt-in).

With ``SEQ_TEST_CPU_REPORT=DIR`` each pytest process (every xdist worker) writes
``DIR/cpu-<worker>.json``: ``{file: [cpu_s, wall_s, own_s]}``. ``own_s`` is the pytest process's
own user + system time while the file's tests ran (setup, call and teardown); ``cpu_s`` adds the
CPU of the child processes the file started (the servers, nodes and builds, each with the
descendants it reaped itself), counted to that file whenever the child is reaped: subprocess's
wait and poll are routed through ``os.wait4``, which gives each child's own usage. A child this
process reaps that no ``subprocess.Popen`` started (multiprocessing's, asyncio's) counts to the
test running when it is reaped. Not counted: processes that outlive their parent and are reaped by
init (a Ray node's daemons, a SIGKILLed server's workers), and processes started before any test
ran in that process (pytest-xdist's workers themselves: their own rows hold their time). Sum the
files with

    python test/_cpu_report.py DIR
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_OUT = os.environ.get("SEQ_TEST_CPU_REPORT", "")
_spent: dict = defaultdict(lambda: [0.0, 0.0, 0.0])
_owner: dict = {}                  # pid of a Popen child -> the test file that started it
_current = [""]                    # the file whose test is running
_recorded = [0.0]                  # CPU of the children reaped through _wait4 so far


def _own() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _reaped() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def _wait4(pid: int, flags: int) -> tuple:
    """``os.waitpid`` for subprocess, through ``os.wait4``: the reaped child's CPU goes to the
    file that started it."""
    got, status, usage = os.wait4(pid, flags)
    if got:
        cpu = usage.ru_utime + usage.ru_stime
        _recorded[0] += cpu
        owner = _owner.pop(got, _current[0])
        if owner:      # "": started before any test here (xdist's controller starting its workers)
            _spent[owner][0] += cpu
    return got, status


def _route_subprocess_waits() -> None:
    popen = subprocess.Popen
    if not all(hasattr(popen, n) for n in ("_try_wait", "_internal_poll")) or not hasattr(os, "wait4"):
        return                     # another Python's internals: reaped children count where reaped
    init, poll = popen.__init__, popen._internal_poll

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _owner[self.pid] = _current[0]

    def _try_wait(self, wait_flags):
        try:
            return _wait4(self.pid, wait_flags)
        except ChildProcessError:
            return self.pid, 0

    def _internal_poll(self, _deadstate=None):
        return poll(self, _deadstate=_deadstate, _waitpid=_wait4)

    popen.__init__, popen._try_wait, popen._internal_poll = __init__, _try_wait, _internal_poll


if _OUT:
    _route_subprocess_waits()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        name = item.nodeid.split("::")[0]
        _current[0] = name
        own, reaped, recorded, wall = _own(), _reaped(), _recorded[0], time.monotonic()
        yield
        row = _spent[name]
        other = (_reaped() - reaped) - (_recorded[0] - recorded)    # reaped, but not through _wait4
        row[0] += _own() - own + max(0.0, other)
        row[1] += time.monotonic() - wall
        row[2] += _own() - own

    def pytest_sessionfinish(session):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(_OUT).mkdir(parents=True, exist_ok=True)
        (Path(_OUT) / f"cpu-{worker}.json").write_text(json.dumps(_spent, indent=0))


def _summary(folder: str) -> None:
    total: dict = defaultdict(lambda: [0.0, 0.0, 0.0])
    for f in Path(folder).glob("cpu-*.json"):
        for name, row in json.loads(f.read_text()).items():
            for i, value in enumerate(row[:3]):
                total[name][i] += value
    rows = sorted(total.items(), key=lambda kv: -kv[1][0])
    print(f"{'cpu_s':>7} {'own_s':>7} {'wall_s':>7}  file   (all files: {sum(r[0] for _, r in rows):.0f} CPU-s)")
    for name, (cpu, wall, own) in rows:
        print(f"{cpu:7.1f} {own:7.1f} {wall:7.1f}  {name}")


if __name__ == "__main__":
    _summary(sys.argv[1])
