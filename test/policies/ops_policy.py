"""A test policy for the operations tests: no contract (the observation dict comes back as
``outputs``), gpu="cpu", and a 2 s idle_timeout so a worker left alone stops within the test.

observation {"op": "fail"} raises (a 500 policy_error: an error for the meter and the alerts);
anything else is echoed."""
import seq


@seq.policy(gpu="cpu", idle_timeout=2.0)
class OpsPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.calls = 0

    @seq.infer
    def infer(self, inputs):
        self.calls += 1
        if inputs.get("op") == "fail":
            raise RuntimeError("asked to fail")
        return {"echo": inputs, "calls": self.calls}
