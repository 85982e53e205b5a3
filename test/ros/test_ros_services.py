"""policy_driver for clients without actions (``~/start_policy``, ``~/cancel_policy``, ``~/outcome``)
and stop conditions (``stop_when``), with real rclpy nodes, a real gateway + echo worker.

- a started run gets the Act goal's result, published on ``~/outcome`` with its run_id;
- a request the Act action would reject is refused with a word and a message naming the argument;
- ``~/cancel_policy`` holds within one control period, nothing is published after, and answers
  with the outcome (``interrupted``);
- ``stop_when`` names a condition the driver offers (``stop_conditions``) or a CheckSuccess
  service; its success ends the run ``stop_when`` (an Act goal and a service start alike); a name
  the driver does not offer is refused.
"""
from __future__ import annotations

import time

import pytest
from action_msgs.msg import GoalStatus
from rclpy.qos import DurabilityPolicy, QoSProfile

from _ros_driver_support import PERIOD_S, Goal, echo_server, ros, setup_driver, wait  # noqa: F401
from sequence_ai_msgs.action import Act
from sequence_ai_msgs.msg import RunOutcome
from sequence_ai_msgs.srv import CancelPolicy, CheckSuccess, StartPolicy

TASK = "put the red cube on the green pad"


def _call(node, client, request):
    fut = client.call_async(request)
    wait(fut.done, 30.0, f"answer of {client.srv_name}")
    return fut.result()


