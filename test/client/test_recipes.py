"""``sequence_ai.prepare``, ``sequence_ai.to_joint_positions`` and ``sequence_ai.recipes``
against the live catalogue of a real gateway: the pick-place demo and toy-policy templates
deployed as shipped, and a stand-in with the pi05-droid template's exact contract served under
the name ``pi05-droid`` (the real one needs openpi and a GPU); and the README's Python example,
extracted from README.md and run as written against the pick-place deployment.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import seq
import sequence_ai
from sequence_ai import recipes
from _core_support import connect
from _servers import ECHO_POLICY, ROOT

POLICIES = Path(__file__).resolve().parents[1] / "policies"

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


@pytest.fixture(scope="module")
def gw(shared_module_gateway):
    deploys = {"pi05-droid": str(POLICIES / "pi05_contract_policy.py"),
               "pick-place": str(ROOT / "examples" / "pick_place" / "policy.py"),
               "toy-policy": str(ROOT / "seq" / "templates" / "toy-policy" / "policy.py"),
               "drifted": ECHO_POLICY}
    for name, file in deploys.items():
        shared_module_gateway.deploy(file, name=name, wait=False)
    for name in deploys:
        d = shared_module_gateway.wait_until(name, timeout=180)
        assert d["status"] == "ready", d
    return shared_module_gateway


def catalogue(gw) -> dict:
    return {m.name: m for m in sequence_ai.models(gw.url)}


def zero_obs():
    import numpy as np
    frame = sequence_ai.encode_jpeg(np.zeros((224, 224, 3), np.uint8))
    return sequence_ai.Observation(
        images=[sequence_ai.ImageFrame("exterior_1", frame), sequence_ai.ImageFrame("wrist_left", frame)],
        proprioception=sequence_ai.Proprioception([0.0] * 7, gripper=[0.0]), instruction="pick up the cup")


def test_prepare_hands_each_row_over_as_the_reference_loop_does(gw):
    model = catalogue(gw)["pi05-droid"]
    with connect(gw, "pi05-droid") as policy:
        chunk = policy.predict(zero_obs()).action_chunk
    rows = [sequence_ai.prepare(chunk, model, i) for i in range(chunk.open_loop_horizon or len(chunk.actions))]
    # the arm values pass raw (the worker already clipped row 3's 1.5 into the bound of 1.0) and
    # the gripper is binarised at 0.5, as pi0.5-DROID's own loop does
    assert [r[:7] for r in rows] == [[0.01] * 7, [0.02] * 7, [0.03] * 7, [1.0] + [0.04] * 6]
    assert [r[7] for r in rows] == [1.0, 0.0, 1.0, 0.0]
    # a row handed in raw is clipped into the declared bounds by prepare itself
    assert sequence_ai.prepare([[1.5] * 7 + [0.2]], model, 0) == [1.0] * 7 + [0.0]
    # pick-place's recipe sends the gripper as returned
    pp = catalogue(gw)["pick-place"]
    assert sequence_ai.prepare([[0.0] * 7 + [0.7]], pp, 0)[7] == 0.7
    with pytest.raises(IndexError):
        sequence_ai.prepare(chunk, model, 4)


def test_to_joint_positions_offsets_every_row_from_the_same_q_ref(gw):
    model = catalogue(gw)["pi05-droid"]
    with connect(gw, "pi05-droid") as policy:
        chunk = policy.predict(zero_obs()).action_chunk
    q_ref = [0.1 * j for j in range(7)]
    targets = sequence_ai.to_joint_positions(chunk, q_ref, model, gateway_url=gw.url)
    assert len(targets) == 4 and all(len(t) == 7 for t in targets)
    for t, target in enumerate(targets[:3]):
        # row t is a displacement from q_ref, not from the previous target (no integration)
        assert target == pytest.approx([q + 0.01 * (t + 1) for q in q_ref])
    assert targets[3] == pytest.approx([q_ref[0] + 1.0] + [q + 0.04 for q in q_ref[1:]])


def test_to_joint_positions_refuses_a_model_without_a_verified_conversion(gw):
    live = catalogue(gw)
    with pytest.raises(ValueError, match="already joint-position targets"):
        sequence_ai.to_joint_positions([[0.0] * 8], [0.0] * 7, live["pick-place"])
    with pytest.raises(ValueError, match="has no recipe"):
        sequence_ai.to_joint_positions([[0.0] * 8], [0.0] * 7, live["drifted"])
    # an entry that says it is pi05-droid but whose live contract is another model's
    drifted = sequence_ai.ModelInfo(name="drifted", contract=live["pi05-droid"].contract,
                                    extra={"template": "pi05-droid"})
    with pytest.raises(ValueError, match="no longer matches the pi05-droid recipe.*action action_space"):
        sequence_ai.to_joint_positions([[0.0] * 8], [0.0] * 7, drifted, gateway_url=gw.url)


def test_each_recipe_checks_clean_against_the_live_catalogue_and_for_model_finds_it(gw):
    live = catalogue(gw)
    for name in ("pick-place", "pi05-droid", "toy-policy"):
        recipe = recipes.for_model(live[name])
        assert recipe is recipes.RECIPES[name] and recipe.TEMPLATE == name
        assert recipe.check(live[name], gateway_url=gw.url) == [], name
    assert recipes.for_model(live["drifted"]) is None
    assert recipes.for_model("pi05_droid") is recipes.pi05_droid
    problems = recipes.pi05_droid.check("drifted", gateway_url=gw.url)
    assert "action action_space: the catalogue says 'joint_absolute', the recipe was written for 'joint_velocity'" in problems
    with pytest.raises(LookupError, match="no model named 'nowhere'"):
        recipes.pick_place.check("nowhere", gateway_url=gw.url)


def test_the_toy_policy_recipe_loop_reaches_its_target(gw):
    xs = recipes.toy_policy.loop("toy-policy", x=0.0, target=0.25, steps=10, gateway_url=gw.url, api_key=gw.api_key)
    assert xs == pytest.approx([0.0, 0.1, 0.2, 0.25])


def _template_contract(path: Path, cls: str) -> dict:
    spec = importlib.util.spec_from_file_location(f"_tmpl_{cls}", path)
    module = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    s = seq.get_spec(getattr(module, cls))
    return {"action": s.action.to_dict() if s.action else None,
            "observation": s.observation.to_dict() if s.observation else None}


@pytest.mark.parametrize("template,path,cls", [
    ("pi05-droid", ROOT / "seq" / "templates" / "pi05-droid" / "policy.py", "Pi05Droid"),
    ("pick-place", ROOT / "examples" / "pick_place" / "policy.py", "PickPlacePolicy"),
    ("toy-policy", ROOT / "seq" / "templates" / "toy-policy" / "policy.py", "ToyPolicy"),
])
def test_each_recipe_is_written_for_its_shipped_template(template, path, cls):
    declared = _template_contract(path, cls)
    recipe = recipes.RECIPES[template]
    if recipe.EXPECT is None:
        assert declared == {"action": None, "observation": None}
        return
    for key in ("action_space", "action_dim", "control_frequency_hz"):
        assert recipe.EXPECT["action"][key] == declared["action"][key]
    assert {v: (c["width"], c["height"]) for v, c in declared["observation"]["cameras"].items()} == \
        {v: (c["width"], c["height"]) for v, c in recipe.EXPECT["observation"]["cameras"].items()}
    assert declared["observation"]["proprio"] == recipe.EXPECT["observation"]["proprio"]


# -- the README's Python example, as written, against the demo's deployment ----------------------

_OUTCOME = re.compile(r"RunOutcome\((\d+) actions over (\d+) chunks in ([\d.]+)s, (\w+)\)")


def _readme_python_block() -> str:
    """The fenced ``python`` block under the README's "From Python" heading, verbatim."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert len(blocks) == 1, f"expected one python block under 'From Python', found {len(blocks)}"
    return blocks[0]


