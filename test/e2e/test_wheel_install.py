"""What a user installs, installed as a user would: the sdist and the wheel ``python -m build``
makes from a clean copy of this checkout, the wheel pip-installed into fresh venvs outside the
source tree (no editable finder, ``PYTHONPATH`` cleared, cwd elsewhere).

* the full venv (``sequence-ai[server]``): every module of the wheel imports (but the short list
  below, whose libraries no extra in it brings); ``seq init`` writes a template from the package
  data, ``seq serve`` on 127.0.0.1 deploys it and a client predicts; Ctrl-C stops the gateway and
  its worker;
* the client venv (``pip install sequence-ai``, no extras): the robot's client imports, connects
  to that gateway and predicts without loading any server, ROS, torch or ``seq`` module, and a
  command that needs an extra answers with one line naming it (exit code 1, no traceback).

The suite runs offline (scripts/in_loopback_ns.sh), so the venvs install from the local wheelhouse
``build/wheelhouse`` that ``bash scripts/wheelhouse.sh`` fills beforehand (bootstrap.sh's test
profile runs it); without it these tests fail and say so.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from _wait import eventually
from sequence_ai.extras import ROS_MODULES

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / "build" / "wheelhouse"
#: the distribution's import packages -> their folder in the source tree
PACKAGE_DIRS = {"seq": "seq", "sequence_ai": "sequence_ai", "sequence_ai_core": "sequence_ai_core",
                "sequence_ai_server": "server/sequence_ai_server", "sequence_ai_data": "sequence_ai_data",
                "sequence_ai_eval": "sequence_ai_eval", "sequence_ai_mcp": "sequence_ai_mcp",
                "sequence_ai_ros": "sequence_ai_ros", "sequence_ai_sim": "sequence_ai_sim"}
#: Modules of the wheel the full venv cannot import, by package: the only ModuleNotFoundError each
#: may raise. An entry that no longer fails must go (the test says so).
EXCUSED = {
    # ROS 2 (rclpy, the message packages) is no PyPI extra: a ROS install or bootstrap.sh's wheels
    "sequence_ai_ros": set(ROS_MODULES),
    # the simulated cell: mujoco, the sim extra
    "sequence_ai_sim": {"mujoco"},
    # the MCP server: the mcp extra
    "sequence_ai_mcp": {"mcp"},
}
#: top-level modules the robot's client must never load (server, ROS, training, the server CLI's)
NOT_IN_CLIENT = {"seq", "sequence_ai_server", "sequence_ai_ros", "sequence_ai_sim", "sequence_ai_mcp",
                 "sequence_ai_eval", "fastapi", "starlette", "uvicorn", "pydantic", "typer", "rich", "rclpy",
                 "torch", "numpy", "mujoco"}
#: the client's whole dependency closure (pip install sequence-ai on Python 3.9-3.13)
CLIENT_CLOSURE = {"sequence-ai", "httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio",
                  "typing-extensions", "exceptiongroup"}
#: what `seq serve` says without the server extra (the module named is the first one missing)
SERVER_LINE = re.compile(r"seq serve: needs the server extra \(\w+ is not installed\): pip install 'sequence-ai\[server\]'\n")


def _clean_env(venv: Path, **extra: str) -> dict:
    """This process's environment without what points at the checkout or the dev venv (PYTHONPATH,
    the venv, the ROS paths env.sh adds, sequence-ai's own settings and pip's machine config), with
    ``venv``'s bin/ first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "AMENT_", "COLCON_", "SEQ_", "SEQUENCES_", "SEQAI_", "PIP_"))
           and k not in ("LD_LIBRARY_PATH", "CMAKE_PREFIX_PATH")}
    env.update(PATH=f"{venv}/bin{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1", PYTHONUNBUFFERED="1",
               PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def _run(cmd, cwd: Path, env: dict, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def _make_venv(where: Path, requirement: str) -> Path:
    """A venv at ``where`` (from this interpreter's base Python, no pip of its own) with
    ``requirement`` pip-installed from the wheelhouse only; returns the venv."""
    if not (WHEELHOUSE / "requirements.txt").is_file() or not list(WHEELHOUSE.glob(".stamp-*")):
        pytest.fail(f"no wheelhouse at {WHEELHOUSE}: run `bash scripts/wheelhouse.sh` (online, outside the "
                    "loopback namespace) before the suite")
    out = _run([sys.executable, "-m", "venv", "--without-pip", where], where.parent, os.environ, timeout=60)
    assert out.returncode == 0, out.stderr
    out = _run([sys.executable, "-m", "pip", "--python", where / "bin" / "python", "install", "-q", "--no-index",
                "--find-links", WHEELHOUSE, requirement], where.parent, _clean_env(where), timeout=300)
    assert out.returncode == 0, (f"pip install {requirement} from {WHEELHOUSE} failed (if a requirement is "
                                 f"missing, run `bash scripts/wheelhouse.sh`):\n{out.stdout}{out.stderr}")
    return where


def _copy_checkout(src: Path) -> Path:
    """``src``: a copy of the checkout as a clone has it (tracked and untracked-not-ignored files,
    links kept; no build/, no egg-info)."""
    src.mkdir()
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(f"tar --null -T - -cf - | tar -xf - -C '{src}'", shell=True, input=files, cwd=ROOT, check=True)
    return src


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """``(src, sdist, wheel)``: a copy of the checkout as a clone has it (tracked and
    untracked-not-ignored files, links kept) and what ``python -m build`` made of it (the wheel
    is built from the sdist, so the sdist holds what the wheel needs)."""
    tmp = tmp_path_factory.mktemp("dist")
    src = _copy_checkout(tmp / "src")
    out = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "out", src], tmp, os.environ,
               timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sdists, wheels = sorted((tmp / "out").glob("*.tar.gz")), sorted((tmp / "out").glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, os.listdir(tmp / "out")
    return src, sdists[0], wheels[0]


@pytest.fixture(scope="module")
def full_venv(dist, tmp_path_factory):
    return _make_venv(tmp_path_factory.mktemp("full") / "venv", f"{dist[2]}[server]")


@pytest.fixture(scope="module")
def client_venv(dist, tmp_path_factory):
    return _make_venv(tmp_path_factory.mktemp("client") / "venv", str(dist[2]))


def _wheel_modules(wheel: Path) -> list:
    """Every module of the wheel's import packages (folders with an __init__.py), dotted."""
    names = zipfile.ZipFile(wheel).namelist()
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    mods = []
    for n in names:
        folder, _, file = n.rpartition("/")
        if folder in packages and file.endswith(".py"):
            stem = file[:-3]
            mods.append(folder.replace("/", ".") if stem == "__init__" else f"{folder.replace('/', '.')}.{stem}")
    return sorted(mods)


def test_the_sdist_and_the_wheel_carry_every_module_the_templates_and_the_ros_files(dist):
    src, sdist, wheel = dist
    whl = zipfile.ZipFile(wheel)
    names = set(whl.namelist())
    # every .py of every package in the source tree is in the wheel, where its import name says
    for top, folder in PACKAGE_DIRS.items():
        for path in (src / folder).rglob("*.py"):
            rel = path.relative_to(src / folder).as_posix()
            assert f"{top}/{rel}" in names, f"{top}/{rel} is missing from the wheel"
    assert "sequence_ai/recipes/__init__.py" in names and "sequence_ai_server/gateway/routes/__init__.py" in names
    # the seq init templates (package data), pick-place copied in from examples/pick_place
    for rel in ("toy-policy/policy.py", "toy-policy/client.py", "pi05-droid/README.md", "toy-adapter/adapter.py",
                "pick-place/policy.py", "pick-place/kinematics.py"):
        assert f"seq/templates/{rel}" in names, rel
    # the ROS package's files (the ament index, package.xml, launch/, config/) as data files
    data = "sequence_ai-0.1.0.data/data/share/"
    for rel in ("ament_index/resource_index/packages/sequence_ai", "sequence_ai/package.xml",
                "sequence_ai/launch/demo.launch.py", "sequence_ai/config/panda_sim.yaml"):
        assert data + rel in names, rel
    meta = whl.read("sequence_ai-0.1.0.dist-info/METADATA").decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert sorted(r for r in requires if "extra ==" not in r) == ["httpx>=0.27", "sniffio>=1.3"], requires
    extras = {line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Provides-Extra:")}
    assert {"image", "fast", "server", "ros", "sim", "demo", "data", "mcp", "ray", "train", "test", "docs"} <= extras
    scripts = whl.read("sequence_ai-0.1.0.dist-info/entry_points.txt").decode()
    for exe in ("seq", "sequence-ai", "sim_robot", "policy_driver", "episode_recorder"):
        assert re.search(rf"^{exe} = ", scripts, re.M), exe
    # the sdist: what a build from it needs besides the packages
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    for rel in ("pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in", "package.xml", "LICENSE", "README.md",
                "resource/sequence_ai", "launch/demo.launch.py", "config/panda_sim.yaml",
                "examples/pick_place/policy.py", "server/sequence_ai_server/gateway/routes/__init__.py"):
        assert rel in members, f"{rel} is missing from the sdist"


_IMPORT_ALL = r"""
import importlib, json, sys
out = {}
for name in json.load(sys.stdin):
    try:
        mod = importlib.import_module(name)
        out[name] = {"file": getattr(mod, "__file__", None)}
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}", "missing": getattr(exc, "name", None)
                     if isinstance(exc, ModuleNotFoundError) else None}
print(json.dumps(out))
"""


def test_the_full_install_imports_every_module_of_the_wheel_from_its_own_site_packages(dist, full_venv, tmp_path):
    modules = _wheel_modules(dist[2])
    assert len(modules) > 150, modules
    site = subprocess.run([full_venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=_clean_env(full_venv)).stdout.strip()
    assert not list(Path(site).glob("__editable__*")), os.listdir(site)     # no editable finder
    for pth in Path(site).glob("*.pth"):
        assert str(ROOT) not in pth.read_text(), f"{pth} points at the checkout"
    out = _run([full_venv / "bin" / "python", "-c", _IMPORT_ALL], tmp_path, _clean_env(full_venv), timeout=180,
               input=json.dumps(modules))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    used = set()
    for name, r in result.items():
        if "file" in r:
            assert r["file"].startswith(site + "/"), f"{name} was imported from {r['file']}, not {site}"
            continue
        top = name.split(".")[0]
        missing = (r["missing"] or "").split(".")[0]
        assert missing in EXCUSED.get(top, ()), f"{name}: {r['error']}"
        used.add(top)
    assert used == set(EXCUSED), f"EXCUSED lists packages that now import whole: {set(EXCUSED) - used}"
    imported = [n for n, r in result.items() if "file" in r]
    assert len(imported) > 120, imported
    # the ROS package's data files land where an ament prefix keeps them
    assert (full_venv / "share" / "sequence_ai" / "launch" / "demo.launch.py").is_file()
    assert (full_venv / "share" / "ament_index" / "resource_index" / "packages" / "sequence_ai").is_file()


def _wait_for(pattern: str, log: Path, proc: subprocess.Popen, timeout: float) -> re.Match:
    def text():
        return log.read_text() if log.exists() else ""

    def matched():
        m = re.search(pattern, text())
        assert m or proc.poll() is None, f"exited with {proc.returncode} before {pattern!r}:\n{text()[-3000:]}"
        return m

    return eventually(matched, timeout, 0.05, what=f"{pattern!r} in {log.name}", detail=lambda: text()[-3000:])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie (exited, not reaped yet) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


_ROBOT = r"""
import json, sys
import sequence_ai
from sequence_ai import ImageFrame, Observation, Proprioception

names = [m.name for m in sequence_ai.models()]
with sequence_ai.connect("toy-policy", params={"max_step": 0.25}) as policy:
    first = policy.predict({"state": [0.0], "target": [0.5]})
    second = policy.predict({"state": [0.4], "target": [0.5]})
wire = Observation(images=[ImageFrame(view="exterior_1", data=b"\xff\xd8", timestamp_ms=0)],
                   proprioception=Proprioception(joint_positions=[0.0] * 7, gripper=[0.0]),
                   instruction="pick").to_wire()
assert wire["images"][0]["data"] == "/9g=", wire
print(json.dumps({"models": names, "first": first, "second": second,
                  "modules": sorted({m.split(".")[0] for m in sys.modules}),
                  "files": sorted({m.__file__ for m in list(sys.modules.values())
                                   if (getattr(m, "__name__", "") or "").startswith("sequence_ai")
                                   and getattr(m, "__file__", None)})}))
"""


def test_seq_serve_from_the_wheel_deploys_a_template_that_the_bare_client_drives_and_stops_on_ctrl_c(
        full_venv, client_venv, tmp_path):
    env = dict(_clean_env(full_venv), SEQ_HEALTH_INTERVAL_S="0.3")   # pings while the robot runs
    out = _run(["seq", "init", "toy-policy", "toy-policy"], tmp_path, env)   # the template is package data
    assert out.returncode == 0 and (tmp_path / "toy-policy" / "policy.py").is_file(), out.stdout + out.stderr
    home = tmp_path / "home"
    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        serve = subprocess.Popen([full_venv / "bin" / "seq", "serve", "--host", "127.0.0.1", "--port", "0",
                                  "--data-dir", home], cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        url = _wait_for(r"serving on (http://127\.0\.0\.1:\d+)", log, serve, 60).group(1)
        gw = dict(SEQUENCES_GATEWAY_URL=url, SEQUENCES_API_KEY=(home / "api_key").read_text().strip(),
                  SEQUENCES_HOME=str(home))
        out = _run(["seq", "deploy", "toy-policy/policy.py"], tmp_path, _clean_env(full_venv, **gw), timeout=120)
        assert out.returncode == 0 and "ready: toy-policy v1" in out.stdout, out.stdout + out.stderr
        worker = json.loads(next((home / "run").glob("toy-policy.*.ready.json")).read_text())
        assert _alive(worker["pid"])

        # the robot's side: the client alone, in its own venv
        out = _run([client_venv / "bin" / "python", "-c", _ROBOT], tmp_path, _clean_env(client_venv, **gw))
        assert out.returncode == 0, out.stdout + out.stderr
        robot = json.loads(out.stdout)
        assert "toy-policy" in robot["models"], robot["models"]
        assert robot["first"] == {"delta": [0.25]} and robot["second"] == {"delta": [pytest.approx(0.1)]}, robot
        assert not NOT_IN_CLIENT & set(robot["modules"]), sorted(NOT_IN_CLIENT & set(robot["modules"]))
        assert all(f.startswith(str(client_venv)) for f in robot["files"]), robot["files"]
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGINT)
        try:
            rc = serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
            raise
    text = log.read_text()
    assert rc == 0 and "gateway stopped" in text and "Traceback" not in text, text[-3000:]
    assert "HTTP Request:" not in text, text[-3000:]      # no line per health ping in `seq serve &`'s shell
    eventually(lambda: not _alive(worker["pid"]), 10, 0.05, what=f"worker {worker['pid']} to exit with its gateway")


def test_the_client_alone_installs_only_httpx_and_answers_a_missing_extra_in_one_line(client_venv, tmp_path):
    env = _clean_env(client_venv)
    py = client_venv / "bin" / "python"
    listed = _run([py, "-c", "import importlib.metadata as m; print('\\n'.join(sorted(d.metadata['Name'].lower() "
                   "for d in m.distributions())))"], tmp_path, env)
    assert listed.returncode == 0, listed.stderr
    installed = {n.replace("_", "-") for n in listed.stdout.split()}
    assert "sequence-ai" in installed and installed <= CLIENT_CLOSURE, sorted(installed - CLIENT_CLOSURE)

    # import and the objects a robot builds, before any gateway: no server, ROS, torch or seq module
    probe = ("import sys, json, sequence_ai\n"
             "from sequence_ai import ImageFrame, Observation, Proprioception\n"
             "Observation(images=[ImageFrame('exterior_1', b'jpeg')], instruction='x',\n"
             "            proprioception=Proprioception(joint_positions=[0.0] * 7)).to_wire()\n"
             "sequence_ai.Policy, sequence_ai.AsyncPolicy, sequence_ai.ConnectOptions, sequence_ai.recipes.pick_place\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = _run([py, "-c", probe], tmp_path, env)
    assert out.returncode == 0, out.stderr
    assert not NOT_IN_CLIENT & set(json.loads(out.stdout)), out.stdout

    # frame encoding without the image extra: an ImportError naming it
    out = _run([py, "-c", "import sequence_ai\ntry:\n    sequence_ai.encode_jpeg([[0]])\n"
                          "except ImportError as e:\n    print(e)"], tmp_path, env)
    assert out.returncode == 0 and out.stdout == ("an array frame needs numpy (it is not installed): "
                                                  "pip install 'sequence-ai[image]'\n"), out.stdout + out.stderr

    # console scripts that need an extra: one line on stderr naming it, exit code 1
    # `python -m seq` (docs/quickstart.md: where coreutils' seq comes first) says the same line:
    # `import seq` itself needs no extra, so seq.__main__'s guard runs
    for cmd in (["seq"], [py, "-m", "seq"]):
        out = _run([*cmd, "serve", "--port", "0"], tmp_path, env)
        assert out.returncode == 1 and SERVER_LINE.fullmatch(out.stderr) and not out.stdout, (cmd, out.stderr)
        out = _run([*cmd, "--help"], tmp_path, env)
        assert out.returncode == 1 and re.fullmatch(r"seq: needs the server extra \(\w+ is not installed\): "
                                                    r"pip install 'sequence-ai\[server\]'\n", out.stderr), (cmd, out.stderr)
    for cmd, prefix in ((["sim_robot"], "sim_robot: needs "),
                        (["policy_driver", "--ros-args", "-p", "model:=x"], "policy_driver: needs "),
                        (["episode_recorder"], "episode_recorder: needs "),
                        (["sequence-ai", "mcp", "--help"], "sequence-ai mcp: needs the mcp extra"),
                        (["sequence-ai", "bag", "export", tmp_path / "no-bag", "--out", tmp_path / "ds"],
                         "sequence-ai bag: needs the data extra")):
        out = _run(cmd, tmp_path, env)
        lines = out.stderr.splitlines()
        assert out.returncode == 1 and len(lines) == 1 and "Traceback" not in out.stderr, (cmd, out.stderr)
        assert lines[0].startswith(prefix), lines
        assert re.search(r"pip install 'sequence-ai\[\w+\]'|needs ROS 2", lines[0]), lines
    # the client's own commands work
    out = _run(["sequence-ai", "version"], tmp_path, env)
    assert out.returncode == 0 and out.stdout.startswith("sequence-ai "), out.stdout + out.stderr


def test_the_full_install_without_ros_names_the_ros_set_up_for_the_nodes(full_venv, tmp_path):
    for exe in ("sim_robot", "policy_driver", "episode_recorder"):
        out = _run([exe], tmp_path, _clean_env(full_venv))
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert re.fullmatch(rf"{exe}: needs (ROS 2 \(\w+ is not importable\)|the \w+ extra).*\n", out.stderr), out.stderr


def test_a_file_deleted_from_the_tree_is_in_no_later_wheel_built_in_the_tree(tmp_path):
    """``pip wheel .`` in the source tree builds in its build/lib, which outlives the build (and
    build/ is bootstrap's folder too): a module or an examples/pick_place file deleted since the
    last build must not come back from there (setup.py's BuildPy empties build_lib first)."""
    src = _copy_checkout(tmp_path / "src")
    stale = {"seq/zz_stale.py": "seq/zz_stale.py",
             "examples/pick_place/zz_stale.py": "seq/templates/pick-place/zz_stale.py"}
    keep = src / "build" / "wheelhouse" / "keep.txt"      # bootstrap's wheelhouse beside build/lib
    keep.parent.mkdir(parents=True)
    keep.write_text("kept\n")

    def wheel(name: str) -> set:
        out = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", tmp_path / name, "."], src, _clean_env(Path(sys.prefix)), timeout=300)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        wheels = list((tmp_path / name).glob("*.whl"))
        assert len(wheels) == 1, wheels
        return set(zipfile.ZipFile(wheels[0]).namelist())

    for rel in stale:
        (src / rel).write_text("STALE = True\n")
    first = wheel("first")
    assert set(stale.values()) <= first, sorted(set(stale.values()) - first)
    assert (src / "build" / "lib" / "seq" / "zz_stale.py").is_file()   # the build really was in the tree
    for rel in stale:
        (src / rel).unlink()
    second = wheel("second")
    assert not set(stale.values()) & second, sorted(set(stale.values()) & second)
    assert first - second == set(stale.values()), sorted(first - second)
    assert "seq/templates/pick-place/policy.py" in second and "seq/__init__.py" in second
    assert keep.read_text() == "kept\n"
