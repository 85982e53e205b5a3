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
    with pytest.raises(ParamError, match="must be <= 10"):
        cast_params(seq.get_spec(P).params, {"replan_steps": 11})
    with pytest.raises(ParamError, match="must be one of"):
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
