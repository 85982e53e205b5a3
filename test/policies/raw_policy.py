"""A test policy with no contract: infer gets the request's dict unchanged and its return goes
back as ``outputs``. Request timeout 1 s.

inputs {"op": ...}:
    "echo"      -> {"echo": inputs}
    "env"       -> the compile-cache variables the worker exported
    "sleep"     -> sleeps inputs["s"] seconds, then {"slept": s}
    "keyerror"  -> inputs["missing"] (a built-in KeyError)
    "custom"    -> raises a policy-defined exception type
"""
import os
import time

import seq


class CalibrationDrift(Exception):
    """Not a built-in: arrives as policy_error with exception_type only."""


@seq.policy(timeouts=seq.Timeouts(request=1.0))
class RawPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.calls = 0

    @seq.infer
    def infer(self, inputs):
        self.calls += 1
        op = inputs.get("op")
        if op == "env":
            return {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")}
        if op == "sleep":
            time.sleep(float(inputs["s"]))
            return {"slept": inputs["s"], "calls": self.calls}
        if op == "keyerror":
            return inputs["missing"]
        if op == "custom":
            raise CalibrationDrift("wrist camera moved")
        return {"echo": inputs, "calls": self.calls}
