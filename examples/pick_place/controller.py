"""Scripted pick-and-place controller for the demo policy (plain numpy).

``PickPlaceController.plan`` is stateless per call: it decides the phase from what the
exterior camera shows (cube and pad positions, see ``perception``) and from proprioception
(arm pose via ``kinematics.fk`` and the measured gripper closure), then returns a chunk of
absolute joint targets that moves toward that phase's goal. Replanning every 8 steps at 15 Hz
therefore closes the loop; nothing is remembered between calls.

Phases (TCP pointing straight down the whole time):
    approach  gripper open, move above the cube at HOVER_Z (rising first when low)
    descend   aligned with the cube: descend to GRASP_Z
    grasp     at GRASP_Z: close the gripper, hold still
    lift      gripper holding something (measured closure between HOLD_MIN and HOLD_MAX):
              hold a few steps for the grip to settle, rise to CARRY_Z
    carry     move above the pad at CARRY_Z
    place     aligned with the pad: descend vertically to PLACE_Z
    release   at PLACE_Z: open the gripper, hold still
    retreat   gripper open and the cube seen on the pad: rise to HOVER_Z and stay (done)
    reopen    gripper closed on nothing (closure >= HOLD_MAX): open and rise, then retry
    search    cube not visible: rise to HOVER_Z and wait
How the phase is inferred without memory: "holding" comes from the measured gripper
closure (a 4.5 cm cube stops the fingers at ~0.44); once the TCP is below CARRY_Z within
5 cm of the pad it keeps descending at its current xy (the pad may be partly hidden by the
cube then, so it is not re-targeted), likewise for the cube below HOVER_Z (2 cm window).

Gripper convention: 0.0 open, 1.0 closed (commands and measurements).
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

import kinematics as kin
import perception as perc

COLOURS = perc.COLOURS
DT = 1.0 / 15.0

GRASP_Z = 0.022     # TCP height when closing on a cube lying on the table (m)
PLACE_Z = 0.032     # TCP height when releasing onto a pad (m)
HOVER_Z = 0.13      # approach height above cubes (m)
CARRY_Z = 0.16      # carry height (m)
DESCEND_LOCK_Z = 0.08  # below this TCP height the grasp descent keeps its xy (m)
ALIGN_TOL = 0.008   # xy alignment before descending (m)
LOW_ALIGN_TOL = 0.02  # keep descending on the cube while within this xy distance (m)
PAD_WINDOW = 0.05   # below CARRY_Z and within this of the pad: keep descending (m)
ON_PAD_TOL = 0.025  # cube seen within this of the pad centre: done (m)
HOLD_MIN, HOLD_MAX = 0.2, 0.85  # measured closure range meaning "holding a cube"
MAX_SPEED_XY = 0.25  # m/s
MAX_SPEED_Z = 0.15   # m/s
MAX_JOINT_STEP = 0.12  # rad per 1/15 s step (1.8 rad/s)
GRIP_SETTLE_STEPS = 4


def parse_instruction(instruction: str) -> tuple[str, str]:
    """``"put the red cube on the green pad"`` -> ``("red", "green")``.

    Accepts "<colour> cube/block" and "<colour> pad/target/square"; otherwise the first two
    colour words are taken as (cube, pad). Raises ValueError if colours are missing.
    """
    text = (instruction or "").lower()
    known = "|".join(COLOURS)
    cube = re.search(rf"\b({known})\s+(?:cube|block|box)\b", text)
    pad = re.search(rf"\b({known})\s+(?:pad|target|square|mat|plate)\b", text)
    words = re.findall(rf"\b({known})\b", text)
    if cube and pad:
        return cube.group(1), pad.group(1)
    if len(words) >= 2:
        return words[0], words[1]
    raise ValueError(
        f"instruction {instruction!r} does not name a cube colour and a pad colour; known "
        f"colours: {', '.join(COLOURS)} (e.g. 'put the red cube on the green pad')")


@dataclasses.dataclass
class Plan:
    """Diagnostics of one planning call."""
    phase: str
    cube_xy: np.ndarray | None
    pad_xy: np.ndarray | None
    tcp: np.ndarray


class PickPlaceController:
    """Plans chunks of absolute joint targets + gripper for a pick-and-place instruction.

    Args:
        chunk_len: T, actions per chunk (default 16 at 15 Hz).
    """

    def __init__(self, chunk_len: int = 16):
        self.chunk_len = int(chunk_len)
        self.last_plan: Plan | None = None  # diagnostics only; never read by plan()

    def plan(self, images: dict, joint_positions, gripper, instruction: str) -> np.ndarray:
        """Return a (T, 8) array: 7 absolute joint targets (rad) + gripper (0 open..1 closed).

        ``images``: {"exterior_1": (224, 224, 3) uint8 RGB, ...}; ``joint_positions`` (7,)
        rad; ``gripper``: measured closure, scalar or (1,). Raises ValueError for an
        instruction without known colours.
        """
        cube_c, pad_c = parse_instruction(instruction)
        q = np.asarray(joint_positions, float).reshape(7)
        g = float(np.asarray(gripper, float).reshape(-1)[0])
        img = images["exterior_1"]
        hsv = perc.rgb_to_hsv(img)  # once per image, shared by both detectors
        cube = perc.find_cube(img, cube_c, hsv)
        pad = perc.find_pad(img, pad_c, hsv)
        cube_xy = None if cube is None else cube.xy
        pad_xy = None if pad is None else pad.xy
        p, _ = kin.fk(q)
        phase, path, grip, settle = self._decide(p, g, cube_xy, pad_xy)
        self.last_plan = Plan(phase, cube_xy, pad_xy, p)
        return self._chunk(q, path, grip, settle)

    # ------------------------------------------------------------------ phase logic
    @staticmethod
    def _decide(p, g, cube_xy, pad_xy):
        xy, z = p[:2], p[2]

        def at(xy_, z_):
            return np.array([xy_[0], xy_[1], z_])

        holding = HOLD_MIN < g < HOLD_MAX
        if holding:
            if pad_xy is None:
                return "carry", [at(xy, CARRY_Z)], 1.0, 0
            d = np.linalg.norm(xy - pad_xy)
            if d <= PAD_WINDOW and z < CARRY_Z - 0.02:
                if z <= PLACE_Z + 0.006:
                    return "release", [], 0.0, 0
                return "place", [at(xy, PLACE_Z)], 1.0, 0
            if d <= ALIGN_TOL:
                return "place", [at(pad_xy, PLACE_Z)], 1.0, 0
            if z < CARRY_Z - 0.02:
                settle = GRIP_SETTLE_STEPS if z < GRASP_Z + 0.015 else 0
                return "lift", [at(xy, CARRY_Z), at(pad_xy, CARRY_Z)], 1.0, settle
            return "carry", [at(pad_xy, CARRY_Z)], 1.0, 0
        if g >= HOLD_MAX:
            return "reopen", [at(xy, HOVER_Z)], 0.0, 0
        if cube_xy is not None and pad_xy is not None \
                and np.linalg.norm(cube_xy - pad_xy) < ON_PAD_TOL:
            return "retreat", [at(xy, HOVER_Z)], 0.0, 0
        if cube_xy is None:
            return "search", [at(xy, max(z, HOVER_Z))], 0.0, 0
        d = np.linalg.norm(xy - cube_xy)
        low = z < HOVER_Z - 0.02
        if (not low and d <= ALIGN_TOL) or (low and d <= LOW_ALIGN_TOL):
            if z <= GRASP_Z + 0.006:
                return "grasp", [], 1.0, 0
            # Near the cube the fingers hide part of it and bias its estimate: stop
            # re-targeting xy below DESCEND_LOCK_Z.
            goal_xy = xy if z < DESCEND_LOCK_Z else cube_xy
            return "descend", [at(goal_xy, GRASP_Z)], 0.0, 0
        if low:
            return "approach", [at(xy, HOVER_Z), at(cube_xy, HOVER_Z)], 0.0, 0
        return "approach", [at(cube_xy, HOVER_Z)], 0.0, 0

    # ------------------------------------------------------------------ trajectory
    def _chunk(self, q, path, grip, settle) -> np.ndarray:
        T = self.chunk_len
        out = np.empty((T, 8))
        out[:, 7] = grip
        R = kin.top_down_rotation(0.0)
        p, _ = kin.fk(q)
        qc = q.copy()
        waypoints = [np.asarray(w, float) for w in path]
        for t in range(T):
            if t >= settle and waypoints:
                step_left = 1.0  # fraction of this step's motion budget left
                while waypoints and step_left > 1e-9:
                    delta = waypoints[0] - p
                    dxy = np.linalg.norm(delta[:2]) / (MAX_SPEED_XY * DT)
                    dz = abs(delta[2]) / (MAX_SPEED_Z * DT)
                    need = max(dxy, dz)  # steps needed to reach the waypoint
                    if need <= step_left:
                        p = waypoints.pop(0)
                        step_left -= need
                    else:
                        p = p + delta * (step_left / need)
                        step_left = 0.0
                qn, _, _ = kin.ik(p, R, qc, iters=12)
                dq = np.clip(qn - qc, -MAX_JOINT_STEP, MAX_JOINT_STEP)
                qc = qc + dq
            out[t, :7] = qc
        return out
