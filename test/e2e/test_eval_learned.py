"""The learned policy shipped with the flywheel example, scored like any deployed policy.

What a user does on a fresh machine, for real: ``seq volume put pick-place-learned
examples/flywheel/checkpoint`` (the shipped checkpoint), ``seq deploy
examples/flywheel/learned_policy.py`` (it declares ``weights="vol://pick-place-learned"``), then
``seq eval run ... --benchmark pick-place --gate success>=BAR`` on scenes no demonstration had
(seed 100004: a layout and a light no demonstration had) -- one episode per colour pair on that
scene, two envs. The eval steps the sim per action row (not on the wall clock) and inference runs
on one torch thread, so each episode's outcome is the same run to run: the shipped checkpoint
placed all six cubes on this scene in the full eval (59 % over 50 scenes per pair; the table is
in examples/flywheel/README.md), and ``BAR`` leaves room for three of the six to go the other
way on a machine whose floating point differs.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from _servers import ROOT, _env

LEARNED = str(ROOT / "examples" / "flywheel" / "learned_policy.py")
CHECKPOINT = ROOT / "examples" / "flywheel" / "checkpoint"
BAR = 0.5
SEED = 100004          # the scene; eval seeds start at 100000, demonstrations used 0..299
TASKS = ("red-on-green", "red-on-blue", "green-on-red", "green-on-blue", "blue-on-red", "blue-on-green")


def seq_cli(gw, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "seq.cli", *args], env=_env(gw.env()), capture_output=True,
                          text=True, timeout=timeout, cwd=str(ROOT))


@pytest.fixture(scope="module")
def learned(shared_module_gateway):
    put = seq_cli(shared_module_gateway, "volume", "put", "pick-place-learned", str(CHECKPOINT))
    assert put.returncode == 0, put.stdout + put.stderr
    d = shared_module_gateway.deploy(LEARNED, name="pick-place-learned", timeout=180)
    assert d["status"] == "ready", shared_module_gateway.log("pick-place-learned")
    return shared_module_gateway, put.stdout


def test_the_shipped_checkpoint_goes_up_as_the_volume_the_policy_declares(learned):
    gw, put = learned
    assert 'use weights="vol://pick-place-learned@v1"' in put
    copies = list((gw.data_dir / "volumes" / "pick-place-learned").rglob("policy.pt"))
    assert len(copies) == 1 and copies[0].read_bytes() == (CHECKPOINT / "policy.pt").read_bytes()


def test_eval_of_the_learned_policy_on_unseen_scenes_prints_a_report_and_passes_its_gate(learned):
    gw, _ = learned
    out = seq_cli(gw, "eval", "run", "pick-place-learned", "--benchmark", "pick-place", "--envs", "2",
                  "--episodes", "1", "--seed", str(SEED), "--gate", f"success>={BAR}")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "benchmark.light_jitter=1.0 (default)" in text
    assert f"gate success>={BAR} on pick-place-learned:" in text and "PASS" in text
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (\S+)\s+1\s+([01]\.000)", text, re.M)}
    assert sorted(rows) == sorted(TASKS), text          # one episode of every colour pair, each scored
    assert sum(rows.values()) >= BAR * len(TASKS)
