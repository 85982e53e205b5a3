"""``PolicyDriver``: the managed (lifecycle) ROS 2 node that drives a robot with a deployed policy.

Lifecycle (``rclpy.lifecycle``; the standard ``~/change_state``, ``~/get_state`` ... services):

* **configure** -- read and validate the parameters (:mod:`.params`), import ``codec_modules``,
  reach the gateway: a gateway that is not up yet, a model that is not deployed on it yet (the
  WARN names the model and the ``seq deploy`` command) or a deployment still warming its queue is
  retried every ``connect_retry_s`` with a WARN log line and diagnostic, for ever or up to
  ``connect_timeout_s``; never a crash. Then check the contract (control rate, camera sizes),
  create the sensor subscriptions, the command outputs (:mod:`.outputs`) and the gate
  (:mod:`.gate`). A refusal (bad parameter, wrong key, a rate that contradicts the contract)
  returns FAILURE with the reason in the log and on ``/diagnostics``.
* **activate** -- accept ``Act`` goals (rejected while inactive) and publish commands.
* **deactivate** -- end the running goal (hold first, then its result: aborted, "driver
  deactivated") and refuse new ones.
* **cleanup** / **shutdown** -- release the subscriptions, outputs, gate and the gateway session.

``autostart`` (default true) configures and activates from the constructor, so ``ros2 run`` or a
launch file with a plain ``Node`` behaves as before; a refusal then raises ``ValueError`` from the
constructor (``main()`` prints one ``error:`` line, exit 2).

Parameters change at run time through the set-parameters callback, which applies or refuses
each change with a reason (read-only ones are refused by rclpy; see :mod:`.params`).

Interfaces (names relative, so a namespace gives two drivers their own robots): ``~/act``
(``sequence_ai_msgs/action/Act``), ``~/start_policy`` / ``~/cancel_policy`` / ``~/outcome`` (the
same runs for clients without actions, :mod:`.services`), ``~/instruction`` (``std_msgs/String``,
swaps the instruction without stopping), ``operator_topic`` (``std_msgs/Bool``, default
``~/operator_active``: a person who outranks every client), ``~/wait_until_ready``
(``std_srvs/Trigger``), ``~/episode`` (episode markers for the recorder), diagnostics on
``/diagnostics`` and ``~/status`` (``DiagnosticArray``).
"""
from __future__ import annotations

import importlib
import os
import threading
import time
from typing import Optional

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.action import ActionServer
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNodeMixin, TransitionCallbackReturn
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

import sequence_ai
from sequence_ai_msgs.action import Act
from sequence_ai_msgs.srv import CheckSuccess

from .. import codecs
from ..codecs import SensorDataError
from ..observation import JOINT_STREAM, ObservationAssembler, StreamRule
from . import params as _params
from .execution import GoalExecution
from .gate import CommandGate
from .goal import OPERATOR_MESSAGE
from .latency import p50_p99
from .outputs import CommandOutputs
from .services import PolicyServices

__all__ = ["PolicyDriver", "ConfigureError"]

SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


class ConfigureError(ValueError):
    """Configuring cannot succeed as set up (a parameter, the key, the contract);
    the message says what is wrong and what to change. Retrying unchanged will not help."""


def _not_deployed(exc: Exception) -> bool:
    """The gateway answered that no deployment has the model's name (``not_found``): one may be
    deployed later (``seq deploy``), so configure waits for it as for an absent gateway."""
    return isinstance(exc, sequence_ai.InvalidRequest) and getattr(exc, "code", None) == "not_found"


def _latency_values(run) -> dict:
    """The diagnostics' observation-to-action figures (s) of ``run`` (the running or the last one):
    p50 / p99 over its chunks so far, "" before its first command from a chunk."""
    samples = list(run.obs_to_action) if run is not None else []
    if not samples:
        return {"obs_to_action_p50_s": "", "obs_to_action_p99_s": ""}
    p50, p99 = p50_p99(samples)
    return {"obs_to_action_p50_s": f"{p50:.4f}", "obs_to_action_p99_s": f"{p99:.4f}"}


