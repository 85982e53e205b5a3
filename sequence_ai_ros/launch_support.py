"""For launch files: ``ros2 launch`` stops its nodes on SIGTERM as it does on Ctrl-C.

Upstream ``launch`` (Jazzy, 3.4) registers a SIGTERM callback on its signal manager, but installs
no Python handler for SIGTERM, so the signal's default action kills ``ros2 launch`` at once (exit
-15, measured: 104 ms) while the nodes it started keep running, unstopped (the driver published
no hold, the recorder closed no bag), until they die with their pipes about 2 s later; and with
a handler its callback only cancels the run ("using SIGTERM can result in orphaned processes").
systemd, docker, a supervisor or ``kill`` send exactly that signal. :func:`stop_nodes_on_sigterm` makes the first SIGTERM a
shutdown like Ctrl-C's instead: SIGINT to every node (each holds, sends its results, closes its
bag), ``sigterm_timeout`` / ``sigkill_timeout`` escalation as usual, and ``ros2 launch`` returns
once they have exited. A later SIGTERM is ignored (the escalation is under way); SIGQUIT keeps
launch's own meaning.

It installs a Python handler for SIGTERM (which does nothing itself: it makes the signal reach
launch's wake-up socket) and replaces launch's SIGTERM callback on the signal manager the running
``LaunchService`` installed (``launch.utilities.signal_management.AsyncSafeSignalManager``,
reached through its name-mangled class attribute: launch has no public hook for this). Where there is none -- a launch service run
off the main thread, as launch_pytest does -- it does nothing.

    from sequence_ai_ros.launch_support import stop_nodes_on_sigterm
    LaunchDescription([stop_nodes_on_sigterm(), Node(...), ...])
"""
from __future__ import annotations

import signal
import threading

from launch.actions import OpaqueFunction

__all__ = ["stop_nodes_on_sigterm", "config_file", "driver_and_recorder"]


def stop_nodes_on_sigterm() -> OpaqueFunction:
    """An action (put it first in a ``LaunchDescription``) that makes SIGTERM to ``ros2 launch``
    stop every node as Ctrl-C does (see the module docstring). Idempotent: including several
    launch files that each carry it installs the handler once."""
    return OpaqueFunction(function=_install)


def _install(context):
    from launch.events import Shutdown
    from launch.logging import get_logger
    from launch.utilities.signal_management import AsyncSafeSignalManager

    manager = getattr(AsyncSafeSignalManager, "_AsyncSafeSignalManager__current", None)
    if manager is None or threading.current_thread() is not threading.main_thread():
        return None
    if getattr(manager, "_sequence_ai_sigterm", False):
        return None
    manager._sequence_ai_sigterm = True
    logger = get_logger("launch")
    seen = []

    def on_sigterm(signum):
        if seen:
            logger.warning("SIGTERM again: the nodes are already stopping (launch escalates to SIGTERM "
                           "and SIGKILL after sigterm_timeout / sigkill_timeout)")
            return
        seen.append(signum)
        logger.warning("SIGTERM: stopping every node as on Ctrl-C (SIGINT to each)")
        # due_to_sigint=False: launch sends SIGINT to each process itself (no terminal did)
        context.emit_event_sync(Shutdown(reason="SIGTERM", due_to_sigint=False))

    manager.handle(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGTERM, _wake_launch)
    return None


def _wake_launch(signum, frame) -> None:
    """The Python-level SIGTERM handler: Python writes the signal to the wake-up fd launch's
    signal manager reads (only for signals that have a Python handler); the work is done there."""


def config_file(context) -> str:
    """The ``config`` launch argument as a path: a bare name is a file in the ``sequence_ai``
    package's ``config/`` folder, an absolute path is taken as is. Raises FileNotFoundError naming
    the argument when the file does not exist."""
    import os

    from ament_index_python.packages import get_package_share_directory
    from launch.substitutions import LaunchConfiguration

    config = LaunchConfiguration("config").perform(context)
    if not os.path.isabs(config):
        config = os.path.join(get_package_share_directory("sequence_ai"), "config", config)
    if not os.path.isfile(config):
        raise FileNotFoundError(f"config:={config} does not exist; give a file in the sequence_ai package's "
                                f"config/ folder or an absolute path")
    return config


def driver_and_recorder(context, config: str) -> list:
    """The ``policy_driver`` node (parameters from ``config``, its ``model`` overridden by a non-empty
    ``model`` argument) and the ``episode_recorder`` node (one bag per Act goal under
    ``record_dir``, started when ``record`` is true), both in the ``namespace`` argument."""
    from launch.conditions import IfCondition
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    namespace = LaunchConfiguration("namespace")
    params: list = [config]
    model = LaunchConfiguration("model").perform(context)
    if model:
        params.append({"model": model})
    return [
        Node(package="sequence_ai", executable="policy_driver", name="policy_driver",
             namespace=namespace, parameters=params, output="screen"),
        Node(package="sequence_ai", executable="episode_recorder", name="episode_recorder", namespace=namespace,
             parameters=[config, {"auto_record": True, "output_dir": LaunchConfiguration("record_dir")}],
             output="screen", condition=IfCondition(LaunchConfiguration("record"))),
    ]
