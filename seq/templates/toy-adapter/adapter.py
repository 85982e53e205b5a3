"""toy-adapter: the smallest @seq.adapter, between the ``pick-place`` benchmark and ``toy-policy``.

toy-policy has its own inputs and outputs ({"state": [x], "target": [t]} -> {"delta": [dx]}),
so this adapter says ``policy_io="own"`` and builds exactly that dict from each benchmark
observation, then turns the answer back into one 8-wide pick-place row (7 joint targets in rad
+ gripper): the first joint moves by dx toward ``target``, everything else holds.

    seq init toy-policy && seq deploy toy-policy/policy.py
    seq init toy-adapter && seq deploy toy-adapter/adapter.py     # registers toy-adapter@v1
    seq adapter check toy-adapter/adapter.py --benchmark pick-place --policy toy-policy
    seq eval run toy-policy --benchmark pick-place --adapter toy-adapter --tasks 1 \\
        --param benchmark.max_seconds=2 --param adapter.target=0.3

Every step says whether it loses information; ``seq adapter show toy-adapter`` lists the reasons
and the eval report carries them as ``adapter_lossy``.
"""
import seq


@seq.adapter(name="toy-adapter", policy_io="own")
class ToyAdapter(seq.Adapter):
    """pick-place -> toy-policy: joint 1 alone, steered toward ``target`` (rad)."""

    def __init__(self, *, target: float = 0.5):
        self.target = float(target)
        self.joints = None          # the last observed arm, kept for the action step
        self.gripper = 0.0

    @seq.observation_step(lossy="the policy sees joint 1 only: the cameras, the other six joints and the gripper are dropped")
    def to_toy_inputs(self, obs: dict) -> dict:
        self.joints = [float(x) for x in obs["proprio"]["joint_positions"]]
        self.gripper = float(obs["proprio"]["gripper"][0])
        return {"state": [self.joints[0]], "target": [self.target]}

    @seq.action_step(lossless=True)
    def to_pick_place_row(self, outputs: dict) -> list:
        if not isinstance(outputs, dict) or "delta" not in outputs:
            raise KeyError(f"toy-policy answers {{'delta': [dx]}}; got {outputs!r}")
        row = list(self.joints)
        row[0] += float(outputs["delta"][0])
        return [row + [self.gripper]]
