"""Franka Panda kinematics for the pick-and-place demo policy (plain numpy).

Forward kinematics from the standard Franka (modified, Craig) DH parameters, plus the flange
(0.107 m), the hand mounted at -45 deg about the flange z axis (as on the real robot), and the
TCP 0.1034 m beyond the hand base, between the fingertips. Damped-least-squares IK.

Poses are in the world frame of the simulation: the robot base (panda_link0) sits at
``BASE_POS`` with rotation ``BASE_ROT`` (the sim's values; a test checks they match).
Units: metres and radians.
"""
from __future__ import annotations

import numpy as np

# Robot base pose in the world (must match sequence_ai_ros.panda_sim.BASE_POS, yaw 0).
BASE_POS = np.array([-0.45, 0.0, 0.0])
BASE_ROT = np.eye(3)

# Modified DH (Craig): per joint i, T = RotX(alpha) TransX(a) RotZ(q_i) TransZ(d).
DH_A = np.array([0.0, 0.0, 0.0, 0.0825, -0.0825, 0.0, 0.088])
DH_D = np.array([0.333, 0.0, 0.316, 0.0, 0.384, 0.0, 0.0])
DH_ALPHA = np.array([0.0, -np.pi / 2, np.pi / 2, np.pi / 2, -np.pi / 2, np.pi / 2, np.pi / 2])
FLANGE_D = 0.107
HAND_YAW = -np.pi / 4
TCP_OFFSET = 0.1034

JOINT_LOWER = np.array([-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973])
JOINT_UPPER = np.array([2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973])
READY_POSE = np.array([0.0, -np.pi / 4, 0.0, -3 * np.pi / 4, 0.0, np.pi / 2, np.pi / 4])


def _rotx(a):
    c, s = np.cos(a), np.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _rotz(a):
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def _tf(R=None, p=None):
    T = np.eye(4)
    if R is not None:
        T[:3, :3] = R
    if p is not None:
        T[:3, 3] = p
    return T


_T_FLANGE_TCP = _tf(p=[0, 0, FLANGE_D]) @ _tf(_rotz(HAND_YAW)) @ _tf(p=[0, 0, TCP_OFFSET])


def joint_frames(q, base_pos=BASE_POS, base_rot=BASE_ROT):
    """World transforms (4, 4) of joint frames 1..7 (z = joint axis) and of the TCP.

    Returns (frames (7, 4, 4), T_tcp (4, 4)).
    """
    q = np.asarray(q, float).reshape(7)
    T = _tf(base_rot, base_pos)
    frames = np.empty((7, 4, 4))
    for i in range(7):
        T = T @ _tf(_rotx(DH_ALPHA[i]), _rotx(DH_ALPHA[i]) @ [DH_A[i], 0, 0]) \
              @ _tf(_rotz(q[i]), [0, 0, DH_D[i]])
        frames[i] = T
    return frames, T @ _T_FLANGE_TCP


def fk(q, base_pos=BASE_POS, base_rot=BASE_ROT):
    """TCP pose in the world for joint angles ``q`` (7,) rad: (pos (3,) m, rot (3, 3))."""
    _, T = joint_frames(q, base_pos, base_rot)
    return T[:3, 3].copy(), T[:3, :3].copy()


def jacobian(q, base_pos=BASE_POS, base_rot=BASE_ROT):
    """Geometric Jacobian (6, 7) of the TCP in the world frame (rows: linear, angular)."""
    frames, T = joint_frames(q, base_pos, base_rot)
    p = T[:3, 3]
    J = np.empty((6, 7))
    for i in range(7):
        z = frames[i][:3, 2]
        J[:3, i] = np.cross(z, p - frames[i][:3, 3])
        J[3:, i] = z
    return J


def _rot_error(R_target, R):
    """Rotation vector (3,) taking R to R_target, in the world frame."""
    Re = R_target @ R.T
    cos = np.clip((np.trace(Re) - 1) / 2, -1.0, 1.0)
    angle = np.arccos(cos)
    v = np.array([Re[2, 1] - Re[1, 2], Re[0, 2] - Re[2, 0], Re[1, 0] - Re[0, 1]])
    s = np.sin(angle)
    if s < 1e-6:
        if angle < 1e-3:
            return 0.5 * v
        # ~180 deg: take the axis from the symmetric part.
        w, V = np.linalg.eigh((Re + Re.T) / 2)
        return V[:, np.argmax(w)] * angle
    return v * (angle / (2 * s))


def top_down_rotation(yaw: float = 0.0) -> np.ndarray:
    """TCP rotation pointing the fingers straight down; at yaw 0 the fingers close along
    world y (the ready pose's orientation)."""
    return _rotz(yaw) @ np.diag([1.0, -1.0, -1.0])


def ik(pos, rot, q0, *, iters: int = 30, damping: float = 0.05, tol: float = 1e-4,
       nullspace_gain: float = 0.1, q_rest=READY_POSE, base_pos=BASE_POS, base_rot=BASE_ROT):
    """Damped-least-squares IK for a TCP pose. ``pos`` (3,) m, ``rot`` (3, 3), ``q0`` (7,) seed.

    Pulls the redundant DOF toward ``q_rest``; respects joint limits (clipped each step).
    Returns (q (7,), pos_err_m, rot_err_rad).
    """
    q = np.clip(np.asarray(q0, float).copy(), JOINT_LOWER, JOINT_UPPER)
    pos = np.asarray(pos, float)
    ep = er = np.inf
    for _ in range(iters):
        p, R = fk(q, base_pos, base_rot)
        e = np.concatenate([pos - p, _rot_error(rot, R)])
        ep, er = np.linalg.norm(e[:3]), np.linalg.norm(e[3:])
        if ep < tol and er < 10 * tol:
            break
        J = jacobian(q, base_pos, base_rot)
        JJt = J @ J.T + (damping ** 2) * np.eye(6)
        Jpinv = J.T @ np.linalg.solve(JJt, np.eye(6))
        dq = Jpinv @ e + (np.eye(7) - Jpinv @ J) @ (nullspace_gain * (q_rest - q))
        n = np.max(np.abs(dq))
        if n > 0.3:
            dq *= 0.3 / n
        q = np.clip(q + dq, JOINT_LOWER, JOINT_UPPER)
    return q, float(ep), float(er)
