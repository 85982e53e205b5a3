"""Reading an /act request on the worker: the body, the contract check, the frame decoding.

* ``parse_act_body(raw, content_type)`` -- the /act body, JSON or the binary framing
  (``sequence_ai_core.protocol``: 4-byte big-endian JSON length, JSON, blobs); a malformed one is
  an ``ApiError`` 400 naming what is wrong.
* ``parse_observation(...)`` -- the ObservationContract check (views, frame sizes, history, depth,
  proprioception widths, instruction), then decoding each frame once: JPEG with simplejpeg
  (libjpeg-turbo), PNG / 16-bit depth PNG with Pillow. Refusals are ``ApiError`` 400s.
* ``parse_delay(body, spec)`` -- the delay fields of an /act body: the committed ``prefix`` and
  ``delay_steps`` (for an infer() that declares them) and the ``request_id`` / ``generation``
  the answer echoes.
* ``peek_deadline(raw, content_type)`` -- the request's ``deadline_ms`` / ``period_ms``, read
  before the body is queued (the queue is ordered by them), validated: 400 naming the field.
* ``synthetic_observation(spec)`` -- the black-frame observation a worker checks itself with.
"""
from __future__ import annotations

import base64
import io
import json
import math
import re
from typing import Any, Optional

import numpy as np
import simplejpeg
from PIL import Image as PILImage

import seq
from seq.spec import PolicySpec
from sequence_ai_core.protocol import (BINARY_CONTENT_TYPE, MAX_DEADLINE_MS, RAW_ENCODING, FramingError, decode_act_body,
                                       frame_bytes)

from sequence_ai_server.common.errors import ApiError

__all__ = ["parse_act_body", "parse_observation", "decode_frame", "decode_image", "decode_depth", "frame_data",
           "fits_float", "synthetic_observation", "SYNTHETIC_INSTRUCTION", "parse_delay", "peek_deadline",
           "MAX_DEADLINE_MS"]

SYNTHETIC_INSTRUCTION = "synthetic check: hold still"
_DEADLINE_HEAD = re.compile(rb'\{"deadline_ms":(-?[0-9.eE+-]{1,32})(?:,"period_ms":(-?[0-9.eE+-]{1,32}))?[,}]')
_JPEG_MAGIC = b"\xff\xd8"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _bad(detail: str, hint: Optional[str] = None, **details: Any) -> ApiError:
    return ApiError("invalid_request", detail, hint=hint, details=details or None)


def _refused(exc: FramingError) -> ApiError:
    return ApiError("invalid_request", exc.detail, hint=exc.hint, details=exc.details)


def parse_act_body(raw: bytes, content_type: str = "application/json") -> tuple[dict, Optional[memoryview]]:
    """Split an /act body into its JSON object and, for the binary framing, the blob region
    (``protocol.decode_act_body``). Raises ApiError(invalid_request) naming what is malformed."""
    try:
        return decode_act_body(raw, content_type)
    except FramingError as exc:
        raise _refused(exc) from None


def frame_data(frame: dict, where: str, blobs: Optional[memoryview]) -> Any:
    """The frame's encoded bytes: a zero-copy view into the binary body's blobs, or
    base64-decoded (``protocol.frame_bytes``). Raises ApiError(invalid_request)."""
    try:
        return frame_bytes(frame, where, blobs)
    except FramingError as exc:
        raise _refused(exc) from None


def _size_mismatch(where: str, got: tuple[int, int], expect: tuple[int, int]) -> ApiError:
    w, h = expect
    return _bad(f"{where}: frame is {got[0]}x{got[1]}, this policy reads {w}x{h}",
                hint=f"send the camera's native frame through a connected sequence_ai Policy, or build the "
                     f"observation with sequence_ai.observation(policy, ...): it is resampled once, from the native "
                     f"pixels, to {w}x{h} (width x height) when encoded; do not shrink it yourself first",
                view_size=list(got), expected=[w, h])


