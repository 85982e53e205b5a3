"""Authoring: @seq.policy declarations are validated at import with readable errors, and what
they declare (contracts, inference parameters, recorded resources) lands on the class's spec."""
from __future__ import annotations

from typing import Annotated, Optional

import numpy as np
import pytest

import seq
from seq._params import ParamError, cast_params


def _contracts():
    action = seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE, action_dim=8,
                                control_frequency_hz=15.0, bounds=[(-3.0, 3.0)] * 7 + [(0.0, 1.0)])
    observation = seq.ObservationContract(cameras={"exterior_1": seq.Camera(224, 224)},
                                          proprio={"joint_positions": 7, "gripper": 1})
    return action, observation


def test_a_closed_form_policy_needs_only_action_and_observation():
    action, observation = _contracts()

    @seq.policy(action=action, observation=observation)
    class Hold(seq.Policy):
        @seq.load
        def load(self, weights_dir):
            self.weights_dir = weights_dir

        @seq.infer
        def infer(self, obs: seq.Observation) -> seq.ActionChunk:
            return seq.ActionChunk(np.zeros((4, 8)))

    spec = seq.get_spec(Hold)
    assert spec.methods == {"load": "load", "infer": "infer"}
    assert spec.action.action_dim == 8 and spec.observation.history == 1
    assert spec.weights is None and spec.params == [] and spec.infer_mode == "observation"
    assert spec.timeouts.startup == 1800.0 and spec.idle_timeout == 600.0
    assert spec.on_full == "queue" and spec.queue_timeout_s == 120.0
    assert seq.is_policy(Hold) and issubclass(Hold, seq.Policy)


def test_declaration_error_is_both_value_error_and_type_error():
    assert issubclass(seq.DeclarationError, ValueError) and issubclass(seq.DeclarationError, TypeError)
    assert issubclass(seq.PolicyInputError, ValueError)


def test_missing_infer_is_refused_at_decoration_naming_the_marker():
    with pytest.raises(seq.DeclarationError, match=r"@seq.infer"):
        @seq.policy()
        class NoInfer:
            @seq.load
            def load(self, weights_dir):
                pass


def test_missing_load_is_refused_at_decoration_naming_the_marker():
    with pytest.raises(seq.DeclarationError, match=r"@seq.load"):
        @seq.policy
        class NoLoad:
            @seq.infer
            def infer(self, obs):
                pass


def test_optional_lifecycle_markers_are_found():
    @seq.policy(streaming=True)
    class Full:
        @seq.load
        def load(self, weights_dir): ...

        @seq.warmup
        def warm(self): ...

        @seq.infer
        def infer(self, obs): ...

        @seq.on_episode
        def episode(self, episode_id): ...

        @seq.shutdown
        def bye(self): ...

    assert seq.get_spec(Full).methods == {"load": "load", "warmup": "warm", "infer": "infer",
                                          "on_episode": "episode", "shutdown": "bye"}


def test_streaming_without_on_episode_is_refused():
    with pytest.raises(seq.DeclarationError, match="on_episode"):
        @seq.policy(streaming=True)
        class S:
            @seq.load
            def load(self, weights_dir): ...

            @seq.infer
            def infer(self, obs): ...


def test_unknown_argument_names_the_closest_one():
    with pytest.raises(seq.DeclarationError) as info:
        seq.policy(obsrevation=None)
    assert info.value.argument == "obsrevation"
    assert "did you mean observation=" in str(info.value)


@pytest.mark.parametrize("kwargs, argument", [
    ({"gpu": 4}, "gpu"),
    ({"gpu": ["H100:2", "A100"]}, "gpu"),
    ({"max_gpus": 0}, "max_gpus"),
    ({"cpu": (4, 2)}, "cpu"),
    ({"memory": -1}, "memory"),
    ({"on_full": "drop"}, "on_full"),
    ({"idle_timeout": 0}, "idle_timeout"),
    ({"min_workers": -1}, "min_workers"),
    ({"queue_timeout_s": "soon"}, "queue_timeout_s"),
    ({"streaming": "yes"}, "streaming"),
    ({"deps": "numpy"}, "deps"),
    ({"weights": {"Base": "hf://a/b"}}, "weights"),
    ({"secrets": ["1bad"]}, "Secret.from_name"),
    ({"timeouts": {"startup": 10, "boot": 5}}, "timeouts"),
    ({"action": "joint_absolute"}, "action"),
])
def test_bad_arguments_are_refused_naming_the_argument(kwargs, argument):
    with pytest.raises(seq.DeclarationError) as info:
        seq.policy(**kwargs)
    assert info.value.argument == argument, str(info.value)


