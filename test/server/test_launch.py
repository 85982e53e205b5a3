"""The launcher interface (server/sequence_ai_server/launchers/base.py, launch_local.py): a real worker
started from a WorkerLaunchSpec reports through typed events -- Placed, Started, Phase, Ready,
Exited -- its secret rotates through the handle, and an image that fails to build reads as
Failed then Exited, with the failing step's output in the build log."""
from __future__ import annotations

import signal
from pathlib import Path

import httpx

from _servers import ECHO_POLICY, echo_observation
from _wait import eventually
from sequence_ai_server.launchers.envs import EnvBuilder
from sequence_ai_server.launchers.base import Exited, Failed, Phase, Placed, Ready, Started, WorkerLaunchSpec
from sequence_ai_server.launchers.local import LocalLauncher


def _spec(tmp: Path, name: str, file: str, image=None) -> WorkerLaunchSpec:
    for sub in ("run", "logs", "weights"):
        (tmp / sub).mkdir(exist_ok=True)
    return WorkerLaunchSpec(name=name, role="serving", version=1, policy_file=file, class_name=None,
                            cwd=str(Path(file).parent), secret="s3cret-" + name, run_dir=tmp / "run", run_key=f"{name}.x",
                            weights_dir=tmp / "weights" / name, log_path=tmp / "logs" / f"{name}.log", image=image,
                            adoptable=False)


def _until(handle, kind, timeout=120.0) -> list:
    """The handle's events up to and including the first ``kind`` one (and any that came with it)."""
    seen = []

    def arrived():
        seen.extend(handle.events())
        return any(isinstance(e, kind) for e in seen)

    eventually(arrived, timeout, 0.05, what=f"a {kind.__name__} event", detail=lambda: f"events so far: {seen}")
    return seen


def test_a_local_worker_reports_placed_started_phases_ready_and_exited(tmp_path):
    spec = _spec(tmp_path, "echo", ECHO_POLICY)
    with open(spec.log_path, "ab") as log:
        h = LocalLauncher().start(spec, log)
        try:
            seen = _until(h, Ready)
            kinds = [type(e) for e in seen]
            assert kinds[:2] == [Placed, Started] and seen[1].pid == h.pid > 0, seen
            phases = [e.report["phase"] for e in seen if isinstance(e, Phase)]
            # the worker's phase file holds its latest phase, so a busy machine may skip one;
            # what is seen keeps the worker's order, ends ready, and carries the declared spec
            order = ["importing", "loading", "warmup", "checking", "ready"]
            assert phases and phases[-1] == "ready" and all(p in order for p in phases), phases
            assert [order.index(p) for p in phases] == sorted(order.index(p) for p in phases), phases
            last = [e for e in seen if isinstance(e, Phase)][-1]
            assert last.report["spec"]["class_name"], last.report
            ready = seen[-1]
            assert ready.report["pid"] == h.pid and ready.url == f"http://127.0.0.1:{ready.report['port']}"
            body = {"observation": echo_observation()}
            r = httpx.post(ready.url + "/act", json=body, headers={"Authorization": f"Bearer {spec.secret}"}, timeout=30)
            assert r.status_code == 200, r.text
            h.set_secret("rotated-secret")                 # through the handle: the old secret stops working
            eventually(lambda: httpx.post(ready.url + "/act", json=body, timeout=30,
                                          headers={"Authorization": f"Bearer {spec.secret}"}).status_code == 401,
                       10, 0.1, what="the old secret to stop working after set_secret")
            r = httpx.post(ready.url + "/act", json=body, headers={"Authorization": "Bearer rotated-secret"}, timeout=30)
            assert r.status_code == 200, r.text
            assert h.last_activity() > 0                   # the worker touched its activity file
        finally:
            h.send_signal(signal.SIGTERM)
            h.wait(30)
    ended = _until(h, Exited, 10)
    assert [e.code for e in ended if isinstance(e, Exited)] == [0], ended


def test_an_image_that_fails_to_build_reads_as_failed_then_exited(tmp_path):
    image = {"base": "debian_slim", "python": "3.11",
             "steps": [{"kind": "pip_install", "args": ["no-such-package-here==9.9.9"]}]}
    spec = _spec(tmp_path, "broken", ECHO_POLICY, image)
    with open(spec.log_path, "ab") as log:
        h = LocalLauncher(EnvBuilder(tmp_path)).start(spec, log)
        assert h.pid == 0 and h.poll() is None          # building: no worker process yet
        seen = _until(h, Exited, 300)
    failed = [e for e in seen if isinstance(e, Failed)]
    assert len(failed) == 1 and "no-such-package-here" in failed[0].reason, seen
    assert [e.code for e in seen if isinstance(e, Exited)] == [1] and h.poll() == 1
    assert not any(isinstance(e, (Started, Ready)) for e in seen), seen
    build_log = (tmp_path / "logs" / "broken.build.log").read_text()
    assert "no-such-package-here==9.9.9" in build_log and "uv pip install" in build_log
    assert list((tmp_path / "envs").iterdir()) == [], "a failed build left a (half-built) environment behind"


def test_a_half_built_environment_of_a_dead_builder_is_removed_and_a_live_ones_kept(tmp_path):
    # a gateway killed mid-build leaves uv writing into its own .{hash}.{pid}.building folder:
    # the next build removes it once that process is gone, and never shares it
    import subprocess
    import sys
    from sequence_ai_server.launchers.envs import remove_orphan_builds
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        folders = {who: tmp_path / f".abc123.{pid}.building" for who, pid in
                   (("dead", dead.pid), ("live", live.pid), ("other", 1))}
        for f in folders.values():
            (f / "lib").mkdir(parents=True)
        (tmp_path / ".zzz999.77.building").mkdir()          # another spec's build is not touched
        removed = remove_orphan_builds(tmp_path, "abc123")
        assert removed == [folders["dead"]] and not folders["dead"].exists()
        assert folders["live"].exists() and folders["other"].exists() and (tmp_path / ".zzz999.77.building").exists()
    finally:
        live.kill()
        live.wait()


def test_the_platform_paths_are_the_folders_holding_the_packages_not_a_package_itself():
    # a package's own folder on a worker's path makes its subpackages (common, worker, ops...)
    # importable as top-level names, over a policy's own modules of those names
    import sequence_ai_server
    import seq
    from sequence_ai_server.launchers.base import platform_paths
    paths = platform_paths()
    assert paths[0] == str(Path(sequence_ai_server.__file__).resolve().parent.parent), paths
    assert str(Path(seq.__file__).resolve().parent.parent) in paths
    assert not any(Path(p, "__init__.py").exists() for p in paths), paths
