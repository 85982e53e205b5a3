"""Per-deployment Python environments from ``image=`` (server/sequence_ai_server/launchers/envs.py): two
policies pinning conflicting versions of one library serve side by side, each in its own
environment built with uv from this machine's package indexes; the build output streams to
`seq deploy` and stays in `seq policy logs NAME --build`; an identical spec reuses the built
environment; a step that needs a container runtime is refused at deploy. Real gateway, real
workers, the real `seq` CLI."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from _servers import seq_cli


# The two pins deployed side by side (tomli 2.4.0 and 2.4.1). The suite runs offline (a loopback-only
# namespace): scripts/prefetch_images.py reads POLICY and PINS from this file and fills uv's cache with
# what their environments install (the worker's requirements included) before the suite starts.
PINS = ("2.4.0", "2.4.1")
OLD, NEW = PINS
POLICY = '''\
import sys

import seq

IMAGE = seq.Image.debian_slim().pip_install("tomli=={version}").env(POLICY_TAG="{tag}")


@seq.policy(image=IMAGE)
class Pinned(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        import tomli
        self.tomli = tomli

    @seq.infer
    def infer(self, inputs):
        import os
        return {{"tomli": self.tomli.__version__, "tomli_file": self.tomli.__file__, "prefix": sys.prefix,
                "executable": sys.executable, "seq_file": seq.__file__, "tag": os.environ.get("POLICY_TAG"),
                "echo": inputs.get("n"), "pid": os.getpid()}}
'''


def _policy(tmp_path: Path, name: str, version: str, tag: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(POLICY.format(version=version, tag=tag))
    return path


def _act(lease: dict, n: int) -> dict:
    r = httpx.post(lease["worker_url"] + "/act", json={"observation": {"n": n}}, timeout=60,
                   headers={"Authorization": f"Bearer {lease['direct_secret']}"})
    assert r.status_code == 200, r.text
    return r.json()["outputs"]


def test_two_policies_pinning_conflicting_versions_serve_side_by_side(module_gateway, tmp_path):
    old = _policy(tmp_path, "tomli_old", OLD, "old")
    new = _policy(tmp_path, "tomli_new", NEW, "new")
    r = seq_cli(module_gateway, "deploy", str(old), "--name", "tomli-old", "--timeout", "600", timeout=660)
    assert r.returncode == 0, r.stdout + r.stderr
    # the build output streamed to the terminal under the phase lines, as it was written
    assert "building_image" in r.stdout and "│" in r.stdout, r.stdout
    assert f"tomli=={OLD}" in r.stdout and "environment ready" in r.stdout, r.stdout
    r = seq_cli(module_gateway, "deploy", str(new), "--name", "tomli-new", "--timeout", "600", timeout=660)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"tomli=={NEW}" in r.stdout, r.stdout

    a, b = module_gateway.connect_ready("tomli-old"), module_gateway.connect_ready("tomli-new")
    out_a, out_b = _act(a, 1), _act(b, 2)
    # both serve at once, each with its own pin, from its own environment under the data dir
    assert (out_a["tomli"], out_b["tomli"]) == (OLD, NEW), (out_a, out_b)
    assert (out_a["echo"], out_b["echo"], out_a["tag"], out_b["tag"]) == (1, 2, "old", "new")
    envs = module_gateway.data_dir.resolve() / "envs"
    for out in (out_a, out_b):
        assert Path(out["prefix"]).resolve().parent == envs, out
        assert Path(out["tomli_file"]).resolve().is_relative_to(Path(out["prefix"]).resolve()), out
        # the platform's worker code is the gateway's, frozen under the data dir
        assert Path(out["seq_file"]).resolve().is_relative_to(module_gateway.data_dir.resolve() / "platform"), out
    assert out_a["prefix"] != out_b["prefix"]
    pids = [out_a["pid"], out_b["pid"]]                 # two worker processes, both running now
    assert all(Path(f"/proc/{p}").exists() for p in pids) and pids[0] != pids[1]
    assert _act(a, 3)["tomli"] == OLD                # still its own after the other one served

    # the build output is kept: seq policy logs NAME --build
    r = seq_cli(module_gateway, "policy", "logs", "tomli-new", "--build", timeout=660)
    assert r.returncode == 0 and f"tomli=={NEW}" in r.stdout and "environment ready" in r.stdout, r.stdout + r.stderr
    assert f"tomli=={OLD}" not in r.stdout

    # the same spec again (another deployment): the built environment is reused, not rebuilt
    t0 = time.monotonic()
    twin = _policy(tmp_path, "tomli_twin", OLD, "old")
    r = seq_cli(module_gateway, "deploy", str(twin), "--name", "tomli-twin", "--timeout", "600", timeout=660)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "using the cached environment" in r.stdout, r.stdout
    assert _act(module_gateway.connect_ready("tomli-twin"), 4)["prefix"] == out_a["prefix"]
    assert sorted(p.name for p in envs.iterdir() if not p.name.startswith(".")) == sorted(
        {Path(out_a["prefix"]).name, Path(out_b["prefix"]).name})
    print(f"cached-environment deploy to first action: {time.monotonic() - t0:.1f} s")


def test_a_step_that_needs_a_container_is_refused_at_deploy_naming_the_step(module_gateway, tmp_path):
    f = tmp_path / "needs_apt.py"
    f.write_text("import seq\n\n\n@seq.policy(image=seq.Image.debian_slim().pip_install('tomli==2.4.0')"
                 ".apt_install('libgl1'))\nclass P(seq.Policy):\n    @seq.infer\n    def infer(self, inputs):\n"
                 "        return {}\n")
    r = module_gateway.client.post("/v1/deployments", json={"name": "needs-apt", "file": str(f)})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_request" and body["details"] == {"step": 2, "kind": "apt_install"}, body
    assert "image step 2 (apt_install)" in body["detail"] and "libgl1" in body["detail"], body
    assert "pip_install / uv_pip_install" in body["hint"] and "install the system package on the host" in body["hint"]
    assert "install podman" not in body["hint"] and "docker daemon" not in body["hint"], body  # a runtime would not help
    # nothing was recorded or started
    assert module_gateway.client.get("/v1/deployments/needs-apt").status_code == 404
    r = seq_cli(module_gateway, "deploy", str(f), "--name", "needs-apt", timeout=660)
    assert r.returncode != 0 and "apt_install" in r.stderr, r.stdout + r.stderr


def test_the_image_is_read_from_the_file_without_importing_it(tmp_path):
    from sequence_ai_server.launchers.envs import EnvBuilder, image_from_source
    f = tmp_path / "p.py"
    f.write_text("import seq\nraise SystemExit('never imported')\n"
                 "BASE = seq.Image.debian_slim('3.11')\n"
                 "IMG = BASE.pip_install('tomli==2.4.0', 'six').env({'A': '1'})\n"
                 "@seq.policy(image=IMG)\nclass P(seq.Policy):\n    pass\n")
    image = image_from_source(str(f))
    assert image == {"base": "debian_slim", "python": "3.11",
                     "steps": [{"kind": "pip_install", "args": ["tomli==2.4.0", "six"]},
                               {"kind": "env", "args": [], "env": {"A": "1"}}]}
    same = tmp_path / "q.py"
    same.write_text("import seq\n@seq.policy(image=seq.Image.debian_slim().pip_install('tomli==2.4.0', 'six')"
                    ".env(A='1'))\nclass Q(seq.Policy):\n    pass\n")
    assert EnvBuilder.spec_hash(image_from_source(str(same))) == EnvBuilder.spec_hash(image)
    other = tmp_path / "r.py"
    other.write_text("import seq\n@seq.policy(image=seq.Image.debian_slim().pip_install('tomli==2.4.1'))\n"
                     "class R(seq.Policy):\n    pass\n")
    assert EnvBuilder.spec_hash(image_from_source(str(other))) != EnvBuilder.spec_hash(image)
    # the image's pin of a package the worker also needs wins; the rest are the gateway's versions
    from importlib import metadata

    from sequence_ai_server.launchers.envs import worker_requirements
    reqs = worker_requirements(["NumPy==1.26.4", "tomli"])
    assert not any(r.startswith("numpy") for r in reqs), reqs
    assert f"fastapi=={metadata.version('fastapi')}" in reqs and f"httpx=={metadata.version('httpx')}" in reqs, reqs
    bad = tmp_path / "s.py"
    bad.write_text("import seq\nimport os\n@seq.policy(image=seq.Image.debian_slim().pip_install(os.environ['X']))\n"
                   "class S(seq.Policy):\n    pass\n")
    from sequence_ai_server.common.errors import ApiError
    with pytest.raises(ApiError, match="image= cannot be read"):
        image_from_source(str(bad))