def test_self_hosted_meaningless_arguments_are_recorded_not_dropped():
    image = seq.Image.debian_slim().apt_install("libgl1").run_commands("echo hi")

    @seq.policy(gpu="L4", max_gpus=2, cpu=(2, 4), memory=16, image=image, region="eu", deps=["einops"],
                models=["qwen3-8-27b"], weights="hf://org/model@abc", secrets=[seq.Secret.from_name("hf")],
                timeouts=seq.Timeouts(startup=900, request=5), idle_timeout=300, min_workers=1,
                buffer_workers=1, on_full="reject", queue_timeout_s=30)
    class P:
        @seq.load
        def load(self, weights_dir): ...

        @seq.infer
        def infer(self, obs): ...

    d = seq.get_spec(P).to_dict()
    assert d["resources"]["gpu"] == "L4" and d["resources"]["region"] == "eu"
    assert d["resources"]["cpu"] == [2.0, 4.0] and d["resources"]["max_gpus"] == 2
    assert [s["kind"] for s in d["resources"]["image"]["steps"]] == ["apt_install", "run_commands"]
    assert d["weights"] == "hf://org/model@abc" and d["secrets"] == ["hf"]
    assert d["timeouts"] == {"startup": 900.0, "request": 5.0}
    assert (d["idle_timeout"], d["min_workers"], d["on_full"], d["queue_timeout_s"]) == (300.0, 1, "reject", 30.0)
    assert d["infer_mode"] == "raw"  # no contract and no Observation annotation


def test_action_contract_validates_and_round_trips():
    action, _ = _contracts()
    d = action.to_dict()
    assert d["action_space"] == "joint_absolute" and d["bounds"][7] == [0.0, 1.0]
    assert seq.ActionContract.from_dict(d) == action
    assert seq.ActionContract("panda", "JOINT_DELTA", 2, 10).action_space is seq.ActionSpace.JOINT_DELTA
    with pytest.raises(seq.DeclarationError, match="joint_absolute, joint_delta"):
        seq.ActionContract("panda", "cartesian", 8, 15.0)
    with pytest.raises(seq.DeclarationError, match="7 pairs for action_dim=8"):
        seq.ActionContract("panda", "joint_absolute", 8, 15.0, bounds=[(-1, 1)] * 7)
    with pytest.raises(seq.DeclarationError, match="low 1.0 is above high -1.0"):
        seq.ActionContract("panda", "joint_absolute", 1, 15.0, bounds=[(1, -1)])
    with pytest.raises(seq.DeclarationError, match="control_frequency_hz"):
        seq.ActionContract("panda", "joint_absolute", 8, 0)
    with pytest.raises(seq.DeclarationError, match="on_violation"):
        seq.ActionContract("panda", "joint_absolute", 8, 15, on_violation="ignore")
    assert seq.ActionContract("p", "ee_delta", 3, 5, max_delta=0.1).max_delta_per_dim() == (0.1, 0.1, 0.1)


def test_observation_contract_validates_and_round_trips():
    _, observation = _contracts()
    d = observation.to_dict()
    assert d == {"cameras": {"exterior_1": {"width": 224, "height": 224, "depth": False}},
                 "proprio": {"joint_positions": 7, "gripper": 1}, "history": 1}
    assert seq.ObservationContract.from_dict(d) == observation
    with pytest.raises(seq.DeclarationError, match="Camera.width"):
        seq.Camera(0, 224)
    with pytest.raises(seq.DeclarationError, match=r"proprio\['gripper'\]"):
        seq.ObservationContract(proprio={"gripper": 0})
    with pytest.raises(seq.DeclarationError, match="seq.Camera"):
        seq.ObservationContract(cameras={"wrist": (224, 224)})
    with pytest.raises(seq.DeclarationError, match="history"):
        seq.ObservationContract(history=0)


