"""Imported first by each node's module: a signal during the node process's imports ends it quietly.

``ros2 launch`` (or a user's Ctrl-C) can stop a node while it still imports rclpy, numpy,
MuJoCo or the client (seconds on a loaded machine). Python's default SIGINT handler then prints
a ``KeyboardInterrupt`` traceback from inside some import, and SIGTERM kills the process with
no exit code of its own (launch reports "process has died"). When this process was started as
one of the node executables (``policy_driver``, ``sim_robot``, ``episode_recorder``, or
``python -m sequence_ai_ros.<module>``), the first SIGINT or SIGTERM raises ``SystemExit(0)``
instead (later ones are ignored) until ``_spin.spin_node`` installs its own handlers: nothing
runs yet, so there is nothing to stop but the imports, and Python exits without a traceback. Imported anywhere else (a test, the demo, a
user's process) this module changes nothing.
"""
from __future__ import annotations

import os
import signal
import sys

EXECUTABLES = frozenset({"policy_driver", "sim_robot", "episode_recorder",
                         "driver_node.py", "sim_node.py", "recorder_node.py"})


def _started_as_node() -> bool:
    return bool(sys.argv) and os.path.basename(sys.argv[0] or "") in EXECUTABLES


def _quiet_exit(signum, frame):
    for sig in (signal.SIGINT, signal.SIGTERM):   # a second one must not kill the exit under way
        signal.signal(sig, signal.SIG_IGN)
    raise SystemExit(0)


if _started_as_node():
    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, _quiet_exit)
