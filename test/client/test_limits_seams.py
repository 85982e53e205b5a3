"""max_delta means one thing per action space, on the worker and on the client, across seams too.

Absolute (and velocity) rows are levels: max_delta bounds the change between consecutive
commanded rows, and the client bounds the first row of each chunk against the last executed
row. Delta rows are the step itself: max_delta bounds each value's magnitude, a seam adds
nothing, and a delta chunk within its limits reaches act() exactly as the policy sent it.
Real gateway and worker processes on loopback (``shared_module_gateway``), the policies in
``test/policies/limits_policy.py``.
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

import sequence_ai
from sequence_ai_core import Limits, max_delta_rule
from _core_support import Recorder, connect, unique

LIMITS = str(Path(__file__).resolve().parents[1] / "policies" / "limits_policy.py")

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


def _deploy(gw, cls: str) -> str:
    name = unique(cls.lower())
    gw.deploy(LIMITS, name, wait=True, class_name=cls)
    return name


@pytest.fixture(scope="module")
def spec_delta(shared_module_gateway):
    """One SpecDeltaPolicy deployment for the module (each test reads the sign its chunks start
    with from what it receives, so the requests of another test before it change nothing)."""
    return _deploy(shared_module_gateway, "SpecDeltaPolicy")


def two_joints():
    return sequence_ai.Observation(images=[], proprioception=sequence_ai.Proprioception([0.0, 0.0]),
                                   instruction="move")


def franka():
    return sequence_ai.Observation(images=[], proprioception=sequence_ai.Proprioception([0.0] * 7, gripper=[0.0]),
                                   instruction="move")


def test_the_spec_joint_delta_contract_lets_no_step_over_max_delta_reach_act(shared_module_gateway, spec_delta):
    name = spec_delta
    rec = Recorder()
    with connect(shared_module_gateway, name, params={"chunk_len": 4}) as policy:
        out = policy.run(franka, rec, max_actions=12, hold=rec.hold, progress=False)
    assert out.reason == "completed" and out.chunks == 3 and out.action_space == "joint_delta"
    # each delta row is the step: no value, the gripper's included, moves more than 0.05
    assert max(abs(v) for row in rec.rows for v in row) <= 0.05 + 1e-12
    # the gripper's 1.0 was a step of 1.0: the worker clipped it to max_delta
    assert {row[7] for row in rec.rows} == {0.05}
    # the joints' +-0.04 increments are within the limits: delivered exactly as sent, although
    # consecutive rows differ by 0.08 and every seam repeats a sign or flips it
    joints = [row[0] for row in rec.rows]
    s = 1.0 if joints[0] > 0 else -1.0      # the deploy's synthetic /act (and other tests) took chunks before
    assert joints == [s * v for v in (0.04, -0.04, 0.04, -0.04, -0.04, 0.04, -0.04, 0.04, 0.04, -0.04, 0.04, -0.04)]
    assert all(row[:7] == [row[0]] * 7 for row in rec.rows)


def test_the_worker_bounds_a_delta_row_by_its_magnitude_not_by_its_change(shared_module_gateway, spec_delta):
    name = spec_delta
    with connect(shared_module_gateway, name, params={"chunk_len": 2, "gripper": 0.03}) as policy:
        pred = policy.predict(franka())
        first = pred.action_chunk.actions[0][0]
        assert abs(first) == 0.04
        # consecutive rows differ by 0.08 > max_delta: not a step, so nothing is clipped
        assert pred.action_chunk.actions == [[first] * 7 + [0.03], [-first] * 7 + [0.03]]
        assert pred.warnings == []
        pred = policy.predict(franka(), params={"chunk_len": 2, "gripper": 1.0})
    # a gripper increment of 1.0 is a step of 1.0: clipped to 0.05, each value named
    assert [row[7] for row in pred.action_chunk.actions] == [0.05, 0.05]
    assert pred.warnings == ["clipped step 0 dim 7: a step of 1, max_delta 0.05",
                             "clipped step 1 dim 7: a step of 1, max_delta 0.05"]


def test_an_absolute_seam_jump_is_clipped_from_the_last_executed_row_with_a_warning(shared_module_gateway):
    name = _deploy(shared_module_gateway, "RampPolicy")
    rec = Recorder()
    with connect(shared_module_gateway, name, params={"chunk_len": 4, "jump": 0.5}) as policy:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = policy.run(two_joints, rec, max_actions=8, hold=rec.hold, progress=False)
    assert out.reason == "completed" and out.chunks == 2
    # inside each chunk the ramp climbs 0.05 a step; the worker had nothing to clip
    assert [round(b[0] - a[0], 9) for a, b in zip(rec.rows[:4], rec.rows[1:4])] == [0.05] * 3
    limit_warnings = [w for w in caught if issubclass(w.category, sequence_ai.LimitWarning)]
    assert len(limit_warnings) == 1, [str(w.message) for w in caught]
    text = str(limit_warnings[0].message)
    m = re.search(r"dim 0: moves (-?[0-9.]+) from the last executed action, max_delta 0.1", text)
    assert "seam" in text and m, text
    jump = float(m.group(1))
    assert abs(jump) > 0.3      # the policy's seam jumped (0.5 less the 0.15 already climbed, wrapped)
    # ... and reached act() exactly max_delta from the last executed row, then the ramp went on
    assert rec.rows[4][0] - rec.rows[3][0] == pytest.approx(0.1 if jump > 0 else -0.1)
    assert rec.rows[4][1] - rec.rows[3][1] == pytest.approx(-0.1 if jump > 0 else 0.1)
    assert out.clipped >= 2
    assert max(abs(b[i] - a[i]) for a, b in zip(rec.rows, rec.rows[1:]) for i in range(2)) <= 0.1 + 1e-9


def test_an_absolute_seam_jump_is_refused_under_on_violation_refuse(shared_module_gateway):
    name = _deploy(shared_module_gateway, "RefusingRampPolicy")
    rec = Recorder()
    with connect(shared_module_gateway, name, params={"chunk_len": 4, "jump": 0.5}) as policy:
        with pytest.raises(sequence_ai.PolicyError) as info:
            policy.run(two_joints, rec, max_actions=8, hold=rec.hold, progress=False)
    exc = info.value
    assert exc.details["reason"] == "bounds"
    m = re.search(r"dim 0: moves (-?[0-9.]+) from the last executed action, max_delta 0.1", str(exc))
    assert m and abs(float(m.group(1))) > 0.3, str(exc)
    # the first chunk played out; the jumping row never reached act(); hold ran once
    assert len(rec.rows) == 4
    assert [round(b[0] - a[0], 9) for a, b in zip(rec.rows, rec.rows[1:])] == [0.05] * 3
    assert rec.holds == 1


def test_one_max_delta_rule_per_action_space():
    assert [max_delta_rule(s) for s in ("joint_absolute", "ee_absolute", "joint_velocity", "joint_delta", "ee_delta")] \
        == ["change", "change", "change", "magnitude", "magnitude"]
    lim = Limits(bounds=None, max_delta=0.05, action_space="joint_delta")
    # a delta row: its magnitude is bounded, whatever the last row was
    assert lim.apply([0.08, -0.02], last=[-0.05, 0.05]) == ([0.05, -0.02], 1)
    assert lim.apply([0.05, -0.05], last=[-0.05, 0.05]) == ([0.05, -0.05], 0)
    lim = Limits(bounds=None, max_delta=[0.1, 0.2], action_space="joint_velocity")
    # a velocity row: its change from the last commanded speed is bounded
    assert lim.apply([0.5, 0.5], last=[0.0, 0.0]) == ([0.1, 0.2], 2)
    assert lim.apply([0.5, 0.5], last=None) == ([0.5, 0.5], 0)