def test_inference_parameters_are_discovered_from_infer_with_their_types():
    @seq.policy
    class P:
        @seq.load
        def load(self, weights_dir): ...

        @seq.infer
        def infer(self, obs: seq.Observation, *, seed=None, replan_steps: Annotated[int, seq.Range(1, 10)] = 5,
                  temperature: float = 0.0, mode: Annotated[str, seq.OneOf("fast", "careful")] = "fast",
                  greedy: bool = True, note: Optional[str] = None):
            ...

    params = {p.name: p for p in seq.get_spec(P).params}
    assert list(params) == ["seed", "replan_steps", "temperature", "mode", "greedy", "note"]
    assert params["replan_steps"].type == "int" and params["replan_steps"].default == 5
    assert params["seed"].type is None and params["note"].nullable
    cast = cast_params(seq.get_spec(P).params, {"replan_steps": "3", "temperature": 1, "greedy": "false", "seed": 7})
    assert cast == {"replan_steps": 3, "temperature": 1.0, "greedy": False, "seed": 7}
    assert type(cast["temperature"]) is float
    with pytest.raises(ParamError, match=r"unknown param\(s\) \['replan'\]; this policy declares: greedy, mode"):
        cast_params(seq.get_spec(P).params, {"replan": 3})
    with pytest.raises(ParamError, match=r"out of range \(allowed: 1 to 10\)"):
        cast_params(seq.get_spec(P).params, {"replan_steps": 11})
    with pytest.raises(ParamError, match=r"allowed: one of"):
        cast_params(seq.get_spec(P).params, {"mode": "reckless"})
    with pytest.raises(ParamError, match="expects int"):
        cast_params(seq.get_spec(P).params, {"replan_steps": 2.5})


def test_an_unsupported_parameter_type_is_refused_at_declaration():
    with pytest.raises(seq.DeclarationError, match="annotate it int, float, bool or str"):
        @seq.policy
        class P:
            @seq.load
            def load(self, weights_dir): ...

            @seq.infer
            def infer(self, obs, *, window: list = None): ...


def test_action_chunk_holds_a_float_array():
    chunk = seq.ActionChunk([[1, 2], [3, 4]], open_loop_horizon=1)
    assert chunk.actions.dtype == np.float64 and len(chunk) == 2 and chunk.open_loop_horizon == 1
    obs = seq.Observation(proprio={"joint_positions": np.zeros(7), "gripper": np.ones(1)}, instruction="x")
    assert obs.joint_positions.shape == (7,) and obs.gripper[0] == 1.0


# ---------------------------------------------------------------- issue 4: parameters, batching, concurrency

def _declare(infer_fn=None, *, policy_kw=None, concurrent=None, batched=None):
    def default_infer(self, obs: seq.Observation) -> seq.ActionChunk:
        return seq.ActionChunk(np.zeros((1, 1)))
    fn = seq.infer(infer_fn or default_infer)
    if batched is not None:
        fn = seq.batched(**batched)(fn)
    body = {"load": seq.load(lambda self, weights_dir: None), "infer": fn}
    cls = type("P", (), body)
    if concurrent is not None:
        cls = seq.concurrent(**concurrent)(cls)
    return seq.policy(**(policy_kw or {}))(cls)


def test_range_and_one_of_are_checked_at_declaration():
    with pytest.raises(seq.DeclarationError, match=r"min 5 is above max 1"):
        seq.Range(5, 1)
    with pytest.raises(seq.DeclarationError, match=r"bounds nothing"):
        seq.Range()

    def on_str(self, obs, *, mode: Annotated[str, seq.Range(0, 1)] = "a"):
        return {}
    with pytest.raises(seq.DeclarationError, match=r"seq.Range bounds a number"):
        _declare(on_str)

    def bad_default(self, obs, *, steps: Annotated[int, seq.Range(1, 10)] = 50):
        return {}
    with pytest.raises(seq.DeclarationError, match=r"default 50 does not fit.*allowed: 1 to 10"):
        _declare(bad_default)

    def bad_choice(self, obs, *, n: Annotated[int, seq.OneOf(1, "two")] = 1):
        return {}
    with pytest.raises(seq.DeclarationError, match=r"OneOf value 'two' is not a int"):
        _declare(bad_choice)


