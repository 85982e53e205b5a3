"""Franka Panda kinematics for the pick-and-place demo policy (plain Python + numpy).

Forward kinematics from the standard Franka (modified, Craig) DH parameters, plus the flange
(0.107 m), the hand mounted at -45 deg about the flange z axis (as on the real robot), and the
TCP 0.1034 m beyond the hand base, between the fingertips. Damped-least-squares IK.

Speed: the controller solves a few hundred IK iterations per planning call, so the chain is
written as one pass of scalar float arithmetic (``_chain``) that yields every joint frame, the
TCP pose and the geometric Jacobian together; numpy is used only for the 6x6 solve of each
IK iteration. The DH joint twists are 0 or +-90 deg, so each one is an exact column swap.

Poses are in the world frame of the simulation: the robot base (panda_link0) sits at
``BASE_POS`` with rotation ``BASE_ROT`` (the sim's values; a test checks they match).
Units: metres and radians.
"""
from __future__ import annotations

import math

import numpy as np

# Robot base pose in the world (must match sequence_ai_sim.panda_sim.BASE_POS, yaw 0).
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

# Per joint: (sign of the twist: 0 none, +1 +90 deg, -1 -90 deg, a, d) as floats.
_TWIST = tuple(int(round(a / (np.pi / 2))) for a in DH_ALPHA)
if any(t not in (-1, 0, 1) for t in _TWIST):  # pragma: no cover - constants above
    raise ValueError("DH_ALPHA entries must be 0 or +-pi/2")
_DH = tuple(zip(_TWIST, (float(a) for a in DH_A), (float(d) for d in DH_D)))
_TCP_D = FLANGE_D + TCP_OFFSET
_CH, _SH = math.cos(HAND_YAW), math.sin(HAND_YAW)
_LOWER = tuple(float(v) for v in JOINT_LOWER)
_UPPER = tuple(float(v) for v in JOINT_UPPER)


def _rotz(a):
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def _chain(q, base_pos, base_rot):
    """One pass down the arm in scalar floats.

    ``q``: 7 floats (rad). Returns (origins, axes, p_tcp, (x, y, z)): 7 joint-frame origins
    and z axes (3-tuples, world), the TCP position and the TCP rotation's columns.
    """
    bp = base_pos
    br = base_rot
    px, py, pz = float(bp[0]), float(bp[1]), float(bp[2])
    # Rotation kept as its three columns (x, y, z axes of the current frame, in the world).
    x0, x1, x2 = float(br[0][0]), float(br[1][0]), float(br[2][0])
    y0, y1, y2 = float(br[0][1]), float(br[1][1]), float(br[2][1])
    z0, z1, z2 = float(br[0][2]), float(br[1][2]), float(br[2][2])
    origins = []
    axes = []
    for (twist, a, d), qi in zip(_DH, q):
        # RotX(alpha) with alpha in {0, +90, -90} deg: swap the y and z columns.
        if twist == 1:
            y0, y1, y2, z0, z1, z2 = z0, z1, z2, -y0, -y1, -y2
        elif twist == -1:
            y0, y1, y2, z0, z1, z2 = -z0, -z1, -z2, y0, y1, y2
        if a:
            px += a * x0
            py += a * x1
            pz += a * x2
        c = math.cos(qi)
        s = math.sin(qi)
        x0, x1, x2, y0, y1, y2 = (c * x0 + s * y0, c * x1 + s * y1, c * x2 + s * y2,
                                  c * y0 - s * x0, c * y1 - s * x1, c * y2 - s * x2)
        if d:
            px += d * z0
            py += d * z1
            pz += d * z2
        origins.append((px, py, pz))
        axes.append((z0, z1, z2))
    # Flange + hand (RotZ(HAND_YAW)) + TCP offset, all along / about the last z axis.
    p_tcp = (px + _TCP_D * z0, py + _TCP_D * z1, pz + _TCP_D * z2)
    xt = (_CH * x0 + _SH * y0, _CH * x1 + _SH * y1, _CH * x2 + _SH * y2)
    yt = (_CH * y0 - _SH * x0, _CH * y1 - _SH * x1, _CH * y2 - _SH * x2)
    return origins, axes, p_tcp, (xt, yt, (z0, z1, z2))


