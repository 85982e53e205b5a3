"""The policy driver's parameters: one table of name, default, description, range, validator and
whether the value may change while the node runs (``generate_parameter_library`` style).

:func:`declare` declares every entry on a node with a ``ParameterDescriptor`` that carries the
description, the range (``FloatingPointRange`` / ``IntegerRange``, so ``ros2 param describe``
shows it and rclpy refuses values outside it) and ``read_only`` for what cannot change at run
time (topics, joints, the model, the output wiring). It returns a frozen :class:`Params`;
:func:`check` validates one value, :func:`check_all` the cross-field rules. The node's
set-parameters callback uses both, so a change is applied or refused with a reason -- never
accepted and ignored.

A YAML file or ``-p`` that writes a float parameter as an integer (``publish_delay_ms: 2``) is the
classic ROS 2 pitfall, so float parameters are declared with dynamic typing and read back as
floats; a value that is not a number is refused naming the parameter and what it takes.

This module imports no rclpy at import time except the interface message types.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

__all__ = ["Spec", "TABLE", "Params", "declare", "check", "check_all", "ParameterRefused",
           "FR3_ARM_JOINTS", "COMMAND_MODES", "GRIPPER_OUTPUTS"]

FR3_ARM_JOINTS = [f"fr3_joint{i}" for i in range(1, 8)]
"""Franka FR3 arm joint names as franka_ros2's ros2_control description spells them."""

COMMAND_MODES = ("joint_commands", "forward_command_controller", "joint_trajectory_controller")
GRIPPER_OUTPUTS = ("none", "forward_command_controller", "joint_trajectory_controller")


class ParameterRefused(ValueError):
    """A parameter value (or a combination of values) the driver cannot run with; the message
    names the parameter, what it got and what it takes."""


_STRINGS, _DOUBLES = "string_array", "double_array"   # typed arrays whose default is "unset"

REALTIME_PRIORITY = 40
"""The publisher thread's default SCHED_FIFO priority: below ros2_control's controller_manager
(its update loop asks for 50), so a controller on the same machine is never delayed by us. On an
idle 2-core machine it took the command publish period error p99 from 1.53 / 1.30 ms at normal
priority to 0.41 / 0.70 ms at 15 / 100 Hz (medians of 5 runs, ``bench/bench_ros_nodes.py
--only publish --publish-compare realtime``). Refused by the OS (no CAP_SYS_NICE, no rtprio
limit): the thread runs at normal priority and the node says so once at info level."""


@dataclass(frozen=True)
class Spec:
    """One parameter.

    default: the value, or ``"string_array"`` / ``"double_array"`` for a typed array left unset.
    lo/hi: inclusive range for numbers (None = open); ``above`` makes ``lo`` exclusive.
    choices: allowed strings.  each: for string arrays, the allowed entries.
    validator: ``validator(value) -> None | str``: a rule of this parameter alone beyond type,
        range and choices (the string says what is wrong).
    When it may change: ``runtime`` -- any time, applied at once (or from the next goal, as the
    description says); ``fixed`` -- never after start (``read_only`` in its descriptor); neither
    -- read at configure: it may change while the node is unconfigured (cleanup first).
    """

    default: Any
    description: str
    lo: Optional[float] = None
    hi: Optional[float] = None
    above: bool = False
    choices: Optional[Tuple[str, ...]] = None
    runtime: bool = False
    each: Optional[Tuple[str, ...]] = None
    validator: Optional[Callable[[Any], Optional[str]]] = None
    fixed: bool = False

    @property
    def when(self) -> str:
        """``runtime``, ``configure`` or ``start``: when a new value can take effect."""
        return "runtime" if self.runtime else ("start" if self.fixed else "configure")


def _identifier(value) -> Optional[str]:
    if value and not value.replace("_", "a").isalnum():
        return f"{value!r} is not an environment variable name (letters, digits, _)"
    return None


def _non_empty(value) -> Optional[str]:
    return None if value else "must not be empty"


