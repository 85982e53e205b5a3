"""Recipe ``pick-place`` (``seq init pick-place``; examples/pick_place): the demo policy.

Rows are absolute targets for a joint-position controller: 7 joint positions (rad) + the
gripper (0 open .. 1 closed) at 15 Hz. Send them raw; there is nothing to convert, so
``to_joint_positions`` refuses this model.

    import sequence_ai
    from sequence_ai.recipes import pick_place

    model = {m.name: m for m in sequence_ai.models()}["pick-place"]
    assert pick_place.check(model) == []
    with sequence_ai.connect("pick-place") as policy:
        pick_place.loop(policy, model, observe=cell.observe, step=cell.step, instruction="put the red cube on the green pad")
"""
from __future__ import annotations

from typing import Any, Optional

from ._base import check_entry, chunk_loop, find_entry

TEMPLATE = "pick-place"
EXPECT = {
    "action": {"action_space": "joint_absolute", "action_dim": 8, "control_frequency_hz": 15.0},
    "observation": {"cameras": {"exterior_1": {"width": 224, "height": 224}, "wrist_left": {"width": 224, "height": 224}},
                    "proprio": {"joint_positions": 7, "gripper": 1}},
}
GRIPPER = {"dim": 7, "binarize_at": None}          # sent as returned (0..1)
CONVERSION = None
CONVERSION_NOTE = "its rows are already joint-position targets (joint_absolute): send them as they are"


#: The worked loop (``_base.chunk_loop``): observe, predict, play ``open_loop_horizon`` rows through
#: ``prepare`` (raw joint targets); returns the rows stepped.
loop = chunk_loop


def check(model: Any = None, *, gateway_url: Optional[str] = None) -> list:
    """Differences between the live catalogue entry (re-read by name) and ``EXPECT``; [] when none."""
    return check_entry(find_entry(model, TEMPLATE, gateway_url), EXPECT, TEMPLATE)