def decode_image(raw: Any, where: str, expect: Optional[tuple[int, int]]) -> np.ndarray:
    """JPEG (simplejpeg) or PNG (Pillow) bytes -> HxWx3 uint8 RGB. The size is checked from the
    header, before decoding. Raises ApiError(invalid_request)."""
    if bytes(raw[:2]) == _JPEG_MAGIC:
        try:
            h, w, _, _ = simplejpeg.decode_jpeg_header(raw)
        except (ValueError, RuntimeError):
            raise _bad(f"{where}: data is not a readable JPEG") from None
        if expect is not None and (w, h) != expect:
            raise _size_mismatch(where, (w, h), expect)
        try:
            return simplejpeg.decode_jpeg(raw, colorspace="RGB")
        except (ValueError, RuntimeError) as exc:
            raise _bad(f"{where}: JPEG could not be decoded ({exc})") from None
    if bytes(raw[:8]) == _PNG_MAGIC:
        img = _open_png(raw, where)
        if expect is not None and img.size != expect:
            raise _size_mismatch(where, img.size, expect)
        try:
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
        except Exception as exc:
            raise _bad(f"{where}: PNG could not be decoded ({exc})") from None
    raise _bad(f"{where}: data is not a JPEG or PNG image", hint="encode each frame as JPEG (quality 95) or PNG")


def decode_frame(frame: dict, where: str, blobs: Optional[memoryview], expect: Optional[tuple[int, int]]) -> np.ndarray:
    """One camera frame of the body -> HxWx3 uint8 RGB: JPEG / PNG (:func:`decode_image`), or
    with ``"encoding": "rgb8"`` its raw pixels (``"shape": [H, W, 3]``, H x W x 3 bytes; a copy,
    or a view of a body the worker owns and nothing else reads: the same-host path's bytearray). Raises ApiError(invalid_request) for another encoding, a
    shape or byte count that does not match, or a size other than ``expect`` (width, height)."""
    data = frame_data(frame, where, blobs)
    encoding = frame.get("encoding")
    if encoding is None:
        return decode_image(data, where, expect)
    if encoding != RAW_ENCODING:
        raise _bad(f"{where}: frame encoding {encoding!r} is not {RAW_ENCODING!r}",
                   hint=f'leave "encoding" out for JPEG / PNG bytes, or send "{RAW_ENCODING}" with "shape": [H, W, 3]')
    shape = frame.get("shape")
    if (not isinstance(shape, list) or len(shape) != 3 or shape[2] != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1 << 15 for n in shape)):
        raise _bad(f"{where}: a raw frame's shape must be [H, W, 3] (positive integers), got {shape!r}")
    if len(data) != shape[0] * shape[1] * 3:
        raise _bad(f"{where}: a raw {shape[0]}x{shape[1]}x3 frame is {shape[0] * shape[1] * 3} bytes, got {len(data)}")
    if expect is not None and (shape[1], shape[0]) != expect:
        raise _size_mismatch(where, (shape[1], shape[0]), expect)
    pixels = np.frombuffer(data, dtype=np.uint8).reshape(shape)
    return pixels if pixels.flags.writeable else pixels.copy()     # a private body's view (same host) is the policy's


def _open_png(raw: Any, where: str):
    try:
        return PILImage.open(io.BytesIO(bytes(raw)), formats=["PNG"])
    except Exception:
        raise _bad(f"{where}: data is not a readable PNG") from None


def decode_depth(raw: Any, where: str, expect: Optional[tuple[int, int]]) -> np.ndarray:
    """A 16-bit grayscale PNG of millimetres -> HxW float32 metres. Raises ApiError otherwise."""
    if bytes(raw[:8]) != _PNG_MAGIC:
        raise _bad(f"{where}: a depth frame must be a 16-bit PNG of millimetres",
                   hint="send depth as a lossless 16-bit PNG (JPEG would corrupt the distances)")
    img = _open_png(raw, where)
    if img.mode not in ("I;16", "I;16B", "I"):
        raise _bad(f"{where}: depth PNG is mode {img.mode}; expected 16-bit grayscale millimetres",
                   hint="encode the depth map as uint16 millimetres")
    if expect is not None and img.size != expect:
        raise _size_mismatch(where, img.size, expect)
    return np.asarray(img, dtype=np.float32) / 1000.0