def _distinct_names(values) -> Optional[str]:
    names = list(values or [])
    if any(not n for n in names):
        return f"has an empty name: {names}"
    dup = sorted({n for n in names if names.count(n) > 1})
    return f"names {dup} more than once" if dup else None


def _relative_or_absolute_topic(value) -> Optional[str]:
    if not value or value.endswith("/") or " " in value:
        return f"{value!r} is not a topic name"
    return None


def _topic_or_empty(value) -> Optional[str]:
    return _relative_or_absolute_topic(value) if value else None


def service_name_problem(value, absolute: bool = True) -> Optional[str]:
    """None for a ROS service name (``/a/b``; with ``absolute=False`` also ``a/b`` or ``~/a``),
    else why it is not one."""
    text = str(value)
    body = text[1:] if text.startswith("/") else (text[2:] if text.startswith("~/") and not absolute else text)
    parts = body.split("/")
    if (absolute and not text.startswith("/")) or not all(
            part and part.replace("_", "a").isalnum() and not part[0].isdigit() for part in parts):
        kind = "an absolute service name (/ns/name" if absolute else "a service name (ns/name or /ns/name"
        return f"{text!r} is not {kind}: letters, digits, _)"
    return None


def stop_conditions(values) -> Dict[str, str]:
    """``{name: service}`` from ``stop_conditions`` entries ``name=/service``.

    Raises ValueError naming the entry that is not one."""
    out: Dict[str, str] = {}
    for entry in values or []:
        name, eq, service = str(entry).partition("=")
        name, service = name.strip(), service.strip()
        if not eq or not name or not name.replace("_", "a").replace("-", "a").isalnum():
            raise ValueError(f"entry {entry!r} is not name=/service (name: letters, digits, _ -)")
        why = service_name_problem(service, absolute=False)
        if why:
            raise ValueError(f"entry {entry!r}: {why}")
        if name in out:
            raise ValueError(f"names {name!r} twice")
        out[name] = service
    return out


def stop_service(p, stop_when: str) -> Optional[str]:
    """The CheckSuccess service a goal's ``stop_when`` names under parameters ``p``: a
    ``stop_conditions`` name, or an absolute service name; "" = ``success_service`` (None without one).

    Raises ValueError naming ``stop_when`` and the conditions offered."""
    name = (stop_when or "").strip()
    if not name:
        return p.success_service or None
    offered = stop_conditions(p.stop_conditions)
    if name in offered:
        return offered[name]
    if name.startswith("/"):
        why = service_name_problem(name)
        if why:
            raise ValueError(f"stop_when {why}")
        return name
    raise ValueError(f"stop_when {name!r} is not a stop condition this driver offers "
                     f"({', '.join(sorted(offered)) or 'none: set stop_conditions'}) nor an absolute "
                     f"CheckSuccess service name (/ns/name)")


def _stop_conditions(values) -> Optional[str]:
    try:
        stop_conditions(values)
    except ValueError as exc:
        return str(exc)
    return None


_VIEW_RULES = ("receive", "header")
_ALIGN = ("latest", "asof", "drop")
_BIG = 1e9

