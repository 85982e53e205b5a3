"""Start-up cost of the processes users and the test suite start: CPU seconds (user + system) and
wall seconds until each is ready.

    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_startup.py [--runs 7] \
        [--baseline DIR] [--rounds 2]

Rows, each the median of ``--runs`` starts:

  - ``seq --help``: the CLI's import and its help text (no gateway asked);
  - ``seq policy status echo``: one command against a running gateway (its answer printed);
  - gateway to ready: ``python -m sequence_ai_server.gateway --port 0`` (a fresh data dir) until
    its ready file is written; CPU read from /proc/PID/stat at that moment;
  - worker to ready: ``python -m sequence_ai_server.worker`` hosting test/policies/echo_policy.py
    until its ready file is written (imports, load, warm-up, the synthetic check);
  - ``python -c pass``: the interpreter alone, the floor under every row;
  - launcher, forked / own process: what a gateway does, ``LocalLauncher.start`` of the same
    worker until its Ready event, forked from the fork server (launchers/forked.py; its own
    start is the unreported first) or started as a process of its own (``fork=False``); a
    baseline without the fork server starts both rows as processes of their own.

``--baseline DIR``: another checkout of this repository (e.g. ``git worktree add /tmp/base
<commit>``) measured the same way, its processes with DIR first on PYTHONPATH; the two alternate
for ``--rounds`` rounds (the same machine load for both) and the ratio this / baseline is printed
per row. Byte code is cached (``PYTHONDONTWRITEBYTECODE`` is unset, as scripts/test.sh does) and
one unreported start of each warms the caches. Prints medians and ratios; no pass/fail.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ECHO_POLICY = ROOT / "test" / "policies" / "echo_policy.py"
TICK = os.sysconf("SC_CLK_TCK")


def _env(root: Path, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    paths = [str(root), str(root / "server")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra or {})
    return env


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _wait_ready(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args[2]} exited with {proc.returncode} or was not ready in {timeout} s")
        time.sleep(0.005)


def _server(root: Path, tmp: Path, kind: str) -> tuple[float, float, subprocess.Popen, dict]:
    """Start a gateway or worker of ``root`` in ``tmp``; (CPU s, wall s) to ready, the process, its ready info."""
    ready = tmp / f"{kind}.ready.json"
    if kind == "gateway":
        cmd = ["-m", "sequence_ai_server.gateway", "--port", "0", "--data-dir", str(tmp / "home"),
               "--ready-file", str(ready)]
        extra = {}
    else:
        cmd = ["-m", "sequence_ai_server.worker", "--file", str(ECHO_POLICY), "--port", "0", "--ready-file",
               str(ready), "--name", "w", "--weights-dir", str(tmp / "weights")]
        extra = {"SEQ_WORKER_SECRET": secrets.token_urlsafe(16)}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, *cmd], env=_env(root, extra), cwd=str(tmp),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_ready(ready, proc)
    wall = time.monotonic() - t0
    return _proc_cpu(proc.pid), wall, proc, json.loads(ready.read_text())


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _command(root: Path, args: list, env: dict | None = None) -> tuple[float, float]:
    """(CPU s, wall s) of one child process run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, *args], env=_env(root, env), capture_output=True, text=True, cwd=str(root))
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{args} exited with {r.returncode}: {r.stderr[-500:]}")
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


_LAUNCHER_ROWS = r"""
import json, os, signal, sys, time
from pathlib import Path
from sequence_ai_server.launchers.base import Ready, WorkerLaunchSpec
from sequence_ai_server.launchers.local import LocalLauncher
tmp, file, runs, fork = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
try:
    launcher = LocalLauncher(fork=fork)
except TypeError:                                   # a checkout from before the fork server
    launcher = LocalLauncher()
tick, out = os.sysconf("SC_CLK_TCK"), []
for i in range(runs + 1):
    d = tmp / f"{int(fork)}-{i}"
    d.mkdir()
    spec = WorkerLaunchSpec(name="w", role="serving", version=1, policy_file=file, class_name=None, cwd=str(d),
                            secret="s" * 20, run_dir=d, run_key="w", weights_dir=d / "weights", log_path=d / "log")
    with open(spec.log_path, "ab") as log:
        t0 = time.monotonic()
        h = launcher.start(spec, log)
        while not any(isinstance(e, Ready) for e in h.events()):
            if h.poll() is not None:
                sys.exit(f"the worker exited with {h.poll()}: {spec.log_path.read_text()[-2000:]}")
            time.sleep(0.002)
        wall = time.monotonic() - t0
        f = Path(f"/proc/{h.pid}/stat").read_text().rsplit(")", 1)[1].split()
        if i:
            out.append(((int(f[11]) + int(f[12])) / tick, wall))
        h.send_signal(signal.SIGTERM)
        h.wait(15)
launcher.close()
print(json.dumps(out))
"""


