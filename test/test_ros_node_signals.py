"""Every node's process stops cleanly on SIGINT (Ctrl-C, ``ros2 launch``) and SIGTERM, promptly,
even when nothing is due on its executor (an idle recorder has no timer to wake it)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

STOP_WITHIN_S = 5.0   # SPIN_WAKE_S (0.2 s) plus shutdown, with room for a loaded 2-core machine


def _start_recorder(tmp_path):
    log = open(tmp_path / "recorder.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "sequence_ai_ros.recorder_node", "--ros-args",
                             "-p", f"output_dir:={tmp_path / 'bags'}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while b"recording to" not in (tmp_path / "recorder.log").read_bytes():
        assert proc.poll() is None, (tmp_path / "recorder.log").read_text()
        assert time.monotonic() < deadline, "the recorder never said it was up"
        time.sleep(0.1)
    return proc, log


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_idle_recorder_exits_cleanly_and_promptly_on_a_signal(tmp_path, sig):
    proc, log = _start_recorder(tmp_path)
    try:
        time.sleep(1.0)               # idle: no sensor, no goal, nothing due
        t0 = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "recorder.log").read_text()
    assert code == 0 and "Traceback" not in text, text
    assert took < STOP_WITHIN_S, f"took {took:.2f} s to stop"
    assert f"recording to {tmp_path / 'bags'}" in text


@pytest.mark.parametrize("value, says", [("5", "light_jitter must be in [0, 1]"),
                                         ("abc", "parameter light_jitter takes a number")])
def test_a_bad_parameter_stops_the_node_with_one_error_line_not_a_traceback(value, says):
    proc = subprocess.run([sys.executable, "-m", "sequence_ai_ros.sim_node", "--ros-args", "-p", f"light_jitter:={value}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: {says}" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
