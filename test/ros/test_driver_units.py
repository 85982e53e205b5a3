"""The policy driver's parts that need no node: the parameter table's validators, the frozen
Params, how a GoalRun turns a RunOutcome into the Act result and terminal status, and how goals'
stop tokens and the run slot behave at acceptance, cancel, preemption and the driver's end."""
from __future__ import annotations

import dataclasses
import threading

import pytest

from sequence_ai import RunOutcome
from sequence_ai_msgs.action import Act
from sequence_ai_ros.driver import params as P
from sequence_ai_ros.driver.execution import GoalExecution
from sequence_ai_ros.driver.goal import ABORT, CANCELED, SUCCEED, GoalRun, RunSlot


def defaults(**changes) -> P.Params:
    values = {name: P.check(name, None if spec.default in ("string_array", "double_array") else spec.default)
              for name, spec in P.TABLE.items()}
    values.update(changes)
    return P.Params(values)


@pytest.mark.parametrize("name, value, says", [
    ("max_sensor_age_s", "abc", "parameter max_sensor_age_s takes a number"),
    ("max_sensor_age_s", 0.0, "max_sensor_age_s must be > 0 and <= 3600, got 0"),
    ("max_sensor_age_s", float("nan"), "must be a finite number"),
    ("realtime_priority", 500, "realtime_priority must be >= 0 and <= 99, got 500"),
    ("realtime_priority", 5.0, "realtime_priority takes an integer"),
    ("feedback_hz", 1.0, "feedback_hz must be >= 2"),
    ("prefetch", "yes", "prefetch takes true or false"),
    ("goal_policy", "sometimes", "goal_policy='sometimes' must be one of ('preempt', 'reject')"),
    ("camera_alignments", ["latest", "newest"], "camera_alignments: ['newest'] not in"),
    ("joint_lower", [0.0, "x"], "joint_lower takes a list of finite numbers"),
    ("arm_joints", ["fr3_joint1", "fr3_joint1"], "arm_joints: names ['fr3_joint1'] more than once"),
    ("api_key_env", "MY KEY", "is not an environment variable name"),
    ("gateway_url", "127.0.0.1:8470", "is not an http(s) URL"),
    ("model", "", "parameter model: must not be empty"),
])
def test_a_bad_value_is_refused_naming_the_parameter_and_what_it_takes(name, value, says):
    with pytest.raises(P.ParameterRefused) as info:
        P.check(name, value)
    assert says in str(info.value)


def test_good_values_are_normalised():
    assert P.check("publish_delay_ms", 2) == 2.0 and isinstance(P.check("publish_delay_ms", 2), float)
    assert P.check("joint_upper", (1, 2.5)) == [1.0, 2.5]
    assert P.check("joint_upper", []) is None and P.check("camera_transports", None) is None
    assert P.check("realtime_priority", 99) == 99


@pytest.mark.parametrize("changes, says", [
    (dict(camera_topics=["a"]), "camera_views has 2 entries but camera_topics has 1"),
    (dict(joint_upper=[0.0]), "joint_upper has 1 entries; a command has 8"),
    (dict(joint_lower=[1.0] * 8, joint_upper=[0.0] * 8), "joint_lower > joint_upper at dimension(s) [0, 1"),
    (dict(hold_mode="zeros"), "only for command_interface velocity"),
    (dict(command_mode="forward_command_controller", arm_joints=["a", "b"]), "arm_joints has 2 names"),
    (dict(command_mode="joint_trajectory_controller", command_interface="velocity"), "needs command_interface position"),
    (dict(command_mode="forward_command_controller", gripper_output="forward_command_controller", gripper_joint=""),
     "needs a gripper value: set gripper_joint"),
])
def test_contradicting_values_are_refused_by_the_cross_checks(changes, says):
    with pytest.raises(P.ParameterRefused, match=None) as info:
        defaults().replace(**changes)
    assert says in str(info.value)


def test_params_are_frozen_and_replace_makes_a_new_object():
    p = defaults()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_sensor_age_s = 1.0
    q = p.replace(max_sensor_age_s=0.2)
    assert (p.max_sensor_age_s, q.max_sensor_age_s, q["max_sensor_age_s"]) == (0.5, 0.2, 0.2)
    assert p.command_width == 8 and defaults(gripper_joint="").command_width == 7
    # configure-time parameters changed one at a time while unconfigured: cross-checks wait for configure
    half = p.replace(cross_check=False, camera_views=["exterior_1"])
    with pytest.raises(P.ParameterRefused):
        P.check_all(half)
    P.check_all(half.replace(camera_topics=["camera/exterior_1/image_raw"]))


def test_descriptors_carry_range_read_only_and_when_a_change_applies():
    age = P.descriptor("max_sensor_age_s")
    assert (age.floating_point_range[0].from_value, age.floating_point_range[0].to_value) == (0.0, 3600.0)
    assert age.dynamic_typing and not age.read_only and "changes apply at run time" in age.additional_constraints
    prio = P.descriptor("realtime_priority")
    assert (prio.integer_range[0].from_value, prio.integer_range[0].to_value, prio.integer_range[0].step) == (0, 99, 1)
    assert "read at configure" in prio.additional_constraints
    assert P.descriptor("autostart").read_only and P.TABLE["autostart"].when == "start"
    assert all(spec.description for spec in P.TABLE.values())


