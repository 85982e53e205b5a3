"""The demo as a user runs it: ``python -m sequence_ai_ros.demo ...`` (what ``scripts/demo.sh``
execs), as its own process.

- ``--policy learned``: the checkpoint shipped with examples/flywheel goes up as the volume
  ``pick-place-learned``, the learned policy is deployed from it and drives the simulated Franka
  over ROS 2 (randomised light, as it was trained);
- SIGTERM (``kill``, ``timeout``, a service stop) ends the demo with everything it started: the
  gateway, the policy's worker and the sim are gone afterwards, not orphaned.
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest

from _servers import ROOT, _env


@pytest.fixture
def run_demo(tmp_path):
    """Start the demo CLI; yields ``start(*args) -> (proc, lines queue)``. Afterwards every process
    that carries this test's tag in its environment (the demo and all it started, orphans too)
    is killed, so a failed test leaves no gateway, worker or sim behind."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex}"

    def start(*args):
        proc = subprocess.Popen([sys.executable, "-m", "sequence_ai_ros.demo", "--out", str(tmp_path), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=_env({"SEQ_TEST_DEMO_TAG": tag}), cwd=str(ROOT))
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
        return proc, lines

    yield start
    for p in tagged(tag):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def tagged(tag: str) -> list:
    """Live processes whose environment has ``SEQ_TEST_DEMO_TAG=tag``."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SEQ_TEST_DEMO_TAG") == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def read_until(lines: queue.Queue, pattern: str, timeout_s: float) -> list:
    """Lines up to and including the first that matches ``pattern`` (or the end of output)."""
    got, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        got.append(line)
        if re.search(pattern, line):
            return got
    raise AssertionError(f"no line matching {pattern!r} within {timeout_s} s:\n{''.join(got)}")


def test_demo_policy_learned_deploys_the_shipped_checkpoint_from_a_volume_and_drives_the_sim(run_demo):
    # 8 s bound: the promise is the deploy from the volume and a run that publishes the net's rows
    # (>= 3 chunks); whether the cube lands in time is examples/flywheel's measurement, not this
    proc, lines = run_demo("--policy", "learned", "--light-jitter", "1", "--seed", "100004", "--max-seconds", "8")
    out = "".join(read_until(lines, r"^total ", 400))
    assert proc.wait(timeout=30) in (0, 1), out        # 0: the task succeeded, 1: it did not
    assert re.search(r"^deployed  pick-place-learned from examples/flywheel/learned_policy\.py "
                     r"\(weights: volume pick-place-learned v1, 2 files, 3\.0 MB\)", out, re.M), out
    assert "goal: 'put the red cube on the green pad' (policy pick-place-learned, seed 100004, light_jitter 1," in out
    for bad in ("Traceback", "InvalidHandle", "never retrieved"):     # the teardown before the summary is quiet
        assert bad not in out, out
    m = re.search(r"^RunOutcome\(reason=(\w+), actions=(\d+), chunks=(\d+)", out, re.M)
    assert m, out
    reason, actions, chunks = m.group(1), int(m.group(2)), int(m.group(3))
    assert reason in ("until", "timeout"), out         # ran to the task check or the time bound, no error
    assert actions >= 8 * 3 and chunks >= 3            # the net answered and its rows were published
    assert re.search(r"^task      (SUCCESS|FAILED): cube \d+\.\d cm from the pad centre", out, re.M), out
    # exit 0 only for a success the task check ended early (the demo's rule)
    assert (proc.returncode == 0) == ("task      SUCCESS" in out and reason == "until"), out


def test_sigterm_stops_the_demo_and_the_gateway_worker_and_sim_it_started(run_demo):
    proc, lines = run_demo("--max-seconds", "40")
    before = read_until(lines, r"^goal:", 240)          # the Act goal is running
    time.sleep(1.0)
    children = psutil.Process(proc.pid).children(recursive=True)
    names = []
    for c in children:
        try:
            names.append(" ".join(c.cmdline()))
        except psutil.NoSuchProcess:
            pass
    joined = "\n".join(names)
    assert "seq.cli serve" in joined and "sequence_ai_server.worker" in joined and "sim_node" in joined, joined
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143, "".join(before)
    after = "".join(iter(lines.get, None))            # the cancel and the teardown of a running goal
    for bad in ("Traceback", "InvalidHandle", "never retrieved"):
        assert bad not in after, after
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.pid for p in alive]


def test_a_negative_seed_is_refused_before_anything_starts(run_demo):
    proc, lines = run_demo("--policy", "learned", "--seed", "-1")
    assert proc.wait(timeout=60) == 2
    out = "".join(iter(lines.get, None))
    assert "--seed takes a non-negative integer, got -1" in out and "deployed" not in out, out


def test_policy_learned_without_torch_names_the_extra_before_deploying(tmp_path):
    """The demo profile installs no torch, which the learned policy's worker imports: the demo
    says so in one line and exits 1 before it starts a gateway or deploys (it was the worker's
    ModuleNotFoundError with "fix the policy and deploy again")."""
    code = ("import sys; sys.modules['torch'] = None; from sequence_ai_ros.demo import main; "
            f"sys.exit(main(['--out', {str(tmp_path)!r}, '--policy', 'learned']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_env({}), cwd=str(ROOT))
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.splitlines() == ["sequence-ai-demo --policy learned: needs the train extra (torch is not "
                                       "installed): pip install 'sequence-ai[train]' (in this checkout: "
                                       f"cd {ROOT} && . scripts/env.sh && pip install -e '.[train]')"], out.stderr
    assert out.stdout == "" and not any(tmp_path.iterdir()), out.stdout     # no gateway, no run folder


def test_deploy_learned_without_a_checkpoint_says_how_to_make_one(tmp_path):
    from sequence_ai_ros import demo

    with pytest.raises(FileNotFoundError, match=r"no policy\.pt in .*; train one with examples/flywheel/run_flywheel\.py"):
        demo.deploy_learned(server=None, checkpoint_dir=tmp_path)
