"""The console scripts of the ROS 2 nodes (``ros2 run sequence_ai <name>``; setup.py's entry
points): each imports its node module only when run, so a missing library is one line naming
what to install (:func:`sequence_ai.extras.missing_line`: the extra, or the ROS 2 set-up for
rclpy and the message packages) and exit code 1, not an ImportError traceback.

The node module is the first thing imported (it installs its quiet signal handlers before its
own imports); ``sequence_ai.extras`` only once a module is found missing.
"""
from __future__ import annotations

import sys
from typing import Callable, Optional

__all__ = ["sim_robot", "policy_driver", "episode_recorder"]


def _guarded(load: Callable[[], Callable[[], Optional[int]]], command: str, extra: str) -> int:
    """``load()()``'s exit code, or 1 after one line on stderr when it raised ModuleNotFoundError
    for a third-party module (``sequence_ai.extras.guarded``, with the import of the node first)."""
    try:
        rc = load()()
    except ModuleNotFoundError as exc:
        from sequence_ai.extras import missing_line
        line = missing_line(exc, command, extra)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1
    return 0 if rc is None else int(rc)


def sim_robot() -> int:
    """``sim_robot``: the simulated Panda cell (needs the sim extra and ROS 2)."""
    def load():
        from .sim_node import main
        return main
    return _guarded(load, "sim_robot", "sim")


def policy_driver() -> int:
    """``policy_driver``: the lifecycle node that drives a robot with a policy (the ros extra, ROS 2)."""
    def load():
        from .driver_node import main
        return main
    return _guarded(load, "policy_driver", "ros")


def episode_recorder() -> int:
    """``episode_recorder``: records episodes to bags (the data extra, ROS 2)."""
    def load():
        from .recorder_node import main
        return main
    return _guarded(load, "episode_recorder", "data")
