"""A two-machine group test policy: ``gpu="L4:2"`` served where one machine holds one card
(``SEQ_RAY_GPUS_PER_NODE=1``) is a group of two members (test_ray_backend.py).

At import it reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK and refuses to load
when one is missing (the platform sets them before the module is imported) or when
``torch.distributed`` was not initialised for it. No contract: infer gets the request's dict.

infer -> {"rank", "world", "sum", "pids", "env"}: one gloo all_reduce (SUM) of the vector
``[rank + 1, 0, ..., pid at index 1 + rank, ...]``, so ``sum`` is 1 + 2 + ... + world and
``pids`` lists every member's process id -- both members must take part for it to return.
@seq.on_episode runs the same all_reduce, then appends ``<episode_id> <rank> <sum>`` to the
file named by ``$GROUP_EPISODE_LOG``.
"""
import os

import torch
import torch.distributed as dist

import seq

ENV_AT_IMPORT = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
_missing = [k for k, v in ENV_AT_IMPORT.items() if v is None]
if _missing:
    raise RuntimeError(f"group variables {_missing} were not set before the policy module was imported")


@seq.policy(gpu="L4:2")
class GroupPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed was not initialised before load()")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def _reduce(self):
        v = torch.zeros(1 + self.world, dtype=torch.float64)
        v[0] = self.rank + 1
        v[1 + self.rank] = os.getpid()
        dist.all_reduce(v, op=dist.ReduceOp.SUM)
        return int(v[0]), [int(p) for p in v[1:]]

    @seq.infer
    def infer(self, inputs):
        total, pids = self._reduce()
        return {"rank": self.rank, "world": self.world, "sum": total, "pids": pids, "env": ENV_AT_IMPORT,
                "echo": inputs.get("n")}

    @seq.on_episode
    def on_episode(self, episode_id):
        total, _ = self._reduce()
        with open(os.environ["GROUP_EPISODE_LOG"], "a") as f:
            f.write(f"{episode_id} {self.rank} {total}\n")