def _jacobian_rows(origins, axes, p_tcp):
    """Geometric Jacobian as 6 row lists (linear xyz, angular xyz) of 7 floats."""
    tx, ty, tz = p_tcp
    rows = [[], [], [], [], [], []]
    for (ox, oy, oz), (ax, ay, az) in zip(origins, axes):
        rx, ry, rz = tx - ox, ty - oy, tz - oz
        rows[0].append(ay * rz - az * ry)
        rows[1].append(az * rx - ax * rz)
        rows[2].append(ax * ry - ay * rx)
        rows[3].append(ax)
        rows[4].append(ay)
        rows[5].append(az)
    return rows


def _as_q(q):
    q = np.asarray(q, float).reshape(-1)
    if q.shape != (7,):
        raise ValueError(f"q must hold 7 joint angles (rad), got shape {q.shape}")
    return q.tolist()


def joint_frames(q, base_pos=BASE_POS, base_rot=BASE_ROT):
    """World transforms (4, 4) of joint frames 1..7 (z = joint axis) and of the TCP.

    ``q`` (7,) rad. Returns (frames (7, 4, 4), T_tcp (4, 4)). Raises ValueError for a ``q``
    that does not hold 7 values.
    """
    qs = _as_q(q)
    frames = np.zeros((7, 4, 4))
    frames[:, 3, 3] = 1.0
    # Re-run the chain keeping every frame's full rotation (rarely needed; not the hot path).
    Rk = np.asarray(base_rot, float)
    pk = np.asarray(base_pos, float)
    for i, (twist, a, d) in enumerate(_DH):
        ca, sa = (1.0, 0.0) if twist == 0 else (0.0, float(twist))
        Rx = np.array([[1.0, 0.0, 0.0], [0.0, ca, -sa], [0.0, sa, ca]])
        pk = pk + a * Rk[:, 0]
        Rk = Rk @ Rx @ _rotz(qs[i])
        pk = pk + d * Rk[:, 2]
        frames[i, :3, :3] = Rk
        frames[i, :3, 3] = pk
    T = np.eye(4)
    T[:3, :3] = Rk @ _rotz(HAND_YAW)
    T[:3, 3] = pk + _TCP_D * Rk[:, 2]
    return frames, T


def fk(q, base_pos=BASE_POS, base_rot=BASE_ROT):
    """TCP pose in the world for joint angles ``q`` (7,) rad: (pos (3,) m, rot (3, 3)).

    Raises ValueError for a ``q`` that does not hold 7 values."""
    _, _, p, (x, y, z) = _chain(_as_q(q), base_pos, base_rot)
    return np.array(p), np.array((x, y, z)).T


def jacobian(q, base_pos=BASE_POS, base_rot=BASE_ROT):
    """Geometric Jacobian (6, 7) of the TCP in the world frame (rows: linear, angular).

    Raises ValueError for a ``q`` that does not hold 7 values."""
    origins, axes, p, _ = _chain(_as_q(q), base_pos, base_rot)
    return np.array(_jacobian_rows(origins, axes, p))


def fk_jacobian(q, base_pos=BASE_POS, base_rot=BASE_ROT):
    """TCP pose and Jacobian from one pass: (pos (3,) m, rot (3, 3), J (6, 7)).

    Raises ValueError for a ``q`` that does not hold 7 values."""
    origins, axes, p, (x, y, z) = _chain(_as_q(q), base_pos, base_rot)
    return (np.array(p), np.array((x, y, z)).T,
            np.array(_jacobian_rows(origins, axes, p)))


