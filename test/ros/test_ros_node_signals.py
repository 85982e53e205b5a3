"""Every node's process stops cleanly and promptly on SIGINT (Ctrl-C), SIGTERM (systemd, docker,
``kill``) and on Ctrl-C under ``ros2 launch`` (a SIGINT from the terminal and the one launch
forwards: two, close together), even when nothing is due on its executor (an idle recorder has no
timer to wake it): exit code 0, no traceback, gone within about a second.

Real processes (``python -m sequence_ai_ros.<node>``), real rclpy and Fast DDS; the driver is
configured and active against a real gateway serving the echo policy. Each test measures the
time from the signal to the process's exit and prints it; the bound asserted is looser than the
1 s goal, for a loaded 2-core machine (the figures printed are the measurement).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from _servers import ECHO_POLICY, ROOT

STOP_GOAL_S = 1.0    # what a node should take, idle machine (printed beside each measurement)
STOP_WITHIN_S = 3.0  # what the test allows: the goal with room for a loaded 2-core machine
KEY_ENV = "SEQ_TEST_SIGNALS_KEY"

# "repeated": SIGINT, then SIGTERM and SIGINT in turn every 20 ms until the process is gone -- Ctrl-C
# under ros2 launch (the terminal's SIGINT and the one launch forwards), a user pressing it again,
# a supervisor's SIGTERM on top: a signal in every phase of the shutdown, each ignored
SIGNALS = {"SIGINT": [signal.SIGINT], "SIGTERM": [signal.SIGTERM], "repeated": None}


@pytest.fixture(scope="module")
def echo_gateway(shared_module_gateway):
    dep = shared_module_gateway.deploy(ECHO_POLICY, name="echo-signals")
    assert dep["status"] == "ready", dep
    os.environ[KEY_ENV] = shared_module_gateway.api_key
    yield shared_module_gateway


def _node_command(name: str, tmp_path, gateway) -> tuple[list, str]:
    """(argv, the log text that says the node is up and spinning)."""
    module = {"sim_robot": "sim_node", "episode_recorder": "recorder_node", "policy_driver": "driver_node"}[name]
    argv = [sys.executable, "-m", f"sequence_ai_ros.{module}", "--ros-args"]
    if name == "episode_recorder":
        return argv + ["-p", f"output_dir:={tmp_path / 'bags'}"], "recording to"
    if name == "sim_robot":
        return argv + ["-p", "publish_rate_hz:=15.0"], "sim_robot ready"
    return argv + ["-p", "model:=echo-signals", "-p", f"gateway_url:={gateway.url}", "-p", f"api_key_env:={KEY_ENV}",
                   "-p", "camera_views:=[exterior_1]", "-p", "camera_topics:=[camera/exterior_1/image_raw]"], \
        "active: Act goals accepted"


def _start(argv, up: str, tmp_path):
    log_path = tmp_path / "node.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 120.0
    while up not in log_path.read_text(errors="replace"):
        assert proc.poll() is None, log_path.read_text(errors="replace")
        assert time.monotonic() < deadline, f"the node never said {up!r}:\n{log_path.read_text(errors='replace')}"
        time.sleep(0.05)
    return proc, log_path


def _stop_time(proc, signals) -> float:
    """Send ``signals`` (None: the "repeated" series), poll until the process has exited; seconds
    from the first signal."""
    t0 = time.monotonic()
    repeat = signals is None
    proc.send_signal(signal.SIGINT if repeat else signals[0])
    deadline, k, last = t0 + 30.0, 0, t0
    while proc.poll() is None:
        assert time.monotonic() < deadline, "still running 30 s after the signal"
        if repeat and time.monotonic() - last >= 0.02:
            k += 1
            last = time.monotonic()
            try:
                proc.send_signal(signal.SIGTERM if k % 2 else signal.SIGINT)
            except ProcessLookupError:   # gone between poll and send
                break
        time.sleep(0.005)
    proc.wait()
    return time.monotonic() - t0


def _idle(seconds: float, proc) -> None:
    """Let the node sit idle (nothing due) for ``seconds``, checking it stays up."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert proc.poll() is None
        time.sleep(0.05)


@pytest.mark.parametrize("how", list(SIGNALS))
@pytest.mark.parametrize("name", ["sim_robot", "episode_recorder", "policy_driver"])
def test_each_node_exits_cleanly_within_about_a_second_of_a_signal(tmp_path, echo_gateway, name, how):
    argv, up = _node_command(name, tmp_path, echo_gateway)
    proc, log_path = _start(argv, up, tmp_path)
    try:
        _idle(0.5, proc)
        took = _stop_time(proc, SIGNALS[how])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text(errors="replace")
    print(f"{name} {how}: exited {took:.3f} s after the signal (goal {STOP_GOAL_S:g} s)")
    assert proc.returncode == 0, text
    for bad in ("Traceback", "KeyboardInterrupt", "terminate called", "EGL_BAD_ACCESS", "never retrieved"):
        assert bad not in text, text
    assert took < STOP_WITHIN_S, f"{name} took {took:.2f} s to stop after {how}:\n{text}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_sim_loads_its_scene_ends_it_quietly(tmp_path, sig):
    """Ctrl-C during start-up (imports, MuJoCo loading the scene): exit 0, no traceback."""
    argv, _ = _node_command("sim_robot", tmp_path, None)
    log_path = tmp_path / "node.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        # the sim is loading once its module has been imported (the scene's MuJoCo warning is printed
        # while the model is compiled); without the warning, the signal lands during the imports
        deadline = time.monotonic() + 60.0
        while "Attaching a spec" not in log_path.read_text(errors="replace") and time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            time.sleep(0.01)
        took = _stop_time(proc, [sig])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text(errors="replace")
    print(f"sim_robot {signal.Signals(sig).name} while loading: exited {took:.3f} s after the signal")
    assert proc.returncode == 0 and "Traceback" not in text, text
    assert took < 30.0, took


@pytest.mark.parametrize("value, says", [("5", "light_jitter must be in [0, 1]"),
                                         ("abc", "parameter light_jitter takes a number")])
def test_a_bad_parameter_stops_the_node_with_one_error_line_not_a_traceback(value, says):
    proc = subprocess.run([sys.executable, "-m", "sequence_ai_ros.sim_node", "--ros-args", "-p", f"light_jitter:={value}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: {says}" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# A node process whose teardown never ends (as Fast DDS's participant teardown can spin, see
# _spin.TEARDOWN_LIMIT_S): destroy_node blocks; the limit is 1 s here.
_HANGING_TEARDOWN = """
import sys, time
from rclpy.node import Node
from sequence_ai_ros import _spin

_spin.TEARDOWN_LIMIT_S = 1.0

class Stuck(Node):
    def __init__(self):
        super().__init__("stuck_teardown")
        self.said = False
        self.create_timer(0.05, self.say)      # from the executor: the node is built and spinning

    def say(self):
        if not self.said:
            self.said = True
            print("spinning", flush=True)

    def destroy_node(self):
        time.sleep(600)

sys.exit(_spin.spin_node(Stuck))
"""


def test_a_teardown_that_hangs_ends_the_process_with_its_stacks_after_the_limit(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _HANGING_TEARDOWN], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout.readline() == "spinning\n"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"teardown cut after {took:.2f} s (limit 1 s)")
    assert proc.returncode == 1, err
    assert "Timeout (0:00:01)!" in err and "in destroy_node" in err, err    # every thread's stack
    assert 1.0 <= took < 30.0