def test_the_readme_python_example_runs_as_written_and_prints_what_its_comment_says(gw):
    block = _readme_python_block()
    claimed = _OUTCOME.search(block.split("print(out)", 1)[1])
    assert claimed, "the README's print(out) comment should show a RunOutcome"
    # as after the README's `seq serve`, `seq deploy ... --name pick-place` and `export
    # SEQUENCES_API_KEY=...`; the demo profile has no `mcp` package, so it is made unimportable;
    # a UserWarning (validate=None and the like) fails the run
    env = {**os.environ, **gw.env()}
    prelude = "import sys, warnings; sys.modules['mcp'] = None; warnings.simplefilter('error', UserWarning)\n"
    run = subprocess.run([sys.executable, "-c", prelude + block], env=env, capture_output=True, text=True,
                         timeout=180, cwd=str(ROOT))
    assert run.returncode == 0, run.stdout + run.stderr
    printed = _OUTCOME.fullmatch(run.stdout.strip().splitlines()[-1])
    assert printed, run.stdout
    actions, chunks, seconds, reason = int(printed[1]), int(printed[2]), float(printed[3]), printed[4]
    assert reason == claimed[4] == "until"          # the sim's own success check ended it
    assert abs(actions - int(claimed[1])) <= 0.3 * int(claimed[1]), (printed[0], claimed[0])
    assert abs(chunks - int(claimed[2])) <= 0.3 * int(claimed[2]), (printed[0], claimed[0])
    assert abs(seconds - float(claimed[3])) <= 0.3 * float(claimed[3]), (printed[0], claimed[0])