def _services(node):
    start = node.create_client(StartPolicy, "policy_driver/start_policy")
    cancel = node.create_client(CancelPolicy, "policy_driver/cancel_policy")
    outcomes = []
    qos = QoSProfile(depth=10, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    node.create_subscription(RunOutcome, "policy_driver/outcome", outcomes.append, qos)
    assert start.wait_for_service(timeout_sec=20.0) and cancel.wait_for_service(timeout_sec=20.0)
    return start, cancel, outcomes


def test_a_started_run_ends_like_an_act_goal_and_its_outcome_is_published(ros, echo_server):
    robot, driver, client, node = setup_driver(ros, echo_server)
    start, cancel, outcomes = _services(node)
    answer = _call(node, start, StartPolicy.Request(instruction=TASK, max_seconds=1.0))
    assert answer.accepted and answer.reason == "" and len(answer.run_id) == 32
    wait(lambda: any(o.run_id == answer.run_id for o in outcomes), 30.0, "the run's outcome")
    out = next(o for o in outcomes if o.run_id == answer.run_id)
    assert out.reason == "timeout" and out.actions > 0 and out.chunks >= 1
    wait(lambda: len(robot.commands) == out.actions + 1, 10.0, "every action and the hold at the robot")
    gone = _call(node, cancel, CancelPolicy.Request(run_id="feedbeef"))
    assert not gone.stopped and "feedbeef" in gone.message


@pytest.mark.parametrize("fields, named", [
    (dict(max_seconds=-1.0), "max_seconds"),
    (dict(max_seconds=float("nan")), "max_seconds"),
    (dict(params_json="[1, 2]"), "params_json"),
    (dict(stop_when="cube_on_pad"), "stop_when"),
    (dict(stop_when="/not a service"), "stop_when"),
    (dict(instruction="  "), "instruction"),
])
def test_a_request_the_act_action_would_reject_is_refused_naming_the_argument(ros, echo_server, fields, named):
    robot, driver, client, node = setup_driver(ros, echo_server)
    start, _, _ = _services(node)
    request = dict(instruction=TASK, max_seconds=1.0)
    request.update(fields)
    answer = _call(node, start, StartPolicy.Request(**request))
    assert not answer.accepted and answer.reason == "invalid" and named in answer.message, answer.message
    if "stop_when" in fields:      # the Act action refuses the same stop condition
        fut = client.send_goal_async(Act.Goal(instruction=TASK, max_seconds=1.0, stop_when=fields["stop_when"]))
        wait(fut.done, 20.0, "goal answer")
        assert not fut.result().accepted
    else:
        assert not Goal(client, **request).handle.accepted
    assert robot.commands == []


def test_cancel_policy_holds_within_one_control_period_and_answers_with_the_outcome(ros, echo_server):
    robot, driver, client, node = setup_driver(ros, echo_server)
    start, cancel, outcomes = _services(node)
    answer = _call(node, start, StartPolicy.Request(instruction=TASK, max_seconds=20.0))
    assert answer.accepted
    wait(lambda: len(robot.commands) >= 10, 20.0, "commands")
    t_cancel = time.monotonic()
    stopped = _call(node, cancel, CancelPolicy.Request(run_id=answer.run_id))
    assert stopped.stopped and stopped.outcome.reason == "interrupted" and stopped.outcome.run_id == answer.run_id
    # the hold within one control period of the cancel reaching the driver (the service call's way
    # there crosses DDS in this loaded test process)
    assert driver.trace.hold_time - driver.trace.stop_time <= PERIOD_S, driver.trace
    assert t_cancel <= driver.trace.stop_time < t_cancel + 5.0, (t_cancel, driver.trace.stop_time)
    hold_t, hold = robot.commands[-1]
    assert hold == pytest.approx(robot.commands[-2][1])        # the last command, repeated
    wait(lambda: time.monotonic() - hold_t > 0.5, 5.0, "half a second of silence")
    assert len(robot.commands) == stopped.outcome.actions + 1
    wait(lambda: any(o.run_id == answer.run_id for o in outcomes), 20.0, "the outcome on ~/outcome")


def test_stop_when_ends_the_run_when_its_condition_says_done(ros, echo_server):
    robot, driver, client, node = setup_driver(ros, echo_server, stop_conditions=["cube_on_pad=/test_check_done"])
    asked = []

    def answer(request, response):
        asked.append(request.instruction)
        response.success = len(robot.commands) >= 8
        return response
    node.create_service(CheckSuccess, "/test_check_done", answer)
    fut = client.send_goal_async(Act.Goal(instruction=TASK, max_seconds=20.0, stop_when="cube_on_pad"))
    wait(fut.done, 20.0, "goal answer")
    assert fut.result().accepted
    res_fut = fut.result().get_result_async()
    wait(res_fut.done, 30.0, "goal result")
    wrapped = res_fut.result()
    assert wrapped.status == GoalStatus.STATUS_SUCCEEDED
    assert wrapped.result.reason == "stop_when" and "cube_on_pad" in wrapped.result.message
    assert asked and set(asked) == {TASK} and 8 <= wrapped.result.actions < 15 * 20
    # the same through the service, naming the CheckSuccess service itself
    start, _, outcomes = _services(node)
    started = _call(node, start, StartPolicy.Request(instruction=TASK, max_seconds=20.0, stop_when="/test_check_done"))
    assert started.accepted
    wait(lambda: any(o.run_id == started.run_id for o in outcomes), 30.0, "the run's outcome")
    assert next(o for o in outcomes if o.run_id == started.run_id).reason == "stop_when"


def test_cancel_of_the_active_run_while_a_new_start_preempts_stops_both(ros, echo_server):
    """``""`` cancels every run accepted at the driver: a start that is still waiting for the run
    it preempts to unwind is stopped too, so the answer "the robot held" is true and no command
    follows it (before, only the older run was stopped and the new one moved the arm)."""
    robot, driver, client, node = setup_driver(ros, echo_server)
    start, cancel, outcomes = _services(node)
    first = _call(node, start, StartPolicy.Request(instruction=TASK, max_seconds=20.0))
    assert first.accepted, first.message
    wait(lambda: len(robot.commands) >= 5, 20.0, "the first run's commands")
    second = _call(node, start, StartPolicy.Request(instruction=TASK, max_seconds=5.0))
    assert second.accepted, second.message
    answer = _call(node, cancel, CancelPolicy.Request(run_id=""))
    answered = time.monotonic()
    assert answer.stopped, answer.message
    time.sleep(1.0)                        # watch for commands that should not come
    after = [t for t, _ in robot.commands if t > answered + PERIOD_S]
    assert after == [], f"{len(after)} commands after the cancel answered 'held'"
    wait(lambda: driver.goals.accepted_runs() == [], 10.0, "both runs concluded")


def test_a_stop_condition_service_that_goes_away_mid_run_is_warned_once_and_the_time_bound_ends_it(ros, echo_server):
    robot, driver, client, node = setup_driver(ros, echo_server, stop_conditions=["cube_on_pad=/test_check_gone"])
    warnings, logger = [], driver.get_logger()

    class Recording:                      # the driver's own logger, its warnings kept for the test
        def __getattr__(self, name):
            return getattr(logger, name)

        def warning(self, message, *args, **kwargs):
            warnings.append(message)
            return logger.warning(message, *args, **kwargs)

    driver.get_logger = lambda: Recording()

    def answer(request, response):
        response.success = False
        return response
    service = node.create_service(CheckSuccess, "/test_check_gone", answer)
    fut = client.send_goal_async(Act.Goal(instruction=TASK, max_seconds=4.0, stop_when="cube_on_pad"))
    wait(fut.done, 20.0, "goal answer")
    assert fut.result().accepted
    wait(lambda: len(robot.commands) >= 5, 20.0, "the run's commands")
    node.destroy_service(service)
    res_fut = fut.result().get_result_async()
    wait(res_fut.done, 30.0, "goal result")
    assert res_fut.result().result.reason == "timeout"
    lapsed = [w for w in warnings if "stop condition /test_check_gone is not answering" in w]
    assert len(lapsed) == 1, warnings
