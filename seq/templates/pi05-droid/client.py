"""The robot's half of pi05-droid: observe a DROID Franka, drive it with the deployed policy.

    python client.py --model my-pi05 "pick up the cup"

Needs ``pip install 'sequence-ai[image]'`` (frames are sized and JPEG-encoded here),
SEQUENCES_API_KEY, and a deployment of this template's policy.py (``seq deploy policy.py``).

Fill in the four methods of ``Robot`` with your hardware's calls; nothing else needs to change.
The rows the policy returns are pi0.5-DROID's own output, untouched: 7 joint velocities (rad/s)
and a gripper position (0 open .. 1 closed), at 15 Hz. ``apply_action`` hands them to a
controller that takes exactly that (DROID's ``RobotEnv(action_space="joint_velocity",
gripper_action_space="position")``); converting them to joint positions for a position
controller is the one thing to get right if your robot has no velocity interface.
"""
import argparse
from typing import List

import sequence_ai


class Robot:
    """Your Franka. Replace each body with your hardware's calls."""

    def cameras(self) -> dict:
        """``{"exterior_1": HxWx3 uint8 RGB, "wrist_left": HxWx3 uint8 RGB}`` at native size."""
        raise NotImplementedError("read the exterior and wrist cameras here")

    def joint_positions(self) -> List[float]:
        """The 7 arm joint angles (rad)."""
        raise NotImplementedError("read the arm's joint positions here")

    def gripper_position(self) -> float:
        """The gripper opening, 0 (open) .. 1 (closed)."""
        raise NotImplementedError("read the gripper here")

    def apply_action(self, row: List[float]) -> None:
        """One row: 7 joint velocities (rad/s) + gripper position (0..1), for one 1/15 s step."""
        raise NotImplementedError("send the joint velocities and the gripper target here")

    def is_safe(self, row: List[float]) -> bool:
        """Your bounds check: return False to stop before this row is applied."""
        return all(abs(v) <= 1.0 for v in row[:7]) and 0.0 <= row[7] <= 1.0

    def hold(self) -> None:
        """Stop the arm where it is (zero velocity); called once on any early ending."""
        self.apply_action([0.0] * 7 + [self.gripper_position()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instruction", help='the task, e.g. "pick up the cup"')
    parser.add_argument("--model", default="pi05-droid", help="the deployment name (seq deploy ... --name)")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="bound on the motion (s)")
    args = parser.parse_args()
    robot = Robot()
    with sequence_ai.connect(args.model, expect={"action_space": "joint_velocity", "action_dim": 8}) as policy:
        policy.wait_until_ready()            # bring the model up before the arm needs it

        def observe() -> sequence_ai.Observation:
            # checked against what the deployment declares before anything is sent
            return sequence_ai.observation(images=robot.cameras(), joints=robot.joint_positions(),
                                           gripper=[robot.gripper_position()], instruction=args.instruction,
                                           contract=policy.contract)

        out = policy.act(args.instruction, observe=observe, act=robot.apply_action,
                         validate=robot.is_safe, hold=robot.hold, max_seconds=args.max_seconds)
    print(out)


if __name__ == "__main__":
    main()
