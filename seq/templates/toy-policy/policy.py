"""toy-policy: the smallest servable policy, with its own inputs and outputs (no contract).

Inputs (the dict a caller sends as the observation): {"state": [x], "target": [t]}
Outputs (what infer returns, sent back as is):          {"delta": [dx]}

dx moves x toward t by at most ``max_step`` per call. Deploy: ``seq deploy policy.py``;
call: ``sequence_ai.connect("toy-policy").predict({"state": [0.0], "target": [0.5]})``.
"""
from typing import Annotated

import seq


@seq.policy(gpu="cpu")
class ToyPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.weights_dir = weights_dir          # no checkpoint: kept, nothing built

    @seq.infer
    def infer(self, inputs, *, max_step: Annotated[float, seq.Range(0.0, 1.0)] = 0.1):
        """{"state": [x], "target": [t]} -> {"delta": [dx]} with |dx| <= max_step."""
        missing = [k for k in ("state", "target") if k not in inputs]
        if missing:
            raise KeyError(f"toy-policy reads {{'state': [x], 'target': [t]}}; missing {missing}")
        x, t = float(inputs["state"][0]), float(inputs["target"][0])
        return {"delta": [max(-max_step, min(max_step, t - x))]}