def test_batched_and_concurrent_land_on_the_spec():
    spec = seq.get_spec(_declare(batched={"max_batch_size": 16}, concurrent={"replicas_per_gpu": 2}))
    assert spec.batching.to_dict() == {"max_batch_size": 16, "eval_wait_ms": 20.0, "serve_wait_ms": 0.0}
    assert spec.slots() == 2 and spec.to_dict()["concurrency"]["replicas_per_gpu"] == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"max_batch_size": 1}, r"from 2 to 256"),
    ({"max_batch_size": 300}, r"from 2 to 256"),
    ({"max_batch_size": 8, "serve_wait_ms": 20}, r"above the 10 ms"),
    ({"max_batch_size": 8, "eval_wait_ms": -1}, r"milliseconds >= 0"),
])
def test_batched_arguments_are_validated(kwargs, message):
    with pytest.raises(seq.DeclarationError, match=message):
        seq.batched(**kwargs)


def test_wait_ms_is_the_old_name_of_eval_wait_ms():
    with pytest.warns(DeprecationWarning, match="eval_wait_ms"):
        mark = seq.batched(max_batch_size=4, wait_ms=35)
    assert mark(lambda self, obs: obs).__seq_batched__.eval_wait_ms == 35.0


def test_serve_wait_needs_a_deployment_that_crowds_its_slots():
    with pytest.raises(seq.DeclarationError, match=r"crowds robots onto its copies"):
        _declare(batched={"max_batch_size": 8, "serve_wait_ms": 5})
    spec = seq.get_spec(_declare(batched={"max_batch_size": 8, "serve_wait_ms": 5},
                                 concurrent={"replicas_per_gpu": 1, "max_inputs": 4}))
    assert spec.batching.serve_wait_ms == 5.0


def test_batching_is_refused_for_streaming_policies():
    def episode(self, episode_id):
        pass
    with pytest.raises(seq.DeclarationError, match=r"not for streaming=True"):
        fn = seq.batched(max_batch_size=4)(seq.infer(lambda self, obs: obs))
        seq.policy(streaming=True)(type("S", (), {"load": seq.load(lambda self, w: None), "infer": fn,
                                                  "on_episode": seq.on_episode(episode)}))


def test_concurrent_arguments_are_validated():
    with pytest.raises(seq.DeclarationError, match=r"replicas_per_gpu=.*integer >= 1"):
        seq.concurrent(replicas_per_gpu=0)
    with pytest.raises(seq.DeclarationError, match=r"below target_inputs"):
        seq.concurrent(target_inputs=4, max_inputs=2)
    with pytest.raises(seq.DeclarationError, match=r"does not divide the 3 card"):
        _declare(policy_kw={"gpu": "H100:3"}, concurrent={"gpus_per_replica": 2})


# ---------------------------------------------------------------- weights

@pytest.mark.parametrize("ref, message", [
    ("ftp://host/ckpt", r"unknown weights scheme 'ftp://'"),
    ("hf://", r"names no Hugging Face repository"),
    ("hf://@main", r"names no Hugging Face repository"),
    ("hf://org/../secrets", r"'\.\.' path segment"),
    ("vol://../x", r"'\.\.' path segment"),
    ("../weights", r"'\.\.' path segment"),
    ("template://not-a-template@v1", r"unknown template 'not-a-template'"),
    ("template://pi05-droid@v9", r"has no version v9"),
    ("vol://ckpt@2", r"version '2' is not vN"),
])
def test_bad_weight_references_are_refused_naming_the_problem(ref, message):
    with pytest.raises(seq.DeclarationError, match=message):
        _declare(policy_kw={"weights": ref})


def test_good_weight_references_and_named_parts_are_recorded():
    parts = {"base": "hf://physical-intelligence/pi05-base@main", "lora": seq.Volume.from_name("my-lora", version=2),
             "norm": seq.Weights.template("pi05-droid", version=1)}
    spec = seq.get_spec(_declare(policy_kw={"weights": parts}))
    assert spec.weights == {"base": "hf://physical-intelligence/pi05-base@main", "lora": "vol://my-lora@v2",
                            "norm": "template://pi05-droid@v1"}
    with pytest.raises(seq.DeclarationError, match=r"9 parts; a dict of weights holds 1 to 8"):
        _declare(policy_kw={"weights": {f"p{i}": "vol://x" for i in range(9)}})
    with pytest.raises(seq.DeclarationError, match=r"unknown template"):
        seq.Weights.template("nope")


