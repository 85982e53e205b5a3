"""``_spin.NodeExecutor``: one spinning thread that waits when nothing is due, threads only for the
callback groups a node names as blocking, and every guarantee the multi-threaded design gave:
other callbacks (timers, subscriptions, services, action requests) are served while a blocking
callback or an action goal's run goes on; its result is sent; stopping never deadlocks on a
callback still running; a blocking callback's exception reaches the spinning thread.

Real rclpy (Fast DDS) in this process, a context per test.
"""
from __future__ import annotations

import resource
import threading
import time

import pytest
import rclpy
from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient, ActionServer
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from std_msgs.msg import String
from std_srvs.srv import Trigger

from sequence_ai_msgs.action import Act
from _wait import eventually
from sequence_ai_ros._spin import destroy_node, NodeExecutor, stop_executor


class Spinning:
    """A NodeExecutor spun by a thread that measures its own CPU time."""

    def __init__(self, ctx, *nodes):
        self.ex = NodeExecutor(context=ctx)
        for n in nodes:
            self.ex.add_node(n)
        self.stop = threading.Event()
        self.cpu_s = self.wall_s = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        c0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.monotonic()
        try:
            self.ex.spin_until_set(self.stop)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc
        c1 = resource.getrusage(resource.RUSAGE_THREAD)
        self.wall_s = time.monotonic() - t0
        self.cpu_s = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)

    def halt(self, timeout=5.0) -> float:
        """Stop the spinning thread; returns how long that took (s)."""
        t0 = time.monotonic()
        self.stop.set()
        self.ex.wake()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the spinning thread did not stop"
        return time.monotonic() - t0


@pytest.fixture
def ctx():
    c = rclpy.context.Context()
    rclpy.init(context=c)
    yield c
    rclpy.shutdown(context=c)


def test_the_spinning_thread_sleeps_between_messages(ctx):
    """One 30 Hz subscription: the spinning thread's CPU is the callbacks' work (a
    MultiThreadedExecutor here spun 85-100 % of a core for the same)."""
    pub_node = rclpy.create_node("pub", context=ctx)
    sub_node = rclpy.create_node("sub", context=ctx)
    got = []
    sub_node.create_subscription(String, "idle_topic", lambda m: got.append(m), 10)
    pub = pub_node.create_publisher(String, "idle_topic", 10)
    spinning = Spinning(ctx, sub_node)
    try:
        eventually(lambda: pub.get_subscription_count() > 0, 20.0, what="discovery")
        t0 = time.monotonic()
        k = 0
        while time.monotonic() - t0 < 2.0:          # 30 Hz for 2 s, from this (the test's) thread
            pub.publish(String(data=str(k)))
            k += 1
            time.sleep(max(0.0, t0 + k / 30.0 - time.monotonic()))
        eventually(lambda: len(got) >= k - 2, 10.0, what="the messages")
    finally:
        spinning.halt()
        stop_executor(spinning.ex)
        sub_node.destroy_node()
        pub_node.destroy_node()
    share = spinning.cpu_s / spinning.wall_s
    print(f"spinning thread: {100 * share:.1f} % of a core for {len(got)} messages in {spinning.wall_s:.1f} s")
    assert spinning.error is None, spinning.error
    assert share < 0.25, share     # work: well under 5 %; a spinning loop takes a core (less only when starved)


