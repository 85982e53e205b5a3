"""The data that crosses the wire, as plain dataclasses with the wire's field names.

An ``Observation`` goes out (cameras, proprioception, instruction); an ``ActionChunk`` comes
back inside a ``Prediction``; ``run()`` and ``act()`` return a ``RunOutcome``. Nothing here
does I/O. No numpy: array-likes with ``.tolist()`` (numpy arrays) are converted on the way
out, and rows come back as lists of floats.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._seam import SeamSummary

__all__ = [
    "END_REASONS",
    "ImageFrame",
    "Proprioception",
    "Observation",
    "ActionChunk",
    "Prediction",
    "RunOutcome",
    "ModelInfo",
    "is_absolute_action_space",
    "observation_to_wire",
]


def _floats(values: Any) -> Optional[List[float]]:
    """A flat list of floats from a list, tuple or array-like (``.tolist()``); None stays None."""
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (int, float)):
        return [float(values)]
    return [float(v) for v in values]


@dataclass
class ImageFrame:
    """One camera frame.

    Args:
        view: the camera name the model declares (e.g. ``"exterior_1"``).
        data: base64 JPEG or PNG text; raw encoded ``bytes`` are base64-encoded for you.
            Use ``sequence_ai.encode_jpeg()`` to turn an HxWx3 uint8 array or a PIL image into it.
        timestamp_ms: capture time in milliseconds, optional.
    """

    view: str
    data: Union[str, bytes]
    timestamp_ms: Optional[float] = None

    def to_wire(self, raw: bool = False) -> Dict[str, Any]:
        """The wire dict; ``raw=True`` keeps encoded bytes as bytes (the /act encoder decides)."""
        data = self.data
        if isinstance(data, (bytes, bytearray)) and not raw:
            data = base64.b64encode(bytes(data)).decode("ascii")
        out: Dict[str, Any] = {"view": self.view, "data": data}
        if self.timestamp_ms is not None:
            out["timestamp_ms"] = self.timestamp_ms
        return out


@dataclass
class Proprioception:
    """The robot's own state. Omitted fields are "not reported", which is not the same as zeros.

    Args:
        joint_positions: joint angles (rad) or positions, one float per joint. Required.
        gripper: gripper state as a list (a dual-arm robot reports two), optional.
        joint_velocities: rad/s per joint, optional.
        end_effector_pose: the pose vector the model expects, optional.
    """

    joint_positions: Sequence[float]
    gripper: Optional[Sequence[float]] = None
    joint_velocities: Optional[Sequence[float]] = None
    end_effector_pose: Optional[Sequence[float]] = None

    def to_wire(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"joint_positions": _floats(self.joint_positions)}
        for name in ("gripper", "joint_velocities", "end_effector_pose"):
            value = getattr(self, name)
            if value is not None:
                out[name] = _floats(value)
        return out


@dataclass
class Observation:
    """What the policy sees at one instant: camera frames, proprioception and an instruction.

    All three are required. ``act()`` (and ``set_instruction()``) overwrite ``instruction`` on
    the copy that is sent; the object you pass is never mutated. ``depth`` (optional) is a list
    of ``{"view", "data"}`` 16-bit PNGs of millimetres for cameras declared ``depth=True``
    (``sequence_ai.observation(depth=...)`` builds it).
    """

    images: List[ImageFrame]
    proprioception: Proprioception
    instruction: Optional[str]
    depth: Optional[List[Dict[str, Any]]] = None

    def to_wire(self, raw: bool = False) -> Dict[str, Any]:
        """The wire dict (base64 frames; ``raw=True`` keeps encoded bytes as bytes)."""
        out: Dict[str, Any] = {
            "images": [img.to_wire(raw) if hasattr(img, "to_wire") else dict(img) for img in self.images],
            "proprioception": (
                self.proprioception.to_wire()
                if hasattr(self.proprioception, "to_wire")
                else dict(self.proprioception)
            ),
            "instruction": self.instruction,
        }
        if self.depth:
            out["depth"] = [
                {"view": d["view"], "data": d["data"] if raw or isinstance(d["data"], str)
                 else base64.b64encode(bytes(d["data"])).decode("ascii")}
                for d in self.depth]
        return out


def observation_to_wire(observation: Union[Observation, Mapping[str, Any]],
                        instruction: Optional[str] = None) -> Dict[str, Any]:
    """The JSON body's ``observation`` object; ``instruction``, when given, replaces the observation's."""
    if isinstance(observation, Observation):
        wire = observation.to_wire(raw=True)
    elif isinstance(observation, Mapping):
        wire = dict(observation)
    else:
        raise TypeError(
            f"observe() must return a sequence_ai.Observation (or its wire dict), got "
            f"{type(observation).__name__}"
        )
    if instruction is not None:
        wire["instruction"] = instruction
    return wire


def is_absolute_action_space(action_space: Optional[str]) -> bool:
    """True when rows are targets (``joint_absolute``, ``ee_absolute``, ``joint_position``).

    Deltas and velocities are not absolute: blending them would rescale increments.
    Unknown or missing action spaces count as not absolute, so nothing is ever blended by guess.
    """
    if not action_space:
        return False
    name = action_space.lower()
    if "delta" in name or "velocity" in name:
        return False
    return "absolute" in name or name.endswith("_position") or name.endswith("_positions")


def _fmt_hz(hz: Optional[float]) -> str:
    if hz is None:
        return "? Hz"
    return f"{hz:g} Hz"


@dataclass
class ActionChunk:
    """A block of future actions, one row per control step.

    Attributes:
        actions: rows x dims floats, the policy's own output, untouched (``rows`` is an alias).
        action_space: what a row means (``joint_absolute``, ``joint_delta``, ``joint_velocity``,
            ``ee_absolute`` ...). Read it: the shapes look the same.
        robot: the robot the rows are for (e.g. ``"panda"``).
        control_frequency_hz: rows per second (Hz) the rows are meant to be played at.
        open_loop_horizon: how many rows to execute before replanning ("replan after N"),
            or None to play the whole chunk.
        extra: response fields this client does not know, preserved rather than dropped.
    """

    actions: List[List[float]]
    action_space: Optional[str] = None
    robot: Optional[str] = None
    control_frequency_hz: Optional[float] = None
    open_loop_horizon: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "ActionChunk":
        known = {"actions", "action_space", "robot", "control_frequency_hz", "open_loop_horizon"}
        rows = [list(map(float, row)) for row in data.get("actions") or []]
        hz = data.get("control_frequency_hz")
        olh = data.get("open_loop_horizon")
        return cls(
            actions=rows,
            action_space=data.get("action_space"),
            robot=data.get("robot"),
            control_frequency_hz=float(hz) if hz is not None else None,
            open_loop_horizon=int(olh) if olh is not None else None,
            extra={k: v for k, v in data.items() if k not in known},
        )

    @property
    def rows(self) -> List[List[float]]:
        """Alias of ``actions``."""
        return self.actions

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def action_dim(self) -> int:
        """Floats per row (0 for an empty chunk)."""
        return len(self.actions[0]) if self.actions else 0

    @property
    def covers_seconds(self) -> Optional[float]:
        """Seconds of motion the whole chunk holds: rows / control_frequency_hz (None without a rate)."""
        if not self.control_frequency_hz:
            return None
        return round(len(self.actions) / self.control_frequency_hz, 3)

    @property
    def playable(self) -> int:
        """Rows executed before replanning: ``open_loop_horizon`` clipped to the chunk, or all rows."""
        n = len(self.actions)
        if self.open_loop_horizon is None or self.open_loop_horizon <= 0:
            return n
        return min(self.open_loop_horizon, n)

    @property
    def is_absolute(self) -> bool:
        """True when rows are targets, not deltas or velocities (see ``is_absolute_action_space``)."""
        return is_absolute_action_space(self.action_space)

    def __repr__(self) -> str:
        covers = self.covers_seconds
        parts = [
            f"{len(self)} steps x {self.action_dim} dims",
            self.action_space or "unknown action space",
            self.robot or "unknown robot",
            _fmt_hz(self.control_frequency_hz),
        ]
        if covers is not None:
            parts.append(f"covers {covers:.2f}s")
        if self.open_loop_horizon is not None:
            parts.append(f"replan after {self.open_loop_horizon}")
        return f"ActionChunk({', '.join(parts)})"


@dataclass
class Prediction:
    """One /act answer.

    Attributes:
        action_chunk: the chunk.
        warnings: server-side warnings (strings), empty when none.
        inference_ms: time the policy's infer() took on the worker, in ms.
        request_id: the server's request id.
        latency_s: round trip measured by this client, in seconds (includes any reconnect).
        own_io: True when the answer carries no action chunk but the ``outputs`` of a policy
            that defines its own inputs and outputs (no contract); ``outputs`` is what its
            infer() returned. ``predict()`` returns ``outputs`` itself for such a policy.
        extra: unknown response fields, preserved.
    """

    action_chunk: ActionChunk
    warnings: List[str] = field(default_factory=list)
    inference_ms: Optional[float] = None
    request_id: Optional[str] = None
    latency_s: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)
    own_io: bool = False
    outputs: Any = field(default=None, repr=False)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any], *, request_id: Optional[str] = None,
                  latency_s: Optional[float] = None) -> "Prediction":
        known = {"action_chunk", "warnings", "inference_ms", "request_id"}
        ms = data.get("inference_ms")
        own_io = data.get("action_chunk") is None and "outputs" in data
        return cls(
            action_chunk=ActionChunk.from_wire(data.get("action_chunk") or {}),
            warnings=list(data.get("warnings") or []),
            inference_ms=float(ms) if ms is not None else None,
            request_id=data.get("request_id") or request_id,
            latency_s=latency_s,
            extra={k: v for k, v in data.items() if k not in known},
            own_io=own_io,
            outputs=data.get("outputs"),
        )


#: Every word a run's ending can be reported with: ``RunOutcome.reason``, the ROS ``Act`` result's
#: and ``RunOutcome.msg``'s ``reason``, the MCP ``act`` tool's ``outcome.reason``. The ones the
#: caller asked for end without a hold (``completed``, ``until``, ``stop_when``); every other one
#: holds the robot first (``operator`` only when something was commanded). ``error`` comes from
#: the ROS driver and the MCP server only: in Python an error is raised, after the hold.
END_REASONS = {
    "completed": "max_actions were executed",
    "until": "the until() callable said done (ROS: the driver's success_service said so)",
    "stop_when": "the stop condition said done: stop_when(observation) in Python, checked every control "
                 "period; a named condition (a CheckSuccess service) on the Act goal or the MCP act call",
    "timeout": "max_seconds of motion elapsed",
    "interrupted": "interrupt(), a StopToken, a cancelled goal or tool call, a preempting goal, the driver "
                   "ending the run",
    "operator": "a human operator holds the robot (Operator.take(), the driver's operator topic): refused "
                "before it started, or held within one control period",
    "validate": "validate() refused an action (it was not executed): a bound, a stale or malformed sensor",
    "delay_exceeded": "the measured inference delay went beyond the policy's max_delay_steps",
    "stale_camera": "a camera stream froze or stalled longer than its maximum frame age",
    "error": "ROS / MCP only: the run failed (the message says why); Python raises instead",
}


@dataclass
class RunOutcome:
    """How a ``run()`` / ``act()`` ended and what happened on the way.

    Attributes:
        reason: why it ended, one of :data:`END_REASONS` (the same words in the ROS ``Act``
            result and the MCP ``act`` tool): ``completed``, ``until``, ``stop_when``,
            ``timeout``, ``interrupted``, ``operator``, ``validate``, ``delay_exceeded`` or
            ``stale_camera``; ``delay_exceeded`` and ``stale_camera`` hold and carry their typed
            error in ``fault``. ``end_reason`` is the same string.
        actions: actions passed to ``act``.
        chunks: chunks that started playing.
        seconds: wall time of the whole call, startup included (s).
        underruns: times an action was due and the buffer was empty.
        underrun_s: total seconds the arm spent with no command (s).
        max_seam_jump: largest per-dimension |first row of a new chunk - last executed action|,
            measured before any smoothing, in the action space's units (read with action_space).
        instruction_swaps: instruction changes that took effect during the run.
        max_instruction_lag_s: longest delay from ``set_instruction()`` to the first action
            computed under it (s), or None if none took effect.
        action_space: the action space of the chunks played, or None if none played.
        late_ticks: times the loop fell more than one control period behind and resynced
            instead of bursting actions to catch up.
        clipped: values the client clipped into the declared bounds / max_delta before they
            reached ``act`` (the worker clips within a chunk; this counts what crossed a seam
            or arrived out of bounds anyway).
        seams: per-seam telemetry (``SeamSummary``: count, jump p50/p99 before and after any
            blend, largest delay sent, rows trimmed, playback left at arrival, ``.records``).
        merge: how chunks were merged (``replace``, ``aligned``, ``aligned_blend``).
        delay_mode: the delay mode the run negotiated (``chunk``, ``guided``, ``trained``).
        stale_answers: answers dropped because they belonged to an older generation or request.
        fault: the typed error of a ``delay_exceeded`` (``DelayUnsupported``) or
            ``stale_camera`` (``StaleCamera``) ending, else None. Those endings hold first.
        obs_to_action_p50_s / obs_to_action_p99_s: observation-to-action latency (s), median
            and 99th percentile over the chunks that played: from ``observe()`` returning the
            frame a request was built from to ``act()`` returning on the first action played from
            the chunk computed on it (encode, network, queue, inference, the wait for its turn in
            the buffer). None when no chunk played.
    """

    reason: str
    actions: int = 0
    chunks: int = 0
    seconds: float = 0.0
    underruns: int = 0
    underrun_s: float = 0.0
    max_seam_jump: float = 0.0
    instruction_swaps: int = 0
    max_instruction_lag_s: Optional[float] = None
    action_space: Optional[str] = None
    late_ticks: int = 0
    clipped: int = 0
    seams: SeamSummary = field(default_factory=SeamSummary)
    merge: str = "replace"
    delay_mode: str = "chunk"
    stale_answers: int = 0
    fault: Optional[Exception] = None
    obs_to_action_p50_s: Optional[float] = None
    obs_to_action_p99_s: Optional[float] = None

    @property
    def end_reason(self) -> str:
        """How the run ended (the same as ``reason``)."""
        return self.reason

    def __repr__(self) -> str:
        return (f"RunOutcome({self.actions} actions over {self.chunks} chunks in "
                f"{self.seconds:.1f}s, {self.reason})")


@dataclass
class ModelInfo:
    """One row of the gateway's catalogue (``sequence_ai.models()``).

    The per-model numbers are read off the declared contract by the gateway; a policy with no
    contract (its own inputs and outputs) has None in each of them.

    Attributes:
        name: the deployment (or template) name; ``short_id`` is the same string, the key to
            index rows by: ``{m.short_id: m for m in sequence_ai.models()}``.
        kind: ``"model"`` (a deployment you can ``connect()`` to) or ``"template"`` (what
            ``seq init <short_id>`` writes; deploy it first). ``template_kind``: ``"policy"``.
        endpoint: ``"act"`` for a deployment, None for a template.
        status: ``starting``, ``ready``, ``failed``, ``stopped`` (or ``template``).
        contract: ``{"action": {...}|None, "observation": {...}|None}`` as declared by the policy.
        params: the inference parameters the policy declares, with their defaults (a list of dicts).
        camera_views: the camera names to send, in declared order.
        state_dim: proprioception width, the sum of ``state_layout`` (not ``action_dim``).
        state_layout: ``{field: width}``, e.g. ``{"joint_positions": 7, "gripper": 1}``.
        action_dim: floats per returned row.  action_space: what a row means
            (``joint_absolute``, ``joint_velocity``, ...).  action_semantics: the controller
            interface the rows are for (the declared action space; ``pass_raw``: nothing converts
            the rows).  robot: the robot they are for.
        control_frequency_hz: rows per second (Hz).
        client_resize: ``{"size": [w, h], "filter": "bilinear"}`` (or ``{"sizes": {view: [w, h]}}``
            when cameras differ): the exact frame size the worker accepts; ``encode()`` and
            ``observation()`` produce it.  input_aspect_ratio: w / h of that size.
        extra: any other fields, preserved.
    """

    name: str
    status: Optional[str] = None
    contract: Optional[Dict[str, Any]] = None
    params: Optional[Any] = None
    short_id: str = ""
    kind: str = "model"
    template_kind: Optional[str] = None
    endpoint: Optional[str] = "act"
    camera_views: Optional[List[str]] = None
    state_dim: Optional[int] = None
    state_layout: Optional[Dict[str, int]] = None
    action_dim: Optional[int] = None
    action_space: Optional[str] = None
    action_semantics: Optional[str] = None
    robot: Optional[str] = None
    control_frequency_hz: Optional[float] = None
    client_resize: Optional[Dict[str, Any]] = None
    input_aspect_ratio: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    _FIELDS = ("name", "status", "contract", "params", "short_id", "kind", "template_kind", "endpoint",
               "camera_views", "state_dim", "state_layout", "action_dim", "action_space",
               "action_semantics", "robot", "control_frequency_hz", "client_resize",
               "input_aspect_ratio")

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "ModelInfo":
        values = {k: data[k] for k in cls._FIELDS if k in data}
        values.setdefault("name", "")
        values["short_id"] = values.get("short_id") or values["name"]
        values.setdefault("kind", "model")
        return cls(**values, extra={k: v for k, v in data.items() if k not in cls._FIELDS})
