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

from typing import Any, Callable, Optional

from ._base import check_entry, find_entry

TEMPLATE = "pick-place"
EXPECT = {
    "action": {"action_space": "joint_absolute", "action_dim": 8, "control_frequency_hz": 15.0},
    "observation": {"cameras": {"exterior_1": {"width": 224, "height": 224}, "wrist_left": {"width": 224, "height": 224}},
                    "proprio": {"joint_positions": 7, "gripper": 1}},
}
GRIPPER = {"dim": 7, "binarize_at": None}          # sent as returned (0..1)
CONVERSION = None
CONVERSION_NOTE = "its rows are already joint-position targets (joint_absolute): send them as they are"


def loop(policy: Any, model: Any, *, observe: Callable[[], Any], step: Callable[[list], Any],
         instruction: str, chunks: int = 10) -> int:
    """The worked loop: observe, predict, play ``open_loop_horizon`` rows through ``prepare``.
    ``observe()`` returns an Observation (``sequence_ai.observation(model, ...)``); ``step(row)``
    commands one row and waits one control period. Returns the rows stepped."""
    from .. import prepare

    policy.set_instruction(instruction)
    n = 0
    for _ in range(chunks):
        chunk = policy.predict(observe()).action_chunk
        for i in range(chunk.open_loop_horizon or len(chunk.actions)):
            step(prepare(chunk, model, i))
            n += 1
    return n


def check(model: Any = None, *, gateway_url: Optional[str] = None) -> list:
    """Differences between the live catalogue entry (re-read by name) and ``EXPECT``; [] when none."""
    return check_entry(find_entry(model, TEMPLATE, gateway_url), EXPECT, TEMPLATE)