def _realtime_refused(logger, priority: int):
    """The gate's ``on_rt_error``: the publisher thread could not take SCHED_FIFO ``priority`` and
    runs at normal priority. Expected at the default 40 on a machine without the right (info); a
    warning for any other value (asked for on purpose)."""
    say = logger.info if priority == _params.REALTIME_PRIORITY else logger.warning
    return lambda why: say(f"publisher thread at normal priority: {why}")


class PolicyDriver(LifecycleNodeMixin, Node):
    """Drives a robot from ``Act`` goals with a deployed policy (see the module docstring).

    Args:
        node_name: default ``policy_driver``; ``**kwargs`` go to ``rclpy.node.Node`` (namespace,
            context, parameter_overrides, ...). The lifecycle services get a callback group of
            their own, so the parameter services answer while configure waits for the gateway.
    Attributes:
        blocking_callback_groups: the groups whose callbacks block (the lifecycle services,
            ``~/wait_until_ready``, the Act action and its goals' runs): a
            ``_spin.NodeExecutor`` runs them on threads of their own; everything else (sensors,
            timers, parameters, the success poll) runs on its spinning thread.
        goals: the :class:`~.execution.GoalExecution` serving the Act action (its goals, the run
            slot, the running and last run, the callbacks handed to the core); the node owns what
            it drives with (policy, assembler, gate, outputs) and their lifecycle.
    Raises:
        ValueError: a parameter is malformed (names it); with ``autostart``, also a configure
            refusal (``ConfigureError``: wrong key, a contradicting control rate).
    """

    def __init__(self, node_name: str = "policy_driver", **kwargs) -> None:
        Node.__init__(self, node_name, **kwargs)
        lifecycle = MutuallyExclusiveCallbackGroup()   # configure can wait for the gateway: blocking
        LifecycleNodeMixin.__init__(self, callback_group=lifecycle)
        self.blocking_callback_groups = [lifecycle]    # run on threads of their own by _spin.NodeExecutor
        self._params = _params.declare(self)       # ParameterRefused (a ValueError) names the problem
        self.policy = None
        self.assembler: Optional[ObservationAssembler] = None
        self.control_rate_hz: Optional[float] = None
        self._gate: Optional[CommandGate] = None
        self._outputs: Optional[CommandOutputs] = None
        self._config_entities: list = []             # subscriptions / clients / timers made by configure
        self._active = False
        self._stopping = threading.Event()
        self._end_message: Optional[str] = None
        self._config_error: Optional[Exception] = None
        self._diag = (DiagnosticStatus.WARN, "unconfigured")
        self._success_client = None
        self._check_clients: dict = {}              # CheckSuccess clients by service name (configure's)
        self._check_group = MutuallyExclusiveCallbackGroup()
        #: the person who outranks every client (``operator_topic``); handed to the core's runs
        self.operator = sequence_ai.Operator()
        self.goals = GoalExecution(self)             # the Act action: goals, the run slot, the core's callbacks
        self._freshness_timer = None
        self._make_interfaces()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        if self._params.autostart:
            self._autostart()

    def _make_interfaces(self) -> None:
        """What exists in every lifecycle state: diagnostics, feedback, instruction, services, action."""
        p = self._params
        periodic = MutuallyExclusiveCallbackGroup()
        self._feedback_timer = self.create_timer(1.0 / p.feedback_hz, self.goals.publish_feedback,
                                                 callback_group=periodic)
        self._status_timer = self.create_timer(1.0 / p.status_hz, self._publish_status, callback_group=periodic)
        self._status_pub = self.create_publisher(DiagnosticArray, "~/status", 10)
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._episode_pub = self.create_publisher(String, "~/episode", 10)   # markers for recorder_node
        self.create_subscription(String, "~/instruction", self._on_instruction, 10, callback_group=periodic)
        ready, act = MutuallyExclusiveCallbackGroup(), ReentrantCallbackGroup()
        self.create_service(Trigger, "~/wait_until_ready", self._on_wait_until_ready, callback_group=ready)
        self._action_server = ActionServer(
            self, Act, "~/act", execute_callback=self.goals.execute, goal_callback=self.goals.on_goal,
            handle_accepted_callback=self.goals.on_accepted, cancel_callback=self.goals.on_cancel, callback_group=act)
        self.blocking_callback_groups += [ready, act]   # a cold start's wait; the goal's run
        self.policy_services = PolicyServices(self)   # ~/start_policy, ~/cancel_policy, ~/outcome
        if p.operator_topic:
            self.create_subscription(Bool, p.operator_topic, self._on_operator, 10,
                                     callback_group=MutuallyExclusiveCallbackGroup())

    def _on_operator(self, msg: Bool) -> None:
        """The operator topic: true holds the robot (a run under way ends ``operator``), false frees it."""
        active = bool(msg.data)
        if active == self.operator.active:
            return
        self.operator.set(active)   # the core's run holds within one control period
        if active:   # every goal accepted or running ends operator (a running one holds within one period)
            for run in self.goals.accepted_runs():
                run.request_end("operator", OPERATOR_MESSAGE)
        self.get_logger().warning("operator holds the robot: runs are refused" if active
                                  else "operator released the robot: runs are accepted")
    def _autostart(self) -> None:
        """configure + activate now (``autostart``); a refusal raises, a gateway timeout logs."""
        if self.trigger_configure() != SUCCESS:
            if self._config_error is not None:
                raise self._config_error
            self.get_logger().error("not configured (see above); configure it again with "
                                    f"`ros2 lifecycle set {self.get_fully_qualified_name()} configure`")
            return
        self.trigger_activate()

    @property
    def trace(self):
        """The ``RunTrace`` of the running goal, else of the last one (empty before any)."""
        return self.goals.trace

    def _lifecycle_label(self) -> str:
        return self._state_machine.current_state[1]

    # -- lifecycle transitions ----------------------------------------------------------------
    def on_configure(self, state) -> TransitionCallbackReturn:
        """Validate, reach the gateway (retrying), build subscriptions/outputs/gate."""
        self._config_error = None
        self._stopping.clear()
        try:
            self._configure()
        except ConfigureError as exc:
            self._config_error = exc
            self._refused(str(exc))
            return FAILURE
        except Exception as exc:  # noqa: BLE001 - a lifecycle transition reports, never raises
            self._refused(f"{type(exc).__name__}: {exc}")
            return FAILURE
        self._set_diag(DiagnosticStatus.OK, "inactive (configured)")
        return SUCCESS

    def _refused(self, why: str) -> None:
        self.get_logger().error(f"configure refused: {why}")
        self._release()
        self._set_diag(DiagnosticStatus.ERROR, f"configure refused: {why}")

    def on_activate(self, state) -> TransitionCallbackReturn:
        self._active = True
        self._end_message = None
        self.get_logger().info(f"active: Act goals accepted; commands -> {CommandOutputs.describe(self._params)}")
        self._set_diag(DiagnosticStatus.OK, "active")
        return SUCCESS

    def on_deactivate(self, state) -> TransitionCallbackReturn:
        self._active = False
        self.goals.end_run("deactivated", "driver deactivated: the run was stopped and the arm held")
        self._set_diag(DiagnosticStatus.OK, "inactive")
        return SUCCESS

    def on_cleanup(self, state) -> TransitionCallbackReturn:
        self._release()
        self._set_diag(DiagnosticStatus.WARN, "unconfigured")
        return SUCCESS

    def on_shutdown(self, state) -> TransitionCallbackReturn:
        self._stopping.set()
        if self._active:
            self._active = False
            self.goals.end_run("shutdown", "driver shutting down: the run was stopped and the arm held")
        self._release()
        self._set_diag(DiagnosticStatus.WARN, "finalized")
        return SUCCESS

    def on_error(self, state) -> TransitionCallbackReturn:
        self._active = False
        self._release()
        self._set_diag(DiagnosticStatus.ERROR, "error: released everything; configure again")
        return SUCCESS

    # -- configure ----------------------------------------------------------------------------
    def _configure(self) -> None:
        p = self._params
        try:
            _params.check_all(p)
            for module in p.codec_modules or []:
                importlib.import_module(module)
            views = list(p.camera_views)
            transports = [codecs.IMAGE_TRANSPORTS.get(t, t) for t in (p.camera_transports or ["raw"] * len(views))]
            for t in transports:
                codecs.image_decoder(t)  # raises when none is registered
            codecs.joint_decoder(str(p.joint_state_type))
            if p.command_mode == "joint_commands":
                codecs.command_encoder(str(p.command_type))
        except (ValueError, ImportError) as exc:
            raise ConfigureError(str(exc)) from None
        self.policy = self._connect()
        sizes = self._check_contract()
        self._make_assembler(views, sizes)
        self._make_subscriptions(views, list(p.camera_topics), transports)
        self._outputs = CommandOutputs(self, p, lambda: 1.0 / (self.control_rate_hz or 15.0),
                                       lambda: self.get_clock().now().to_msg())
        self._gate = CommandGate(self.goals.publish, p.publish_delay_ms / 1000.0, self.goals.published,
                                 p.realtime_priority, _realtime_refused(self.get_logger(), p.realtime_priority),
                                 gil_lead_s=p.publish_gil_lead_ms / 1000.0)
        # camera freshness at the control rate, also while the loop waits for a chunk (armed per run)
        self._freshness_timer = self.create_timer(1.0 / (self.control_rate_hz or 15.0), self.goals.watch_cameras,
                                                  callback_group=MutuallyExclusiveCallbackGroup())
        self._freshness_timer.cancel()
        self._config_entities.append(self._freshness_timer)
        if p.success_service:
            self._success_client = self.check_success_client(p.success_service)
        # the stop conditions' poll (success_service, a goal's stop_when); asks only while a run has one
        self._config_entities.append(self.create_timer(1.0 / p.success_poll_hz, self.goals.poll_success,
                                                       callback_group=self._check_group))

    def check_success_client(self, service: str):
        """The ``CheckSuccess`` client of ``service``, made once per configure (released by cleanup)."""
        client = self._check_clients.get(service)
        if client is None:
            client = self._check_clients[service] = self.create_client(CheckSuccess, service,
                                                                       callback_group=self._check_group)
            self._config_entities.append(client)
        return client

    def _connect(self):
        """``sequence_ai.connect`` with retries while the gateway is not reachable (see configure)."""
        p = self._params
        api_key = os.environ.get(p.api_key_env) or None
        deadline = None if p.connect_timeout_s == 0 else time.monotonic() + p.connect_timeout_s
        url = p.gateway_url or os.environ.get("SEQUENCES_GATEWAY_URL") or "the default gateway"
        attempt = 0
        while True:
            attempt += 1
            try:
                policy = sequence_ai.connect(p.model, api_key=api_key, gateway_url=p.gateway_url or None,
                                             operator=self.operator)
                policy.__enter__()
                return policy
            except sequence_ai.SequencesError as exc:
                undeployed = _not_deployed(exc)
                if not exc.retryable and not undeployed:
                    raise ConfigureError(f"cannot connect to deployment {p.model!r} at {url}: "
                                         f"{type(exc).__name__}: {exc}") from None
                why = f"{type(exc).__name__}: {exc}"
            if deadline is not None and time.monotonic() >= deadline:
                what = f"model {p.model!r} not deployed at {url}" if undeployed else f"gateway {url} not reachable"
                raise TimeoutError(f"{what} within connect_timeout_s={p.connect_timeout_s:g} s "
                                   f"({attempt} attempts; last: {why})")
            if undeployed:
                text = (f"model {p.model!r} is not deployed on the gateway at {url}: waiting for it (attempt "
                        f"{attempt}, retry in {p.connect_retry_s:g} s); deploy it with "
                        f"`seq deploy <policy file> --name {p.model}`")
            else:
                text = f"waiting for the gateway at {url} (attempt {attempt}, retry in {p.connect_retry_s:g} s): {why}"
            self.get_logger().warning(text)
            self._set_diag(DiagnosticStatus.WARN, text)
            self._publish_status()
            if self._stopping.wait(p.connect_retry_s):
                raise TimeoutError("shutdown requested while waiting for the gateway")

    def _check_contract(self) -> dict:
        """Control rate and camera sizes from the contract; raises ConfigureError on a contradiction."""
        p = self._params
        contract = sequence_ai.Contract.from_wire(self.policy.contract)
        declared = contract.action.control_frequency_hz if contract.action is not None else None
        wanted = float(p.control_rate_hz)
        if declared and wanted and abs(float(declared) - wanted) > 1e-6 * float(declared):
            raise ConfigureError(
                f"control_rate_hz={wanted:g} contradicts {p.model}'s contract (control_frequency_hz={declared}): "
                f"the rate comes from the policy; set 0 or {declared}")
        self.control_rate_hz = float(declared) if declared else (wanted or None)
        delay_ms = float(p.publish_delay_ms)
        if delay_ms > 0 and self.control_rate_hz and delay_ms / 1000.0 >= 0.5 / self.control_rate_hz:
            raise ConfigureError(
                f"publish_delay_ms={delay_ms:g} is not below half the control period of {p.model} "
                f"({500.0 / self.control_rate_hz:.3g} ms at {self.control_rate_hz:g} Hz): lower it, or set 0")
        cams = contract.observation.cameras if contract.observation is not None else {}
        return {v: c.size for v, c in cams.items() if v in p.camera_views and c.size}

    def _make_assembler(self, views, sizes) -> None:
        p = self._params
        n = len(views)
        rules = {v: StreamRule(tb, al) for v, tb, al in zip(
            views, p.camera_time_bases or ["receive"] * n, p.camera_alignments or ["latest"] * n)}
        rules[JOINT_STREAM] = StreamRule(p.joint_state_time_base, p.joint_state_alignment)
        self.assembler = ObservationAssembler(
            views, list(p.joint_names), p.gripper_joint or None, max_age_s=p.max_sensor_age_s, rules=rules,
            header_clock=lambda: self.get_clock().now().nanoseconds * 1e-9, camera_sizes=sizes,
            max_frame_age_s=self._frame_ages(views), frozen_pixels=bool(p.camera_frozen_pixels))

    def _frame_ages(self, views) -> dict:
        """``{view: max frame age (s)}`` from ``camera_max_frame_age_s`` (empty: ``max_sensor_age_s``)."""
        p = self._params
        ages = list(p.camera_max_frame_age_s or [])
        return {v: float(ages[i]) if ages else float(p.max_sensor_age_s) for i, v in enumerate(views)}

    def _make_subscriptions(self, views, topics, transports) -> None:
        sensors = MutuallyExclusiveCallbackGroup()
        for view, topic, type_name in zip(views, topics, transports):
            self._config_entities.append(self.create_subscription(
                codecs.message_class(type_name), topic,
                lambda msg, v=view, t=type_name: self._on_image(v, msg, t), qos_profile_sensor_data,
                callback_group=sensors))
        joint_type = str(self._params.joint_state_type)
        self._config_entities.append(self.create_subscription(
            codecs.message_class(joint_type), self._params.joint_state_topic,
            lambda msg: self._on_joint_state(msg, joint_type), qos_profile_sensor_data, callback_group=sensors))

    def _release(self) -> None:
        """Undo configure: subscriptions, outputs, gate, the gateway session (idempotent)."""
        for entity in self._config_entities:
            try:
                if hasattr(entity, "cancel") and hasattr(entity, "timer_period_ns"):
                    self.destroy_timer(entity)
                elif hasattr(entity, "call_async"):
                    self.destroy_client(entity)
                else:
                    self.destroy_subscription(entity)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._config_entities = []
        self._freshness_timer = None
        self._success_client = None
        self._check_clients = {}
        if self._gate is not None:
            self._gate.stop()
            self._gate = None
        if self._outputs is not None:
            self._outputs.destroy()
            self._outputs = None
        if self.policy is not None:
            policy, self.policy = self.policy, None
            policy.interrupt()
            policy.__exit__(None, None, None)
        self.assembler = None

    # -- parameters at run time ---------------------------------------------------------------
    def _on_set_parameters(self, parameters) -> SetParametersResult:
        """Apply every change or refuse the whole set with the reason (nothing accepted and ignored).

        Run-time parameters apply at once; configure-time ones only while unconfigured (they
        are read by the next configure, which checks the cross-field rules); ``autostart`` is
        read-only (rclpy refuses it)."""
        changes = {}
        state = self._lifecycle_label()
        for prm in parameters:
            spec = _params.TABLE.get(prm.name)
            if spec is None:
                continue
            if spec.when == "start" or (spec.when == "configure" and state != "unconfigured"):
                return SetParametersResult(successful=False, reason=(
                    f"{prm.name} is read at configure and the node is {state}: deactivate and clean it up "
                    f"(ros2 lifecycle set {self.get_fully_qualified_name()} cleanup), set it, configure again"
                    if spec.when == "configure" else f"{prm.name} is fixed at start"))
            changes[prm.name] = prm.value
        if not changes:
            return SetParametersResult(successful=True)
        try:
            new = self._params.replace(cross_check=state != "unconfigured", **changes)
        except _params.ParameterRefused as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        self._params = new
        if "max_sensor_age_s" in changes and self.assembler is not None:
            self.assembler.max_age_s = new.max_sensor_age_s
        if self.assembler is not None and {"max_sensor_age_s", "camera_max_frame_age_s"} & set(changes):
            self.assembler.set_max_frame_age(self._frame_ages(self.assembler.views))
        if "camera_frozen_pixels" in changes and self.assembler is not None:
            self.assembler.frozen_pixels = bool(new.camera_frozen_pixels)
        if "feedback_hz" in changes:
            self._feedback_timer.timer_period_ns = int(1e9 / new.feedback_hz)
        if "status_hz" in changes:
            self._status_timer.timer_period_ns = int(1e9 / new.status_hz)
        self.get_logger().info("parameters applied: " + ", ".join(f"{k}={new[k]!r}" for k in changes))
        return SetParametersResult(successful=True)

    # -- sensors, instruction, readiness ------------------------------------------------------
    def _on_image(self, view: str, msg, type_name: str) -> None:
        try:
            if self.assembler is not None:
                self.assembler.on_image(view, msg, type_name)
        except SensorDataError as exc:
            self.get_logger().error(f"malformed camera message dropped: {exc}", throttle_duration_sec=2.0)

    def _on_joint_state(self, msg, type_name: str) -> None:
        try:
            if self.assembler is not None:
                self.assembler.on_joint_state(msg, type_name)
        except SensorDataError as exc:
            self.get_logger().error(f"malformed joint state dropped: {exc}", throttle_duration_sec=2.0)

    def _on_instruction(self, msg: String) -> None:
        text = msg.data.strip()
        if not text:
            self.get_logger().warning("ignored empty instruction on ~/instruction")
            return
        if self.policy is None:
            self.get_logger().warning(f"ignored instruction {text!r}: the driver is not configured")
            return
        run = self.goals.run
        if run is None:
            self.policy.set_instruction(text)  # thread-safe; takes effect on the next request
        else:
            with run.instruction_lock:         # the feedback says it at once (each request re-reads it)
                self.policy.set_instruction(text)
                run.instruction_now = text
        self.get_logger().info(f"instruction now {text!r}")

    def _on_wait_until_ready(self, request, response):
        """Bring a cold deployment up (blocks this service's own callback group only)."""
        if self.policy is None:
            response.success, response.message = False, f"not configured (lifecycle state {self._lifecycle_label()})"
            return response
        if not self.goals.slot.try_take(request):
            response.success, response.message = True, "a run is active: the policy is serving"
            return response
        try:
            waited = self.policy.wait_until_ready(float(self._params.ready_timeout_s))
            response.success, response.message = True, f"ready after {waited:.1f} s"
        except Exception as exc:  # noqa: BLE001 - reported to the caller, never raised into rclpy
            response.success, response.message = False, f"{type(exc).__name__}: {exc}"
        finally:
            self.goals.slot.release(request)
        return response

    # -- diagnostics --------------------------------------------------------------------------
    def _set_diag(self, level, message: str) -> None:
        self._diag = (level, message)
        self._publish_status()

    def _publish_status(self) -> None:
        """One ``DiagnosticStatus`` on ``/diagnostics`` and ``~/status``: lifecycle, run and latency figures."""
        level, message = self._diag
        goals = self.goals
        run = goals.run
        last = goals.last_outcome
        if run is None and level == DiagnosticStatus.OK and last is not None and last.reason not in ("completed", "until"):
            level = DiagnosticStatus.WARN
        trace = goals.trace
        shown = run or goals.last_run
        values = {
            "lifecycle_state": self._lifecycle_label(),
            "state": run.status if run is not None else "idle",
            "model": str(self._params.model),
            "control_rate_hz": f"{self.control_rate_hz or 0.0:g}",
            "commands": CommandOutputs.describe(self._params),
            "actions": str(len(trace.commands)),
            "chunks": str(len(trace.seams)),
            "underruns": str(shown.underruns if shown is not None else 0),
            "observation_to_chunk_s": "" if goals.obs_to_chunk_s is None else f"{goals.obs_to_chunk_s:.4f}",
            **_latency_values(shown),
            "instruction": (self.policy.instruction or "") if self.policy is not None else "",
            "last_reason": "" if last is None else str(last.reason),
            "last_message": (goals.last_run.stop_reason or "") if goals.last_run is not None else "",
        }
        status = DiagnosticStatus(level=level, name=f"{self.get_fully_qualified_name().lstrip('/')}: policy driver",
                                  hardware_id=str(self._params.model), message=message,
                                  values=[KeyValue(key=k, value=v) for k, v in values.items()])
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        try:
            self._status_pub.publish(msg)
            self._diagnostics_pub.publish(msg)
        except Exception:  # noqa: BLE001 - the context is going away
            pass

    # -- stopping -----------------------------------------------------------------------------
    def stop_runs(self, timeout_s: float = 3.0, why: str = "shutdown",
                  message: str = "driver shutting down: the run was stopped and the arm held") -> bool:
        """End the active run (if any): it publishes its hold and gets its result (aborted,
        ``message``). Called on Ctrl-C / SIGTERM while the ROS context is still valid. Goals
        arriving after this are refused. Returns True when no run is active any more, False
        after ``timeout_s`` (s)."""
        self._stopping.set()
        self._active = False
        return self.goals.end_run(why, message, timeout_s)

    def destroy_node(self) -> None:
        try:
            self._stopping.set()
            self._active = False
            if self.goals.run is not None:
                self.goals.end_run("shutdown", "driver node destroyed: the run was stopped and the arm held")
            self._release()
        finally:
            self._action_server.destroy()
            super().destroy_node()
