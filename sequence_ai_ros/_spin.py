"""One ``main()`` for every node here: spin until Ctrl-C / SIGTERM, then shut down in order.

rclpy's default signal handler invalidates the ROS context the moment Ctrl-C arrives, before a
node can publish anything on its way out (the driver's hold, the recorder's end-of-episode
marker). So the process takes SIGINT and SIGTERM itself: the signal becomes KeyboardInterrupt in
the main thread, ``on_stop(node)`` runs while the context is still valid, and only then are the
executor, the node and rclpy shut down -- joined, so rclpy's C++ layer does not abort at exit.

Python runs a signal handler only when the main thread is back in the interpreter, and without
rclpy's own handler nothing wakes an executor that waits with no timer due (an idle recorder).
So the main thread spins in ``SPIN_WAKE_S`` slices: a signal is acted on within that long.

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
from typing import Callable, Optional

import rclpy
from rclpy.exceptions import InvalidHandle
from rclpy.executors import Executor, ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions


SPIN_WAKE_S = 0.2
"""The longest the main thread waits in one executor slice (s): the bound on signal latency."""


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def spin_once(executor: Executor, timeout_sec: float) -> None:
    """``executor.spin_once(timeout_sec)`` (s) that survives an entity destroyed by another thread
    while this one built its wait set (see the module docstring). Raises what ``spin_once`` raises
    otherwise (``ExternalShutdownException`` when the context was shut down)."""
    try:
        executor.spin_once(timeout_sec=timeout_sec)
    except InvalidHandle:
        pass   # an entity being destroyed: the next wait set leaves it out


def spin(executor: Executor) -> None:
    """``executor.spin()`` for a spinning thread, through :func:`spin_once`: returns once the
    executor is shut down or its context is. Raises nothing of the destroy race."""
    while executor.context.ok() and not executor._is_shutdown:   # Executor.spin()'s own condition
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


def spin_node(make_node: Callable[[], Node], *, threads: int, args=None,
              on_stop: Optional[Callable[[Node], None]] = None) -> int:
    """Create the node with ``make_node()``, spin it on ``threads`` executor threads, stop cleanly.

    Args:
        make_node: builds the node (after ``rclpy.init``).
        threads: MultiThreadedExecutor threads.
        args: command-line arguments for ``rclpy.init`` (``--ros-args ...``).
        on_stop: called with the node after Ctrl-C / SIGTERM, before anything is shut down.
    Returns:
        the process exit code: 0, or 2 when ``make_node`` refused a parameter (``ValueError``,
        printed as one ``error:`` line).
    """
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    signal.signal(signal.SIGINT, _raise_keyboard_interrupt)   # also when started with SIGINT ignored (a shell's `&`)
    node = None
    executor = MultiThreadedExecutor(num_threads=threads)
    try:
        try:
            node = make_node()
        except ValueError as exc:      # a bad parameter: say which, no traceback
            print(f"error: {exc}", file=sys.stderr)
            return 2
        executor.add_node(node)
        while rclpy.ok():
            spin_once(executor, SPIN_WAKE_S)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None and on_stop is not None:
            on_stop(node)
        stop_executor(executor)
        if node is not None:
            node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()
    return 0