# ---------------------------------------------------------------- the image spec

def test_an_image_is_immutable_and_each_method_returns_a_new_one():
    base = seq.Image.debian_slim(python="3.12")
    more = base.apt_install("libgl1")
    assert base.steps == () and len(more.steps) == 1 and more.python == "3.12"
    with pytest.raises(Exception):
        more.base = "other"          # frozen dataclass
    assert hash(more) == hash(seq.Image.debian_slim(python="3.12").apt_install("libgl1"))


def test_a_credential_in_image_env_is_refused():
    with pytest.raises(seq.DeclarationError, match=r"HF_TOKEN looks like a credential"):
        seq.Image.debian_slim().env(HF_TOKEN="abc")
    with pytest.raises(seq.DeclarationError, match=r"looks like a credential"):
        seq.Image.debian_slim().env(HOME_NOTE="hf_" + "a" * 30)
    with pytest.raises(seq.DeclarationError, match=r"looks like a credential written into the image"):
        seq.Image.debian_slim().run_commands("pip install git+https://ghp_" + "b" * 30 + "@github.com/acme/x")
    assert seq.Image.debian_slim().env(OPENPI_DATA_HOME="/data").steps[0].env == (("OPENPI_DATA_HOME", "/data"),)


@pytest.mark.parametrize("build, message", [
    (lambda: seq.Image.debian_slim(python="2.7"), r"'2.7' is not offered"),
    (lambda: seq.Image.debian_slim().apt_install(), r"names no package name"),
    (lambda: seq.Image.debian_slim().apt_install("git; rm -rf /"), r"no spaces or shell characters"),
    (lambda: seq.Image.from_registry("has space:1"), r"is not an image reference"),
    (lambda: seq.Image.debian_slim().run_commands("make", secrets=["not ok!"]), r"is not a valid name"),
])
def test_image_steps_are_validated(build, message):
    with pytest.raises(seq.DeclarationError, match=message):
        build()


def test_a_step_secret_is_seen_only_by_that_step_in_the_dockerfile():
    img = (seq.Image.debian_slim().apt_install("git")
           .run_commands("pip install git+https://$GH_TOKEN@github.com/acme/private", secrets=[seq.Secret.from_name("gh")])
           .uv_pip_install("numpy==1.26.4").env(MODE="serve"))
    lines = img.dockerfile().splitlines()
    assert lines[2] == "FROM python:3.11-slim-bookworm"
    secret_lines = [ln for ln in lines if "--mount=type=secret" in ln]
    assert len(secret_lines) == 1 and "id=gh" in secret_lines[0] and "/run/secrets/gh" in secret_lines[0]
    assert lines[-1] == 'ENV MODE="serve"' and "uv pip install --system numpy==1.26.4" in lines[-2]
    assert img.to_dict()["steps"][1]["secrets"] == ["gh"]


def test_action_chunk_carries_an_optional_action_space():
    chunk = seq.ActionChunk(np.zeros((2, 3)), action_space=seq.ActionSpace.JOINT_DELTA)
    assert chunk.action_space == "joint_delta" and seq.ActionChunk([[0.0]]).action_space is None


# ---------------------------------------------------------------- seq validate / init / image / deploy --dry-run

from pathlib import Path  # noqa: E402

from seq.cli._scaffold import TEMPLATES  # noqa: E402

_ROOT = Path(__file__).resolve().parents[2]


def _seq(*args: str):
    """The real ``seq`` typer app in-process (no gateway: SEQUENCES_GATEWAY_URL points at port 9)."""
    from _servers import seq_cli
    return seq_cli(None, *args, env={"SEQUENCES_GATEWAY_URL": "http://127.0.0.1:9", "SEQUENCES_API_KEY": "unused",
                                     "COLUMNS": "400"})


def test_init_list_names_every_template():
    r = _seq("init", "--list")
    assert r.returncode == 0
    assert [line.split()[0] for line in r.stdout.splitlines()] == list(TEMPLATES) == [
        "toy-policy", "pick-place", "pi05-droid", "toy-adapter"]


