"""A policy that declares gpu="H100:2": refused at deploy on a machine without two H100s."""
import seq


@seq.policy(gpu="H100:2")
class NeedsH100(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, inputs):
        return {"ok": True}
