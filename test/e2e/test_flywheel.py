"""The data flywheel example end to end at toy scale (examples/flywheel/run_flywheel.py).

Real everything, small: ``seq serve``, the closed-form policy's worker, two recorded episodes
(the sim driven through the client, bags written by the recorder's BagWriter), the project's
exporter (``sequence-ai bag export --format lerobot``), a few torch training steps, ``seq volume
put`` of that checkpoint and ``seq deploy`` of the learned policy that loads it, and ``seq eval run learned --compare pick-place`` on
one short episode. It proves the plumbing, not the success rate (see examples/flywheel/README.md
for the full-scale figures).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
FLYWHEEL = REPO / "examples" / "flywheel"
EPISODES = 2
SIM_S = 2.0            # sim-time bound of each recorded / evaluated episode (s): 31 control steps
STEPS_PER_EPISODE = 31  # rows of 0.066 s of sim time until the 2 s bound is reached


@pytest.fixture(scope="module")
def flywheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("flywheel")
    proc = subprocess.run(
        [sys.executable, str(FLYWHEEL / "run_flywheel.py"), "--out", str(out), "--episodes", str(EPISODES),
         "--max-seconds", str(SIM_S), "--jobs", "1", "--train-steps", "3", "--train-batch", "8", "--eval-episodes", "1",
         "--eval-envs", "1", "--eval-tasks", "1", "--eval-max-seconds", str(SIM_S)],
        capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((out / "flywheel.json").read_text())
    return out, summary, proc.stdout


def test_record_writes_one_labelled_bag_per_episode_in_the_recorders_format(flywheel):
    out, summary, _ = flywheel
    from sequence_ai_ros.bag.reader import read_episode

    recs = json.loads((out / "record.json").read_text())
    assert [r["task"] for r in recs] == ["red-on-green", "red-on-blue"]   # pairs cycle with the seeds
    assert [r["seed"] for r in recs] == [0, 1]
    for r in recs:
        ep = read_episode(Path(r["bag"]))
        assert ep.task == r["instruction"]
        assert ep.start["views"] == ["exterior_1", "wrist_left"]
        assert ep.success is False and r["success"] is False   # 2 s is too short to place a cube
        assert ep.end["outcome"]["actions"] == r["actions"] == STEPS_PER_EPISODE
        assert len(ep.commands) == STEPS_PER_EPISODE
        assert all(len(m) == STEPS_PER_EPISODE for m in ep.images.values())
        # log times are simulated time: commands one control period apart (the sim advances a
        # whole number of 2 ms physics steps per 1/15 s row: 0.066 s)
        dt = np.diff([t for t, _ in ep.commands]) * 1e-9
        assert np.ptp(dt) < 1e-6 and abs(dt[0] - 1.0 / 15.0) < 0.002
    assert summary["record"] == {**summary["record"], "episodes": EPISODES, "failed": 0, "successes": 0}


def test_export_makes_a_lerobot_dataset_whose_tasks_are_the_instructions(flywheel):
    out, _, _ = flywheel
    import pyarrow.parquet as pq

    info = json.loads((out / "dataset" / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 15 and info["robot_type"] == "panda"
    assert info["total_episodes"] == EPISODES and info["total_frames"] == EPISODES * STEPS_PER_EPISODE
    tasks = pq.read_table(out / "dataset" / "meta" / "tasks.parquet").column("task").to_pylist()
    assert sorted(tasks) == ["put the red cube on the blue pad", "put the red cube on the green pad"]


def test_train_reads_the_dataset_and_writes_a_small_checkpoint_conditioned_on_its_tasks(flywheel):
    out, summary, _ = flywheel
    sys.path.insert(0, str(FLYWHEEL))
    import torch
    from model import load_checkpoint

    t = summary["train"]
    assert t["steps"] == 3 and t["frames"] == EPISODES * STEPS_PER_EPISODE and t["episodes"] == EPISODES
    assert np.isfinite(t["final_l1"]) and 0 < t["final_l1"] < 5
    ck = out / "checkpoint" / "policy.pt"
    assert 0.1e6 < ck.stat().st_size < 5e6
    model, stats, _ = load_checkpoint(ck)
    assert sorted(model.cfg.tasks) == ["put the red cube on the blue pad", "put the red cube on the green pad"]
    imgs = {v: torch.zeros(1, 3, 96, 96) for v in model.cfg.views}
    with torch.no_grad():
        a = model(imgs, torch.zeros(1, 8), torch.tensor([0]))
        b = model(imgs, torch.zeros(1, 8), torch.tensor([1]))
    assert a.shape == (1, 16, 8)
    assert not torch.allclose(a, b)   # the task embedding changes the chunk
    assert len(stats["action_mean"]) == 8 and all(s > 0 for s in stats["action_std"])


def test_the_learned_policy_is_deployed_from_a_volume_and_evaluated_against_the_teacher(flywheel):
    out, summary, stdout = flywheel
    # the checkpoint went up as version 1 of the volume the policy declares, byte for byte
    assert summary["deploy"]["volume"].startswith("uploaded pick-place-learned v1: 2 files")
    copies = list((out / "server" / "volumes").rglob("policy.pt"))
    assert len(copies) == 1 and copies[0].read_bytes() == (out / "checkpoint" / "policy.pt").read_bytes()
    ev = summary["eval"]
    assert ev["rc"] == 0 and ev["id"].startswith("ev-")
    report = ev["report"]
    assert "arm learned (policy learned v1): 1 episode(s), 0 error(s)" in report
    assert "arm pick-place (policy pick-place v1): 1 episode(s), 0 error(s)" in report
    rows = [line.split(",") for line in ev["csv"].strip().splitlines()]
    header, body = rows[0], rows[1:]
    arms = {r[header.index("arm")] for r in body}
    assert arms == {"learned", "pick-place"}
    # both arms stepped the sim to the 2 s bound (the learned one answered every query)
    for r in body:
        assert float(r[header.index("episode_s")]) == pytest.approx(SIM_S, abs=0.1)


def test_the_learned_policy_returns_chunks_and_refuses_an_instruction_it_was_not_trained_on(flywheel):
    out, _, _ = flywheel
    sys.path.insert(0, str(FLYWHEEL))
    import seq
    from learned_policy import LearnedPickPlacePolicy

    policy = LearnedPickPlacePolicy()
    policy.load(str(out / "checkpoint"))
    assert policy.checkpoint == str(out / "checkpoint" / "policy.pt")
    img = np.zeros((224, 224, 3), np.uint8)

    def obs(text):
        return seq.Observation(images={"exterior_1": img, "wrist_left": img},
                               proprio={"joint_positions": np.zeros(7), "gripper": np.zeros(1)}, instruction=text)

    chunk = policy.infer(obs("Put the red cube on the green pad."))   # case and full stop forgiven
    assert np.asarray(chunk.actions).shape == (16, 8) and chunk.open_loop_horizon == 8
    assert np.isfinite(np.asarray(chunk.actions)).all()
    with pytest.raises(seq.PolicyInputError, match="put the red cube on the green pad"):
        policy.infer(obs("put the purple cube on the moon"))


def test_train_refuses_an_empty_budget_and_writes_nothing(flywheel, tmp_path):
    out, _, _ = flywheel
    sys.path.insert(0, str(FLYWHEEL))
    from train import train

    for kw in ({"steps": 0}, {"minutes": -1.0}, {"steps": 3, "save_every_min": 0}):
        with pytest.raises(ValueError, match="must be > 0"):
            train(out / "dataset", tmp_path / "ck", **kw)
    assert not (tmp_path / "ck").exists()


def test_a_file_that_is_not_a_checkpoint_is_refused_by_name(tmp_path):
    sys.path.insert(0, str(FLYWHEEL))
    import torch
    from model import load_checkpoint

    junk, other = tmp_path / "junk.pt", tmp_path / "other.pt"
    junk.write_bytes(bytes(range(256)) * 64)
    torch.save({"foo": torch.zeros(3)}, other)
    for path in (junk, other):
        with pytest.raises(RuntimeError, match=r"is not a checkpoint written by train\.py"):
            load_checkpoint(path)


def test_a_checkpoint_from_another_model_version_is_refused_with_the_fix(tmp_path):
    sys.path.insert(0, str(FLYWHEEL))
    import torch
    from model import ModelConfig, VisuomotorPolicy, load_checkpoint, save_checkpoint

    path = tmp_path / "policy.pt"
    save_checkpoint(path, VisuomotorPolicy(ModelConfig(tasks=["a", "b"])), {}, {})
    ck = torch.load(path, weights_only=True)
    ck["state_dict"] = {k.replace("stem.", "net."): v for k, v in ck["state_dict"].items()}   # the pre-FiLM names
    torch.save(ck, path)
    with pytest.raises(RuntimeError, match=r"written by another version of model\.py .* retrain it with train\.py"):
        load_checkpoint(path)


def test_prefix_weights_are_one_over_the_committed_rows_then_decay_to_zero():
    sys.path.insert(0, str(FLYWHEEL))
    from model import prefix_weights

    w = prefix_weights(16, 4, 10).tolist()
    assert w[:4] == [1.0] * 4 and w[10:] == [0.0] * 6
    assert all(1.0 > a > b > 0.0 for a, b in zip(w[4:9], w[5:10]))
    assert prefix_weights(16, 0, 0).tolist() == [0.0] * 16


def test_guided_sampling_inpaints_the_committed_prefix_and_stays_deterministic():
    """Real-time-chunking guidance pulls the flow head's chunk onto the committed rows (the
    unguided chunk ignores them) and, starting from the noise mean, repeats exactly."""
    sys.path.insert(0, str(FLYWHEEL))
    import torch
    from model import ModelConfig, VisuomotorPolicy

    torch.manual_seed(0)
    model = VisuomotorPolicy(ModelConfig(tasks=["a", "b"])).eval()
    z = torch.randn(1, 2 * 32 * 2 + 32 + 8)
    prefix = torch.randn(1, 9, 8)
    free = model.sample(z)
    guided = model.sample(z, prefix=prefix, delay=5)
    assert free.shape == guided.shape == (1, 16, 8)
    err_free = (free[0, :5] - prefix[0, :5]).abs().mean().item()
    err_guided = (guided[0, :5] - prefix[0, :5]).abs().mean().item()
    assert err_guided < 0.05 * err_free, (err_guided, err_free)
    assert torch.equal(model.sample(z, prefix=prefix, delay=5), guided)
    assert torch.equal(model.sample(z), free)


def test_the_shipped_policy_inpaints_the_committed_prefix_and_refuses_a_delay_beyond_its_maximum():
    sys.path.insert(0, str(FLYWHEEL))
    import seq
    from learned_policy import MAX_DELAY_STEPS, LearnedPickPlacePolicy

    policy = LearnedPickPlacePolicy()
    policy.load(str(FLYWHEEL / "checkpoint"))
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)
    obs = seq.Observation(images={"exterior_1": img, "wrist_left": img},
                          proprio={"joint_positions": np.array([0.0, -0.78, 0.0, -2.36, 0.0, 1.57, 0.78]),
                                   "gripper": np.zeros(1)}, instruction="put the red cube on the green pad")
    free = np.asarray(policy.infer(obs).actions)            # no prefix: the regression chunk
    prefix = (free[:8] + 0.05).astype(np.float32)           # committed rows the chunk did not plan
    rows = np.asarray(policy.infer(obs, prefix=prefix, delay_steps=5).actions)
    assert rows.shape == (16, 8)
    np.testing.assert_array_equal(rows[:5], prefix[:5].astype(np.float64))
    # the row after the committed ones continues from them (guidance), not from the free chunk
    assert np.abs(rows[5, :7] - prefix[5, :7]).max() < np.abs(free[5, :7] - prefix[5, :7]).max()
    assert np.array_equal(np.asarray(policy.infer(obs, prefix=prefix, delay_steps=5).actions), rows)
    with pytest.raises(seq.PolicyInputError, match=f"delay_steps=9 is outside 0..{MAX_DELAY_STEPS}"):
        policy.infer(obs, prefix=np.repeat(prefix, 2, axis=0), delay_steps=9)
