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

The executor is a :class:`NodeExecutor`: single-threaded, so a node's CPU is its callbacks' work
(``MultiThreadedExecutor`` here spun a core for one 30 Hz subscription), with threads only for the
callback groups a node names as blocking (the Act goal's run, a configure waiting for its
gateway, a recorder's episode goal).

A node that destroys its own entities while it spins (the driver's lifecycle cleanup and shutdown
transitions, run on an executor thread) races rclpy's wait-set build on the spinning thread: an
entity's QoS event handler whose destruction was requested after the build took it raises
``InvalidHandle`` there, which ends ``executor.spin()`` (its thread dies; nothing is executed any
more, so service replies and results never arrive). :func:`spin_once`, :func:`spin` and
:meth:`NodeExecutor.spin_until_set` ride that out: the wait set is dropped, and the next one no
longer lists the destroyed entity. A timer cancelled by another thread after the wait reported it
ready (the driver cancels its camera watch when a run ends) makes rclpy's take raise "timer is
canceled" and leaves the timer and its callback group marked busy; ``NodeExecutor`` skips that
callback and clears both marks, so the timer fires again once reset and its group is not stuck.
An executor shut down by another thread while the spinning thread builds a wait set (a test's
teardown, ``stop_executor``) ends the spin quietly rather than with rclpy's AttributeError.
"""
from __future__ import annotations

import faulthandler
import signal
import sys
import threading
import time
import traceback
from typing import Callable, Optional

import rclpy
from rclpy.exceptions import InvalidHandle
from rclpy.executors import (ConditionReachedException, Executor, ExternalShutdownException, ShutdownException,
                             SingleThreadedExecutor, TimeoutException)
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions
from rclpy.task import Task


TEARDOWN_LIMIT_S = 30.0
"""How long :func:`spin_node` gives the teardown after ``on_stop`` (executor stopped, node destroyed,
rclpy shut down; about 0.1 s normally) before the process prints every thread's stack and exits 1.
Above the bounded waits inside it: the spinning thread's join (5 s) and :func:`stop_executor`
(about 10 s at most), so only a teardown stuck for good reaches it.
Fast DDS 2.14 (the Jazzy wheels) can spin forever at 100 % of a core while it destroys a participant:
``DomainParticipant::set_listener(nullptr)`` waits, without releasing its mutex, for a discovery
callback that needs that mutex (eProsima/Fast-DDS#6513). It struck the suite's own process once in
about twenty runs; a node stopped by Ctrl-C must not hang there. faulthandler's watchdog is a C thread,
so it fires while that spin holds the GIL."""

SPIN_WAKE_S = 0.2
"""The longest one executor slice of :func:`spin` waits (s): how soon a spinning thread sees
that it is asked to stop."""


def _timer_cancel_race(exc: BaseException) -> bool:
    """True for rclpy's "timer is canceled" RCLError: a timer the wait set saw ready was cancelled
    by another thread (the driver's camera watch, when a run ends) before this thread took it."""
    return type(exc).__name__ == "RCLError" and "timer is canceled" in str(exc)


def _release_after_cancel_race(entity) -> None:
    """What rclpy's handler skips when taking the timer raises: the timer is marked as back in the
    wait list and its callback group as no longer executing it. Without this the timer never
    fires again in this executor, and a mutually exclusive group's other callbacks never run."""
    entity._executor_event = False
    try:
        entity.callback_group.ending_execution(entity)
    except Exception:  # noqa: BLE001 - a group that did not count it
        pass


def _destroyed_waitable_race(exc: BaseException) -> bool:
    """True for rclpy's RCLError "Failed to add 'rcl_action_server_t' to wait set: action server
    pointer is invalid" (or a client's): an action server or client destroyed by another thread
    after this one took it into its wait set (a recorder removed and destroyed mid-spin; it ended a
    test module's spinning thread once in clean-clone CI)."""
    text = str(exc)
    return type(exc).__name__ == "RCLError" and "to wait set" in text and "pointer is invalid" in text


def spin_once(executor: Executor, timeout_sec: float) -> None:
    """``executor.spin_once(timeout_sec)`` (s) that survives an entity destroyed by another thread
    while this one built its wait set (see the module docstring), an action server or client
    included. Raises what ``spin_once`` raises otherwise (``ExternalShutdownException`` when the
    context was shut down)."""
    try:
        executor.spin_once(timeout_sec=timeout_sec)
    except InvalidHandle:
        pass   # an entity being destroyed: the next wait set leaves it out
    except Exception as exc:  # noqa: BLE001 - only the destroy race is ridden out
        if not _destroyed_waitable_race(exc):
            raise


def _shut_down_meanwhile(executor: Executor) -> bool:
    """True when ``executor`` was shut down by another thread: ``Executor.shutdown`` sets its
    guard conditions to None, and a wait set being built on the spinning thread at that moment
    meets the None (``AttributeError: 'NoneType' object has no attribute 'handle'``). The
    spinning thread then ends as it would have at its next check, instead of dying with the
    error; an AttributeError of a running executor (a callback's) is raised."""
    return bool(executor._is_shutdown)


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
        except AttributeError:
            if _shut_down_meanwhile(executor):
                return
            raise


class NodeExecutor(SingleThreadedExecutor):
    """A single-threaded executor that idles: callbacks run on the spinning thread, one at a time,
    except those of the callback groups a node names as blocking, each of which runs on a thread
    of its own while it lasts.

    Why not ``MultiThreadedExecutor``: the rclpy here keeps each callback it hands to its pool in
    its task list, and every pass yields each task not executing yet before it waits, so the
    spinning thread resubmits them instead of waiting while the pool (contending for the GIL)
    gets round to them: 85-100 % of a core for one 30 Hz subscription (measured with rclpy 7.1.5), where a
    single-threaded executor uses 2-3 %. Here the spinning thread waits in ``rcl_wait`` whenever
    nothing is due (test_node_executor measures its CPU).

    Blocking work (the Act goal's run, a lifecycle configure that waits for its gateway, the
    recorder's RecordEpisode goal and bag rewrites) runs on a thread started for that callback,
    so sensor callbacks, timers and the parameter and action services keep being served while it
    runs. A node names those groups in ``blocking_callback_groups`` (read by :meth:`add_node`), or
    a caller passes them to :meth:`run_on_thread`. Tasks created from a method of an object whose
    ``callback_group`` is one of them run on a thread too: the action server's execute task
    (``ActionServer.notify_execute`` -> ``create_task(self._execute_goal, ...)``), i.e. the goal's
    run. While such a thread runs, a mutually exclusive group's other callbacks wait (rclpy leaves
    them out of the wait set), as they would in any executor.

    An exception raised by a callback on a thread is raised again on the spinning thread at its
    next :meth:`spin_once` (as ``MultiThreadedExecutor`` does with its pool's).
    Call :meth:`join_threads` after stopping the spinning thread and before destroying the nodes.
    """

    def __init__(self, *, context=None) -> None:
        super().__init__(context=context)
        self._threaded_groups: set = set()
        self._threads: set = set()
        self._threads_lock = threading.Lock()
        self._thread_errors: list = []

    def run_on_thread(self, *groups) -> None:
        """Run the callbacks of ``groups`` (``CallbackGroup``) on threads of their own."""
        self._threaded_groups.update(groups)

    def add_node(self, node) -> bool:
        self.run_on_thread(*getattr(node, "blocking_callback_groups", ()))
        return super().add_node(node)

    def create_task(self, callback, *args, **kwargs) -> Task:
        # rclpy's create_task, with the mark set before the task becomes visible to the spinning thread
        task = Task(callback, args, kwargs, executor=self)
        owner = getattr(callback, "__self__", None)
        if getattr(owner, "callback_group", None) in self._threaded_groups:
            task._sequence_ai_thread = True
        with self._tasks_lock:
            self._tasks.append((task, None, None))
            if self._guard is not None:    # None once shut down (a run thread finishing late)
                self._guard.trigger()
        return task

    def _on_thread(self, handler, entity) -> bool:
        if getattr(handler, "_sequence_ai_thread", False):
            return True
        group = getattr(entity, "callback_group", None)
        return group is not None and group in self._threaded_groups

    def _start_thread(self, handler) -> None:
        running = getattr(handler, "_sequence_ai_runner", None)
        if running is not None and running.is_alive():
            # yielded again before its thread got inside it (a task not yet executing is
            # yielded on every pass): let that thread get there
            time.sleep(0.0002)
            return
        started = threading.Event()

        def run():
            started.set()
            try:
                handler()
                if handler.done() and handler.exception() is not None:
                    with self._threads_lock:
                        self._thread_errors.append(handler.exception())
                    self.wake()
            finally:
                with self._threads_lock:
                    self._threads.discard(thread)

        thread = threading.Thread(target=run, name="callback", daemon=True)
        handler._sequence_ai_runner = thread   # a coroutine that suspended is resumed on a new one
        with self._threads_lock:
            self._threads.add(thread)
        thread.start()
        started.wait()

    def read_errors(self) -> list:
        """The exceptions raised by callbacks on threads and not raised again yet (cleared)."""
        with self._threads_lock:
            errors, self._thread_errors = self._thread_errors, []
        return errors

    def _spin_once_impl(self, timeout_sec=None, wait_condition=lambda: False) -> None:
        errors = self.read_errors()
        if errors:
            raise errors[0]
        try:
            handler, entity, node = self.wait_for_ready_callbacks(timeout_sec, None, wait_condition)
        except (ShutdownException, TimeoutException, ConditionReachedException):
            return
        if self._on_thread(handler, entity):
            self._start_thread(handler)
            return
        handler()
        if handler.exception() is not None:
            if _timer_cancel_race(handler.exception()):   # cancelled by another thread after the wait: not run
                _release_after_cancel_race(entity)
                return
            raise handler.exception()
        handler.result()

    def spin_until_set(self, event: threading.Event) -> None:
        """Spin until ``event`` is set (wake it with :meth:`wake` after setting it), the executor
        is shut down or its context is. Survives the destroy race (module docstring)."""
        while not event.is_set() and self._context.ok() and not self._is_shutdown:
            try:
                self._spin_once_impl(None, event.is_set)
            except InvalidHandle:
                pass
            except ExternalShutdownException:
                return
            except AttributeError:
                if _shut_down_meanwhile(self):
                    return
                raise

    def join_threads(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s`` s in all) for the callbacks running on threads; True when none is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._threads_lock:
                threads = list(self._threads)
            if not threads:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            threads[0].join(left)


def destroy_node(node: Node) -> None:
    """``node.destroy_node()``, then destroy the node's action servers and clients it left.

    rclpy's ``destroy_node`` destroys publishers, subscriptions, services, clients, timers and
    guard conditions, but not the action servers and clients (waitables): each keeps the rcl node
    alive, so the node -- and with the last node of a context, its DDS participant -- was
    finalized by whichever garbage collection later freed them, in the middle of unrelated code.
    That moved Fast DDS's participant teardown (see ``TEARDOWN_LIMIT_S``) to a random point: a
    suite's pytest worker hung there, inside an HTTP request of a later test. Raises nothing that
    ``destroy_node`` does not.
    """
    from rclpy.action import ActionClient, ActionServer
    node.destroy_node()        # first: a node's own destroy_node may still use them (the driver's result)
    for waitable in list(node.waitables):
        if isinstance(waitable, (ActionClient, ActionServer)):
            waitable.destroy()


def stop_executor(executor: Executor, timeout_s: float = 5.0) -> None:
    """Stop ``executor`` and let the callbacks it already handed to its threads finish (a
    ``MultiThreadedExecutor``'s pool, a :class:`NodeExecutor`'s callback threads), *before* the
    caller destroys its nodes.

    ``Executor.shutdown()`` of the rclpy here returns without waiting for them, so a timer or
    subscription callback queued in the pool ran after ``destroy_node()`` and failed with
    "cannot use Destroyable because destruction was requested"; nobody read that exception, and
    rclpy printed "The following exception was never retrieved" when the task was collected.
    This joins the pool (at most ``timeout_s`` s for the executor's own wait) and reads every
    finished task's exception, so teardown is quiet. Call it from a thread that is not one of
    the executor's own. Waits at most about ``2 * timeout_s``. Raises nothing.
    """
    executor.shutdown(timeout_sec=timeout_s)
    if isinstance(executor, NodeExecutor):
        executor.join_threads(timeout_s)
        executor.read_errors()
        return
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


def spin_node(make_node: Callable[[], Node], *, args=None,
              on_stop: Optional[Callable[[Node], None]] = None) -> int:
    """Create the node with ``make_node()``, spin it on a :class:`NodeExecutor`, stop cleanly.

    Args:
        make_node: builds the node (after ``rclpy.init``); its ``blocking_callback_groups``
            run on threads of their own (see :class:`NodeExecutor`).
        args: command-line arguments for ``rclpy.init`` (``--ros-args ...``).
        on_stop: called with the node after Ctrl-C / SIGTERM, before anything is shut down,
            while the executor still spins on its thread.
    Returns:
        the process exit code: 0; 2 when ``make_node`` refused a parameter (``ValueError``,
        printed as one ``error:`` line); 1 when a callback raised (its traceback printed). A
        teardown that takes over ``TEARDOWN_LIMIT_S`` ends the process with exit code 1 and
        every thread's stack on stderr instead.
    """
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = _Stop()
    node = None
    executor = NodeExecutor()
    release = threading.Event()      # the spinning thread leaves once on_stop is done
    spinner: Optional[threading.Thread] = None
    failure: list = []

    def spin_thread() -> None:
        try:
            executor.spin_until_set(release)
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
            faulthandler.dump_traceback_later(TEARDOWN_LIMIT_S, exit=True)   # see TEARDOWN_LIMIT_S
            release.set()
            if spinner is not None:
                executor.wake()
                spinner.join(5.0)
            stop_executor(executor)
            if node is not None:
                destroy_node(node)
            if rclpy.ok():
                # uninstall_handlers=False: rclpy's uninstall (it installed none: NO) set SIGINT
                # back to the OS default, and a Ctrl-C after it killed the process (exit -2)
                rclpy.shutdown(uninstall_handlers=False)
            faulthandler.cancel_dump_traceback_later()
            # Python's finalization sets every signal with a Python handler back to the OS default
            # (not one set to SIG_IGN), and a repeated Ctrl-C / SIGTERM landing there killed the
            # process as it exited (exit -2 / -15, "process has died"): it is done, ignore them
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
    if failure:
        traceback.print_exception(failure[0])
        return 1
    return code
