"""``policy_driver``: drives a robot with a deployed policy, as a ROS 2 node.

The whole data path passes through here, in order:

1. subscriptions keep recent camera frames and joint states (``observation.py``; decoders from
   ``codecs.py``: ``sensor_msgs/Image`` or ``sensor_msgs/CompressedImage`` per camera, or a
   registered custom type);
2. an ``Act`` goal (``sequence_ai_msgs/action/Act``, what a VLM calls as a tool) starts
   ``Policy.act()`` from ``sequence_ai`` -- the core fetches action chunks from the worker's
   ``/act``, prefetches the next while one plays, and paces actions on the monotonic clock at
   the chunk's control frequency;
3. each action is published as a joint command (``command_type``: ``std_msgs/Float64MultiArray``
   for a ros2_control forward controller, ``trajectory_msgs/JointTrajectory`` or
   ``sensor_msgs/JointState``).

Publishing and pacing. The core owns the schedule: action *k* is due at
``t0 + k / control_frequency_hz`` on ``time.monotonic()`` (drift-free, resynced rather than
bursting when late), and it calls ``act(row)`` at that instant on the goal's thread -- an asyncio
loop that also observes, encodes and parses HTTP, whose timers wake up to 1 ms late (epoll's
millisecond timeout) and later still when another thread holds the GIL. So ``act(row)`` only
hands the row to the node's publisher thread (``_CommandGate``), which publishes it on its own
monotonic grid, one control period apart, ``publish_delay_ms`` after the core's deadline: the
core's wake-up jitter is absorbed by that small fixed delay instead of reaching the robot.
``publish_delay_ms: 0`` publishes straight from the core's callback (no thread). The process's
GIL switch interval is lowered in ``main()`` (``GIL_SWITCH_INTERVAL_S``) so a thread that wakes
at its deadline waits less for the interpreter. ``bench/bench_publish_jitter.py`` measures the
publish period error.

Control rate. It comes from the policy's contract (``control_frequency_hz``). The
``control_rate_hz`` parameter is a cross-check only: 0 (default) accepts the contract, any
other value that disagrees with it makes the node refuse to start (``ValueError``).

Stopping. Cancelling the goal calls ``Policy.interrupt()``; the core unwinds through ``hold``,
which publishes one hold command (``hold_mode``: the last published command, or zeros for the
arm joints of a velocity interface) and latches the publisher shut, so no command can follow the
hold: a row still waiting in the publisher thread is dropped (the latch and the thread's publish
share one lock). Every early ending (cancel, preempt, validate, error, timeout) goes through
``hold``; a run that ends ``completed`` / ``until`` first lets its last queued row go out, then
latches. The result's ``actions`` counts commands actually published.

Sensors. Before every action ``validate`` asks the assembler for problems: a stale stream
(older than ``max_sensor_age_s``) or a malformed message (wrong encoding, wrong size) ends the
run with reason ``validate`` and a hold; the result's ``message`` names the stream. ``observe``
never raises for a stale stream: it returns the last good observation so the core's request
does not fail, and the next ``validate`` stops the run before any action computed from it plays.

Goals. A new goal while one runs preempts it by default (``goal_policy: preempt``; the old goal
is aborted with reason ``interrupted`` and message ``preempted by a new goal``) or is rejected
(``goal_policy: reject``). Feedback is published by a timer at ``feedback_hz`` (>= 2 Hz).

Other interfaces: ``~/instruction`` (``std_msgs/String``) swaps the instruction without stopping
(``Policy.set_instruction``); ``~/status`` (``diagnostic_msgs/DiagnosticArray``) reports the
lifecycle and latency figures at ``status_hz``; ``~/wait_until_ready`` (``std_srvs/Trigger``)
blocks its own callback group until a cold deployment can serve. Every name is relative, so a
namespace (``-r __ns:=/left``) gives two drivers in one process their own robots.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import List, Optional

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from std_msgs.msg import String
from std_srvs.srv import Trigger

import sequence_ai
from sequence_ai_msgs.action import Act
from sequence_ai_msgs.srv import CheckSuccess

from . import codecs
from ._params import declare_parameters
from ._spin import spin_node
from .codecs import SensorDataError
from .observation import JOINT_STREAM, ObservationAssembler, SensorError, StreamRule
from .bag import events as _capture  # issue 7: episode markers for recorder_node

GIL_SWITCH_INTERVAL_S = 0.0005
"""sys.setswitchinterval() that ``main()`` sets for the driver process (s; CPython's default is
0.005): a thread woken at its publish deadline waits at most about this long for the GIL held by
an rclpy executor thread running Python code. A process-wide setting, so the node's constructor
leaves it alone; an embedding process (the demo, the benchmark) may set it the same way."""

_S = Parameter.Type.STRING_ARRAY
_D = Parameter.Type.DOUBLE_ARRAY

_PARAMS = {
    # name: (default or type, description)
    "model": ("pick-place", "Deployment name to connect to (sequence_ai.connect(model=...))."),
    "gateway_url": ("", "Gateway URL; empty = $SEQUENCES_GATEWAY_URL or http://127.0.0.1:8470."),
    "api_key_env": ("SEQUENCES_API_KEY", "Name of the environment variable holding the API key (never the key itself)."),
    "camera_views": (["exterior_1", "wrist_left"], "Camera view names, in the policy's vocabulary."),
    "camera_topics": (
        ["camera/exterior_1/image_raw", "camera/wrist_left/image_raw"],
        "Camera topic per view, same order as camera_views.",
    ),
    "camera_transports": (_S, "Per view: raw (sensor_msgs/Image), compressed (sensor_msgs/CompressedImage) "
                              "or a registered 'pkg/msg/Type'; empty = raw for all."),
    "camera_time_bases": (_S, "Per view: receive (arrival time) or header (header.stamp); empty = receive."),
    "camera_alignments": (_S, "Per view: latest, asof (newest not after the control tick) or drop (each frame used once); empty = latest."),
    "joint_state_topic": ("joint_states", "Joint state topic."),
    "joint_state_type": ("sensor_msgs/msg/JointState", "Joint state message type (a registered decoder)."),
    "joint_state_time_base": ("receive", "receive or header (see camera_time_bases)."),
    "joint_state_alignment": ("latest", "latest, asof or drop (see camera_alignments)."),
    "joint_names": (
        ["panda_joint1", "panda_joint2", "panda_joint3", "panda_joint4", "panda_joint5", "panda_joint6", "panda_joint7"],
        "Arm joints in the policy's joint_positions order.",
    ),
    "gripper_joint": ("panda_gripper", "Joint state name carrying the gripper value; empty = none."),
    "codec_modules": (_S, "Python modules imported at start that register custom decoders/encoders (sequence_ai_ros.codecs)."),
    "command_topic": ("joint_commands", "Joint command topic."),
    "command_type": ("float64_multi_array", "float64_multi_array, joint_trajectory, joint_state, or a registered encoder."),
    "command_interface": ("position", "position or velocity: which field JointTrajectory/JointState commands fill."),
    "command_joint_names": (_S, "Names for JointTrajectory/JointState commands; empty = joint_names + gripper_joint."),
    "hold_mode": ("hold_last", "hold_last (publish the last command once) or zeros (zero the arm joints, for velocity interfaces)."),
    "publish_delay_ms": (2.0, "Commands go out on the driver's own monotonic grid this long (ms) after the core's "
                              "paced deadline, absorbing its wake-up jitter; must be below half a control period; "
                              "0 = publish from the core's callback directly."),
    "realtime_priority": (0, "SCHED_FIFO priority (1-99) of the publisher thread (publish_delay_ms > 0); 0 = normal "
                             "scheduling. Needs CAP_SYS_NICE or an rtprio limit; refused by the OS = a warning."),
    "control_rate_hz": (0.0, "Cross-check of the contract's control_frequency_hz (Hz); 0 = accept the contract. A mismatch refuses to start."),
    "max_sensor_age_s": (0.5, "A frame or joint state older than this (s) stops the run (reason validate) with a hold."),
    "sensor_wait_s": (10.0, "How long a goal waits for the first frames and joint state (s)."),
    "default_max_seconds": (60.0, "Time bound used when a goal's max_seconds is 0 (s); must be > 0."),
    "prefetch": (True, "Request the next chunk while the current one plays."),
    "lookahead": (1, "Chunks held ahead in the buffer."),
    "smooth_seam": (0, "Ramp the first N steps of each new chunk out of the last action (absolute spaces only)."),
    "joint_lower": (_D, "Lower bound per command dimension for validate (rad / gripper units); empty = none."),
    "joint_upper": (_D, "Upper bound per command dimension for validate; empty = none."),
    "goal_policy": ("preempt", "A new Act goal while one runs: preempt (the old one ends interrupted) or reject."),
    "feedback_hz": (4.0, "Act feedback rate while a goal runs (Hz, >= 2)."),
    "status_hz": (1.0, "~/status diagnostics rate (Hz)."),
    "ready_timeout_s": (300.0, "How long ~/wait_until_ready waits for a cold deployment (s)."),
    "success_service": (
        "",
        "Optional sequence_ai_msgs/srv/CheckSuccess service polled during a run; success ends it "
        "early with reason 'until'. Empty = run until max_seconds.",
    ),
    "success_poll_hz": (2.0, "How often the success service is asked during a run (Hz)."),
}

_CHOICES = {
    "command_interface": ("position", "velocity"),
    "hold_mode": ("hold_last", "zeros"),
    "goal_policy": ("preempt", "reject"),
    "joint_state_time_base": ("receive", "header"),
    "joint_state_alignment": ("latest", "asof", "drop"),
}


@dataclass
class RunTrace:
    """What one goal commanded: for plots and tests.

    ``commands``: (monotonic time s, values) per published command; ``seams``: index into
    ``commands`` where each chunk started; ``hold_time``: monotonic time of the hold, if any.
    """

    commands: list = field(default_factory=list)
    seams: list = field(default_factory=list)
    hold_time: Optional[float] = None
    hold_command: Optional[list] = None


def _per_view(values, views, default, name, choices=None) -> List[str]:
    values = list(values or [])
    if not values:
        return [default] * len(views)
    if len(values) != len(views):
        raise ValueError(f"{name} has {len(values)} entries but camera_views has {len(views)}: give one per view")
    if choices is not None:
        bad = [v for v in values if v not in choices]
        if bad:
            raise ValueError(f"{name}: {bad} not in {choices}")
    return values


def set_thread_realtime(priority: int) -> Optional[str]:
    """Put the calling thread under ``SCHED_FIFO`` at ``priority`` (1..99); 0 = leave it alone.

    Returns None on success (or for 0), else why not (the OS said no: needs CAP_SYS_NICE or an
    ``rtprio`` limit, e.g. ``ulimit -r 99`` / ``/etc/security/limits.conf``; or not Linux).
    """
    if priority <= 0:
        return None
    if not hasattr(os, "sched_setscheduler"):
        return "SCHED_FIFO is not available on this OS"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(int(priority)))  # 0: this thread (Linux)
    except OSError as exc:
        return f"SCHED_FIFO priority {priority} refused ({exc.strerror}): grant CAP_SYS_NICE or an rtprio limit"
    return None


class _CommandGate:
    """Where every joint command leaves the driver: the publisher thread and the hold latch.

    The core calls ``submit(values)`` at each action's paced deadline, on its asyncio thread.

    - ``delay_s == 0``: the row is published right there, inside the core's callback.
    - ``delay_s > 0`` and the period known (``open`` / ``set_period``): the row is queued with a
      due time on the gate's own grid and the gate's thread publishes it then
      (``time.monotonic()`` seconds)::

          d = min(delay_s, period_s / 2)
          due(0) = arrival(0) + d
          due(k) = max(due(k-1) + period_s, arrival(k) + d)

      so rows leave exactly one control period apart, ``d`` (plus the worst wake-up
      lateness of the core so far) after the core's deadlines. A row that arrives later than
      its slot allows (the core woke late, or resynced after an underrun) moves the grid later
      -- one irregular period -- and never earlier, so there is no burst and no catching up.
      The first row of a run waits ``d``: at most half a period. Later rows wait ``d`` plus the
      largest lateness of the core since it last resynced (it resyncs when more than a period
      late), so a row leaves at most about ``d`` + one period after the core's deadline.

    Safety, all under one lock (``cond``): ``hold(target)`` latches the gate, drops whatever is
    queued and publishes the hold once; the thread re-checks the latch and the queue under the
    same lock immediately before it publishes. So a queued row never follows a hold, a cancel or
    a stop; nothing is published while latched (between runs). ``open()`` starts a run;
    ``drain()`` ends one that finished normally (its last rows go out, then the latch).

    Args:
        publish: ``publish(values)`` sends one command (called with the lock held).
        delay_s: see above (s, >= 0).
        on_published: ``on_published(t, values, due)`` after each published row: when it went
            out and when it was due (monotonic s; ``due`` is None without the thread).
        rt_priority: SCHED_FIFO priority of the publisher thread (0 = normal scheduling).
        on_rt_error: called with the reason when ``rt_priority`` could not be applied.
    """

    def __init__(self, publish, delay_s: float, on_published, rt_priority: int = 0, on_rt_error=None) -> None:
        if not (delay_s >= 0.0 and math.isfinite(delay_s)):
            raise ValueError(f"publish delay must be a finite number of seconds >= 0, got {delay_s}")
        self._publish = publish
        self._on_published = on_published
        self.delay_s = float(delay_s)
        self.cond = threading.Condition()
        self.latched = True               # no command before a run starts, none after its hold
        self.last: Optional[list] = None  # the last published row of this run
        self.accepted = 0                 # rows handed over by the core in this run
        self.regrids = 0                  # rows that moved the grid later (diagnostics)
        self._queue: deque = deque()      # (due monotonic s, values)
        self._next_due: Optional[float] = None
        self._period_s: Optional[float] = None
        self._stopped = False
        self._thread = None
        self._rt_priority = int(rt_priority)
        self._on_rt_error = on_rt_error
        if self.delay_s > 0:
            self._thread = threading.Thread(target=self._run, name="policy_driver_publisher", daemon=True)
            self._thread.start()

    def open(self, period_s: Optional[float]) -> None:
        """Start a run: unlatch, empty grid; ``period_s`` (s) is the control period, None = unknown yet."""
        with self.cond:
            self.latched, self.last, self.accepted, self.regrids = False, None, 0, 0
            self._queue.clear()
            self._next_due = None
            self._period_s = period_s

    def set_period(self, period_s: float) -> None:
        """The control period (s) of the chunk that is starting (the node refuses rate changes)."""
        with self.cond:
            self._period_s = float(period_s)

    def submit(self, values: list) -> bool:
        """Take one row from the core (at its deadline); False when latched (the row is dropped)."""
        arrival = time.monotonic()
        with self.cond:
            if self.latched:
                return False
            self.accepted += 1
            if self._thread is None or self._period_s is None:
                self._emit(values)
                return True
            due = arrival + min(self.delay_s, 0.5 * self._period_s)  # the first row: < one period late
            if self._next_due is not None:
                if due > self._next_due + 1e-4:
                    self.regrids += 1
                due = max(due, self._next_due)
            self._next_due = due + self._period_s
            self._queue.append((due, values))
            self.cond.notify_all()
            return True

    def hold(self, target_for) -> Optional[list]:
        """Latch, drop queued rows and publish ``target_for(last)`` once; None if already latched.

        ``target_for(last_published_or_None)`` returns the hold command (or None: nothing to send).
        Returns the command published (or [] when there was nothing to publish).
        """
        with self.cond:
            if self.latched:
                return None
            self.latched = True
            self._queue.clear()
            self.cond.notify_all()
            target = target_for(self.last)
            if target is None:
                return []
            self._publish(target)
            return target

    def drain(self, timeout_s: float) -> bool:
        """End a run that finished normally: wait (up to ``timeout_s``) for queued rows, then latch.

        Returns True when every queued row went out (rows left after the timeout are dropped).
        """
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self._queue and not self.latched and not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            flushed = not self._queue
            self.latched = True
            self._queue.clear()
            return flushed

    def stop(self) -> None:
        """Latch and end the publisher thread (joined, up to 2 s)."""
        with self.cond:
            self._stopped = True
            self.latched = True
            self._queue.clear()
            self.cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _emit(self, values: list, due: Optional[float] = None) -> None:
        self._publish(values)
        self.last = values
        self._on_published(time.monotonic(), values, due)

    def _run(self) -> None:
        why = set_thread_realtime(self._rt_priority)
        if why is not None and self._on_rt_error is not None:
            self._on_rt_error(why)
        with self.cond:
            while not self._stopped:
                if self.latched or not self._queue:
                    self.cond.wait()
                    continue
                due, values = self._queue[0]
                left = due - time.monotonic()
                if left > 0:
                    self.cond.wait(left)  # a hold, a stop or a new row wakes it: everything is re-checked
                    continue
                self._queue.popleft()
                self._emit(values, due)
                self.cond.notify_all()    # drain() waits for the queue to empty


class PolicyDriver(Node):
    """Drives a robot from ``Act`` goals with a deployed policy (see the module docstring).

    Args:
        node_name: default ``policy_driver``; ``**kwargs`` go to ``rclpy.node.Node`` (namespace,
            context, parameter_overrides, ...).

    Raises:
        ValueError: a parameter is malformed (names it) or ``control_rate_hz`` contradicts the
            policy's contract.
        sequence_ai errors from ``connect`` (wrong key, unknown model, gateway unreachable).
    """

    def __init__(self, node_name: str = "policy_driver", **kwargs) -> None:
        super().__init__(node_name, **kwargs)
        p = declare_parameters(self, _PARAMS)   # floats accept YAML integers (_params.py)
        self._p = p
        for name, choices in _CHOICES.items():
            if p[name] not in choices:
                raise ValueError(f"parameter {name}={p[name]!r} must be one of {choices}")
        for module in p["codec_modules"] or []:
            importlib.import_module(module)
        views, topics = list(p["camera_views"]), list(p["camera_topics"])
        if len(views) != len(topics):
            raise ValueError(f"camera_views has {len(views)} entries but camera_topics has {len(topics)}")
        if p["default_max_seconds"] <= 0:
            raise ValueError("default_max_seconds must be > 0: every run is bounded")
        if p["feedback_hz"] < 2.0:
            raise ValueError(f"feedback_hz must be >= 2 Hz, got {p['feedback_hz']}")
        transports = [codecs.IMAGE_TRANSPORTS.get(t, t) for t in _per_view(p["camera_transports"], views, "raw", "camera_transports")]
        time_bases = _per_view(p["camera_time_bases"], views, "receive", "camera_time_bases", ("receive", "header"))
        aligns = _per_view(p["camera_alignments"], views, "latest", "camera_alignments", ("latest", "asof", "drop"))
        for t in transports:
            codecs.image_decoder(t)  # raises when none is registered
        self._joint_type = str(p["joint_state_type"])
        codecs.joint_decoder(self._joint_type)
        self._encoder = codecs.command_encoder(str(p["command_type"]))
        delay_ms = float(p["publish_delay_ms"])
        if not (delay_ms >= 0.0 and math.isfinite(delay_ms)):
            raise ValueError(f"publish_delay_ms must be >= 0 (0 = no publisher thread), got {delay_ms}")
        rt = int(p["realtime_priority"])     # checked before connect(): a refused start holds no session
        if not 0 <= rt <= 99:
            raise ValueError(f"realtime_priority must be 0 (off) or a SCHED_FIFO priority 1..99, got {rt}")
        self._lower = list(p["joint_lower"] or []) or None   # typed, unset by default
        self._upper = list(p["joint_upper"] or []) or None
        self._n_arm = len(p["joint_names"])
        self._cmd_names = list(p["command_joint_names"] or []) or (
            list(p["joint_names"]) + ([p["gripper_joint"]] if p["gripper_joint"] else []))

        # connect first: the contract gives the control rate and the camera sizes
        api_key = os.environ.get(p["api_key_env"]) or None
        self.policy = sequence_ai.connect(p["model"], api_key=api_key, gateway_url=p["gateway_url"] or None)
        self.policy.__enter__()
        try:
            contract = self.policy.contract or {}
            self.control_rate_hz = self._check_rate(contract)
            if delay_ms > 0 and self.control_rate_hz and delay_ms / 1000.0 >= 0.5 / self.control_rate_hz:
                raise ValueError(
                    f"publish_delay_ms={delay_ms:g} is not below half the control period of {p['model']} "
                    f"({500.0 / self.control_rate_hz:.3g} ms at {self.control_rate_hz:g} Hz): lower it, or set 0")
            cams = ((contract.get("observation") or {}).get("cameras") or {})
            sizes = {v: (int(c["width"]), int(c["height"])) for v, c in cams.items()
                     if v in views and isinstance(c, dict) and "width" in c}
        except BaseException:
            self.policy.__exit__(None, None, None)
            raise

        rules = {v: StreamRule(tb, al) for v, tb, al in zip(views, time_bases, aligns)}
        rules[JOINT_STREAM] = StreamRule(p["joint_state_time_base"], p["joint_state_alignment"])
        self.assembler = ObservationAssembler(
            views, p["joint_names"], p["gripper_joint"] or None, max_age_s=float(p["max_sensor_age_s"]),
            rules=rules, header_clock=lambda: self.get_clock().now().nanoseconds * 1e-9, camera_sizes=sizes,
        )
        sensors = MutuallyExclusiveCallbackGroup()
        for view, topic, type_name in zip(views, topics, transports):
            self.create_subscription(
                codecs.message_class(type_name), topic,
                lambda msg, v=view, t=type_name: self._on_image(v, msg, t), qos_profile_sensor_data,
                callback_group=sensors,
            )
        self.create_subscription(codecs.message_class(self._joint_type), p["joint_state_topic"],
                                 self._on_joint_state, qos_profile_sensor_data, callback_group=sensors)
        self._cmd_pub = self.create_publisher(codecs.message_class(self._encoder.msg_type), p["command_topic"], 10)

        self._gate = _CommandGate(self._publish, delay_ms / 1000.0, self._published, rt,
                                  lambda why: self.get_logger().warning(f"publisher thread not real-time: {why}"))
        self._goal_handle = None
        self._busy = threading.Lock()
        self._cancelled_goals: set = set()   # id() of goals whose cancel this node accepted
        self._preempting = None        # the goal handle a new goal is preempting
        self.trace = RunTrace()
        self._instruction: Optional[str] = None   # set while a run is active
        self._task_done = False
        self._status = "idle"
        self._underruns = 0
        self._stop_reason: Optional[str] = None
        self._last_good = None
        self._observed_at: Optional[float] = None
        self._obs_to_chunk_s: Optional[float] = None
        self._last_outcome = None
        self._run_t0 = 0.0
        self._run_max_s = 1.0
        self._success_client = None
        self._success_call = None
        if p["success_service"]:
            group = MutuallyExclusiveCallbackGroup()
            self._success_client = self.create_client(CheckSuccess, p["success_service"], callback_group=group)
            self.create_timer(1.0 / float(p["success_poll_hz"]), self._poll_success, callback_group=group)
        periodic = MutuallyExclusiveCallbackGroup()
        self.create_timer(1.0 / float(p["feedback_hz"]), self._publish_feedback, callback_group=periodic)
        self._status_pub = self.create_publisher(DiagnosticArray, "~/status", 10)
        # capture (issue 7): start/end markers of each Act episode, for recorder_node
        self._episode_pub = self.create_publisher(String, "~/episode", 10)
        self._episode_started = False
        self.create_timer(1.0 / float(p["status_hz"]), self._publish_status, callback_group=periodic)
        self.create_subscription(String, "~/instruction", self._on_instruction, 10, callback_group=periodic)
        self.create_service(Trigger, "~/wait_until_ready", self._on_wait_until_ready,
                            callback_group=MutuallyExclusiveCallbackGroup())
        self._action_server = ActionServer(
            self, Act, "~/act",
            execute_callback=self._execute,
            goal_callback=self._on_goal,
            cancel_callback=self._on_cancel,
            callback_group=ReentrantCallbackGroup(),
        )

    def _check_rate(self, contract: dict) -> Optional[float]:
        """The control rate (Hz) from the contract, cross-checked with ``control_rate_hz``."""
        declared = (contract.get("action") or {}).get("control_frequency_hz")
        wanted = float(self._p["control_rate_hz"])
        if wanted < 0:
            raise ValueError(f"control_rate_hz must be >= 0 (0 = from the contract), got {wanted}")
        if declared and wanted and abs(float(declared) - wanted) > 1e-6 * float(declared):
            raise ValueError(
                f"control_rate_hz={wanted} contradicts {self._p['model']}'s contract "
                f"(control_frequency_hz={declared}): the rate comes from the policy; set 0 or {declared}")
        return float(declared) if declared else (wanted or None)

    # -- sensors --------------------------------------------------------------------------
    def _on_image(self, view: str, msg, type_name: str) -> None:
        try:
            self.assembler.on_image(view, msg, type_name)
        except SensorDataError as exc:
            self.get_logger().error(f"malformed camera message dropped: {exc}", throttle_duration_sec=2.0)

    def _on_joint_state(self, msg) -> None:
        try:
            self.assembler.on_joint_state(msg, self._joint_type)
        except SensorDataError as exc:
            self.get_logger().error(f"malformed joint state dropped: {exc}", throttle_duration_sec=2.0)

    def _on_instruction(self, msg: String) -> None:
        text = msg.data.strip()
        if not text:
            self.get_logger().warning("ignored empty instruction on ~/instruction")
            return
        self.policy.set_instruction(text)  # thread-safe; takes effect on the next request
        self.get_logger().info(f"instruction now {text!r}")

    def _poll_success(self) -> None:
        """Ask the success service (never blocks: the answer lands in a done-callback)."""
        instruction = self.policy.instruction if self._instruction is not None else None
        if instruction is None or self._task_done or self._success_call is not None:
            return
        if not self._success_client.service_is_ready():
            return
        call = self._success_client.call_async(CheckSuccess.Request(instruction=instruction))
        self._success_call = call

        def done(fut, asked=instruction):
            self._success_call = None
            res = fut.result()
            if res is not None and res.success and self.policy.instruction == asked:
                self._task_done = True

        call.add_done_callback(done)

    # -- periodic -------------------------------------------------------------------------
    def _publish_feedback(self) -> None:
        gh = self._goal_handle
        if gh is None:
            return
        fb = Act.Feedback()
        fb.actions = len(self.trace.commands)
        fb.chunks = len(self.trace.seams)
        fb.underruns = self._underruns
        fb.elapsed_s = time.monotonic() - self._run_t0
        fb.progress = float(min(1.0, fb.elapsed_s / self._run_max_s))
        fb.instruction = self.policy.instruction or (self._instruction or "")
        fb.status = self._status
        try:
            gh.publish_feedback(fb)
        except Exception:  # noqa: BLE001 - the goal ended between the check and the publish
            pass

    def _publish_status(self) -> None:
        level = DiagnosticStatus.OK
        if self._status == "idle" and self._last_outcome is not None and self._last_outcome.reason not in (
                "completed", "until"):
            level = DiagnosticStatus.WARN
        values = {
            "state": self._status,
            "model": str(self._p["model"]),
            "control_rate_hz": f"{self.control_rate_hz or 0.0:g}",
            "actions": str(len(self.trace.commands)),
            "chunks": str(len(self.trace.seams)),
            "underruns": str(self._underruns),
            "observation_to_chunk_s": "" if self._obs_to_chunk_s is None else f"{self._obs_to_chunk_s:.4f}",
            "instruction": self.policy.instruction or "",
            "last_reason": "" if self._last_outcome is None else str(self._last_outcome.reason),
            "last_message": self._stop_reason or "",
        }
        status = DiagnosticStatus(level=level, name=f"{self.get_fully_qualified_name()}", hardware_id=str(self._p["model"]),
                                  message=self._status, values=[KeyValue(key=k, value=v) for k, v in values.items()])
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._status_pub.publish(msg)

    def _on_wait_until_ready(self, request, response):
        """Bring a cold deployment up (blocks this service's own callback group only)."""
        if not self._busy.acquire(blocking=False):
            response.success, response.message = True, "a run is active: the policy is serving"
            return response
        try:
            self._status = "warming"
            waited = self.policy.wait_until_ready(float(self._p["ready_timeout_s"]))
            self.control_rate_hz = self._check_rate(self.policy.contract or {})
            response.success, response.message = True, f"ready after {waited:.1f} s"
        except Exception as exc:  # noqa: BLE001 - reported to the caller, never raised into rclpy
            response.success, response.message = False, f"{type(exc).__name__}: {exc}"
        finally:
            self._status = "idle"
            self._busy.release()
        return response

    # -- the callbacks handed to the core -------------------------------------------------
    def _publish(self, values: list) -> None:
        msg = self._encoder.encode(values, self._cmd_names, 1.0 / (self.control_rate_hz or 15.0),
                                   self._p["command_interface"], self.get_clock().now().to_msg())
        self._cmd_pub.publish(msg)

    def _published(self, t: float, values: list, due: Optional[float]) -> None:
        """The gate published ``values`` at monotonic ``t`` (s; ``due`` unused): record it in the trace."""
        self.trace.commands.append((t, values))

    def _send(self, action) -> None:
        """Hand one action to the publisher (called by the core at the action's deadline).

        Dropped when a hold has latched the gate; see ``_CommandGate`` for when it is published.
        """
        if self._gate.submit([float(x) for x in action]):
            self._status = "running"

    def _hold_target(self, last: Optional[list]) -> Optional[list]:
        """The hold command for ``hold_mode``, from the last published command (or the arm's state)."""
        target = last
        if target is None:  # stopped before the first command: hold where the arm is
            q = self.assembler.latest_joint_positions()
            g = self.assembler.latest_gripper()
            target = None if q is None else q + ([g] if g is not None else [])
        if target is not None and self._p["hold_mode"] == "zeros":
            # velocity interface: stop the arm joints; the gripper keeps its last command
            target = [0.0] * min(self._n_arm, len(target)) + list(target[self._n_arm:])
        return target

    def _hold(self) -> None:
        """Publish one hold command, then latch: nothing is published after it (queued rows are dropped)."""
        target = self._gate.hold(self._hold_target)
        if target is not None:
            self.trace.hold_time = time.monotonic()
            self.trace.hold_command = target or None

    def _validate(self, action) -> bool:
        """Sensors fresh and well-formed; action finite and inside the configured bounds."""
        problems = self.assembler.problems()
        if problems:
            self._stop_reason = "; ".join(problems)
            self.get_logger().error(f"stopping the run (validate): {self._stop_reason}")
            return False
        if not all(math.isfinite(float(x)) for x in action):
            self._stop_reason = f"non-finite action {list(action)}"
            return False
        for i, x in enumerate(action):
            if self._lower is not None and i < len(self._lower) and x < self._lower[i]:
                self._stop_reason = f"action dim {i} = {x:.4f} below joint_lower {self._lower[i]}"
                return False
            if self._upper is not None and i < len(self._upper) and x > self._upper[i]:
                self._stop_reason = f"action dim {i} = {x:.4f} above joint_upper {self._upper[i]}"
                return False
        return True

    def _observe(self, instruction: str):
        """The observation for the next request; never raises for stale data (see module docstring)."""
        gh = self._goal_handle
        if gh is not None and gh.is_cancel_requested:
            # A cancel that arrived while the run was starting: the core clears its interrupt flag
            # when a run starts, so deliver it again now, before any action can be sent.
            self.policy.interrupt()
        try:
            obs = self.assembler.build(instruction)
            self._last_good = obs
        except SensorError as exc:
            self.get_logger().warning(f"observation refused ({exc}); the next validate stops the run",
                                      throttle_duration_sec=2.0)
            obs = self._last_good if self._last_good is not None else self.assembler.build(instruction, strict=False)
        self._observed_at = time.monotonic()
        return obs

    def _on_chunk(self, chunk, first_action_index) -> None:
        hz = chunk.control_frequency_hz
        if hz and self.control_rate_hz and abs(hz - self.control_rate_hz) > 1e-6 * hz:
            raise ValueError(f"chunk at {hz} Hz contradicts the control rate {self.control_rate_hz} Hz")
        if self._observed_at is not None:
            self._obs_to_chunk_s = time.monotonic() - self._observed_at
        if hz:
            self._gate.set_period(1.0 / float(hz))
        self.trace.seams.append(self._gate.accepted)  # this chunk's first row is the next one accepted

    def _on_underrun(self) -> None:
        self._underruns += 1

    # -- the Act action ---------------------------------------------------------------------
    def _on_goal(self, goal_request) -> GoalResponse:
        if self._busy.locked() and self._p["goal_policy"] == "reject":
            self.get_logger().warning("rejected Act goal: a run is already active (goal_policy=reject)")
            return GoalResponse.REJECT
        if not goal_request.instruction.strip():
            self.get_logger().warning("rejected Act goal: empty instruction")
            return GoalResponse.REJECT
        if not (goal_request.max_seconds >= 0 and math.isfinite(goal_request.max_seconds)):
            self.get_logger().warning(f"rejected Act goal: max_seconds={goal_request.max_seconds}")
            return GoalResponse.REJECT
        if goal_request.params_json:
            try:
                if not isinstance(json.loads(goal_request.params_json), dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                self.get_logger().warning(f"rejected Act goal: params_json is not a JSON object ({exc})")
                return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _on_cancel(self, goal_handle) -> CancelResponse:
        # Remember the cancel before interrupting: the run can end (interrupted) before rclpy has
        # moved the goal to CANCELING, which happens only after this callback returns.
        self._cancelled_goals.add(id(goal_handle))
        if goal_handle is self._goal_handle or self._goal_handle is None:
            self.policy.interrupt()  # thread-safe; the loop stops within one control period
        return CancelResponse.ACCEPT

    def _cancel_accepted(self, goal_handle, wait_s: float = 2.0) -> bool:
        """True when this goal's cancel was accepted; waits briefly for rclpy's CANCELING state."""
        if id(goal_handle) not in self._cancelled_goals:
            return goal_handle.is_cancel_requested
        deadline = time.monotonic() + wait_s
        while not goal_handle.is_cancel_requested and time.monotonic() < deadline:
            time.sleep(0.002)
        self._cancelled_goals.discard(id(goal_handle))
        return goal_handle.is_cancel_requested

    def _wait_for_sensors(self, goal_handle=None) -> bool:
        """Wait (up to ``sensor_wait_s``) for every stream; False on timeout, a fault or a cancel."""
        deadline = time.monotonic() + float(self._p["sensor_wait_s"])
        while not self.assembler.ready():
            if time.monotonic() > deadline or self.assembler.faults:
                return False
            if goal_handle is not None and id(goal_handle) in self._cancelled_goals:
                return False
            time.sleep(0.02)
        return True

    def _acquire(self, goal_handle) -> bool:
        """Take the run slot; preempt the running goal first (goal_policy=preempt)."""
        if self._busy.acquire(blocking=False):
            return True
        self._preempting = self._goal_handle
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            self.policy.interrupt()  # repeated: a run that had not bound its interrupt yet sees it next time
            if self._busy.acquire(timeout=0.05):
                return True
        return False

    def _execute(self, goal_handle):
        goal = goal_handle.request
        result = Act.Result()
        if not self._acquire(goal_handle):
            result.reason, result.message = "error", "could not preempt the running goal within 10 s"
            goal_handle.abort()
            return result
        try:
            return self._run_goal(goal_handle, goal, result)
        finally:
            if self._episode_started:  # capture (issue 7): the end marker, with the result and label
                self._episode_started = False
                label = bool(self._task_done) if self._success_client is not None else None
                self._episode_pub.publish(String(data=_capture.end_event(self, result, label)))
            self._busy.release()

    def _run_goal(self, goal_handle, goal, result):
        max_s = goal.max_seconds if goal.max_seconds > 0 else float(self._p["default_max_seconds"])
        params = json.loads(goal.params_json) if goal.params_json else None
        self.trace = RunTrace()
        self._underruns, self._stop_reason, self._last_good = 0, None, None
        self._goal_handle, self._run_t0, self._run_max_s = goal_handle, time.monotonic(), max_s
        self._status, self._instruction = "starting", goal.instruction
        self.assembler.clear_faults()
        try:
            sensors_ok = self._wait_for_sensors(goal_handle)
            if id(goal_handle) in self._cancelled_goals and self._cancel_accepted(goal_handle):
                # cancelled before the run started: nothing was published, nothing to hold
                result.reason, result.message = "interrupted", "cancelled before the run started"
                goal_handle.canceled()
                return result
            if not sensors_ok:
                faults = self.assembler.faults
                if faults:
                    result.reason, result.message = "validate", "; ".join(faults.values())
                else:
                    result.reason, result.message = "error", (
                        f"no camera/joint data within {self._p['sensor_wait_s']} s: check the topic parameters")
                self.get_logger().error(f"Act goal not started ({result.reason}): {result.message}")
                goal_handle.abort()
                return result
            self._gate.open(1.0 / self.control_rate_hz if self.control_rate_hz else None)
            self._task_done = False
            until = (lambda: self._task_done) if self._success_client is not None else None
            self._episode_pub.publish(String(data=_capture.start_event(self, goal)))  # capture (issue 7)
            self._episode_started = True
            try:
                outcome = self.policy.act(
                    goal.instruction,
                    observe=lambda: self._observe(goal.instruction),
                    act=self._send,
                    max_seconds=max_s,
                    until=until,
                    validate=self._validate,
                    hold=self._hold,
                    on_underrun=self._on_underrun,
                    prefetch=bool(self._p["prefetch"]),
                    lookahead=int(self._p["lookahead"]),
                    smooth_seam=int(self._p["smooth_seam"]),
                    on_chunk=self._on_chunk,
                    params=params,
                    progress=False,
                )
            except Exception as exc:  # the core already ran hold; report, do not crash the node
                self._hold()
                self.get_logger().error(f"Act goal failed: {type(exc).__name__}: {exc}")
                result.reason, result.message = "error", f"{type(exc).__name__}: {exc}"
                goal_handle.abort()
                return result
        finally:
            self._goal_handle, self._instruction, self._status = None, None, "idle"
            # a normal ending lets its last queued row go out (an early one has latched already)
            self._gate.drain(timeout_s=self._gate.delay_s + (1.0 / (self.control_rate_hz or 15.0)) + 0.5)
        self._last_outcome = outcome
        _fill_result(result, outcome)
        result.actions = len(self.trace.commands)  # published: a row queued when the hold came was dropped
        preempted = self._preempting is goal_handle and outcome.reason == "interrupted"
        if preempted:
            self._preempting = None
            result.message = "preempted by a new goal"
        elif outcome.reason == "validate":
            result.message = self._stop_reason or ""
        if outcome.reason == "interrupted" and self._cancel_accepted(goal_handle):
            goal_handle.canceled()
        elif preempted or outcome.reason == "validate":
            goal_handle.abort()
        else:
            goal_handle.succeed()
        self.get_logger().info(f"Act '{goal.instruction}': {outcome!r}" + (f" ({result.message})" if result.message else ""))
        return result

    def stop_runs(self, timeout_s: float = 3.0) -> bool:
        """Interrupt the active run (if any) and wait until it has unwound through ``hold``.

        Called on Ctrl-C / SIGTERM before the ROS context goes away, so the hold can still be
        published. Returns True when no run is active any more, False after ``timeout_s`` (s).
        """
        self.policy.interrupt()
        if self._busy.acquire(timeout=timeout_s):
            self._busy.release()
            return True
        return False

    def destroy_node(self) -> None:
        try:
            self.policy.interrupt()
            self._gate.stop()
            self.policy.__exit__(None, None, None)
        finally:
            self._action_server.destroy()
            super().destroy_node()


def _fill_result(result, outcome) -> None:
    result.reason = str(outcome.reason)
    result.actions = int(outcome.actions)
    result.chunks = int(outcome.chunks)
    result.seconds = float(outcome.seconds)
    result.underruns = int(outcome.underruns)
    result.underrun_s = float(outcome.underrun_s)
    result.max_seam_jump = float(outcome.max_seam_jump or 0.0)
    result.instruction_swaps = int(outcome.instruction_swaps or 0)
    result.max_instruction_lag_s = float(outcome.max_instruction_lag_s or 0.0)
    result.action_space = str(outcome.action_space or "")


def outcome_message(result):
    """An ``Act.Result`` as a ``sequence_ai_msgs/msg/RunOutcome`` (same fields), e.g. to log or record it."""
    from sequence_ai_msgs.msg import RunOutcome

    return RunOutcome(**{name: getattr(result, name) for name in RunOutcome.get_fields_and_field_types()})


def _stop_runs(node: "PolicyDriver") -> None:
    if not node.stop_runs(timeout_s=3.0):
        node.get_logger().error("the active run did not unwind within 3 s of the shutdown request")


def main(args=None) -> int:
    """``ros2 run sequence_ai policy_driver``: spin until Ctrl-C / SIGTERM, then shut down cleanly.

    On the signal the active run is interrupted and its hold published (waiting up to 3 s) while
    the ROS context is still valid; then the node shuts down (``_spin.spin_node``). The process's
    GIL switch interval is set to ``GIL_SWITCH_INTERVAL_S`` first (see there).
    """
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    return spin_node(PolicyDriver, threads=6, args=args, on_stop=_stop_runs)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