class _Handle:
    is_cancel_requested = False


def _outcome(reason, actions=12):
    return RunOutcome(reason=reason, actions=actions, chunks=2, seconds=1.0, action_space="joint_absolute")


@pytest.mark.parametrize("reason, cancel, end, status, message", [
    ("timeout", False, None, SUCCEED, ""),
    ("completed", False, None, SUCCEED, ""),
    ("interrupted", True, None, CANCELED, ""),
    ("interrupted", False, ("preempted", "preempted by a new goal"), ABORT, "preempted by a new goal"),
    ("interrupted", True, ("shutdown", "driver shutting down"), ABORT, "driver shutting down"),
    ("validate", False, None, ABORT, "exterior_1: stale"),
])
def test_every_outcome_maps_to_a_result_and_a_terminal_status(reason, cancel, end, status, message):
    run = GoalRun(_Handle(), "pick", 5.0)
    run.trace.commands = [(0.0, [0.0] * 8)] * 7       # published: fewer than the core handed over
    run.stop_reason = "exterior_1: stale" if reason == "validate" else None
    if end:
        run.request_end(*end)
    result, got = run.finish(_outcome(reason), cancel_confirmed=cancel)
    assert got == status and result.message == message and result.reason == reason
    assert result.actions == 7 and result.chunks == 2 and result.action_space == "joint_absolute"


def test_an_early_ending_counts_what_was_published_and_the_first_end_request_wins():
    run = GoalRun(_Handle(), "pick", 5.0)
    run.request_end("deactivated", "driver deactivated")
    run.request_end("shutdown", "driver shutting down")
    assert run.ending and run.end_request == ("deactivated", "driver deactivated")
    run.trace.commands = [(0.0, [0.0] * 8)] * 3
    result, status = run.early("error", "TransportError: gone")
    assert (result.reason, result.message, result.actions, status) == ("error", "TransportError: gone", 3, ABORT)
    fb = run.feedback()
    assert fb.actions == 3 and 0.0 <= fb.progress <= 1.0 and fb.status == "starting" and fb.instruction == "pick"
    run.instruction_now = "place"          # a swap on ~/instruction
    assert run.feedback().instruction == "place"


# ------------------------------------------------------------------ stop tokens and the run slot

class _GoalHandle:
    """The parts of rclpy's ServerGoalHandle the acceptance and cancel callbacks use."""

    def __init__(self, instruction: str) -> None:
        self.request = Act.Goal(instruction=instruction, max_seconds=2.0)
        self.is_active = True
        self.is_cancel_requested = False
        self.executed = False

    def execute(self) -> None:
        self.executed = True


class _Node:
    """What GoalExecution's acceptance, cancel and end bookkeeping read of the node."""

    def __init__(self) -> None:
        self._active, self._end_message = True, None
        self._params = defaults()


class _Goals(GoalExecution):
    def __init__(self) -> None:
        super().__init__(_Node())

    def run_of(self, handle) -> GoalRun:
        return self._goals[id(handle)]


def test_each_goal_gets_its_own_stop_token_at_acceptance_and_the_newest_preempts_the_older():
    goals = _Goals()
    first, second = _GoalHandle("first"), _GoalHandle("second")
    goals.on_accepted(first)
    one = goals.run_of(first)
    assert first.executed and not one.stop.stopped
    goals.on_accepted(second)
    two = goals.run_of(second)
    assert one.stop.stopped and one.end_request == ("preempted", "preempted by a new goal")
    assert second.executed and not two.stop.stopped and two.end_request is None


def test_a_cancel_stops_only_its_own_goal_and_a_late_one_reaches_no_later_goal():
    goals = _Goals()
    first = _GoalHandle("first")
    goals.on_cancel(first)                    # the cancel overtook the accepted callback
    goals.on_accepted(first)
    one = goals.run_of(first)
    assert one.cancel_accepted and one.stop.stopped
    first.is_active = False                    # it ended
    goals._goals.pop(id(first))
    goals.on_cancel(first)                    # a cancel that lands after the end: nothing to stop
    assert id(first) not in goals._goals
    second = _GoalHandle("second")
    goals.on_accepted(second)
    two = goals.run_of(second)
    assert not two.stop.stopped and not two.ending


def test_the_drivers_end_stops_every_accepted_goal_and_one_accepted_while_inactive_never_runs():
    goals = _Goals()
    handles = [_GoalHandle("a"), _GoalHandle("b")]
    for h in handles:
        goals._goals[id(h)] = GoalRun(h, h.request.instruction, 2.0)   # accepted, not started
    assert goals.end_run("deactivated", "driver deactivated", timeout_s=1.0)
    assert all(goals.run_of(h).end_request == ("deactivated", "driver deactivated") for h in handles)
    goals.node._active = False
    late = _GoalHandle("late")
    goals.on_accepted(late)
    assert goals.run_of(late).stop.stopped and goals.run_of(late).end_request[0] == "inactive"


