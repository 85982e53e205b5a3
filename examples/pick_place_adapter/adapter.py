"""Adapter ``pick-place-fused``: the ``pick-place`` benchmark <-> a policy that reads one camera
named ``scene`` and an 8-wide ``state`` (joints then gripper), e.g. ``policy.py`` beside this file.

    seq deploy examples/pick_place_adapter/policy.py --name fused-pick-place
    seq deploy examples/pick_place_adapter/adapter.py            # registers pick-place-fused@v1
    seq eval run fused-pick-place --benchmark pick-place --adapter pick-place-fused --episodes 1

Observation: the benchmark's ``exterior_1`` frame becomes ``scene`` (pixels unchanged); the
``wrist_left`` frame is dropped (lossy: the policy reads one view); ``joint_positions`` (7) and
``gripper`` (1) are concatenated, in that order, into ``state`` (lossless: nothing is lost and
the order is fixed). Actions: the policy already returns the benchmark's rows (absolute joint
targets + gripper at 15 Hz), passed through unchanged.
"""
import seq

SOURCE_VIEW = "exterior_1"
DROPPED_VIEW = "wrist_left"


@seq.adapter(name="pick-place-fused", policy_io="contract")
class PickPlaceFused(seq.Adapter):
    """pick-place -> one camera "scene" and state = joints + gripper."""

    def __init__(self, *, view: str = SOURCE_VIEW):
        self.view = view

    @seq.observation_step(lossy="the wrist camera (wrist_left) is dropped: the policy reads one view")
    def one_camera(self, obs: dict) -> dict:
        images = obs["images"]
        if self.view not in images:
            raise KeyError(f"the benchmark rendered {sorted(images)}; this adapter reads {self.view!r}")
        return {**obs, "images": {"scene": images[self.view]}}

    @seq.observation_step(lossless=True)
    def fused_state(self, obs: dict) -> dict:
        proprio = obs["proprio"]
        state = [float(x) for x in proprio["joint_positions"]] + [float(x) for x in proprio["gripper"]]
        return {**obs, "proprio": {"state": state}}

    @seq.action_step(lossless=True)
    def rows(self, actions):
        return actions
