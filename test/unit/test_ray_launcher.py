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
    launcher._placing = {}
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


def test_two_workers_started_at_once_cannot_both_pass_the_max_gpus_check(tmp_path):
    """The check and the reservation are one lock section: with one place left and two extras
    placed at the same time (the supervisor starts them outside its lock), one is refused; a build
    placed meanwhile neither counts nor is counted later; a failed placement gives its place back."""
    launcher = RayLauncher.__new__(RayLauncher)
    launcher.gpus_per_node, launcher._lock, launcher._live, launcher._placing = 1, threading.Lock(), {"fl": {"w1"}}, {}
    inside, release = threading.Event(), threading.Event()
    handle = type("H", (), {"returncode": None})

    def place(spec, *a):
        if spec.role == "extra":
            inside.set()
            assert release.wait(10)
        return handle()

    launcher._place = place
    spec = WorkerLaunchSpec(name="fl", role="extra", version=1, policy_file=ECHO, class_name=None, cwd=str(tmp_path),
                            secret="s", run_dir=tmp_path, run_key="k", weights_dir=tmp_path, log_path=tmp_path / "l",
                            resources={"gpu": "L4", "max_gpus": 2})
    first = threading.Thread(target=launcher.start, args=(spec,))
    first.start()
    assert inside.wait(10)                                   # the first extra is being placed
    with pytest.raises(ApiError) as exc:                     # the second is refused meanwhile
        launcher.start(spec)
    assert exc.value.code == "deployment_full" and exc.value.details["held"] == 2
    launcher.start(dataclasses.replace(spec, role="build"))  # a build still goes, and is not added
    release.set()
    first.join(10)
    assert len(launcher._live["fl"]) == 2 and launcher._placing == {"fl": 0}
    launcher._live["fl"].discard("w1")

    def fail(spec, *a):
        raise RuntimeError("no node has the resources")

    launcher._place = fail
    with pytest.raises(RuntimeError):
        launcher.start(spec)
    assert launcher._placing == {"fl": 0} and len(launcher._live["fl"]) == 1   # the place is given back
