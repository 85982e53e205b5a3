"""The simulated Panda cell (sequence_ai_sim.panda_sim) and the demo policy's models of it."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
import mujoco  # noqa: E402  (after MUJOCO_GL is set)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "pick_place"))

import kinematics as kin  # noqa: E402
import perception as perc  # noqa: E402
from sequence_ai_sim import panda_sim as ps  # noqa: E402
from sequence_ai_sim.panda_sim import COLOURS, PandaPickPlaceSim  # noqa: E402


@pytest.fixture(scope="module")
def sim():
    s = PandaPickPlaceSim(seed=0)
    yield s
    s.close()


def test_scene_is_deterministic_per_seed(sim):
    sim.reset(3)
    a = sim.object_positions()
    sim.reset(4)
    b = sim.object_positions()
    sim.reset(3)
    c = sim.object_positions()
    for k in a:
        np.testing.assert_allclose(a[k], c[k], atol=1e-9)
    assert any(np.linalg.norm(a[k][:2] - b[k][:2]) > 0.01 for k in a)
    other = PandaPickPlaceSim(seed=3)
    try:
        d = other.object_positions()
        for k in a:
            np.testing.assert_allclose(a[k], d[k], atol=1e-9)
    finally:
        other.close()


@pytest.mark.parametrize("seed", range(10))
def test_layout_non_overlapping_and_reachable(sim, seed):
    lay = sim.sample_layout(seed)
    names = list(lay)
    for i, n in enumerate(names):
        x, y = lay[n]
        assert ps.WORKSPACE_X[0] <= x <= ps.WORKSPACE_X[1]
        assert ps.WORKSPACE_Y[0] <= y <= ps.WORKSPACE_Y[1]
        r = np.hypot(x - ps.BASE_POS[0], y - ps.BASE_POS[1])
        assert 0.3 < r < 0.78, (n, r)
        for m in names[i + 1:]:
            assert np.hypot(*(np.subtract(lay[n], lay[m]))) >= 0.08


def test_start_state(sim):
    sim.reset(0)
    assert sim.time == 0.0
    np.testing.assert_allclose(sim.joint_positions(), ps.READY_POSE, atol=1e-6)
    assert sim.gripper() == pytest.approx(0.0, abs=1e-3)
    assert sim.joint_names == [f"panda_joint{i}" for i in range(1, 8)] + ["panda_gripper"]
    assert sim.JOINT_LIMITS.shape == (8, 2)
    np.testing.assert_allclose(sim.JOINT_LIMITS[:7, 0], kin.JOINT_LOWER)
    np.testing.assert_allclose(sim.JOINT_LIMITS[:7, 1], kin.JOINT_UPPER)
    # Objects rest on the table.
    for c in COLOURS:
        assert sim.object_positions()[f"cube_{c}"][2] == pytest.approx(ps.CUBE_HALF, abs=2e-3)


def test_arm_tracks_commands_and_gripper(sim):
    sim.reset(0)
    target = ps.READY_POSE + np.array([0.3, 0.2, -0.2, 0.3, 0.2, -0.2, 0.3])
    sim.set_command(target, 1.0)
    sim.step(1.0)
    assert sim.time == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(sim.joint_positions(), target, atol=5e-3)
    assert sim.gripper() > 0.95
    sim.set_command(target, 0.0)
    sim.step(1.0)
    assert sim.gripper() < 0.05


def test_cameras_render_and_cubes_visible(sim):
    sim.reset(0)
    for cam in ("exterior_1", "wrist_left"):
        img = sim.render(cam)
        assert img.shape == (224, 224, 3) and img.dtype == np.uint8
        assert img.std() > 5  # not blank
    img = sim.render("exterior_1")
    pos = sim.object_positions()
    for c in COLOURS:
        cube_mask, pad_mask = perc.colour_masks(img, c)
        assert cube_mask.sum() >= perc.MIN_CUBE_PIXELS, c
        assert pad_mask.sum() >= perc.MIN_PAD_PIXELS, c
        # The cube's projected centre lands on its blob.
        u, v = sim.camera_model().project(pos[f"cube_{c}"])[0]
        assert cube_mask[int(v), int(u)], c


def test_camera_model_constants_match_sim(sim):
    cm = sim.camera_model("exterior_1")
    assert (cm.width, cm.height) == (perc.IMAGE_SIZE, perc.IMAGE_SIZE)
    assert cm.fx == pytest.approx(perc.FX) and cm.fy == pytest.approx(perc.FY)
    assert cm.cx == pytest.approx(perc.CX) and cm.cy == pytest.approx(perc.CY)
    np.testing.assert_allclose(cm.position, perc.CAM_POS, atol=1e-9)
    np.testing.assert_allclose(np.asarray(cm.rotation), perc.CAM_ROT, atol=1e-9)
    # And the model agrees with the renderer: projected cube centres sit in their blobs.
    pts = np.array([sim.object_positions()[f"cube_{c}"] for c in COLOURS])
    np.testing.assert_allclose(perc.project(pts), cm.project(pts), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 5])
def test_perception_locates_objects(sim, seed):
    sim.reset(seed)
    img = sim.render("exterior_1")
    pos = sim.object_positions()
    for c in COLOURS:
        cube = perc.find_cube(img, c)
        pad = perc.find_pad(img, c)
        assert cube is not None and pad is not None, c
        assert np.linalg.norm(cube.xy - pos[f"cube_{c}"][:2]) < 0.005, c
        assert np.linalg.norm(pad.xy - pos[f"pad_{c}"][:2]) < 0.005, c


@pytest.fixture(scope="module")
def lit_sim():
    s = PandaPickPlaceSim(seed=0, light_jitter=1.0)
    yield s
    s.close()


def test_light_jitter_draws_the_light_from_the_seed_and_leaves_the_layout_alone(sim, lit_sim):
    sim.reset(7)
    lit_sim.reset(7)
    assert sim.light == {"brightness": 1.0, "tint": [1.0, 1.0, 1.0], "tilt_rad": 0.0, "ambient": 1.0}
    first = dict(lit_sim.light)
    for k, v in sim.object_positions().items():                 # same seed, same layout
        np.testing.assert_allclose(lit_sim.object_positions()[k], v, atol=1e-9)
    img7 = lit_sim.render("exterior_1").astype(float)
    lit_sim.reset(8)
    assert lit_sim.light != first
    lit_sim.reset(7)
    assert lit_sim.light == first                                 # the same seed, the same light
    np.testing.assert_array_equal(lit_sim.render("exterior_1"), img7)
    # the spread at jitter 1: brightness within +-35 %, tint +-12 %, tilt <= 0.5 rad
    draws = []
    for seed in range(40):
        lit_sim.reset(seed)
        draws.append(lit_sim.light)
    b = [d["brightness"] for d in draws]
    assert 0.65 <= min(b) < 0.85 and 1.15 < max(b) <= 1.35
    assert all(0.88 <= t <= 1.12 for d in draws for t in d["tint"])
    assert all(0.0 <= d["tilt_rad"] <= 0.5 for d in draws) and max(d["tilt_rad"] for d in draws) > 0.3
    means = []
    for seed in (int(np.argmin(b)), int(np.argmax(b))):          # the darkest and brightest scenes differ visibly
        lit_sim.reset(seed)
        means.append(lit_sim.render("exterior_1").mean())
    assert means[1] - means[0] > 20


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_perception_locates_objects_under_randomised_light(lit_sim, seed):
    lit_sim.reset(seed)
    img = lit_sim.render("exterior_1")
    pos = lit_sim.object_positions()
    for c in COLOURS:
        cube, pad = perc.find_cube(img, c), perc.find_pad(img, c)
        assert cube is not None and pad is not None, (c, lit_sim.light)
        assert np.linalg.norm(cube.xy - pos[f"cube_{c}"][:2]) < 0.005, (c, lit_sim.light)
        assert np.linalg.norm(pad.xy - pos[f"pad_{c}"][:2]) < 0.005, (c, lit_sim.light)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "bright", None])
def test_light_jitter_outside_0_to_1_is_refused_naming_the_range(bad):
    with pytest.raises(ValueError, match=r"light_jitter must be"):
        PandaPickPlaceSim(seed=0, light_jitter=bad)


def test_fk_matches_mujoco(sim):
    rng = np.random.default_rng(0)
    base_pos, base_rot = sim.robot_base_pose()
    np.testing.assert_allclose(base_pos, kin.BASE_POS, atol=1e-9)
    np.testing.assert_allclose(base_rot, kin.BASE_ROT, atol=1e-9)
    try:
        for _ in range(20):
            q = rng.uniform(kin.JOINT_LOWER, kin.JOINT_UPPER)
            sim.data.qpos[sim._arm_qadr] = q
            mujoco.mj_kinematics(sim.model, sim.data)
            p_mj, R_mj = sim.tcp_pose()
            p, R = kin.fk(q)
            assert np.linalg.norm(p - p_mj) < 1e-3
            np.testing.assert_allclose(R, R_mj, atol=1e-3)
    finally:
        sim.reset(0)


def test_ik_reaches_top_down_targets():
    rng = np.random.default_rng(1)
    for _ in range(10):
        target = np.array([rng.uniform(-0.08, 0.25), rng.uniform(-0.24, 0.24),
                           rng.uniform(0.02, 0.2)])
        q, ep, er = kin.ik(target, kin.top_down_rotation(), kin.READY_POSE, iters=100)
        p, R = kin.fk(q)
        assert np.linalg.norm(p - target) < 2e-3
        assert np.allclose(R, kin.top_down_rotation(), atol=1e-2)


def test_success_check(sim):
    sim.reset(0)
    pos = sim.object_positions()
    ok, info = sim.success("red", "green")
    assert not ok and info["xy_dist_m"] > 0.03
    pad = pos["pad_green"]
    sim.set_cube_pose("red", [pad[0] + 0.01, pad[1], ps.TABLE_Z + 2 * ps.PAD_HALF_HEIGHT
                              + ps.CUBE_HALF + 0.001])
    sim.step(0.5)
    ok, info = sim.success("red", "green")
    assert ok, info
    assert not sim.success("red", "blue")[0]
    assert not sim.success("green", "green")[0]
    # Held in the air above the pad: not a success.
    sim.set_cube_pose("red", [pad[0], pad[1], 0.15])
    assert not sim.success("red", "green")[0]
    with pytest.raises(ValueError):
        sim.success("purple", "green")
    sim.reset(0)
