"""Episode markers: the JSON the driver publishes on ``~/episode`` and the recorder writes to bags.

The driver calls :func:`start_event` when an ``Act`` goal starts driving and :func:`end_event`
when it has ended (its result filled); both return the ``std_msgs/String`` payload (JSON text).
The recorder, told to record around ``Act`` goals, opens a bag on ``start`` and closes it on
``end``. The start marker carries the driver's observation-assembly settings (views, resolved
topics, transports, time bases, alignments, joint names, max sensor age), so an export rebuilds
observations with exactly the rules the driver used live (:func:`assembler_from_start`).

Start: ``{"event": "start", "source": "act", "task", "max_seconds", "goal_id", "t_ns",
"views", "camera_topics", "camera_transports", "camera_time_bases", "camera_alignments",
"joint_state_topic", "joint_state_type", "joint_state_time_base", "joint_state_alignment",
"joint_names", "gripper_joint", "max_sensor_age_s", "command_mode", "command_topic", "command_type",
"control_frequency_hz"}`` (a ros2_control ``command_mode`` adds ``command_joint_names`` and, with a
gripper output, ``gripper_command_topic``). ``control_frequency_hz`` (Hz) is the rate the driver
publishes commands at -- the policy contract's -- and the export's fps (``None`` when the driver
had none), also declared as the command topic's entry of ``stream_rates_hz`` (``{topic: Hz}``) with
origin ``contract`` in ``stream_rate_sources``; the recorder adds every other stream's rate
(``sequence_ai_ros.bag.rates``) and the export checks each stream's times against its rate
(``sequence_ai_ros.bag.frames``). The start marker carries the dataset's contract too:
``contract`` (the policy's ``{"observation": ..., "action": ...}`` as its handshake gave it; ``null``
without one) and ``policy`` (``{"model", "version"}``: the deployment and the version that served).
End: ``{"event": "end", "source": "act", "goal_id", "t_ns", "outcome": {Act result fields, the
seam telemetry included}, "seams": {the seam statistics}, "label": {"success": true | false |
null}}`` (``null`` when the driver has no success check).
"""
from __future__ import annotations

import json
import time
from typing import Optional

_SEAM_FIELDS = ("chunks", "max_seam_jump", "seams", "seam_jump_p50", "seam_jump_p99", "seam_jump_before_blend_p99",
                "seam_max_delay_steps", "seam_rows_trimmed", "seam_min_playback_left_s", "merge", "delay_mode")
_RESULT_FIELDS = ("reason", "actions", "chunks", "seconds", "underruns", "underrun_s", "max_seam_jump",
                  "instruction_swaps", "max_instruction_lag_s", "action_space", "message") + _SEAM_FIELDS[2:] + (
                  "obs_to_action_p50_s", "obs_to_action_p99_s")
#: ``metadata.yaml`` ``custom_data`` keys of the provenance a bag carries (JSON each).
CONTRACT_KEY, POLICY_KEY, SEAMS_KEY = "sequence_ai.contract", "sequence_ai.policy", "sequence_ai.seams"


def _resolve(node, topic: str) -> str:
    try:
        return node.resolve_topic_name(topic)
    except Exception:  # older rclpy: relative names resolve against the node namespace
        ns = node.get_namespace().rstrip("/")
        return topic if topic.startswith("/") else f"{ns}/{topic}"


def _per_view(values, n: int, default: str) -> list:
    values = list(values or [])
    return values if len(values) == n else [default] * n


def assembly_settings(node, p: dict) -> dict:
    """The observation-assembly part of a start marker, from driver-style parameters ``p``."""
    views = list(p["camera_views"])
    return {
        "views": views,
        "camera_topics": [_resolve(node, t) for t in p["camera_topics"]],
        "camera_transports": _per_view(p.get("camera_transports"), len(views), "raw"),
        "camera_time_bases": _per_view(p.get("camera_time_bases"), len(views), "receive"),
        "camera_alignments": _per_view(p.get("camera_alignments"), len(views), "latest"),
        "joint_state_topic": _resolve(node, p["joint_state_topic"]),
        "joint_state_type": p.get("joint_state_type", "sensor_msgs/msg/JointState"),
        "joint_state_time_base": p.get("joint_state_time_base", "receive"),
        "joint_state_alignment": p.get("joint_state_alignment", "latest"),
        "joint_names": list(p["joint_names"]),
        "gripper_joint": p.get("gripper_joint") or None,
        "max_sensor_age_s": float(p.get("max_sensor_age_s", 0.5)),
        **command_settings(node, p),
    }


def command_settings(node, p) -> dict:
    """Where the driver's commands go: ``command_topic`` / ``command_type`` of the arm output
    (``joint_commands`` mode: the parameters; a ros2_control mode: the controller's topic and
    ``float64_multi_array`` / ``joint_trajectory``), plus ``command_mode`` and, for a separate
    gripper output, ``gripper_command_topic``."""
    mode = p.get("command_mode", "joint_commands")
    if mode == "joint_commands":
        return {"command_mode": mode, "command_topic": _resolve(node, p["command_topic"]),
                "command_type": p.get("command_type", "float64_multi_array")}
    forward = mode == "forward_command_controller"
    out = {"command_mode": mode,
           "command_topic": _resolve(node, f"{p['arm_controller']}/{'commands' if forward else 'joint_trajectory'}"),
           "command_type": "float64_multi_array" if forward else "joint_trajectory",
           "command_joint_names": list(p.get("arm_joints") or [])}
    grip = p.get("gripper_output", "none")
    if grip != "none":
        kind = "commands" if grip == "forward_command_controller" else "joint_trajectory"
        out["gripper_command_topic"] = _resolve(node, f"{p['gripper_controller']}/{kind}")
    return out