def test_the_toy_adapter_template_scaffolds_and_seq_validate_classifies_its_steps(tmp_path):
    target = tmp_path / "mine"
    r = _seq("init", "toy-adapter", str(target))
    assert r.returncode == 0, r.stderr
    assert "next: seq adapter check" in r.stdout and (target / "adapter.py").is_file()
    r = _seq("validate", str(target / "adapter.py"))
    assert r.returncode == 0, r.stderr
    assert "toy-adapter (ToyAdapter in adapter.py), policy_io own" in r.stdout
    assert "lossy: the policy sees joint 1 only" in r.stdout and "params     adapter.target=0.5" in r.stdout


@pytest.mark.parametrize("template", [t for t in TEMPLATES if t != "toy-adapter"])
def test_every_template_scaffolds_and_passes_seq_validate(template, tmp_path):
    target = tmp_path / "mine"
    r = _seq("init", template, str(target))
    assert r.returncode == 0, r.stderr
    assert (target / "policy.py").is_file()
    r = _seq("validate", str(target / "policy.py"))
    assert r.returncode == 0, r.stderr
    assert "platform    accepted" in r.stdout and "lifecycle   @seq.load load()" in r.stdout
    assert "not provisioned" not in r.stdout            # image steps are built (envs.py), not just recorded
    assert "pip/uv_pip/env steps are built" in r.stdout and "apt_install/run_commands/registry bases are refused" \
        in r.stdout


def test_validate_shows_image_weights_code_contracts_and_param_ranges():
    r = _seq("validate", str(_ROOT / "seq" / "templates" / "pi05-droid" / "policy.py") + ":Pi05Droid")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "image       nvidia/cuda:12.2.2-cudnn8-runtime-ubuntu22.04 (python 3.11)" in out
    assert "  apt-get install   git, git-lfs" in out and "  env               OPENPI_DATA_HOME=/data/.cache/openpi" in out
    assert "weights     template://pi05-droid@v1" in out and "-> mounted at <data_dir>/weights/pi05-droid" in out
    assert "code        1 file(s)" in out and "              policy.py" in out
    assert "action      droid_franka · joint_velocity · 8 dims · 15 Hz" in out
    assert "observation exterior_1 224x224, wrist_left 224x224 · joint_positions[7] · gripper[1] · instruction" in out
    assert "param       replan_steps: int = 8  range 1..15" in out


def test_validate_fails_with_a_readable_error_for_a_malformed_declaration(tmp_path):
    r = _seq("validate", str(_ROOT / "test" / "policies" / "bad_declaration_policy.py"))
    assert r.returncode == 1
    assert "error[declaration]: ActionContract.action_dim: 0 is out of range" in r.stderr
    r = _seq("validate", str(tmp_path / "nope.py"))
    assert r.returncode == 2 and "no such file" in r.stderr
    bad = tmp_path / "bad_weights.py"
    bad.write_text("import seq\n@seq.policy(weights='hf://')\nclass P:\n    @seq.load\n    def load(self, w): pass\n"
                   "    @seq.infer\n    def infer(self, x): return x\n")
    r = _seq("validate", str(bad))
    assert r.returncode == 1 and "names no Hugging Face repository" in r.stderr


def test_init_refuses_a_non_empty_directory_and_an_unknown_template(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    r = _seq("init", "toy-policy", str(tmp_path))
    assert r.returncode == 2 and "is not empty" in r.stderr and (tmp_path / "keep.txt").read_text() == "mine"
    r = _seq("init", "nope", str(tmp_path / "new"))
    assert r.returncode == 2 and "unknown template 'nope'" in r.stderr


def test_deploy_dry_run_prints_the_validation_and_sends_nothing():
    r = _seq("deploy", str(_ROOT / "examples" / "pick_place" / "policy.py"), "--dry-run")   # no gateway at :9
    assert r.returncode == 0, r.stderr
    assert "policy      pick-place" in r.stdout and "dry run: nothing was sent" in r.stdout


def test_image_dockerfile_renders_the_declared_image():
    r = _seq("image", "dockerfile", str(_ROOT / "seq" / "templates" / "pi05-droid" / "policy.py"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "FROM nvidia/cuda:12.2.2-cudnn8-runtime-ubuntu22.04" in lines
    assert any(ln.startswith("RUN cd /opt/openpi && GIT_LFS_SKIP_SMUDGE=1 uv pip install") for ln in lines)