def test_a_blocking_goal_and_service_run_on_threads_while_everything_else_is_served(ctx):
    server_node = rclpy.create_node("blocking_server", context=ctx)
    client_node = rclpy.create_node("blocking_client", context=ctx)
    release = threading.Event()
    ticks, messages, threads = [], [], {}
    blocking_srv, act = MutuallyExclusiveCallbackGroup(), ReentrantCallbackGroup()
    server_node.blocking_callback_groups = [blocking_srv, act]

    def slow_service(request, response):        # blocks until the test releases it
        threads["service"] = threading.current_thread().name
        release.wait(20.0)
        response.success, response.message = True, "released"
        return response

    def execute(goal_handle):                   # a goal's run: blocks too
        threads["goal"] = threading.current_thread().name
        release.wait(20.0)
        goal_handle.succeed()
        return Act.Result(reason="completed", actions=3)

    server_node.create_service(Trigger, "slow", slow_service, callback_group=blocking_srv)
    server_node.create_service(Trigger, "quick", lambda req, res: setattr(res, "success", True) or res)
    server_node.create_timer(0.02, lambda: ticks.append(time.monotonic()))
    server_node.create_subscription(String, "chatter", messages.append, 10)
    server = ActionServer(server_node, Act, "blocking_act", execute_callback=execute, callback_group=act)
    spinning = Spinning(ctx, server_node)
    client_ex = NodeExecutor(context=ctx)   # the client side spins separately, as another process would
    client_ex.add_node(client_node)
    client_stop = threading.Event()
    client_thread = threading.Thread(target=client_ex.spin_until_set, args=(client_stop,), daemon=True)
    client_thread.start()
    try:
        slow = client_node.create_client(Trigger, "slow")
        quick = client_node.create_client(Trigger, "quick")
        action = ActionClient(client_node, Act, "blocking_act")
        pub = client_node.create_publisher(String, "chatter", 10)
        assert slow.wait_for_service(timeout_sec=20.0) and quick.wait_for_service(timeout_sec=20.0)
        assert action.wait_for_server(timeout_sec=20.0)
        slow_answer = slow.call_async(Trigger.Request())
        goal = action.send_goal_async(Act.Goal(instruction="block", max_seconds=5.0))
        eventually(lambda: "service" in threads and "goal" in threads, 20.0, what="both blocking callbacks running")
        eventually(lambda: goal.done(), 20.0, what="the goal's acceptance while its run blocks")
        result = goal.result().get_result_async()
        # while both block: timers fire, messages arrive, another service answers
        n_ticks = len(ticks)
        for i in range(5):
            pub.publish(String(data=str(i)))
        answers = [quick.call_async(Trigger.Request()) for _ in range(3)]
        eventually(lambda: all(a.done() for a in answers), 20.0, what="the quick service while the others block")
        eventually(lambda: len(messages) >= 5 and len(ticks) >= n_ticks + 5, 20.0, what="timer ticks and messages")
        assert not slow_answer.done() and not result.done()
        release.set()
        eventually(lambda: slow_answer.done() and result.done(), 20.0, what="the blocking callbacks' answers")
        assert slow_answer.result().message == "released"
        assert result.result().status == GoalStatus.STATUS_SUCCEEDED and result.result().result.actions == 3
        assert threads["service"] != spinning.thread.name and threads["goal"] != spinning.thread.name
        action.destroy()
    finally:
        release.set()
        spinning.halt()
        client_stop.set()
        client_ex.wake()
        client_thread.join(5.0)
        stop_executor(spinning.ex)
        stop_executor(client_ex)
        server.destroy()
        destroy_node(server_node)
        destroy_node(client_node)
    assert spinning.error is None, spinning.error


def test_stopping_does_not_wait_on_a_blocking_callback_and_join_threads_bounds_it(ctx):
    node = rclpy.create_node("stuck", context=ctx)
    group = MutuallyExclusiveCallbackGroup()
    node.blocking_callback_groups = [group]
    entered, release = threading.Event(), threading.Event()

    def stuck():
        entered.set()
        release.wait(30.0)

    timer = node.create_timer(0.01, stuck, callback_group=group)
    spinning = Spinning(ctx, node)
    try:
        eventually(entered.is_set, 20.0, what="the blocking callback")
        timer.cancel()
        took = spinning.halt()
        assert took < 2.0, took                              # the spinning thread left at once
        assert not spinning.ex.join_threads(0.2)             # bounded: it is still in its callback
        release.set()
        assert spinning.ex.join_threads(10.0)
    finally:
        release.set()
        stop_executor(spinning.ex)
        node.destroy_node()
    assert spinning.error is None, spinning.error


def test_an_exception_in_a_blocking_callback_is_raised_on_the_spinning_thread(ctx):
    node = rclpy.create_node("raiser", context=ctx)
    group = MutuallyExclusiveCallbackGroup()
    node.blocking_callback_groups = [group]
    timer = None

    def boom():
        timer.cancel()
        raise RuntimeError("boom in a blocking callback")

    timer = node.create_timer(0.01, boom, callback_group=group)
    spinning = Spinning(ctx, node)
    try:
        spinning.thread.join(20.0)                   # the error ends spin_until_set
        assert not spinning.thread.is_alive()
        assert isinstance(spinning.error, RuntimeError) and "boom" in str(spinning.error)
    finally:
        spinning.halt()
        stop_executor(spinning.ex)
        node.destroy_node()
