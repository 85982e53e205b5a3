"""A streaming test policy with two replicas: each answer says which replica ran it and how many
acts that replica has seen in the episode; ``@seq.on_episode`` appends the ended episode id to
the file named by ``$EPISODE_LOG``."""
import os

import seq


@seq.policy(streaming=True)
@seq.concurrent(replicas_per_gpu=2)
class EpisodePolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.steps = {}

    @seq.infer
    def infer(self, inputs):
        eid = inputs.get("episode")
        self.steps[eid] = self.steps.get(eid, 0) + 1
        return {"replica": self.seq_replica, "steps": self.steps[eid], "instance": id(self)}

    @seq.on_episode
    def on_episode(self, episode_id):
        self.steps.pop(episode_id, None)
        with open(os.environ["EPISODE_LOG"], "a") as f:
            f.write(f"{episode_id} {self.seq_replica}\n")
