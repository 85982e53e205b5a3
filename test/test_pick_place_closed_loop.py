"""The demo policy's controller drives the simulated Panda closed-loop, in process.

Exactly as the served path: 15 Hz, 16-step chunks, replanning every 8 steps from fresh
renders of both cameras, each JPEG-encoded at quality 95 (Pillow) and decoded before
perception.
"""
from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
pytest.importorskip("mujoco")
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "pick_place"))

from controller import PickPlaceController, parse_instruction  # noqa: E402
from sequence_ai_ros.panda_sim import PandaPickPlaceSim  # noqa: E402

HZ = 15.0
HORIZON = 8


def jpeg_roundtrip(img: np.ndarray) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def run_episode(sim, seed, instruction, max_s=30.0):
    """Returns (succeeded, sim seconds, phases seen, moved cube colour or None)."""
    sim.reset(seed)
    start = sim.object_positions()
    ctrl = PickPlaceController(chunk_len=16)
    cube, pad = parse_instruction(instruction)
    phases = []
    max_step = 0.0
    while sim.time < max_s:
        images = {cam: jpeg_roundtrip(sim.render(cam)) for cam in sim.cameras}
        chunk = ctrl.plan(images, sim.joint_positions(), np.array([sim.gripper()]), instruction)
        assert chunk.shape == (16, 8)
        assert np.all(chunk[:, :7] >= sim.JOINT_LIMITS[:7, 0] - 1e-9)
        assert np.all(chunk[:, :7] <= sim.JOINT_LIMITS[:7, 1] + 1e-9)
        prev = sim.joint_positions()
        max_step = max(max_step, float(np.abs(chunk[0, :7] - prev).max()),
                       float(np.abs(np.diff(chunk[:, :7], axis=0)).max()))
        phases.append(ctrl.last_plan.phase)
        for action in chunk[:HORIZON]:
            sim.set_command(action[:7], action[7])
            sim.step(1.0 / HZ)
        ok, _ = sim.success(cube, pad)
        if ok and sim.gripper() < 0.1:
            break
    ok, info = sim.success(cube, pad)
    moved = [c for c in ("red", "green", "blue")
             if np.linalg.norm(sim.object_positions()[f"cube_{c}"][:2]
                               - start[f"cube_{c}"][:2]) > 0.03]
    return ok, sim.time, phases, moved, max_step, info


@pytest.fixture(scope="module")
def sim():
    s = PandaPickPlaceSim(seed=0)
    yield s
    s.close()


@pytest.mark.parametrize("seed,instruction", [
    (0, "put the red cube on the green pad"),
    (3, "put the blue cube on the red pad"),
    (7, "Place the green block on the blue pad."),
])
def test_pick_and_place_succeeds(sim, seed, instruction):
    cube, _ = parse_instruction(instruction)
    ok, t, phases, moved, max_step, info = run_episode(sim, seed, instruction)
    assert ok, f"seed {seed} {instruction!r}: failed after {t:.1f} s; {info}; phases {phases}"
    assert t <= 30.0
    assert moved == [cube], f"moved {moved}, expected only the {cube} cube"
    assert max_step <= 0.12 + 1e-9
    # Released and stays there.
    for _ in range(15):
        sim.step(1.0 / HZ)
    assert sim.success(*parse_instruction(instruction))[0]
    for p in ("approach", "descend", "grasp", "lift", "carry", "place", "release"):
        assert p in phases, (p, phases)


def test_different_instruction_moves_different_cube(sim):
    ok, _, _, moved, _, _ = run_episode(sim, 0, "put the green cube on the red pad")
    assert ok and moved == ["green"]


def test_unknown_colour_is_rejected():
    ctrl = PickPlaceController()
    img = np.zeros((224, 224, 3), np.uint8)
    with pytest.raises(ValueError, match="red, green, blue"):
        ctrl.plan({"exterior_1": img, "wrist_left": img}, np.zeros(7), 0.0,
                  "put the purple cube on the orange pad")
    assert parse_instruction("put the red cube on the green pad") == ("red", "green")
    assert parse_instruction("move the BLUE cube onto the red pad") == ("blue", "red")
    assert parse_instruction("green pad gets the red cube") == ("red", "green")
