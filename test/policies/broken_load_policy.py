"""A policy whose load() fails: the deployment must end up failed with this error."""
import seq


@seq.policy(
    action=seq.ActionContract(robot="panda", action_space="joint_absolute", action_dim=8, control_frequency_hz=15.0),
)
class BrokenLoad(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        raise FileNotFoundError(f"checkpoint missing: no params in {weights_dir}")

    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        return seq.ActionChunk([[0.0] * 8])