def command_values(msg) -> list:
    """The command values of a recorded command message: ``Float64MultiArray.data``, or a
    ``JointTrajectory``'s first point (its positions, else its velocities); [] for an empty one."""
    if hasattr(msg, "data"):
        return [float(x) for x in msg.data]
    points = getattr(msg, "points", None) or []
    if not points:
        return []
    first = points[0]
    return [float(x) for x in (first.positions if len(first.positions) else first.velocities)]


def start_event(node, params, goal, goal_id=None, control_rate_hz: Optional[float] = None) -> str:
    """JSON start marker for an ``Act`` goal starting on ``node`` (a PolicyDriver): the goal, its
    ``goal_id`` (a ``unique_identifier_msgs/UUID`` or None), the control rate (Hz) and the
    observation assembly of driver parameters ``params``."""
    event = {"event": "start", "source": "act", "task": goal.instruction,
             "max_seconds": float(goal.max_seconds),
             "goal_id": bytes(goal_id.uuid).hex() if goal_id is not None else None,
             "t_ns": time.time_ns(), "control_frequency_hz": float(control_rate_hz) if control_rate_hz else None,
             **assembly_settings(node, params), **policy_provenance(node, params)}
    if control_rate_hz:
        event["stream_rates_hz"] = {event["command_topic"]: float(control_rate_hz)}
        event["stream_rate_sources"] = {event["command_topic"]: "contract"}
    return json.dumps(event)


def policy_provenance(node, params) -> dict:
    """``{"contract", "policy"}`` of a start marker: the driver's policy contract as its handshake
    gave it (``node.policy.contract``; ``None`` without a policy or a contract) and ``{"model",
    "version"}`` (the deployment name parameter; the version the gateway's handshake named, when
    the client keeps it, else ``None``)."""
    policy = getattr(node, "policy", None)
    contract = getattr(policy, "contract", None) if policy is not None else None
    engine = getattr(policy, "_engine", policy)   # sequence_ai.Policy wraps the AsyncPolicy that owns the wire
    session = getattr(getattr(engine, "_wire", None), "session", None)
    version = getattr(session, "version", None)
    try:
        model = params.get("model") if hasattr(params, "get") else getattr(params, "model", None)
    except Exception:   # a params object without the key
        model = None
    return {"contract": json.loads(json.dumps(contract, default=str)) if contract else None,
            "policy": {"model": model, "version": version}}


def end_event(result, success: Optional[bool]) -> str:
    """JSON end marker: the ``Act`` result (the RunOutcome) and the success label (or ``None``)."""
    outcome = {k: getattr(result, k) for k in _RESULT_FIELDS if hasattr(result, k)}
    seams = {k: getattr(result, k) for k in _SEAM_FIELDS if hasattr(result, k)}
    return json.dumps({"event": "end", "source": "act", "t_ns": time.time_ns(), "outcome": outcome,
                       "seams": seams, "label": {"success": success}})


def provenance(start: dict, end: Optional[dict]) -> dict:
    """What a dataset keeps of an episode's markers: ``contract`` (``{"observation", "action"}`` or
    ``None``), ``policy`` (``{"model", "version"}`` or ``None``), ``seams`` (the end marker's seam
    statistics, else those among its outcome's fields; ``None`` for a RecordEpisode or cut bag) and
    ``stream_rates`` (``{topic: {"hz", "origin", "measured_hz"}}``)."""
    end = end or {}
    outcome = end.get("outcome") or {}
    seams = end.get("seams") or ({k: outcome[k] for k in _SEAM_FIELDS if k in outcome} or None)
    rates, origins = start.get("stream_rates_hz") or {}, start.get("stream_rate_sources") or {}
    measured = end.get("measured_rates_hz") or {}
    return {"contract": start.get("contract"), "policy": start.get("policy"), "seams": seams,
            "stream_rates": {t: {"hz": rates.get(t), "origin": origins.get(t), "measured_hz": measured.get(t)}
                             for t in sorted(set(rates) | set(measured))}}


def provenance_custom_data(start: dict, end: Optional[dict]) -> dict:
    """``metadata.yaml`` ``custom_data`` entries of a bag's provenance (:func:`provenance`):
    :data:`CONTRACT_KEY`, :data:`POLICY_KEY`, :data:`SEAMS_KEY` (JSON text; only those known)."""
    info = provenance(start, end)
    out = {}
    for key, value in ((CONTRACT_KEY, info["contract"]), (POLICY_KEY, info["policy"]), (SEAMS_KEY, info["seams"])):
        if value is not None:
            out[key] = json.dumps(value, sort_keys=True, default=str)
    return out


def assembler_from_start(start: dict, clock, header_clock):
    """An :class:`~sequence_ai_ros.observation.ObservationAssembler` configured as the start
    marker says, reading time from ``clock``/``header_clock`` (s) -- the exporter's bag clock.

    Raises:
        ValueError: the marker lacks views or joint names (not a recorder/driver marker).
    """
    from ..observation import JOINT_STREAM, ObservationAssembler, StreamRule

    views = list(start.get("views") or [])
    n = len(views)
    rules = {v: StreamRule(tb, al) for v, tb, al in zip(
        views, _per_view(start.get("camera_time_bases"), n, "receive"),
        _per_view(start.get("camera_alignments"), n, "latest"))}
    rules[JOINT_STREAM] = StreamRule(start.get("joint_state_time_base", "receive"),
                                     start.get("joint_state_alignment", "latest"))
    return ObservationAssembler(views, list(start.get("joint_names") or []), start.get("gripper_joint") or None,
                                max_age_s=float(start.get("max_sensor_age_s", 0.5)), clock=clock,
                                rules=rules, header_clock=header_clock)
