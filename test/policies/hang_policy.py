"""A test policy whose infer hangs once asked to: the jammed-worker case (issue 5).

infer(obs, hang=False): with ``hang=True`` it sleeps "forever" (an hour) on the replica thread,
so the worker's /ping keeps answering but reports ``degraded`` once the inference has run past
``timeouts.request`` (1 s here). Otherwise it returns a 4-row chunk of zeros (action_dim 2).
"""
import time

import numpy as np

import seq


@seq.policy(
    action=seq.ActionContract(robot="toy", action_space=seq.ActionSpace.JOINT_ABSOLUTE, action_dim=2,
                              control_frequency_hz=10.0),
    observation=seq.ObservationContract(proprio={"joint_positions": 2}),
    timeouts=seq.Timeouts(request=1.0),
)
class HangPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.calls = 0

    @seq.infer
    def infer(self, obs: seq.Observation, *, hang: bool = False) -> seq.ActionChunk:
        self.calls += 1
        if hang:
            time.sleep(3600.0)
        return seq.ActionChunk(np.zeros((4, 2)))