def _rot_error_cols(Rt, cols):
    """Rotation vector (3-tuple) taking R to R_target, in the world frame.

    ``Rt``: target rotation as 3 row tuples; ``cols``: R's three columns (x, y, z axes).
    Re = Rt @ R.T, so Re[i][j] = sum_k Rt[i][k] * R[j][k] = dot(Rt row i, R row j).
    """
    x, y, z = cols
    r = ((x[0], y[0], z[0]), (x[1], y[1], z[1]), (x[2], y[2], z[2]))  # R's rows
    Re = [[Rt[i][0] * r[j][0] + Rt[i][1] * r[j][1] + Rt[i][2] * r[j][2] for j in range(3)]
          for i in range(3)]
    cos = min(1.0, max(-1.0, (Re[0][0] + Re[1][1] + Re[2][2] - 1.0) / 2.0))
    angle = math.acos(cos)
    v0, v1, v2 = Re[2][1] - Re[1][2], Re[0][2] - Re[2][0], Re[1][0] - Re[0][1]
    s = math.sin(angle)
    if s < 1e-6:
        if angle < 1e-3:
            return 0.5 * v0, 0.5 * v1, 0.5 * v2
        # ~180 deg: take the axis from the symmetric part.
        M = np.array(Re)
        w, V = np.linalg.eigh((M + M.T) / 2)
        ax = V[:, int(np.argmax(w))] * angle
        return float(ax[0]), float(ax[1]), float(ax[2])
    k = angle / (2.0 * s)
    return v0 * k, v1 * k, v2 * k


def _rot_error(R_target, R):
    """Rotation vector (3,) taking R (3, 3) to R_target (3, 3), in the world frame."""
    R = np.asarray(R, float)
    Rt = tuple(tuple(row) for row in np.asarray(R_target, float).tolist())
    return np.array(_rot_error_cols(Rt, tuple(tuple(c) for c in R.T.tolist())))


def top_down_rotation(yaw: float = 0.0) -> np.ndarray:
    """TCP rotation pointing the fingers straight down; at yaw 0 the fingers close along
    world y (the ready pose's orientation)."""
    return _rotz(yaw) @ np.diag([1.0, -1.0, -1.0])


def ik(pos, rot, q0, *, iters: int = 30, damping: float = 0.05, tol: float = 1e-4,
       nullspace_gain: float = 0.1, q_rest=READY_POSE, base_pos=BASE_POS, base_rot=BASE_ROT):
    """Damped-least-squares IK for a TCP pose. ``pos`` (3,) m, ``rot`` (3, 3), ``q0`` (7,) seed.

    Each iteration: e = (position error, rotation vector), n = nullspace_gain * (q_rest - q),
    dq = n + J^T (J J^T + damping^2 I)^-1 (e - J n) (the damped pseudo-inverse step plus the
    pull toward ``q_rest`` through (I - J^+ J)), scaled so no joint moves more than 0.3 rad,
    then clipped to the joint limits. Stops early once the position error < ``tol`` m and the
    rotation error < 10 * ``tol`` rad (the damped nullspace pull leaves ~1-2 mm, so with the
    defaults it usually runs all ``iters``). Returns (q (7,), pos_err_m, rot_err_rad), errors
    of the returned q's predecessor as in a plain loop (measured before the last step).
    Raises ValueError for a ``q0`` that does not hold 7 values.
    """
    q = [min(hi, max(lo, v)) for v, lo, hi in zip(_as_q(q0), _LOWER, _UPPER)]
    tx, ty, tz = (float(v) for v in np.asarray(pos, float).reshape(3))
    Rt = tuple(tuple(row) for row in np.asarray(rot, float).reshape(3, 3).tolist())
    rest = [float(v) for v in np.asarray(q_rest, float).reshape(7)]
    lam2 = float(damping) ** 2
    ep = er = math.inf
    for _ in range(iters):
        origins, axes, p, cols = _chain(q, base_pos, base_rot)
        ex, ey, ez = tx - p[0], ty - p[1], tz - p[2]
        rx, ry, rz = _rot_error_cols(Rt, cols)
        ep = math.sqrt(ex * ex + ey * ey + ez * ez)
        er = math.sqrt(rx * rx + ry * ry + rz * rz)
        if ep < tol and er < 10 * tol:
            break
        J = np.array(_jacobian_rows(origins, axes, p))
        n = nullspace_gain * (np.array(rest) - np.array(q))
        A = J @ J.T
        A.flat[::7] += lam2
        dq = n + J.T @ np.linalg.solve(A, np.array((ex, ey, ez, rx, ry, rz)) - J @ n)
        m = float(np.abs(dq).max())
        if m > 0.3:
            dq *= 0.3 / m
        q = [min(hi, max(lo, v + d)) for v, d, lo, hi in zip(q, dq.tolist(), _LOWER, _UPPER)]
    return np.array(q), float(ep), float(er)
