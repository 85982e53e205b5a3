"""The Ray launcher's own checks that run before anything is placed (launchers/ray.py), in
process: no cluster, no ``ray.init``. The launcher on a real cluster is test/server/test_ray_backend.py."""
from __future__ import annotations

import dataclasses
import threading

import pytest

from _core_support import ECHO
from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.launchers.base import WorkerLaunchSpec
from sequence_ai_server.launchers.ray import RayLauncher


def test_a_worker_past_max_gpus_is_refused_deployment_full_and_a_build_is_not_counted(tmp_path):
    """The launcher's own cap (no cluster needed: it refuses before anything is placed) words a
    full deployment as the local card pool does, so the gateway answers per on_full."""
    launcher = RayLauncher.__new__(RayLauncher)            # no ray.init: the check comes first
    launcher.gpus_per_node, launcher._lock, launcher._live = 1, threading.Lock(), {"fl": {"w1", "w2"}}
    placed: list = []
    launcher._place = lambda spec, *a: placed.append(spec.role) or type("H", (), {"returncode": None})()
    spec = WorkerLaunchSpec(name="fl", role="extra", version=1, policy_file=ECHO, class_name=None, cwd=str(tmp_path),
                            secret="s", run_dir=tmp_path, run_key="k", weights_dir=tmp_path, log_path=tmp_path / "l",
                            resources={"gpu": "L4", "max_gpus": 2})
    with pytest.raises(ApiError) as exc:
        launcher.start(spec)
    assert exc.value.code == "deployment_full" and exc.value.details == {"reason": "deployment_full", "max_gpus": 2,
                                                                         "held": 2}, exc.value.details
    launcher.start(dataclasses.replace(spec, role="build"))       # it replaces the serving worker
    assert placed == ["build"]
