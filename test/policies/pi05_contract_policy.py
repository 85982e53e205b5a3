"""A stand-in served under the name ``pi05-droid``: the pi05-droid template's exact declared
contract (read from seq/templates/pi05-droid/policy.py, never its openpi load), with fixed rows
so a test can check ``prepare`` and ``to_joint_positions`` against the live catalogue.

Each chunk: 4 rows, row t = [0.01 * (t + 1)] * 7 arm values (cumulative displacements from
the pose the chunk was asked at) + gripper ``[0.7, 0.3, 0.51, 0.49][t]``; row 3's first arm
value is 1.5, outside the template's bound of 1.0.
"""
import importlib.util
from pathlib import Path

import numpy as np

import seq

_TEMPLATE = Path(__file__).resolve().parents[2] / "seq" / "templates" / "pi05-droid" / "policy.py"
_spec = importlib.util.spec_from_file_location("_pi05_droid_template", _TEMPLATE)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_DECLARED = seq.get_spec(_module.Pi05Droid)


@seq.policy(action=_DECLARED.action, observation=_DECLARED.observation)
class Pi05ContractStandIn(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        rows = np.array([[0.01 * (t + 1)] * 7 + [g] for t, g in enumerate([0.7, 0.3, 0.51, 0.49])])
        rows[3, 0] = 1.5
        return seq.ActionChunk(rows, open_loop_horizon=4)
