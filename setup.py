"""sequence-ai: deploy a robot policy and drive a robot with it.

One repository, two shapes: a normal Python distribution (``pip install sequence-ai``, console
scripts in the environment's ``bin/``) and the ROS 2 ament_python package ``sequence_ai``
described by ``package.xml``. colcon builds the latter from ``ros/sequence_ai/``, whose files are
links to this folder (the root itself is no colcon package: see ``colcon.pkg``); there
``setup.cfg`` sends the console scripts to ``lib/sequence_ai/`` where ``ros2 run`` looks. The
interface package ``sequence_ai_msgs`` is ``msg/`` (ament_cmake), a package of its own.
"""
import os
import shutil
from glob import glob

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# The import names this distribution installs; sequence_ai_server lives in server/ (package_dir).
TOP_LEVEL = ["seq", "sequence_ai", "sequence_ai_core", "sequence_ai_data", "sequence_ai_eval",
             "sequence_ai_mcp", "sequence_ai_ros", "sequence_ai_sim"]
PACKAGES = (find_packages(HERE, include=[p for name in TOP_LEVEL for p in (name, name + ".*")])
            + find_packages(os.path.join(HERE, "server"), include=["sequence_ai_server", "sequence_ai_server.*"]))
TEMPLATE_FILES = ("py", "md", "txt", "json", "yaml", "toml")
# `seq init pick-place` copies the demo policy, which lives in examples/pick_place (the demo and
# its tests run it from there); the built package carries a copy as seq/templates/pick-place.
PICK_PLACE = os.path.join("examples", "pick_place")
README = os.path.join(HERE, "README.md")


def _empty_build_lib(build_lib):
    """Remove ``build_lib`` (``build/lib`` of an in-tree ``pip wheel .``, ``<build-base>/lib`` of
    colcon's ament_python build): build_py only adds and overwrites there, so a module or
    example file deleted from the tree would otherwise stay in every later wheel and install.
    Never a folder holding this tree (a misconfigured ``--build-lib``)."""
    lib, here = os.path.realpath(build_lib), os.path.realpath(HERE)
    if lib == here or here.startswith(lib + os.sep) or os.path.exists(os.path.join(lib, "setup.py")):
        raise SystemExit(f"setup.py: refusing to empty build_lib {build_lib}: it holds the source tree")
    shutil.rmtree(lib, ignore_errors=True)


class BuildPy(build_py):
    """build_py from an empty build_lib (:func:`_empty_build_lib`: nothing deleted from the tree
    survives in a build) that also copies examples/pick_place/*.py into
    seq/templates/pick-place/ of the build (the wheel, a colcon install); a tree without
    examples/ builds without that template (``seq init pick-place`` then says it ships with the
    source checkout)."""

    def run(self):
        if not self.editable_mode:   # an editable install's build_lib is a fresh temporary folder
            _empty_build_lib(self.build_lib)
        super().run()
        src = os.path.join(HERE, PICK_PLACE)
        if not os.path.isdir(src):
            return
        dest = os.path.join(self.build_lib, "seq", "templates", "pick-place")
        os.makedirs(dest, exist_ok=True)
        for name in sorted(os.listdir(src)):
            if name.rsplit(".", 1)[-1] in TEMPLATE_FILES and os.path.isfile(os.path.join(src, name)):
                shutil.copyfile(os.path.join(src, name), os.path.join(dest, name))


ROS_PACKAGE = "sequence_ai"

