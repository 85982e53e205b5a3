"""sequence_ai_msgs: the generated Act action, and a real ROS 2 action round trip in-process.

Run under `. scripts/env.sh` (after scripts/bootstrap.sh), ideally inside
scripts/in_loopback_ns.sh.
"""
import threading

import pytest

import rclpy  # noqa: E402
from rclpy.action import ActionClient, ActionServer  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402

from sequence_ai_msgs.action import Act  # noqa: E402
from sequence_ai_ros._spin import destroy_node

RESULT_FIELDS = dict(
    reason="timeout",
    actions=123,
    chunks=16,
    seconds=8.25,
    underruns=2,
    underrun_s=0.125,
    max_seam_jump=0.0375,
    instruction_swaps=1,
    max_instruction_lag_s=0.5,
    action_space="joint_absolute",
    message="",
)


def test_goal_defaults_and_fields():
    goal = Act.Goal()
    assert goal.instruction == ""
    # Unset max_seconds is 0.0: the server must refuse such a goal (max_seconds > 0 required).
    assert goal.max_seconds == 0.0
    goal = Act.Goal(instruction="put the red cube on the green pad", max_seconds=12.5)
    assert goal.max_seconds == 12.5

    result = Act.Result(**RESULT_FIELDS)
    for name, value in RESULT_FIELDS.items():
        assert getattr(result, name) == value
    assert Act.Result().reason == "" and Act.Result().message == ""

    fb = Act.Feedback(progress=0.5, actions=3, chunks=1, elapsed_s=1.5)
    assert fb.progress == pytest.approx(0.5) and fb.elapsed_s == 1.5


@pytest.fixture
def ros_context():
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx)
    try:
        yield ctx
    finally:
        rclpy.shutdown(context=ctx)


def test_action_round_trip(ros_context):
    ctx = ros_context
    server_node = rclpy.create_node("act_test_server", context=ctx)
    client_node = rclpy.create_node("act_test_client", context=ctx)
    received_goals = []

    def execute(goal_handle):
        received_goals.append((goal_handle.request.instruction, goal_handle.request.max_seconds))
        for i in range(3):
            goal_handle.publish_feedback(
                Act.Feedback(progress=(i + 1) / 3.0, actions=8 * (i + 1), chunks=i + 1,
                             elapsed_s=0.5 * (i + 1)))
        goal_handle.succeed()
        return Act.Result(**RESULT_FIELDS)

    server = ActionServer(server_node, Act, "act", execute)
    client = ActionClient(client_node, Act, "act")
    executor = MultiThreadedExecutor(num_threads=4, context=ctx)
    executor.add_node(server_node)
    executor.add_node(client_node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    feedback = []
    try:
        assert client.wait_for_server(timeout_sec=20.0), "action server not discovered"
        done = threading.Event()
        outcome = {}

        def on_result(fut):
            outcome["result"] = fut.result()
            done.set()

        def on_goal(fut):
            handle = fut.result()
            outcome["accepted"] = handle.accepted
            if not handle.accepted:
                done.set()
                return
            handle.get_result_async().add_done_callback(on_result)

        send = client.send_goal_async(
            Act.Goal(instruction="put the red cube on the green pad", max_seconds=12.5),
            feedback_callback=lambda msg: feedback.append(msg.feedback))
        send.add_done_callback(on_goal)
        assert done.wait(20.0), "no result within 20 s"
        assert outcome["accepted"]
        wrapped = outcome["result"]
    finally:
        executor.shutdown(timeout_sec=5.0)
        spinner.join(timeout=10.0)
        client.destroy()
        server.destroy()
        destroy_node(client_node)
        destroy_node(server_node)
    assert not spinner.is_alive()

    from action_msgs.msg import GoalStatus
    assert wrapped.status == GoalStatus.STATUS_SUCCEEDED
    result = wrapped.result
    for name, value in RESULT_FIELDS.items():
        assert getattr(result, name) == value, name
    assert received_goals == [("put the red cube on the green pad", 12.5)]
    # Feedback is best effort (a message may be dropped, and the result can overtake the last one),
    # but what arrives arrives in order and intact.
    chunks = [f.chunks for f in feedback]
    assert chunks == sorted(set(chunks)) and set(chunks) <= {1, 2, 3}, chunks
    for f in feedback:
        assert f.progress == pytest.approx(f.chunks / 3.0) and f.actions == 8 * f.chunks