def test_the_run_slot_gives_up_at_once_for_a_goal_stopped_while_it_waits():
    slot = RunSlot()
    running, waiting = GoalRun(_Handle(), "running", 2.0), GoalRun(_Handle(), "waiting", 2.0)
    assert slot.take(running, 1.0) and slot.busy
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("took", slot.take(waiting, 30.0)))
    waiter.start()
    waiting.request_end("preempted", "preempted by a new goal")   # wakes the wait: no 30 s
    waiter.join(10.0)
    assert not waiter.is_alive() and got["took"] is False and slot.busy
    slot.release(running)
    assert not slot.busy and slot.wait_free(0.0)
    nxt = GoalRun(_Handle(), "next", 2.0)
    assert slot.take(nxt, 1.0)
    assert not slot.try_take("ready") and not slot.take(GoalRun(_Handle(), "x", 2.0), 0.0)
    slot.release("someone else")               # only the holder frees it
    assert slot.busy


def test_observation_to_action_pieces():
    from sequence_ai import ImageFrame, Observation, Proprioception
    from sequence_ai_ros.driver.latency import ObservationMarks, observation_start_s, p50_p99

    def obs(*stamps_ms):
        return Observation(images=[ImageFrame(view=f"v{i}", data=b"", timestamp_ms=ms) for i, ms in enumerate(stamps_ms)],
                           proprioception=Proprioception(joint_positions=[0.0]), instruction="x")

    assert observation_start_s(obs(100_200, 100_050), 100.5) == pytest.approx(100.05)   # the oldest frame
    assert observation_start_s(obs(0, None), 100.5) == 100.5        # unstamped: the observation's time
    assert observation_start_s(obs(0, 100_300), 100.5) == pytest.approx(100.3)
    assert observation_start_s(obs(900_000), 100.5) == 100.5        # stamped after it: another clock
    marks = ObservationMarks(keep=3)
    first, second, third, fourth = obs(1), obs(2), obs(3), obs(4)
    assert marks.find(first) is None                                 # nothing observed yet
    for o, built, start in ((first, 1.0, 10.0), (second, 2.0, 20.0), (third, 3.0, 30.0)):
        marks.add(o, built, start)
    # by identity, not by time: an equal but distinct observation is not the one a chunk carries
    assert (marks.find(second), marks.find(obs(2)), marks.find(None)) == ((2.0, 20.0), None, None)
    marks.add(fourth, 4.0, 40.0)
    assert (marks.find(first), marks.find(fourth)) == (None, (4.0, 40.0))   # keep=3: the oldest forgotten
    marks.clear()
    assert marks.find(fourth) is None
    from types import SimpleNamespace as NS
    from sequence_ai_ros.driver.latency import chunk_observation
    chunk = object()
    engine = NS(_buffer=NS(current=NS(chunk=chunk, tag=(0, None, 7.5, second))))
    assert chunk_observation(NS(_engine=engine), chunk) is second             # the core's tag on the entry
    assert chunk_observation(NS(_engine=engine), object()) is None            # another chunk plays
    assert chunk_observation(NS(_engine=NS(_buffer=NS(current=NS(chunk=chunk, tag=(0, None, 7.5))))), chunk) is None
    assert chunk_observation(NS(_engine=NS(_buffer=NS(current=None))), chunk) is None
    assert p50_p99([]) == (0.0, 0.0)
    assert p50_p99([0.3]) == (0.3, 0.3)
    p50, p99 = p50_p99([0.1 * i for i in range(101)])
    assert (p50, p99) == (pytest.approx(5.0), pytest.approx(9.9))


def test_goal_result_carries_the_latency_samples():
    run = GoalRun(handle=None, instruction="x", max_seconds=1.0)
    result, _ = run.early("error", "no chunk")
    assert (result.obs_to_action_p50_s, result.obs_to_action_p99_s) == (0.0, 0.0)   # none played
    run.obs_to_action.extend([0.3, 0.2, 0.4])
    result, _ = run.finish(RunOutcome(reason="timeout", actions=3, chunks=3, seconds=1.0, underruns=0,
                                      underrun_s=0.0), cancel_confirmed=False)
    assert result.obs_to_action_p50_s == pytest.approx(0.3) and 0.39 < result.obs_to_action_p99_s <= 0.4


def test_a_refused_realtime_priority_is_info_at_the_default_and_a_warning_when_asked_for():
    from sequence_ai_ros.driver.node import _realtime_refused

    said = []

    class Log:
        def info(self, m):
            said.append(("info", m))

        def warning(self, m):
            said.append(("warning", m))

    _realtime_refused(Log(), P.REALTIME_PRIORITY)("no CAP_SYS_NICE")
    _realtime_refused(Log(), 80)("no CAP_SYS_NICE")
    assert said == [("info", "publisher thread at normal priority: no CAP_SYS_NICE"),
                    ("warning", "publisher thread at normal priority: no CAP_SYS_NICE")]