def _launcher_rows(root: Path, tmp: Path, runs: int) -> dict:
    rows = {}
    for fork, row in ((True, "launcher, forked"), (False, "launcher, own process")):
        r = subprocess.run([sys.executable, "-c", _LAUNCHER_ROWS, str(tmp), str(ECHO_POLICY), str(runs), str(int(fork))],
                           env=_env(root), capture_output=True, text=True, cwd=str(tmp))
        if r.returncode != 0:
            raise RuntimeError(f"the launcher rows failed: {r.stderr[-1000:]}")
        rows[row] = [tuple(x) for x in json.loads(r.stdout.strip().splitlines()[-1])]
    return rows


def measure(root: Path, runs: int) -> dict:
    """{row: [(cpu_s, wall_s), ...]} for the checkout at ``root``; the first start of each is unreported."""
    rows: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for kind in ("worker", "gateway"):
            for i in range(runs + 1):
                (tmp / f"{kind}{i}").mkdir()
                cpu, wall, proc, info = _server(root, tmp / f"{kind}{i}", kind)
                if i:
                    rows.setdefault(f"{kind} to ready", []).append((cpu, wall))
                if kind == "worker" or i < runs:
                    _stop(proc)
        rows.update(_launcher_rows(root, tmp, runs))
        gateway = proc                              # the last gateway stays up for the CLI rows
        try:
            key = Path(info["api_key_file"]).read_text().strip()
            cli_env = {"SEQUENCES_GATEWAY_URL": info["url"], "SEQUENCES_API_KEY": key, "COLUMNS": "200"}
            _command(root, ["-m", "seq.cli", "deploy", str(ECHO_POLICY), "--name", "echo"], cli_env)
            for name, args in (("seq --help", ["-m", "seq.cli", "--help"]),
                               ("seq policy status echo", ["-m", "seq.cli", "policy", "status", "echo"]),
                               ("python -c pass", ["-c", "pass"])):
                _command(root, args, cli_env)
                rows[name] = [_command(root, args, cli_env) for _ in range(runs)]
        finally:
            _stop(gateway)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="starts per row and round (median reported)")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout to compare with")
    ap.add_argument("--rounds", type=int, default=2, help="with --baseline: alternations of the two")
    a = ap.parse_args()
    roots = [("this", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    results: dict = {label: {} for label, _ in roots}
    for r in range(a.rounds if a.baseline else 1):
        for label, root in (roots if r % 2 == 0 else roots[::-1]):
            for row, values in measure(root, a.runs).items():
                results[label].setdefault(row, []).extend(values)
    starts = len(next(iter(results["this"].values())))
    print(f"load average {os.getloadavg()[0]:.1f}; median of {starts} starts per row")
    head = f"{'':26s} {'CPU s':>7s} {'wall s':>7s}"
    print(head + (f" {'base CPU':>9s} {'base wall':>9s} {'CPU ratio':>9s}" if a.baseline else ""))
    for row, values in results["this"].items():
        cpu, wall = statistics.median(c for c, _ in values), statistics.median(w for _, w in values)
        line = f"{row:26s} {cpu:7.2f} {wall:7.2f}"
        if a.baseline:
            base = results["baseline"][row]
            bcpu, bwall = statistics.median(c for c, _ in base), statistics.median(w for _, w in base)
            line += f" {bcpu:9.2f} {bwall:9.2f} {cpu / bcpu:9.2f}"
        print(line)


if __name__ == "__main__":
    main()