def fits_float(value: Any) -> bool:
    """False for an int too large for a 64-bit float (JSON allows any number of digits)."""
    try:
        float(value)
    except OverflowError:
        return False
    except (TypeError, ValueError):
        return True       # not a number at all: the caller's own check names that
    return True


def _prefix(value: Any, action: Any) -> Optional[np.ndarray]:
    """The committed prefix: None, or rows x action_dim finite floats (float32)."""
    if value is None:
        return None
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError, RecursionError):
        arr = None
    if arr is None or arr.dtype.kind not in "iuf":     # strings, booleans, null, ragged or huge ints
        raise _bad("prefix must be a list of rows of numbers (the committed actions)", field="prefix") from None
    arr = arr.astype(np.float64)
    dim = action.action_dim if action is not None else None
    if arr.ndim != 2 or arr.shape[0] == 0 or (dim is not None and arr.shape[1] != dim):
        raise _bad(f"prefix has shape {list(arr.shape)}; expected k x {dim or 'action_dim'} with k >= 1",
                   hint="send the committed rows in the chunk's action space, or null on a cold request",
                   field="prefix")
    if not np.all(np.isfinite(arr)):
        raise _bad("prefix holds NaN or infinity", field="prefix")
    return arr.astype(np.float32)


def _count_field(body: dict, name: str) -> Optional[int]:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 53:
        raise _bad(f"{name} must be a whole number >= 0, got {str(value)[:40]}", field=name)
    return value