TABLE: Dict[str, Spec] = {
    "autostart": Spec(True, "Configure and activate at start (a plain node); false = wait for lifecycle "
                            "transitions (ros2 lifecycle set ... configure / activate).", fixed=True),
    "model": Spec("pick-place", "Deployment name to connect to (sequence_ai.connect(model=...)).",
                  validator=_non_empty),
    "gateway_url": Spec("", "Gateway URL; empty = $SEQUENCES_GATEWAY_URL or http://127.0.0.1:8470.",
                        validator=lambda v: None if not v or v.startswith(("http://", "https://"))
                        else f"{v!r} is not an http(s) URL"),
    "api_key_env": Spec("SEQUENCES_API_KEY", "Name of the environment variable holding the API key (never the key itself).",
                        validator=lambda v: _non_empty(v) or _identifier(v)),
    "connect_retry_s": Spec(2.0, "Seconds between attempts to reach a gateway that is not up yet (configure).",
                            lo=0.05, hi=60.0),
    "connect_timeout_s": Spec(0.0, "Give up configuring after this long without a gateway (s); 0 = keep trying.",
                              lo=0.0, hi=_BIG),
    "camera_views": Spec(["exterior_1", "wrist_left"], "Camera view names, in the policy's vocabulary."),
    "camera_topics": Spec(["camera/exterior_1/image_raw", "camera/wrist_left/image_raw"],
                          "Camera topic per view, same order as camera_views."),
    "camera_transports": Spec(_STRINGS, "Per view: raw (sensor_msgs/Image), compressed (sensor_msgs/CompressedImage) "
                                        "or a registered 'pkg/msg/Type'; empty = raw for all."),
    "camera_time_bases": Spec(_STRINGS, "Per view: receive (arrival time) or header (header.stamp); empty = receive.",
                              each=_VIEW_RULES),
    "camera_alignments": Spec(_STRINGS, "Per view: latest, asof (newest not after the control tick) or drop "
                                        "(each frame used once); empty = latest.", each=_ALIGN),
    "joint_state_topic": Spec("joint_states", "Joint state topic.", validator=_relative_or_absolute_topic),
    "joint_state_type": Spec("sensor_msgs/msg/JointState", "Joint state message type (a registered decoder)."),
    "joint_state_time_base": Spec("receive", "receive or header (see camera_time_bases).", choices=_VIEW_RULES),
    "joint_state_alignment": Spec("latest", "latest, asof or drop (see camera_alignments).", choices=_ALIGN),
    "joint_names": Spec([f"panda_joint{i}" for i in range(1, 8)], "Arm joints in the policy's joint_positions "
                        "order, as named in the joint state messages.", validator=_distinct_names),
    "gripper_joint": Spec("panda_gripper", "Joint state name carrying the gripper value; empty = none."),
    "codec_modules": Spec(_STRINGS, "Python modules imported at configure that register custom decoders/encoders "
                                    "(sequence_ai_ros.codecs)."),
    "command_mode": Spec("joint_commands", "Where arm commands go: joint_commands (command_topic/command_type, "
                         "arm + gripper in one message), forward_command_controller (<arm_controller>/commands, "
                         "Float64MultiArray of len(arm_joints)) or joint_trajectory_controller "
                         "(<arm_controller>/joint_trajectory).", choices=COMMAND_MODES),
    "arm_controller": Spec("fr3_arm_controller", "ros2_control controller name for the arm (command_mode != joint_commands)."),
    "arm_joints": Spec(list(FR3_ARM_JOINTS), "The arm controller's joints, in the policy's action order "
                       "(command_mode != joint_commands).", validator=_distinct_names),
    "gripper_output": Spec("none", "Where the gripper value goes when command_mode is a controller: none, "
                           "forward_command_controller (<gripper_controller>/commands) or joint_trajectory_controller "
                           "(<gripper_controller>/joint_trajectory).", choices=GRIPPER_OUTPUTS),
    "gripper_controller": Spec("fr3_gripper_controller", "ros2_control controller name for the gripper."),
    "gripper_joints": Spec(["fr3_finger_joint1"], "The gripper controller's joints (each gets the gripper command).",
                           validator=_distinct_names),
    "gripper_scale": Spec(1.0, "Gripper command = policy gripper value x this (e.g. 0.04 m for an FR3 finger "
                               "joint from a 0..1 action).", lo=-_BIG, hi=_BIG),
    "trajectory_output": Spec("rows", "command_mode joint_trajectory_controller: rows (one single-point "
                              "trajectory per control tick) or chunk (each chunk as one JointTrajectory, every row "
                              "at its time_from_start, stamped with its first row's due time so it takes over from "
                              "the playing one at the seam).", choices=("rows", "chunk")),
    "trajectory_velocities": Spec(False, "trajectory_output chunk: give every point velocities from the rows "
                                         "(central differences) for a controller that interpolates position + "
                                         "velocity (cubic: joint velocity continuous across seams)."),
    "command_topic": Spec("joint_commands", "Joint command topic (command_mode joint_commands).",
                          validator=_relative_or_absolute_topic),
    "command_type": Spec("float64_multi_array", "float64_multi_array, joint_trajectory, joint_state, or a registered "
                                                "encoder (command_mode joint_commands)."),
    "command_interface": Spec("position", "position or velocity: what the action rows are and which field "
                              "JointTrajectory/JointState commands fill.", choices=("position", "velocity")),
    "command_joint_names": Spec(_STRINGS, "Names for JointTrajectory/JointState commands; empty = joint_names + gripper_joint."),
    "hold_mode": Spec("hold_last", "hold_last (publish the last command once) or zeros (zero the arm joints, for "
                      "velocity interfaces).", choices=("hold_last", "zeros"), runtime=True),
    "publish_delay_ms": Spec(2.0, "Commands go out on the driver's own monotonic grid this long (ms) after the "
                                  "core's paced deadline, absorbing its wake-up jitter; must be below half a control "
                                  "period; 0 = publish from the core's callback directly.", lo=0.0, hi=1000.0),
    "publish_gil_lead_ms": Spec(0.0, "The publisher thread (publish_delay_ms > 0) takes Python's GIL back this long "
                                     "(ms) before each command's due time and sleeps to it holding the GIL, so another "
                                     "thread's long C call (JPEG encode, JSON, the executor) cannot delay the publish; "
                                     "the driver's other Python threads pause at most this long per command (1 ms = "
                                     "1.5 % of the time at 15 Hz, 10 % at 100 Hz). 0 = off (the default: with the "
                                     "thread at realtime_priority it measured better off).", lo=0.0, hi=100.0),
    "realtime_priority": Spec(REALTIME_PRIORITY, "SCHED_FIFO priority (1-99) of the publisher thread "
                                 "(publish_delay_ms > 0); 0 = normal scheduling. Needs CAP_SYS_NICE or an rtprio "
                                 "limit (ulimit -r); where the OS refuses, the thread runs at normal priority (logged "
                                 "once: info at the default 40, a warning for any other value). Default 40: below "
                                 "ros2_control's controller_manager (50), so it never delays a controller's "
                                 "update.", lo=0, hi=99),
    "control_rate_hz": Spec(0.0, "Cross-check of the contract's control_frequency_hz (Hz); 0 = accept the "
                                 "contract. A mismatch refuses to configure.", lo=0.0, hi=10000.0),
    "max_sensor_age_s": Spec(0.5, "A frame or joint state older than this (s) stops the run (reason validate) "
                                  "with a hold.", lo=0.0, hi=3600.0, above=True, runtime=True),
    "camera_max_frame_age_s": Spec(_DOUBLES, "Per view: the most a camera may go without a fresh frame (s) -- new "
                                             "pixels (see camera_frozen_pixels) and an advancing header stamp. A "
                                             "frozen or stalled camera past it stops new requests, holds and ends the "
                                             "goal with reason stale_camera naming the view; empty = max_sensor_age_s "
                                             "for every view.", runtime=True),
    "camera_frozen_pixels": Spec(True, "A frame with the same pixels as the one before is not fresh (a real sensor's "
                                       "noise makes every frame differ); false for simulated cameras, which render a "
                                       "still scene identically (then stamps and arrivals alone count).", runtime=True),
    "sensor_wait_s": Spec(10.0, "How long a goal waits for the first frames and joint state (s).",
                          lo=0.0, hi=3600.0, runtime=True),
    "default_max_seconds": Spec(60.0, "Time bound used when a goal's max_seconds is 0 (s); must be > 0.",
                                lo=0.0, hi=_BIG, above=True, runtime=True),
    "prefetch": Spec(True, "Request the next chunk while the current one plays (from the next goal).", runtime=True),
    "lookahead": Spec(1, "Chunks held ahead in the buffer (from the next goal).", lo=0, hi=64, runtime=True),
    "smooth_seam": Spec(0, "Ramp the first N steps of each new chunk out of the last action (absolute spaces "
                           "only; from the next goal).", lo=0, hi=1000, runtime=True),
    "joint_lower": Spec(_DOUBLES, "Lower bound per command dimension for validate (rad / gripper units); empty = none.",
                        runtime=True),
    "joint_upper": Spec(_DOUBLES, "Upper bound per command dimension for validate; empty = none.", runtime=True),
    "goal_policy": Spec("preempt", "A new Act goal while one runs: preempt (the old one ends interrupted) or reject.",
                        choices=("preempt", "reject"), runtime=True),
    "feedback_hz": Spec(4.0, "Act feedback rate while a goal runs (Hz, >= 2).", lo=2.0, hi=1000.0, runtime=True),
    "status_hz": Spec(1.0, "~/status and /diagnostics rate (Hz).", lo=0.0, hi=100.0, above=True, runtime=True),
    "ready_timeout_s": Spec(300.0, "How long ~/wait_until_ready waits for a cold deployment (s).",
                            lo=0.0, hi=_BIG, above=True, runtime=True),
    "success_service": Spec("", "Optional sequence_ai_msgs/srv/CheckSuccess service polled during a run; success "
                                "ends it early with reason 'until'. Empty = run until max_seconds."),
    "success_poll_hz": Spec(2.0, "How often the success service (or a goal's stop_when service) is asked during "
                                 "a run (Hz).", lo=0.0, hi=100.0, above=True),
    "stop_conditions": Spec(_STRINGS, "Named stop conditions an Act goal's or ~/start_policy's stop_when may ask for, "
                                      "as name=/service entries (each a sequence_ai_msgs/srv/CheckSuccess service, "
                                      "polled at success_poll_hz); success ends the run with reason stop_when.",
                            validator=_stop_conditions),
    "operator_topic": Spec("~/operator_active", "std_msgs/Bool topic of the human operator, who outranks every "
                                                "client: while true, Act goals and ~/start_policy are refused "
                                                "(reason operator) and a run under way holds within one control "
                                                "period and ends operator. Empty = no operator topic.",
                           validator=_topic_or_empty, fixed=True),
}


