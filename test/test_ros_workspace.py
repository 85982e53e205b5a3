"""The checkout as a user's ROS 2 workspace: cloned into ``src/``, ``colcon build`` with no flags,
``source install/setup.bash``, then ``ros2 pkg`` / ``ros2 run`` / ``ros2 launch`` find it.

colcon is colcon-common-extensions from PyPI (the test extra); the ROS 2 underlay is the venv's
Jazzy wheels. The one thing a real ROS install would not need is how CMake reaches those wheels
(Python3_EXECUTABLE, scripts/cmake/wheel_fixups.cmake, BUILD_TESTING=OFF as in bootstrap.sh):
that goes into the workspace's colcon defaults file (``$COLCON_HOME/defaults.yaml``), written by
the clone's own ``scripts/colcon_defaults.sh`` (what the README tells a venv user to run), so the
command itself stays a bare ``colcon build``. The checkout's own install/ (bootstrap's
sequence_ai_msgs and sequence_ai prefix) is taken off every path first, so whatever resolves
afterwards comes from the workspace.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.prefix)


def _without_checkout_install(value: str) -> str:
    own = str(ROOT / "install")
    return os.pathsep.join(p for p in value.split(os.pathsep) if p and not p.startswith(own))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A workspace with a copy of this checkout (tracked and untracked-not-ignored files, as a
    clone would have them, symlinks kept) in src/sequence-ai; returns ``(ws, env)``."""
    ws = tmp_path_factory.mktemp("ws")
    src = ws / "src" / "sequence-ai"
    src.mkdir(parents=True)
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(f"tar --null -T - -cf - | tar -xf - -C '{src}'", shell=True, input=files, cwd=ROOT, check=True)
    home = ws / ".colcon"
    home.mkdir()
    # the defaults file the README tells a venv user to generate, from the clone's own script
    defaults = subprocess.run(["bash", str(src / "scripts" / "colcon_defaults.sh")], env=dict(os.environ, PYTHON=sys.executable),
                              capture_output=True, text=True, check=True).stdout
    assert f"-DCMAKE_PROJECT_INCLUDE={src}/scripts/cmake/wheel_fixups.cmake\n" in defaults, defaults
    assert f"-DPython3_EXECUTABLE={sys.executable}\n" in defaults, defaults
    (home / "defaults.yaml").write_text(defaults)
    env = dict(os.environ)
    for key in ("PYTHONPATH", "LD_LIBRARY_PATH"):
        env[key] = _without_checkout_install(env.get(key, ""))
    env.update(AMENT_PREFIX_PATH=str(VENV), CMAKE_PREFIX_PATH=str(VENV), COLCON_HOME=str(home),
               ROS_LOG_DIR=str(ws / "roslog"))
    return ws, env


def _sh(script: str, ws: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=ws, env=env, capture_output=True, text=True, timeout=timeout)


def test_colcon_discovers_both_packages_and_builds_them_without_flags(workspace):
    ws, env = workspace
    out = _sh("colcon list", ws, env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = sorted(line.split("\t") for line in out.stdout.splitlines())
    assert rows == [["sequence_ai", "src/sequence-ai/ros/sequence_ai", "(ros.ament_python)"],
                    ["sequence_ai_msgs", "src/sequence-ai/msg", "(ros.ament_cmake)"]], out.stdout

    out = _sh("colcon build", ws, env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "Summary: 2 packages finished" in out.stdout, out.stdout

    # sourced, the workspace is what ros2 and Python find
    out = _sh(
        ". install/setup.bash\n"
        "ros2 pkg executables sequence_ai\n"
        "echo prefix $(ros2 pkg prefix sequence_ai)\n"
        "python -c 'import sequence_ai_ros, sequence_ai_msgs.action as a; print(\"from\", sequence_ai_ros.__file__, a.__file__)'\n"
        "ros2 interface show sequence_ai_msgs/action/Act | grep -E '^string instruction'\n"
        "ros2 launch sequence_ai demo.launch.py --show-args\n", ws, env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for exe in ("episode_recorder", "policy_driver", "sim_robot"):
        assert f"sequence_ai {exe}\n" in text, text
    assert f"prefix {ws}/install/sequence_ai\n" in text, text
    assert f"from {ws}/install/sequence_ai/lib/" in text and f"{ws}/install/sequence_ai_msgs/lib/" in text, text
    assert "\nstring instruction" in text, text
    assert "'record':" in text and "'seed':" in text, text
    assert (ws / "install" / "sequence_ai" / "share" / "sequence_ai" / "config" / "panda_sim.yaml").is_file()
    assert (ws / "install" / "sequence_ai" / "share" / "sequence_ai" / "LICENSE").is_file()

    # ros2 run starts the node from the workspace: a bad parameter is refused by the node itself
    out = _sh(". install/setup.bash\nros2 run sequence_ai sim_robot --ros-args -p light_jitter:=5", ws, env, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "error: light_jitter must be in [0, 1]" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_the_editable_pip_install_keeps_its_console_scripts_on_path():
    # setup.cfg sends setup.py's own script installs to lib/sequence_ai (for colcon); the editable
    # pip install bootstrap.sh made must still have put every console script in the venv's bin/
    for exe in ("seq", "sequence-ai", "policy_driver", "sim_robot", "episode_recorder"):
        assert (VENV / "bin" / exe).is_file(), exe
    assert not (VENV / "lib" / "sequence_ai").exists()