def parse_delay(body: dict, spec: PolicySpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The delay fields of an /act body -> (keyword arguments for infer, fields to echo).

    ``prefix`` (rows x action_dim, absolute, float32 array; None on a cold request) and
    ``delay_steps`` (int >= 0, control steps; 0 when absent) go to infer() only when it declares
    them (``spec.delay_inputs``). ``request_id`` (str, 1..128 chars) and ``generation``
    (int >= 0) are echoed in the answer. ``obs_time`` (unix s) must be a finite number or null.
    Raises ApiError(invalid_request): a malformed field, a prefix shorter than delay_steps, or
    delay_steps beyond the contract's ``max_delay_steps`` (``details.reason = "delay_exceeded"``).
    """
    action = spec.action
    prefix = _prefix(body.get("prefix"), action)
    steps = _count_field(body, "delay_steps")
    generation = _count_field(body, "generation")
    rid = body.get("request_id")
    if rid is not None and (not isinstance(rid, str) or not 0 < len(rid) <= 128):
        raise _bad("request_id must be a string of 1 to 128 characters", field="request_id")
    t = body.get("obs_time")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not fits_float(t)
                          or not np.isfinite(float(t))):
        raise _bad(f"obs_time must be the capture time in unix seconds or null, got {str(t)[:40]}", field="obs_time")
    if prefix is not None and steps is not None and prefix.shape[0] < steps:
        raise _bad(f"prefix has {prefix.shape[0]} rows, fewer than delay_steps={steps}",
                   hint="pad the prefix by repeating its last row", field="prefix")
    limit = action.max_delay_steps if action is not None else None
    if steps is not None and limit is not None and steps > limit:
        raise ApiError("invalid_request", f"delay_steps={steps} is beyond the {limit} control steps this policy "
                       "declares it handles (max_delay_steps)", details={"reason": "delay_exceeded",
                       "delay_steps": steps, "max_delay_steps": limit},
                       hint="lower the latency (a closer worker, fewer robots per replica) or use a policy trained for longer delays")
    given = {"prefix": prefix, "delay_steps": steps or 0}
    delay = {name: given[name] for name in spec.delay_inputs}
    echo = {k: v for k, v in (("request_id", rid), ("generation", generation)) if v is not None}
    return delay, echo


def _proprio(name: str, values: Any) -> np.ndarray:
    if isinstance(values, bool) or not isinstance(values, (list, int, float)):
        raise _bad(f"proprioception.{name} must be a list of numbers, got {type(values).__name__}")
    try:
        arr = np.atleast_1d(np.asarray(values, dtype=np.float64))
    except OverflowError:
        raise _bad(f"proprioception.{name} holds a number too large for a 64-bit float",
                   hint=f"send proprioception.{name} as finite floats in SI units (rad, m)", field=name) from None
    except (TypeError, ValueError, RecursionError):
        raise _bad(f"proprioception.{name} must be a list of numbers") from None
    if arr.ndim != 1:
        raise _bad(f"proprioception.{name} must be a flat list of numbers, got shape {list(arr.shape)}")
    return arr


def _timestamp(value: Any, where: str) -> Optional[float]:
    """A frame's ``timestamp_ms``: null or a finite number (ms); ApiError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not fits_float(value) \
            or not np.isfinite(float(value)):
        raise _bad(f"{where}: timestamp_ms must be a finite number of milliseconds or null, got {str(value)[:40]}",
                   hint="send the capture time in ms (e.g. time.time() * 1000) or leave it out")
    return value


def _frame_lists(raw: Any) -> tuple[list, list, dict, str]:
    """The observation's parts with their JSON types checked: images, depth, proprio, instruction."""
    if not isinstance(raw, dict):
        raise _bad(f"observation must be a JSON object, got {type(raw).__name__}")
    images_in = raw.get("images") or []
    depth_in = raw.get("depth") or []
    proprio_in = raw.get("proprioception") or {}
    instruction = raw.get("instruction") or ""
    if not isinstance(images_in, list) or not all(isinstance(f, dict) and isinstance(f.get("view"), str) for f in images_in):
        raise _bad("observation.images must be a list of {view, data}", hint="see docs/design.md")
    if not isinstance(depth_in, list) or not all(isinstance(f, dict) and isinstance(f.get("view"), str) for f in depth_in):
        raise _bad("observation.depth must be a list of {view, data}", hint="see docs/design.md")
    if not isinstance(proprio_in, dict):
        raise _bad("observation.proprioception must be an object of field -> [numbers]")
    if not isinstance(instruction, str):
        raise _bad("observation.instruction must be a string")
    return images_in, depth_in, proprio_in, instruction


def _check_views(contract: Any, frames: dict[str, list[dict]], warnings: list[str]) -> None:
    """Declared views present (undeclared ones dropped with a warning), ``history`` frames per view
    (the newest kept). Edits ``frames`` in place."""
    declared = ", ".join(f"{v} ({c.width}x{c.height})" for v, c in contract.cameras.items()) or "none"
    missing = [v for v in contract.cameras if v not in frames]
    if missing:
        raise _bad(f"missing view(s) {missing}; this policy reads: {declared}",
                   hint="send one frame per declared camera view, named exactly as declared",
                   missing_views=missing, declared_views=list(contract.cameras))
    for view in list(frames):
        if view not in contract.cameras:
            warnings.append(f"view {view!r} is not declared by this policy and was ignored")
            del frames[view]
    n = contract.history
    for view, fs in frames.items():
        if len(fs) < n:
            raise _bad(f"view {view!r} has {len(fs)} frame(s); this policy reads {n} per view (history={n})",
                       hint=f"send the last {n} frame(s) of each view, oldest first",
                       view=view, got=len(fs), expected=n)
        if len(fs) > n:
            frames[view] = fs[-n:]                  # the newest n; older ones are not read


def _check_depth(contract: Any, depth_frames: dict[str, dict], warnings: list[str]) -> None:
    """Declared depth frames present; undeclared ones dropped with a warning (in place)."""
    missing_depth = [v for v, c in contract.cameras.items() if c.depth and v not in depth_frames]
    if missing_depth:
        raise _bad(f"missing depth frame(s) for view(s) {missing_depth}",
                   hint="send observation.depth: [{view, data: base64 16-bit PNG of millimetres}]",
                   missing_depth=missing_depth)
    for view in list(depth_frames):
        cam = contract.cameras.get(view)
        if cam is None or not cam.depth:
            warnings.append(f"depth for view {view!r} is not declared by this policy and was ignored")
            del depth_frames[view]


def _check_proprio(contract: Any, proprio: dict[str, np.ndarray], instruction: str) -> None:
    """Declared proprioception fields present, of their declared widths, finite; the
    instruction non-empty."""
    for name, width in contract.proprio.items():
        if name not in proprio:
            raise _bad(f"missing proprioception.{name}; this policy reads {dict(contract.proprio)}",
                       hint=f"send proprioception.{name} as a list of {width} float(s)", missing_field=name)
        got = proprio[name].shape[0]
        if got != width:
            raise _bad(f"proprioception.{name} has {got} value(s); this policy reads {width}",
                       hint=f"send exactly {width} value(s) for {name}; declared: {dict(contract.proprio)}",
                       field=name, got=got, expected=width)
        if not np.all(np.isfinite(proprio[name])):
            raise _bad(f"proprioception.{name} contains NaN or infinity")
    if not instruction.strip():
        raise _bad("instruction is empty; this policy needs a task instruction",
                   hint='send observation.instruction, e.g. "put the red cube on the green pad"')


def _expected_size(contract: Any, view: str) -> Optional[tuple[int, int]]:
    cam = contract.cameras.get(view) if contract is not None else None
    return (cam.width, cam.height) if cam is not None else None


def parse_observation(raw: Any, spec: PolicySpec, episode_id: Optional[str],
                      blobs: Optional[memoryview] = None) -> tuple[seq.Observation, list[str]]:
    """Check a wire observation against the contract (if declared), then decode it.

    Checks, before any decoding: declared views present (undeclared ones dropped with a
    warning), at least ``history`` frames per view (older extras dropped), declared depth frames
    present, proprioception fields present with their declared widths and finite, instruction
    non-empty. -> (the decoded ``seq.Observation``, warnings). Raises ApiError(invalid_request)
    naming what is wrong and what to send.
    """
    images_in, depth_in, proprio_in, instruction = _frame_lists(raw)
    frames: dict[str, list[dict]] = {}
    for frame in images_in:
        frames.setdefault(frame["view"], []).append(frame)
    depth_frames = {d["view"]: d for d in depth_in}
    proprio = {name: _proprio(name, values) for name, values in proprio_in.items()}
    warnings: list[str] = []
    contract = spec.observation
    if contract is not None:
        _check_views(contract, frames, warnings)
        _check_depth(contract, depth_frames, warnings)
        _check_proprio(contract, proprio, instruction)
    images: dict[str, np.ndarray] = {}
    timestamps: dict[str, Optional[float]] = {}
    history = contract.history if contract is not None else 1
    for view, fs in frames.items():
        where = f"view {view!r}"
        arrays = [decode_frame(f, where, blobs, _expected_size(contract, view)) for f in fs]
        images[view] = arrays[0] if history == 1 and len(arrays) == 1 else np.stack(arrays)
        timestamps[view] = _timestamp(fs[-1].get("timestamp_ms"), where)
    depth: dict[str, np.ndarray] = {}
    for view, d in depth_frames.items():
        where = f"depth {view!r}"
        depth[view] = decode_depth(frame_data(d, where, blobs), where, _expected_size(contract, view))
    obs = seq.Observation(images=images, proprio=proprio, instruction=instruction, episode_id=episode_id,
                          depth=depth, timestamps_ms=timestamps)
    return obs, warnings


def synthetic_observation(spec: PolicySpec) -> dict[str, Any]:
    """Black frames at each declared size (``history`` of them per view), zero 16-bit depth
    maps where declared, zero vectors of each declared width, an instruction."""
    contract = spec.observation
    images, depth = [], []
    for view, cam in contract.cameras.items():
        buf = io.BytesIO()
        PILImage.new("RGB", (cam.width, cam.height)).save(buf, format="PNG")
        data = base64.b64encode(buf.getvalue()).decode()
        images.extend({"view": view, "data": data, "timestamp_ms": 0} for _ in range(contract.history))
        if cam.depth:
            buf = io.BytesIO()
            PILImage.fromarray(np.zeros((cam.height, cam.width), dtype=np.uint16)).save(buf, format="PNG")
            depth.append({"view": view, "data": base64.b64encode(buf.getvalue()).decode()})
    return {"images": images, "depth": depth,
            "proprioception": {k: [0.0] * w for k, w in contract.proprio.items()},
            "instruction": SYNTHETIC_INSTRUCTION}




def _ms_field(value: Any, name: str, meaning: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not fits_float(value):
        raise _bad(f"{name} must be a number of milliseconds, got {str(value)[:40]}", field=name,
                   hint=f"send {name} as {meaning}, in ms, or leave it out")
    ms = float(value)
    if math.isnan(ms) or ms <= 0:
        raise _bad(f"{name} is {str(value)[:40]}: it must be more than 0 ms" +
                   (" (this deadline has already passed)" if name == "deadline_ms" and ms <= 0 else ""),
                   field=name, hint=f"send {name} as {meaning}, in ms; a robot already out of actions sends 1")
    if ms > MAX_DEADLINE_MS:
        raise _bad(f"{name} is {str(value)[:40]} ms, beyond {MAX_DEADLINE_MS:.0f} ms", field=name,
                   hint=f"send {name} as {meaning}, in ms (at most {MAX_DEADLINE_MS:.0f}), or leave it out")
    return ms


def peek_deadline(raw: bytes, content_type: str) -> tuple[Optional[float], Optional[float]]:
    """An /act body's ``deadline_ms`` and ``period_ms`` -> (deadline ms, period ms), each None
    when absent; read before the body is decoded, since the queue is ordered by it.

    ``deadline_ms``: the playback the robot has left when it sends, less its network round trip
    (ms, in (0, 60000]): the time the worker has to answer. ``period_ms``: the session's
    declared time between chunks (replan rows / control Hz, ms, in (0, 60000]). The client
    writes them first in the JSON (``{"deadline_ms":..,"period_ms":..,``), read here without
    parsing the rest; anywhere else in the JSON they are found by parsing it whole. A body
    that carries neither is served as before deadlines existed. Raises ApiError
    (invalid_request, ``details.field`` naming the field): not a number, NaN, 0 or below
    (past), above 60000 (absurd). A body that is malformed otherwise is left for the replica's
    full check (this returns (None, None))."""
    if content_type.startswith(BINARY_CONTENT_TYPE):       # the JSON part only: no copy of the frames
        if len(raw) < 4:
            return None, None
        text = bytes(memoryview(raw)[4:4 + int.from_bytes(bytes(raw[:4]), "big")])
    else:
        text = bytes(raw)
    head = _DEADLINE_HEAD.match(text, 0, 120)
    # the head stands for the body only when neither key appears again after it: a period_ms the
    # pattern could not read (a string, NaN, a space before it) or a repeated key is parsed whole
    if head is not None and text.find(b'"period_ms"', head.end()) < 0 and text.find(b'"deadline_ms"', head.end()) < 0:
        try:
            values = [None if g is None else float(g) for g in head.groups()]
        except ValueError:
            values = None
        if values is not None:
            return _ms_field(values[0], "deadline_ms", "the playback left less the round trip"), \
                _ms_field(values[1], "period_ms", "the time between this robot's chunks")
    if b'"deadline_ms"' not in text and b'"period_ms"' not in text:
        return None, None
    try:
        body = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, None
    if not isinstance(body, dict):
        return None, None
    return (_ms_field(body.get("deadline_ms"), "deadline_ms", "the playback left less the round trip"),
            _ms_field(body.get("period_ms"), "period_ms", "the time between this robot's chunks"))
