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
KEYFRAME_STEPS = 4  # IK every this many moving steps; joint-space interpolation between
IK_ITERS = 12
START_MAX_GAP = 0.4  # rad: a start_command further than this from the measured joints is ignored


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
    start: str = "measured"  # what the chunk started from: "measured" joints or "command"


class PickPlaceController:
    """Plans chunks of absolute joint targets + gripper for a pick-and-place instruction.

    Args:
        chunk_len: T, actions per chunk (default 16 at 15 Hz).
    """

    def __init__(self, chunk_len: int = 16):
        self.chunk_len = int(chunk_len)
        self.last_plan: Plan | None = None  # diagnostics only; never read by plan()

    def plan(self, images: dict, joint_positions, gripper, instruction: str, *,
             start_command=None) -> np.ndarray:
        """Return a (T, 8) array: 7 absolute joint targets (rad) + gripper (0 open..1 closed).

        ``images``: {"exterior_1": (224, 224, 3) uint8 RGB, ...}; ``joint_positions`` (7,)
        rad; ``gripper``: measured closure, scalar or (1,).

        ``start_command``: optional (7,) rad, the arm command that will be in force when this
        chunk starts playing (the previous chunk's last executed row, known to the caller,
        e.g. the policy wrapper remembering what it returned). The phase is still decided
        from the observation, but the trajectory then continues from that command instead
        of from the measured joints, which lag it (servo tracking plus the observation's
        age): no backwards jump at the chunk seam. Ignored (the chunk starts from the
        measured joints) when it is further than START_MAX_GAP rad from them on any joint,
        i.e. when the arm is evidently not following it. ``plan`` itself keeps no state.

        Raises ValueError for an instruction without known colours, or a ``start_command``
        that is not 7 finite values.
        """
        cube_c, pad_c = parse_instruction(instruction)
        q = np.asarray(joint_positions, float).reshape(7)
        g = float(np.asarray(gripper, float).reshape(-1)[0])
        q_start, source = self._start(q, start_command)
        img = images["exterior_1"]
        hsv = perc.rgb_to_hsv(img)  # once per image, shared by both detectors
        cube = perc.find_cube(img, cube_c, hsv)
        pad = perc.find_pad(img, pad_c, hsv)
        cube_xy = None if cube is None else cube.xy
        pad_xy = None if pad is None else pad.xy
        p, _ = kin.fk(q)
        anchor = None if source == "measured" else kin.fk(q_start)[0]
        phase, path, grip, settle = self._decide(p, g, cube_xy, pad_xy, anchor)
        self.last_plan = Plan(phase, cube_xy, pad_xy, p, source)
        return self._chunk(q_start, path, grip, settle)

    @staticmethod
    def _start(q, start_command):
        """(joints the chunk starts from (7,), "command" | "measured")."""
        if start_command is None:
            return q, "measured"
        c = np.asarray(start_command, float).reshape(-1)
        if c.shape != (7,) or not np.all(np.isfinite(c)):
            raise ValueError(f"start_command must be 7 finite joint positions (rad), got "
                             f"{np.asarray(start_command).tolist()!r}; pass None to start "
                             f"from the measured joints")
        if np.max(np.abs(c - q)) > START_MAX_GAP:
            return q, "measured"
        return np.clip(c, kin.JOINT_LOWER, kin.JOINT_UPPER), "command"

    # ------------------------------------------------------------------ phase logic
    @staticmethod
    def _decide(p, g, cube_xy, pad_xy, anchor=None):
        """(phase, path waypoints, gripper command, settle steps) from the measured TCP
        position ``p`` (3,) m and closure ``g``. Waypoints that keep "the current" xy (or
        height) take it from ``anchor`` (3,) m, the TCP at the chunk's start (default ``p``).
        """
        xy, z = p[:2], p[2]
        hxy, hz = (xy, z) if anchor is None else (anchor[:2], anchor[2])

        def at(xy_, z_):
            return np.array([xy_[0], xy_[1], z_])

        holding = HOLD_MIN < g < HOLD_MAX
        if holding:
            if pad_xy is None:
                return "carry", [at(hxy, CARRY_Z)], 1.0, 0
            d = np.linalg.norm(xy - pad_xy)
            if d <= PAD_WINDOW and z < CARRY_Z - 0.02:
                if z <= PLACE_Z + 0.006:
                    return "release", [], 0.0, 0
                return "place", [at(hxy, PLACE_Z)], 1.0, 0
            if d <= ALIGN_TOL:
                return "place", [at(pad_xy, PLACE_Z)], 1.0, 0
            if z < CARRY_Z - 0.02:
                settle = GRIP_SETTLE_STEPS if z < GRASP_Z + 0.015 else 0
                return "lift", [at(hxy, CARRY_Z), at(pad_xy, CARRY_Z)], 1.0, settle
            return "carry", [at(pad_xy, CARRY_Z)], 1.0, 0
        if g >= HOLD_MAX:
            return "reopen", [at(hxy, HOVER_Z)], 0.0, 0
        if cube_xy is not None and pad_xy is not None \
                and np.linalg.norm(cube_xy - pad_xy) < ON_PAD_TOL:
            return "retreat", [at(hxy, HOVER_Z)], 0.0, 0
        if cube_xy is None:
            return "search", [at(hxy, max(hz, HOVER_Z))], 0.0, 0
        d = np.linalg.norm(xy - cube_xy)
        low = z < HOVER_Z - 0.02
        if (not low and d <= ALIGN_TOL) or (low and d <= LOW_ALIGN_TOL):
            if z <= GRASP_Z + 0.006:
                return "grasp", [], 1.0, 0
            # Near the cube the fingers hide part of it and bias its estimate: stop
            # re-targeting xy below DESCEND_LOCK_Z.
            goal_xy = hxy if z < DESCEND_LOCK_Z else cube_xy
            return "descend", [at(goal_xy, GRASP_Z)], 0.0, 0
        if low:
            return "approach", [at(hxy, HOVER_Z), at(cube_xy, HOVER_Z)], 0.0, 0
        return "approach", [at(cube_xy, HOVER_Z)], 0.0, 0

    # ------------------------------------------------------------------ trajectory
    def _cartesian_targets(self, p, path, settle) -> tuple[list, set]:
        """TCP position (3,) for each step of the chunk (None where the arm holds), and the
        steps during which an intermediate waypoint (a corner of the path) is passed.

        Walks ``path`` from ``p`` at MAX_SPEED_XY / MAX_SPEED_Z per step (a step may pass a
        waypoint and continue toward the next); steps before ``settle`` and after the last
        waypoint is reached hold.
        """
        targets: list = [None] * self.chunk_len
        corners: set = set()
        waypoints = [np.asarray(w, float) for w in path]
        for t in range(settle, self.chunk_len):
            if not waypoints:
                break
            step_left = 1.0  # fraction of this step's motion budget left
            while waypoints and step_left > 1e-9:
                delta = waypoints[0] - p
                dxy = np.linalg.norm(delta[:2]) / (MAX_SPEED_XY * DT)
                dz = abs(delta[2]) / (MAX_SPEED_Z * DT)
                need = max(dxy, dz)  # steps needed to reach the waypoint
                if need <= step_left:
                    p = waypoints.pop(0)
                    step_left -= need
                    if waypoints:
                        corners.add(t)
                else:
                    p = p + delta * (step_left / need)
                    step_left = 0.0
            targets[t] = p
        return targets, corners

    def _chunk(self, q, path, grip, settle) -> np.ndarray:
        """Joint targets along the Cartesian path, TCP pointing down.

        IK is solved only at keyframes: every ``KEYFRAME_STEPS``-th moving step, the last
        one, and the steps on either side of a path corner. Each solve is seeded from the
        previous keyframe's solution (the first from ``q``). Between keyframes the path is a
        straight line at most KEYFRAME_STEPS * 1.7 cm long, and the steps between are
        interpolated linearly in joint space by their distance along it (the TCP stays
        within ~1 mm of the line). Every step's joint motion is clipped to MAX_JOINT_STEP.
        """
        T = self.chunk_len
        out = np.empty((T, 8))
        out[:, 7] = grip
        R = kin.top_down_rotation(0.0)
        p, _ = kin.fk(q)
        targets, corners = self._cartesian_targets(p, path, settle)
        moving = [t for t in range(T) if targets[t] is not None]
        goal = {}  # step -> joint-space goal (7,)
        if moving:
            keys = set(moving[KEYFRAME_STEPS - 1::KEYFRAME_STEPS]) | {moving[-1]}
            keys |= corners | {t - 1 for t in corners if t - 1 >= moving[0]}
            prev_t, prev_q, prev_p = moving[0] - 1, q, p
            for k in sorted(keys):
                qk, _, _ = kin.ik(targets[k], R, prev_q, iters=IK_ITERS)
                span = float(np.linalg.norm(targets[k] - prev_p))
                for t in range(prev_t + 1, k + 1):
                    f = (float(np.linalg.norm(targets[t] - prev_p)) / span if span > 1e-9
                         else (t - prev_t) / (k - prev_t))
                    goal[t] = prev_q + (qk - prev_q) * min(1.0, f)
                prev_t, prev_q, prev_p = k, qk, targets[k]
        qc = q.copy()
        for t in range(T):
            if t in goal:
                qc = qc + np.clip(goal[t] - qc, -MAX_JOINT_STEP, MAX_JOINT_STEP)
            out[t, :7] = qc
        return out
