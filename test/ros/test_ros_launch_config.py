"""launch/ and config/ checked without the launch package; observation rules unit-tested (no rclpy).

The launch files are written for a real ROS 2 install; here they are parsed, and what they
name (config files, executables, launch arguments) is checked against setup.py and config/.
The param files are loaded and every key is checked against the driver's declared parameters.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from sequence_ai_ros import codecs
from sequence_ai_ros.driver_node import _PARAMS
from sequence_ai_ros.observation import ObservationAssembler, StaleSensorError, StreamRule

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = sorted((ROOT / "launch").glob("*.launch.py"))


def _strings(tree):
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _setup_kwargs() -> dict:
    """The keyword arguments setup.py passes to setup(), run from the root (setuptools.setup replaced)."""
    import runpy
    from unittest import mock

    seen: dict = {}
    with mock.patch("setuptools.setup", lambda **kw: seen.update(kw)), mock.patch("sys.argv", ["setup.py", "--name"]):
        runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    return seen


def _console_scripts():
    text = (ROOT / "setup.py").read_text()
    return set(re.findall(r'"(\w+) = sequence_ai_ros\.executables:\w+"', text))


@pytest.mark.parametrize("path", LAUNCH, ids=lambda p: p.name)
def test_launch_file_parses_and_names_real_executables_and_configs(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in funcs
    strings = _strings(tree)
    if "driver_and_recorder" in {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}:
        # the shared node list of sequence_ai_ros.launch_support: its names count as this file's
        strings |= _strings(ast.parse((ROOT / "sequence_ai_ros" / "launch_support.py").read_text()))
    executables = {s for s in strings if s in ("policy_driver", "sim_robot", "episode_recorder")}
    assert executables and executables <= _console_scripts(), executables
    configs = {s for s in strings if s.endswith(".yaml")}
    assert configs, "a launch file names its default config"
    for c in configs:
        assert (ROOT / "config" / c).exists(), c


@pytest.mark.parametrize("path", [p for p in LAUNCH if p.name != "demo.launch.py"], ids=lambda p: p.name)
def test_driver_and_sim_launch_declare_namespace_model_config(path):
    tree = ast.parse(path.read_text())
    declared = {c.args[0].value for c in ast.walk(tree) if isinstance(c, ast.Call)
                and getattr(c.func, "id", "") == "DeclareLaunchArgument"}
    assert {"namespace", "model", "config"} <= declared


def _declared(module: str) -> set:
    """Parameter names a node module declares (its ``declare_parameters`` table), read from source."""
    text = (ROOT / "sequence_ai_ros" / f"{module}.py").read_text()
    return set(re.findall(r'^\s+"(\w+)": \(', text, re.M))


CONFIGS = sorted(p.name for p in (ROOT / "config").glob("*.yaml"))


@pytest.mark.parametrize("name", CONFIGS)
def test_config_applies_under_any_namespace(name):
    # a bare node-name key (policy_driver:) matches only /policy_driver: under namespace:=arm the
    # node silently ran with its defaults. /** matches every node in every namespace.
    data = yaml.safe_load((ROOT / "config" / name).read_text())
    assert list(data) == ["/**"] and list(data["/**"]) == ["ros__parameters"], list(data)


@pytest.mark.parametrize("name", ["panda_sim.yaml", "franka_droid.yaml"])
def test_config_keys_are_declared_driver_parameters_and_documented(name):
    text = (ROOT / "config" / name).read_text()
    params = yaml.safe_load(text)["/**"]["ros__parameters"]
    sim, recorder = _declared("sim_node"), _declared("recorder_node")
    assert sim and recorder
    # every key is some node's; the sim's keys are none of the driver's (one file feeds both)
    assert set(params) <= set(_PARAMS) | sim | recorder, set(params) - set(_PARAMS) - sim - recorder
    assert not sim & set(_PARAMS), sim & set(_PARAMS)
    assert "api_key" not in params                      # the key never lives in YAML
    for key in params:
        line = next(l for l in text.splitlines() if l.strip().startswith(f"{key}:"))
        before = text.splitlines()[text.splitlines().index(line) - 1]
        assert "#" in line or before.strip().startswith("#"), f"{key} is not documented"
    n_views = len(params["camera_views"])
    for key in ("camera_topics", "camera_transports", "camera_time_bases", "camera_alignments"):
        if key in params:
            assert len(params[key]) == n_views, key


def test_franka_droid_is_joint_velocity_with_zero_hold():
    params = yaml.safe_load((ROOT / "config" / "franka_droid.yaml").read_text())["/**"]["ros__parameters"]
    assert params["camera_views"] == ["exterior_1", "wrist_left"]
    assert params["command_interface"] == "velocity" and params["hold_mode"] == "zeros"
    assert len(params["joint_lower"]) == len(params["joint_upper"]) == 8


def test_package_xml_declares_every_ros_package_the_nodes_import():
    xml = (ROOT / "package.xml").read_text()
    deps = set(re.findall(r"<exec_depend>([\w-]+)</exec_depend>", xml))
    imported = set()
    for f in (ROOT / "sequence_ai_ros").glob("*.py"):
        imported |= set(re.findall(r"^\s*from (\w+_msgs|std_srvs|rclpy|rcl_interfaces|builtin_interfaces)\b", f.read_text(), re.M))
    assert imported <= deps, imported - deps


# -- observation rules (the same code the bag exporter runs) ---------------------------------

class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _frame(value=10):
    return codecs.DecodedImage(np.full((4, 4, 3), value, np.uint8))


def _joints(asm, stamp=0.0):
    class Msg:
        name = [f"j{i}" for i in range(2)] + ["g"]
        position = [0.1, 0.2, 0.9]

        class header:
            class stamp:
                sec, nanosec = int(stamp), int((stamp % 1) * 1e9)
    asm.on_joint_state(Msg)


def test_header_time_base_ages_by_stamp_and_receive_by_arrival():
    mono, wall = _Clock(), _Clock()
    asm = ObservationAssembler(["cam"], ["j0", "j1"], "g", max_age_s=0.5, clock=mono, header_clock=wall,
                               rules={"cam": StreamRule("header", "latest")})
    asm.on_frame("cam", _frame(), stamp_s=99.0)   # stamped 1 s ago (header) but received just now
    _joints(asm)
    assert any("cam: stale" in p for p in asm.problems())
    assert not any(p.startswith("joint_state") for p in asm.problems())
    asm.on_frame("cam", _frame(), stamp_s=100.0)
    assert asm.problems() == []
    mono.t += 0.6                                  # joints go stale by arrival time
    assert [p.split(":")[0] for p in asm.problems()] == ["joint_state"]
    with pytest.raises(StaleSensorError, match="joint_state"):
        asm.build("x")


def test_asof_skips_frames_stamped_after_the_tick_and_drop_uses_each_frame_once():
    mono, wall = _Clock(), _Clock()
    asm = ObservationAssembler(["a", "b"], ["j0", "j1"], "g", clock=mono, header_clock=wall,
                               rules={"a": StreamRule("header", "asof"), "b": StreamRule("receive", "drop")})
    asm.on_frame("a", _frame(1), stamp_s=99.9)
    asm.on_frame("a", _frame(2), stamp_s=100.2)   # from the future (clock skew): not used yet
    asm.on_frame("b", _frame(3), stamp_s=0.0)
    _joints(asm)
    obs = asm.build("x")
    assert obs.images[0].timestamp_ms == 99900
    with pytest.raises(StaleSensorError, match="no new sample"):
        asm.build("x")                              # 'b' has nothing new
    assert asm.problems() == []                     # per tick, drop only checks age
    asm.on_frame("b", _frame(4), stamp_s=0.0)
    wall.t = 100.3
    assert asm.build("x").images[0].timestamp_ms == 100200


def test_wrong_size_and_bad_encoding_become_faults_that_name_the_stream():
    asm = ObservationAssembler(["cam"], ["j0", "j1"], "g", camera_sizes={"cam": (4, 4)})
    with pytest.raises(codecs.SensorDataError, match="8x8"):
        asm.on_frame("cam", codecs.DecodedImage(np.zeros((8, 8, 3), np.uint8)), 0.0)

    class Bad:
        encoding, height, width, step, data = "16UC1", 4, 4, 8, bytes(32)

        class header:
            class stamp:
                sec = nanosec = 0
    with pytest.raises(codecs.SensorDataError, match="16UC1"):
        asm.on_image("cam", Bad)
    assert list(asm.faults) == ["cam"] and "8x8" in asm.faults["cam"]
    asm.clear_faults()
    assert asm.faults == {}


def test_a_jpeg_compressed_frame_is_sent_without_re_encoding():
    import io
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(buf, format="JPEG", quality=80)

    class Msg:
        format, data = "jpeg", buf.getvalue()

        class header:
            class stamp:
                sec = nanosec = 0
    asm = ObservationAssembler(["cam"], ["j0", "j1"], "g", max_age_s=1e9, header_clock=lambda: 0.0)
    asm.on_image("cam", Msg, "sensor_msgs/msg/CompressedImage")
    _joints(asm)
    assert asm.build("x").images[0].data == buf.getvalue()      # the same bytes, raw (no base64 hop)


def test_a_custom_joint_message_plugs_in_through_the_registry():
    codecs.register_joint_decoder("my_robot_msgs/msg/ArmState",
                                  lambda m: codecs.JointSample(names=list(m.joints), positions=list(m.q)))

    class Arm:
        joints, q = ["j0", "j1", "g"], [1.0, 2.0, 0.5]

        class header:
            class stamp:
                sec = nanosec = 0
    asm = ObservationAssembler(["cam"], ["j1", "j0"], "g")
    asm.on_joint_state(Arm, "my_robot_msgs/msg/ArmState")
    assert asm.latest_joint_positions() == [2.0, 1.0] and asm.latest_gripper() == 0.5
    with pytest.raises(ValueError, match="no joint decoder"):
        codecs.joint_decoder("other/msg/X")


def test_license_file_matches_the_license_tags():
    xml = (ROOT / "package.xml").read_text()
    assert re.findall(r"<license>([^<]+)</license>", xml) == ["Apache-2.0"]
    assert re.findall(r"<license>([^<]+)</license>", (ROOT / "msg" / "package.xml").read_text()) == ["Apache-2.0"]
    assert 'license="Apache-2.0"' in (ROOT / "setup.py").read_text()
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    # colcon installs it with the package (share/sequence_ai/LICENSE) from ros/sequence_ai
    assert (ROOT / "ros" / "sequence_ai" / "LICENSE").resolve() == (ROOT / "LICENSE").resolve()


def test_the_colcon_package_folder_links_every_file_setup_py_reads_to_the_root():
    # colcon builds sequence_ai from ros/sequence_ai; setup.py runs there with relative paths
    pkg = ROOT / "ros" / "sequence_ai"
    for name in ("package.xml", "setup.py", "setup.cfg", "README.md", "LICENSE", "resource", "launch", "config",
                 "sequence_ai_core", "sequence_ai", "seq", "server", "sequence_ai_ros", "examples"):
        assert (pkg / name).is_symlink() and (pkg / name).resolve() == (ROOT / name).resolve(), name
    packages = _setup_kwargs()["packages"]      # what setup() is given, as colcon reads it
    assert "sequence_ai_ros" in packages and "sequence_ai.recipes" in packages, packages
    for p in packages:
        top = p.split(".")[0]
        assert (pkg / ("server" if top == "sequence_ai_server" else top)).exists(), p
