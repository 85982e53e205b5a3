"""CPU seconds per test file, for finding what the suite spends its cores on (opt-in).

With ``SEQ_TEST_CPU_REPORT=DIR`` each pytest process (every xdist worker) writes
``DIR/cpu-<worker>.json``: ``{file: [cpu_s, wall_s]}``, where cpu_s is the process's own user +
system time plus that of the children it reaped (the servers, nodes and builds a file starts and
stops), measured around each test's setup, call and teardown. A child still running when a file
ends (a session-scoped gateway) is counted where it is reaped. Sum the files with

    python test/_cpu_report.py DIR
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_OUT = os.environ.get("SEQ_TEST_CPU_REPORT", "")
_spent: dict = defaultdict(lambda: [0.0, 0.0])


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if _OUT:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        cpu, wall = _cpu(), time.monotonic()
        yield
        row = _spent[item.nodeid.split("::")[0]]
        row[0] += _cpu() - cpu
        row[1] += time.monotonic() - wall

    def pytest_sessionfinish(session):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(_OUT).mkdir(parents=True, exist_ok=True)
        (Path(_OUT) / f"cpu-{worker}.json").write_text(json.dumps(_spent, indent=0))


def _summary(folder: str) -> None:
    total: dict = defaultdict(lambda: [0.0, 0.0])
    for f in Path(folder).glob("cpu-*.json"):
        for name, (cpu, wall) in json.loads(f.read_text()).items():
            total[name][0] += cpu
            total[name][1] += wall
    rows = sorted(total.items(), key=lambda kv: -kv[1][0])
    print(f"{'cpu_s':>7} {'wall_s':>7}  file   (all files: {sum(r[0] for _, r in rows):.0f} CPU-s)")
    for name, (cpu, wall) in rows:
        print(f"{cpu:7.1f} {wall:7.1f}  {name}")


if __name__ == "__main__":
    _summary(sys.argv[1])
