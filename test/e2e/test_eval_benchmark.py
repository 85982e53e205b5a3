"""``@seq.benchmark`` declarations and the contract check eval runs before anything starts."""
from __future__ import annotations

import sys

import pytest

import seq
from seq._benchmark import contract_problems

OBS = seq.ObservationContract(cameras={"exterior_1": seq.Camera(224, 224)}, proprio={"joint_positions": 7, "gripper": 1})
ACT = seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE, action_dim=8,
                         control_frequency_hz=15.0)


def declare(**over):
    kw = dict(name="toy", tasks={"reach": "reach the ball"}, observation=OBS, action=ACT)
    kw.update(over)

    @seq.benchmark(**kw)
    class Toy(seq.Benchmark):
        @seq.setup
        def setup(self, *, max_seconds: float = 10.0, size: int = 3):
            pass

        @seq.reset
        def reset(self, task, seed):
            pass

        @seq.observe
        def observe(self):
            return {}

        @seq.step
        def step(self, action):
            pass

        @seq.check
        def check(self):
            return True, {"success": 1.0}
    return Toy


def test_a_benchmark_declares_its_tasks_contracts_and_setup_parameters():
    spec = seq.get_benchmark_spec(declare())
    assert seq.is_benchmark(declare()) and not seq.is_benchmark(object)
    assert spec.tasks == {"reach": "reach the ball"}
    assert [(p.name, p.type, p.default) for p in spec.params] == [("max_seconds", "float", 10.0), ("size", "int", 3)]
    assert spec.methods == {"setup": "setup", "reset": "reset", "observe": "observe", "step": "step", "check": "check"}
    assert spec.control_period_s == pytest.approx(1 / 15)


def test_a_benchmark_without_a_check_is_refused_at_declaration():
    with pytest.raises(seq.DeclarationError, match=r"no method is marked @seq.check"):
        @seq.benchmark(name="toy", tasks={"a": "b"}, observation=OBS, action=ACT)
        class Broken:
            @seq.reset
            def reset(self, task, seed): ...

            @seq.observe
            def observe(self): ...

            @seq.step
            def step(self, action): ...


@pytest.mark.parametrize("over,match", [
    ({"name": "Bad Name"}, "not a benchmark name"),
    ({"tasks": {}}, "at least one task"),
    ({"tasks": {"a b": "x"}}, "not a plain name"),
    ({"episode_s_estimate": 0}, "positive number"),
])
def test_malformed_declarations_name_the_argument(over, match):
    with pytest.raises(seq.DeclarationError, match=match):
        declare(**over)


def test_contract_problems_name_every_disagreement():
    spec = seq.get_benchmark_spec(declare())
    ok = {"action": ACT.to_dict(), "observation": OBS.to_dict()}
    assert contract_problems(spec, ok) == []
    bad = {"action": {**ACT.to_dict(), "action_space": "ee_delta", "action_dim": 7, "control_frequency_hz": 10.0},
           "observation": {"cameras": {"exterior_1": {"width": 64, "height": 64}, "wrist_left": {"width": 224, "height": 224}},
                           "proprio": {"joint_positions": 6, "ee_pose": 7}, "history": 2}}
    problems = contract_problems(spec, bad)
    assert problems == [
        "action space: the policy returns ee_delta, toy takes joint_absolute",
        "action width: the policy returns 7 numbers a row, toy takes 8",
        "control frequency: the policy's rows are for 10.0 Hz, toy steps at 15 Hz",
        "camera 'exterior_1': the policy wants 64x64, toy renders 224x224",
        "camera 'wrist_left': the policy reads it, toy renders only ['exterior_1']",
        "proprio 'joint_positions': the policy wants 6 values, toy reports 7",
        "proprio 'ee_pose': the policy reads it, toy reports only ['gripper', 'joint_positions']",
        "history: the policy wants 2 frames per camera, toy provides 1",
    ]
    assert "raw infer" in contract_problems(spec, {"action": ACT.to_dict(), "observation": None})[0]


def test_importing_seq_does_not_import_the_simulator():
    import subprocess
    code = "import seq, seq.cli, sys; print('mujoco' in sys.modules, 'sequence_ai_sim.benchmarks.pick_place' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"