setup(
    name="sequence-ai",
    version="0.1.0",
    description="Self-hosted action-chunk policy serving and a robot client with ROS 2 nodes",
    long_description=open(README, encoding="utf-8").read() if os.path.exists(README) else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    # The robot client (sequence_ai, sequence_ai_core) runs on 3.9+; the server, authoring and ROS
    # parts need 3.10+ (their extras and bootstrap.sh pick that interpreter).
    python_requires=">=3.9",
    # Every package under the import names this distribution owns (sequence_ai.recipes and
    # sequence_ai_server.gateway.routes were once missed by a hand-written list: the wheel could not import).
    packages=PACKAGES,
    # Files read at run time, beside the code: the ``seq init`` templates (the file types
    # seq.cli._scaffold.init_template copies). pick-place is examples/pick_place, copied in by build_py.
    package_data={"seq": [f"templates/*/*.{ext}" for ext in TEMPLATE_FILES]},
    include_package_data=False,
    package_dir={"sequence_ai_server": "server/sequence_ai_server"},
    cmdclass={"build_py": BuildPy},
    # The robot client is deliberately small: httpx (which brings anyio) and sniffio, which
    # httpcore imports on every request and, when it is missing, re-searches sys.path for each
    # time (~0.2-0.9 ms of CPU per /act; bench/bench_client.py).
    install_requires=["httpx>=0.27", "sniffio>=1.3"],
    extras_require={
        # client frames: simplejpeg (libjpeg-turbo) encodes; Pillow resizes and writes depth PNG
        "image": ["simplejpeg>=1.7", "pillow>=10", "numpy>=1.24"],
        # the persistent /act channel (a websocket; without it the client uses HTTP /act):
        # ~1.3 ms less client CPU and ~0.4 ms less worker CPU per request than httpx + POST /act
        # (bench/bench_wire.py)
        "fast": ["websockets>=15"],    # 15: connect(proxy=None)
        "server": [
            "fastapi>=0.110",
            "uvicorn>=0.29",
            "uvloop>=0.19; sys_platform != 'win32'",   # worker: the /act event loop (bench_client.py)
            "httptools>=0.6",     # worker: uvicorn's C HTTP parser (h11 costs ~0.3 ms more per /act)
            "websockets>=15",     # worker: the /act channel and the openpi-compatible endpoint
            "msgpack>=1.0",       # worker: the openpi-compatible endpoint's codec
            "uv>=0.13",               # gateway: builds image= environments (envs.py)
            "pydantic>=2.5",
            "numpy>=1.24",
            "simplejpeg>=1.7",     # worker: JPEG decode (libjpeg-turbo); Pillow stays for PNG / depth
            "pillow>=10",
            "typer>=0.12",
            "rich>=13",
            "cryptography>=41",       # gateway: secrets encrypted at rest (Fernet)
            "prometheus-client>=0.19",  # gateway: /metrics
            "nvidia-ml-py>=12",   # gateway: the card inventory from NVML (ops/gpus.py); nvidia-smi is the fallback
        ],
        # the simulated cell and its benchmarks (sequence_ai_sim; no rclpy)
        # the ROS 2 nodes' Python libraries that come from PyPI (rclpy and the message packages come
        # from the ROS 2 install: /opt/ros/<distro> or the bootstrap's wheels); sim_robot also needs
        # the sim extra and episode_recorder the data extra
        "ros": ["numpy>=1.24", "simplejpeg>=1.7", "pillow>=10"],
        "sim": ["mujoco>=3.1", "numpy>=1.24", "pillow>=10", "fast-simplification>=0.2"],
        "demo": ["matplotlib>=3.7"],
        # LeRobot datasets (sequence_ai_data, no rclpy) and episode bags (sequence_ai_ros.bag;
        # `sequence-ai bag`)
        "data": ["rosbags>=0.10", "pyarrow>=14", "av>=12", "simplejpeg>=1.7", "numpy>=1.24", "pillow>=10"],
        # pytest pinned below 8.4: launch_pytest's fixtures break on >= 8.4 and launch_testing's plugin
        # on 9 (both load in every pytest run of the venv); colcon builds the scratch workspace of
        # test/e2e/test_ros_workspace.py; schemathesis fuzzes the worker's and the gateway's OpenAPI (under
        # pytest 8 pip picks a schemathesis that uses hypothesis-jsonschema 0.23, which needs a
        # hypothesis before 6.156)
        # test/client/test_chat_decide.py: llama.cpp's OpenAI-compatible server (an sdist: built once with
        # cmake + g++, then pip's wheel cache; scripts/bootstrap.sh sets CMAKE_ARGS to keep the build
        # small) and gguf, which writes the test's tiny model
        # build + setuptools: test/e2e/test_wheel_install.py builds the sdist and the wheel (python -m build
        # --no-isolation: pyproject.toml's setuptools>=70.1, newer than Python 3.11's venv's 65.5)
        "test": ["pytest==8.3.5", "build>=1.0", "setuptools>=70.1", "colcon-common-extensions>=0.3", "pytest-timeout>=2.3", "pytest-xdist>=3.5",
                 "hypothesis>=6.90,<6.156", "simplejpeg>=1.7", "psutil>=5.9", "schemathesis>=4.0",
                 "llama-cpp-python[server]==0.3.36", "gguf>=0.17"],
        # workers placed by Ray (`seq serve --backend ray`); ray 2.60.0 checked here
        "ray": ["ray[default]>=2.60,<3", "psutil>=5.9"],
        # the flywheel example's learned policy (examples/flywheel: train.py, learned_policy.py);
        # pinned: 2.13.0 resolves to the local CPU build here
        "train": ["torch==2.13.0"],
        # `sequence-ai mcp` (sequence_ai_mcp): the official MCP SDK; 2.3.0 checked here. Python mode
        # on the simulated cell also needs the sim extra; --ros needs the ROS 2 set-up
        "mcp": ["mcp>=2.3,<3"],
        # the documentation site (mkdocs build; the test suite builds it)
        "docs": ["mkdocs>=1.6"],
    },
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{ROS_PACKAGE}"]),
        (f"share/{ROS_PACKAGE}", ["package.xml", "LICENSE"]),
        (f"share/{ROS_PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{ROS_PACKAGE}/config", glob("config/*.yaml")),
    ],
    entry_points={
        "console_scripts": [
            # each script loads its module when run: without the extra it needs, one line naming
            # the extra (sequence_ai.extras), not a traceback
            "seq = sequence_ai.extras:seq_main",
            "sequence-ai = sequence_ai.cli:main",
            "seqai = sequence_ai.cli:main",
            # ROS 2 executables (ros2 run sequence_ai <name>)
            "sim_robot = sequence_ai_ros.executables:sim_robot",
            "policy_driver = sequence_ai_ros.executables:policy_driver",
            "episode_recorder = sequence_ai_ros.executables:episode_recorder",
        ],
        # `sequence-ai bag ...`: the client's CLI finds it here and never imports sequence_ai_ros
        "sequence_ai.commands": ["bag = sequence_ai_ros.bag.cli:main",
                                 "mcp = sequence_ai_mcp.cli:main"],
    },
    zip_safe=False,
)