def _kind(spec: Spec) -> str:
    d = spec.default
    if d == _STRINGS or (isinstance(d, list) and (not d or isinstance(d[0], str))):
        return "strings"
    if d == _DOUBLES:
        return "doubles"
    if isinstance(d, bool):
        return "bool"
    if isinstance(d, float):
        return "float"
    return "int" if isinstance(d, int) else "string"


def _range_text(spec: Spec) -> str:
    lo = "" if spec.lo is None else (f"> {spec.lo:g}" if spec.above else f">= {spec.lo:g}")
    hi = "" if spec.hi is None or spec.hi >= _BIG else f"<= {spec.hi:g}"
    return " and ".join(t for t in (lo, hi) if t)


def check(name: str, value: Any) -> Any:
    """Validate one value of parameter ``name`` against its type, range, choices and validator.

    Returns the value normalised (floats as ``float``, arrays as lists, an unset typed array as
    None). Raises :class:`ParameterRefused` naming the parameter, the value and what it takes.
    """
    value = _check_value(name, value)
    spec = TABLE[name]
    if spec.validator is not None and value is not None:
        why = spec.validator(value)
        if why:
            raise ParameterRefused(f"parameter {name}: {why}")
    return value


def _check_value(name: str, value: Any) -> Any:
    spec = TABLE[name]
    kind = _kind(spec)
    if value is None:
        if spec.default in (_STRINGS, _DOUBLES):
            return None
        raise ParameterRefused(f"parameter {name} has no value ({spec.description})")
    if kind in ("float", "int"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParameterRefused(f"parameter {name} takes a number ({spec.description}), got {value!r}")
        if kind == "int" and isinstance(value, float):
            raise ParameterRefused(f"parameter {name} takes an integer, got {value!r}")
        value = float(value) if kind == "float" else int(value)
        if not math.isfinite(value):
            raise ParameterRefused(f"parameter {name} must be a finite number, got {value!r}")
        low_bad = spec.lo is not None and (value <= spec.lo if spec.above else value < spec.lo)
        if low_bad or (spec.hi is not None and value > spec.hi):
            raise ParameterRefused(f"{name} must be {_range_text(spec)}, got {value:g}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ParameterRefused(f"parameter {name} takes true or false, got {value!r}")
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise ParameterRefused(f"parameter {name} takes a string, got {value!r}")
        if spec.choices is not None and value not in spec.choices:
            raise ParameterRefused(f"parameter {name}={value!r} must be one of {spec.choices}")
        return value
    return _check_array(name, spec, kind, value)


def _check_array(name: str, spec: Spec, kind: str, value: Any) -> Any:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ParameterRefused(f"parameter {name} takes a list, got {value!r}")
    items = list(value)
    if kind == "doubles":
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in items):
            raise ParameterRefused(f"parameter {name} takes a list of finite numbers, got {items!r}")
        return [float(v) for v in items] or None
    if any(not isinstance(v, str) for v in items):
        raise ParameterRefused(f"parameter {name} takes a list of strings, got {items!r}")
    if spec.each is not None:
        bad = [v for v in items if v not in spec.each]
        if bad:
            raise ParameterRefused(f"{name}: {bad} not in {spec.each}")
    return items if (items or spec.default != _STRINGS) else None


class Params:
    """The validated parameter values, frozen: read as ``p.name`` or ``p["name"]``.

    A change at run time makes a new object (:meth:`replace`); the node swaps its reference, so
    a reader always sees one consistent set.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Dict[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"Params is frozen: cannot set {name}")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def get(self, name: str, default: Any = None) -> Any:
        """``p[name]`` or ``default`` when there is no such parameter."""
        return self._values.get(name, default)

    def replace(self, cross_check: bool = True, **changes: Any) -> "Params":
        """A new Params with ``changes`` applied (each checked with :func:`check`) and, unless
        ``cross_check`` is False, the cross-field rules re-checked (:func:`check_all`; configure
        checks them anyway). Raises :class:`ParameterRefused`."""
        values = dict(self._values)
        for name, value in changes.items():
            values[name] = check(name, value)
        new = Params(values)
        if cross_check:
            check_all(new)
        return new

    @property
    def command_width(self) -> int:
        """Values per action row: arm joints plus one for the gripper (when ``gripper_joint`` is set)."""
        return len(self.joint_names) + (1 if self.gripper_joint else 0)


def check_all(p: Params) -> None:
    """Cross-field rules. Raises :class:`ParameterRefused` naming the parameters at odds."""
    views, topics = list(p.camera_views), list(p.camera_topics)
    if not views:
        raise ParameterRefused("camera_views is empty: name at least one camera view")
    if len(views) != len(topics):
        raise ParameterRefused(f"camera_views has {len(views)} entries but camera_topics has {len(topics)}")
    for key in ("camera_transports", "camera_time_bases", "camera_alignments", "camera_max_frame_age_s"):
        given = p[key]
        if given and len(given) != len(views):
            raise ParameterRefused(f"{key} has {len(given)} entries but camera_views has {len(views)}: give one per view")
    bad_age = [a for a in (p.camera_max_frame_age_s or []) if not 0 < a <= 3600.0]
    if bad_age:
        raise ParameterRefused(f"camera_max_frame_age_s has {bad_age}: each must be in (0, 3600] s")
    if not p.joint_names:
        raise ParameterRefused("joint_names is empty: name the arm joints in the policy's order")
    width = p.command_width
    for key in ("joint_lower", "joint_upper"):
        bound = p[key]
        if bound and len(bound) != width:
            raise ParameterRefused(f"{key} has {len(bound)} entries; a command has {width} "
                                   f"(len(joint_names) + gripper): give one per dimension or none")
    lower, upper = p.joint_lower, p.joint_upper
    if lower and upper:
        bad = [i for i, (a, b) in enumerate(zip(lower, upper)) if a > b]
        if bad:
            raise ParameterRefused(f"joint_lower > joint_upper at dimension(s) {bad}")
    if p.hold_mode == "zeros" and p.command_interface != "velocity":
        raise ParameterRefused("hold_mode zeros commands 0 to the arm joints: only for command_interface velocity "
                               "(on a position interface it would send the arm to 0 rad); use hold_last")
    _check_outputs(p)


def _check_outputs(p: Params) -> None:
    if p.command_mode == "joint_commands":
        return
    if len(p.arm_joints) != len(p.joint_names):
        raise ParameterRefused(
            f"arm_joints has {len(p.arm_joints)} names but the policy commands {len(p.joint_names)} arm joints "
            f"(joint_names): the {p.command_mode} takes exactly one value per arm joint")
    if len(set(p.arm_joints)) != len(p.arm_joints) or any(not j for j in p.arm_joints):
        raise ParameterRefused(f"arm_joints must be distinct, non-empty names, got {list(p.arm_joints)}")
    if not p.arm_controller:
        raise ParameterRefused("arm_controller is empty: name the ros2_control controller")
    if p.command_mode == "joint_trajectory_controller" and p.command_interface != "position":
        raise ParameterRefused(
            "command_mode joint_trajectory_controller needs command_interface position: its default settings "
            "take positions for every joint; drive a velocity policy through forward_command_controller")
    if p.gripper_output != "none":
        if not p.gripper_joint:
            raise ParameterRefused(f"gripper_output {p.gripper_output} needs a gripper value: set gripper_joint")
        if not p.gripper_joints or not p.gripper_controller:
            raise ParameterRefused(f"gripper_output {p.gripper_output} needs gripper_controller and gripper_joints")


def descriptor(name: str) -> ParameterDescriptor:
    """The ``ParameterDescriptor`` for ``name``: description, range, read_only."""
    spec = TABLE[name]
    kind = _kind(spec)
    extra = {"runtime": ["changes apply at run time"], "start": ["fixed at start"],
             "configure": ["read at configure: change it while unconfigured"]}[spec.when]
    if spec.choices:
        extra.append(f"one of {', '.join(spec.choices)}")
    if kind in ("float", "int") and _range_text(spec):
        extra.append(_range_text(spec))
    d = ParameterDescriptor(
        description=spec.description,
        additional_constraints="; ".join(extra),
        read_only=spec.fixed,
        dynamic_typing=kind == "float",
    )
    if kind == "int" and spec.lo is not None and spec.hi is not None:
        d.integer_range = [IntegerRange(from_value=int(spec.lo), to_value=int(spec.hi), step=1)]
    # rclpy applies a FloatingPointRange only to a double value; with dynamic typing (a YAML
    # integer for a float) check() enforces the same range, and an exclusive lower bound.
    d.floating_point_range = float_range(name)
    return d


def float_range(name: str) -> List[FloatingPointRange]:
    """The ``FloatingPointRange`` of a float parameter (empty when open on both sides)."""
    spec = TABLE[name]
    if _kind(spec) != "float" or spec.lo is None or spec.hi is None:
        return []
    return [FloatingPointRange(from_value=float(spec.lo), to_value=float(spec.hi), step=0.0)]


def declare(node, table: Optional[Dict[str, Spec]] = None) -> Params:
    """Declare every parameter of ``table`` (default :data:`TABLE`) on ``node`` and return the
    validated, frozen :class:`Params`.

    Raises:
        ParameterRefused (a ValueError): a value is out of range, of the wrong type, or the
            values contradict each other (names the parameter and what it takes).
    """
    from rclpy.exceptions import ParameterUninitializedException
    from rclpy.parameter import Parameter

    table = TABLE if table is None else table
    values: Dict[str, Any] = {}
    for name, spec in table.items():
        d = descriptor(name)
        default = spec.default
        if default == _STRINGS:
            default = Parameter.Type.STRING_ARRAY
        elif default == _DOUBLES:
            default = Parameter.Type.DOUBLE_ARRAY
        try:
            node.declare_parameter(name, default, d)
        except Exception as exc:   # rclpy's range/type refusal: say it in the table's words
            override = node._parameter_overrides.get(name) if hasattr(node, "_parameter_overrides") else None
            if override is not None:
                check(name, override.value)
            raise ParameterRefused(f"parameter {name}: {exc}") from None
        try:
            value = node.get_parameter(name).value
        except ParameterUninitializedException:
            value = None
        values[name] = check(name, value)
    params = Params(values)
    check_all(params)
    return params

