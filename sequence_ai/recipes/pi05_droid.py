"""Recipe ``pi05-droid`` (``seq init pi05-droid``): pi0.5 fine-tuned on DROID.

Rows are for DROID's ``joint_velocity`` controller interface: 7 arm values + the gripper
position. The checkpoint's own reference loop takes each row, binarises the gripper (> 0.5 ->
1.0 closed, else 0.0), clips and steps; ``prepare(chunk, model, i)`` does exactly that:

    env = RobotEnv(action_space="joint_velocity", gripper_action_space="position")
    chunk = policy.predict(obs).action_chunk
    for i in range(chunk.open_loop_horizon or len(chunk)):
        env.step(sequence_ai.prepare(chunk, model, i))

Only for a controller with no joint-velocity interface, convert: the arm values are cumulative
displacements from the pose the chunk was requested at, so every row offsets the same ``q_ref``
(read ONCE, before the request; re-reading the live pose each step integrates them):

    q_ref = arm.joint_positions()
    for target in sequence_ai.to_joint_positions(chunk, q_ref, model):
        arm.move_to_joint_positions(target)
"""
from __future__ import annotations

from typing import Any, Optional

from ._base import check_entry, chunk_loop, find_entry

TEMPLATE = "pi05-droid"
EXPECT = {
    "action": {"action_space": "joint_velocity", "action_dim": 8, "control_frequency_hz": 15.0},
    "observation": {"cameras": {"exterior_1": {"width": 224, "height": 224}, "wrist_left": {"width": 224, "height": 224}},
                    "proprio": {"joint_positions": 7, "gripper": 1}},
}
GRIPPER = {"dim": 7, "binarize_at": 0.5}
CONVERSION = "offset_from_q_ref"
CONVERSION_NOTE = "every row offsets the q_ref read before the chunk was requested"


#: The worked loop for a joint-velocity controller (``_base.chunk_loop``): ``step(prepare(chunk,
#: model, i))`` for the chunk's ``open_loop_horizon`` rows, then ask again; returns the rows stepped.
loop = chunk_loop


def check(model: Any = None, *, gateway_url: Optional[str] = None) -> list:
    """Differences between the live catalogue entry (re-read by name) and ``EXPECT``; [] when none."""
    return check_entry(find_entry(model, TEMPLATE, gateway_url), EXPECT, TEMPLATE)
