"""One ``main()`` for every node here: spin until Ctrl-C / SIGTERM, then shut down in order.

rclpy's default signal handler invalidates the ROS context the moment Ctrl-C arrives, before a
node can publish anything on its way out (the driver's hold, the recorder's end-of-episode
marker). So the process takes SIGINT and SIGTERM itself, and a signal never lands as an
exception in the middle of a callback:

* while the node is being built (``make_node``: the driver's configure can wait for its gateway
  or its model there) the first signal raises ``KeyboardInterrupt`` in the main thread, which
  ends that wait; the process exits 0 without a node;
* once it spins, the executor runs on a thread of its own and the main thread only waits for a
  signal: the first one sets the stop, ``on_stop(node)`` runs while the context is still valid
  and the executor still spins (the driver's result goes out), then the executor is stopped and
  joined, the node destroyed and rclpy shut down -- joined, so rclpy's C++ layer does not abort;
* every later signal is ignored (Ctrl-C under ``ros2 launch`` reaches a node twice: from the
  terminal to the process group, and forwarded by launch; a second ``KeyboardInterrupt`` raised
  during the first one's shutdown printed a traceback). ``ros2 launch`` escalates to SIGKILL
  itself when a node does not stop within its timeouts.

The import window before ``spin_node`` runs is covered by :mod:`._entry`.

A node that destroys its own entities while it spins (the driver's lifecycle cleanup and shutdown
transitions, run on an executor thread) races rclpy's wait-set build on the spinning thread: an
entity's QoS event handler whose destruction was requested after the build took it raises
``InvalidHandle`` there, which ends ``executor.spin()`` (its thread dies; nothing is executed any
more, so service replies and results never arrive). :func:`spin_once` and :func:`spin` ride that
out: the wait set is dropped, and the next one no longer lists the destroyed entity.
"""
from __future__ import annotations

import signal
import sys
import threading
import traceback
from typing import Callable, Optional

import rclpy
from rclpy.exceptions import InvalidHandle
from rclpy.executors import Executor, ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions


SPIN_WAKE_S = 0.2
"""The longest one executor slice of :func:`spin` waits (s): how soon a spinning thread sees
that it is asked to stop."""


def spin_once(executor: Executor, timeout_sec: float) -> None:
    """``executor.spin_once(timeout_sec)`` (s) that survives an entity destroyed by another thread
    while this one built its wait set (see the module docstring). Raises what ``spin_once`` raises
    otherwise (``ExternalShutdownException`` when the context was shut down)."""
    try:
        executor.spin_once(timeout_sec=timeout_sec)
    except InvalidHandle:
        pass   # an entity being destroyed: the next wait set leaves it out


def spin(executor: Executor, until: Optional[threading.Event] = None) -> None:
    """``executor.spin()`` for a spinning thread, through :func:`spin_once`: returns once the
    executor is shut down or its context is, or ``until`` is set (seen within ``SPIN_WAKE_S``).
    Raises nothing of the destroy race; a callback's exception propagates."""
    while executor.context.ok() and not executor._is_shutdown:   # Executor.spin()'s own condition
        if until is not None and until.is_set():
            return
        try:
            spin_once(executor, SPIN_WAKE_S)
        except ExternalShutdownException:
            return


def stop_executor(executor: MultiThreadedExecutor, timeout_s: float = 5.0) -> None:
    """Stop ``executor`` and let the callbacks it already handed to its thread pool finish,
    *before* the caller destroys its nodes.

    ``Executor.shutdown()`` of the rclpy here returns without waiting for them, so a timer or
    subscription callback queued in the pool ran after ``destroy_node()`` and failed with
    "cannot use Destroyable because destruction was requested"; nobody read that exception, and
    rclpy printed "The following exception was never retrieved" when the task was collected.
    This joins the pool (at most ``timeout_s`` s for the executor's own wait) and reads every
    finished task's exception, so teardown is quiet. Call it from a thread that is not one of
    the executor's own. Waits at most about ``2 * timeout_s``. Raises nothing.
    """
    executor.shutdown(timeout_sec=timeout_s)
    pool = getattr(executor, "_executor", None)           # MultiThreadedExecutor's ThreadPoolExecutor
    if pool is not None:   # bounded: a callback stuck for good must not hang the process at exit
        joiner = threading.Thread(target=pool.shutdown, kwargs={"wait": True}, daemon=True)
        joiner.start()
        joiner.join(timeout_s)
    for task in list(getattr(executor, "_futures", ()) or ()):
        if task.done():
            task.exception()    # marks it read; a callback's error here is teardown noise


class _Stop:
    """SIGINT / SIGTERM for :func:`spin_node`: the first one sets ``requested`` (and raises
    ``KeyboardInterrupt`` while ``interrupt_main``, i.e. while the node is being built); every
    later one is ignored."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.interrupt_main = True
        self.signum: Optional[int] = None
        for sig in (signal.SIGINT, signal.SIGTERM):   # SIGINT also when started with it ignored (`&`)
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.requested.is_set():
            return                        # already stopping: a second Ctrl-C, launch's forwarded SIGINT
        self.signum = signum
        self.requested.set()
        if self.interrupt_main:
            self.interrupt_main = False
            raise KeyboardInterrupt

    def set(self) -> None:
        """Stop without a signal (the spinning thread ended)."""
        self.interrupt_main = False
        self.requested.set()


def spin_node(make_node: Callable[[], Node], *, threads: int, args=None,
              on_stop: Optional[Callable[[Node], None]] = None) -> int:
    """Create the node with ``make_node()``, spin it on ``threads`` executor threads, stop cleanly.

    Args:
        make_node: builds the node (after ``rclpy.init``).
        threads: MultiThreadedExecutor threads.
        args: command-line arguments for ``rclpy.init`` (``--ros-args ...``).
        on_stop: called with the node after Ctrl-C / SIGTERM, before anything is shut down,
            while the executor still spins on its thread.
    Returns:
        the process exit code: 0; 2 when ``make_node`` refused a parameter (``ValueError``,
        printed as one ``error:`` line); 1 when a callback raised (its traceback printed).
    """
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = _Stop()
    node = None
    executor = MultiThreadedExecutor(num_threads=threads)
    release = threading.Event()      # the spinning thread leaves once on_stop is done
    spinner: Optional[threading.Thread] = None
    failure: list = []

    def spin_thread() -> None:
        try:
            spin(executor, until=release)
        except BaseException as exc:  # noqa: BLE001 - a callback raised: reported by the main thread
            failure.append(exc)
        finally:
            stop.set()

    code = 0
    try:
        try:
            node = make_node()
        except ValueError as exc:      # a bad parameter: say which, no traceback
            print(f"error: {exc}", file=sys.stderr)
            code = 2
        else:
            stop.interrupt_main = False
            executor.add_node(node)
            spinner = threading.Thread(target=spin_thread, name="executor", daemon=True)
            spinner.start()
            stop.requested.wait()     # a signal's handler runs here (this wait is interruptible)
    except KeyboardInterrupt:
        pass                          # a signal while the node was being built
    finally:
        stop.set()                    # from here on every signal is ignored
        try:
            if node is not None and on_stop is not None:
                on_stop(node)
        finally:
            release.set()
            if spinner is not None:
                spinner.join(SPIN_WAKE_S + 5.0)
            stop_executor(executor)
            if node is not None:
                node.destroy_node()
            if rclpy.ok():
                rclpy.shutdown()
    if failure:
        traceback.print_exception(failure[0])
        return 1
    return code
