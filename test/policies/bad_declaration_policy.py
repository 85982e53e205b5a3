"""A policy whose declaration is malformed (action_dim=0): importing it raises DeclarationError."""
import seq


@seq.policy(
    action=seq.ActionContract(robot="panda", action_space="joint_absolute", action_dim=0, control_frequency_hz=15.0),
)
class BadDeclaration(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        return seq.ActionChunk([[0.0]])
