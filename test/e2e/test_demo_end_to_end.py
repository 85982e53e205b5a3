"""The main job, headless and for real: a served policy drives the simulated Franka over ROS 2.

Real processes: ``seq serve`` (gateway), the demo policy's worker, ``sim_robot`` (MuJoCo); in this
process: the ``policy_driver`` node and a ROS 2 action client sending ``Act`` goals.
"""
from __future__ import annotations

import os

import pytest

from sequence_ai_ros import demo

CONTROL_PERIOD_S = 1.0 / 15.0


@pytest.fixture(scope="module")
def served_policy(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("server")
    with demo.local_server(data_dir) as server:
        demo.deploy(server)
        old = dict(os.environ)
        os.environ.update(server.env())
        try:
            yield server
        finally:
            os.environ.clear()
            os.environ.update(old)


def test_act_goal_puts_the_red_cube_on_the_green_pad(served_policy, tmp_path):
    result = demo.drive("put the red cube on the green pad", seed=0, max_seconds=45.0, out_dir=tmp_path)
    o = result.outcome
    assert result.status == "succeeded", f"{o['reason']}: {o['message']}"
    assert o["reason"] == "until", o           # the sim's success check ended the run early
    assert result.success, f"cube {result.distance_m * 100:.1f} cm from the pad"
    assert result.distance_m < 0.03
    assert o["action_space"] == "joint_absolute"
    assert o["chunks"] >= 2 and o["actions"] >= o["chunks"]
    # actions run at 15 Hz: never faster than the control rate, and (a late tick is dropped, not
    # burst) at least 80 % of the ticks the run's length holds, on a loaded 2-core machine
    assert o["actions"] <= o["seconds"] * 15.0 + 2, o
    assert o["actions"] >= 0.8 * (o["seconds"] - o["underrun_s"]) * 15.0, o
    # max_seam_jump spans every dimension: the gripper's 0 -> 1 close can fall on a seam
    assert 0.0 <= o["max_seam_jump"] <= 1.0, o
    # observation-to-action latency from the sim camera's stamps: positive, and no more than the run
    # plus a frame's age when observed (1 s is far above it)
    assert 0.0 < o["obs_to_action_p50_s"] <= o["obs_to_action_p99_s"] <= o["seconds"] + 1.0, o
    assert len(result.commands) == o["actions"]
    assert len(result.seams) == o["chunks"]
    # the picture exists: frames + plot, and the GIF beside it
    assert result.picture.exists() and result.picture.stat().st_size > 10_000
    assert result.picture.with_suffix(".gif").exists()


def test_a_different_instruction_moves_a_different_cube(served_policy, tmp_path):
    result = demo.drive("put the blue cube on the red pad", seed=3, max_seconds=45.0, out_dir=tmp_path,
                        picture=False)
    assert result.outcome["reason"] == "until", result.outcome
    assert result.success, f"cube {result.distance_m * 100:.1f} cm from the pad"


def test_cancel_publishes_the_hold_within_one_control_period_and_nothing_after(served_policy, tmp_path):
    result = demo.drive("put the green cube on the blue pad", seed=1, max_seconds=45.0, out_dir=tmp_path,
                        cancel_after_s=2.0, picture=False)
    assert result.status == "canceled"
    assert result.outcome["reason"] == "interrupted"
    assert result.hold_time is not None and result.cancel_time is not None
    received = result.received
    assert len(received) >= 2
    # the last message anyone saw is the hold: the last commanded position, repeated
    hold_t, hold_cmd = received[-1]
    assert hold_cmd == pytest.approx(received[-2][1])
    assert hold_cmd == pytest.approx(result.commands[-1][1])
    # it arrived within one control period of the cancel request being sent
    assert 0.0 <= hold_t - result.cancel_time <= CONTROL_PERIOD_S, hold_t - result.cancel_time
    # and nothing followed it (drive() listens for a further second after the result)
    assert all(t <= hold_t for t, _ in received)
    assert result.outcome["actions"] == len(result.commands)


def test_teardown_runs_queued_callbacks_before_destroy_and_prints_no_unretrieved_exception():
    """The demo's teardown (``_spin.stop_executor`` then ``destroy_node``): callbacks the executor
    had already queued in its pool run while their node is alive, so rclpy never prints
    "The following exception was never retrieved: cannot use Destroyable ..." (it did, twice, on
    an ordinary demo run). Busy timers keep the pool's queue full at the moment of shutdown."""
    import contextlib
    import gc
    import io
    import threading
    import time

    import rclpy
    from rclpy.callback_groups import ReentrantCallbackGroup
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.node import Node

    from sequence_ai_ros._spin import stop_executor

    printed, ran = io.StringIO(), []
    for _ in range(3):
        ctx = rclpy.Context()
        rclpy.init(context=ctx)
        try:
            node = Node("teardown_probe", context=ctx)
            group = ReentrantCallbackGroup()
            for _ in range(4):   # 1 kHz timers whose callbacks take 10 ms: two threads fall behind
                node.create_timer(0.001, lambda: (ran.append(1), time.sleep(0.01)), callback_group=group)
            executor = MultiThreadedExecutor(num_threads=2, context=ctx)
            executor.add_node(node)
            spin = threading.Thread(target=executor.spin, daemon=True)
            spin.start()
            time.sleep(0.3)
            with contextlib.redirect_stderr(printed):
                executor.shutdown()
                spin.join(timeout=5)
                stop_executor(executor)
                node.destroy_node()
                del executor, spin, node
                gc.collect()
        finally:
            ctx.try_shutdown()
    assert len(ran) > 20                       # the timers did fire: the pool was busy at shutdown
    assert "never retrieved" not in printed.getvalue(), printed.getvalue()


def test_a_sim_that_dies_starting_fails_the_run_at_once_naming_its_log(served_policy, tmp_path):
    import time

    t0 = time.monotonic()
    # the node either exits or stays up without a sim (its thread failed): the run ends either
    # way, pointing at the sim's log
    with pytest.raises(RuntimeError, match=r"sim_robot.*; see .*sim_robot\.log"):
        demo.drive("put the red cube on the green pad", seed=-1, max_seconds=5.0, out_dir=tmp_path, picture=False)
    assert time.monotonic() - t0 < 60                # not the 120 s service wait
    assert "expected non-negative integer" in (tmp_path / "sim_robot.log").read_text()
