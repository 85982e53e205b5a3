"""Hosting one ``@seq.policy`` class: load, warm up, check, infer, batch, route episodes.

Everything here is independent of the process launcher: the HTTP worker (``worker.py``) drives
it today, and another launcher (a Ray actor, say) can drive the same object. The pieces:

  * ``load_policy_class(file, class_name)`` -- import a policy file, find its class.
  * ``parse_act_body(raw, content_type)`` -- the /act body, JSON or the binary framing
    (``application/vnd.sequence-ai.act+bin``: 4-byte big-endian JSON length, JSON, blobs).
  * ``parse_observation(...)`` -- the contract check (views, frame sizes, history, depth,
    proprioception widths, instruction), then decoding each frame once: JPEG with simplejpeg
    (libjpeg-turbo), PNG / 16-bit depth PNG with Pillow. Refusals are ``ApiError`` 400s.
  * ``finish_chunk(result, spec)`` -- the ActionContract check: shape, action_dim, action_space,
    finite values, open_loop_horizon, then bounds / max_delta clipped with a warning per step and
    dimension or refused (``details.reason = "bounds"``). max_delta bounds the change between
    consecutive rows for absolute and velocity spaces, each value's magnitude for delta spaces.
  * ``PolicyHost`` -- the replicas (``@seq.concurrent``: one instance and one thread each), the
    batcher (``@seq.batched``), sticky episodes (``episode_id`` -> replica; ``@seq.on_episode``
    at episode end, explicit or after ``episode_idle_s`` of quiet).

Every call into policy code runs on that replica's own thread, never on the caller's event loop.
"""
from __future__ import annotations

import base64
import binascii
import concurrent.futures
import importlib.util
import io
import json
import logging
import os
import queue
import struct
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import simplejpeg
from PIL import Image as PILImage

import seq
from seq._params import ParamError, cast_params
from seq._policy import PolicySpec, get_spec, is_policy
from seq._scaling import EVAL_BATCH_DEADLINE_MS

from .errors import ApiError, new_request_id

__all__ = [
    "BINARY_CONTENT_TYPE", "DEFAULT_MAX_BODY_BYTES", "EPISODE_IDLE_S", "PolicyError", "PolicyHost", "Prepared",
    "load_policy_class", "parse_act_body", "parse_observation", "finish_chunk", "synthetic_observation",
    "export_compile_caches", "encode_binary_body",
]

log = logging.getLogger("sequence_ai_server.worker")

BINARY_CONTENT_TYPE = "application/vnd.sequence-ai.act+bin"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024     # a 2x224^2 JPEG observation is ~30 KB; raw 4K frames still fit
EPISODE_IDLE_S = 300.0                        # an episode with no /act for this long is ended by the worker
MAX_WARNINGS = 32
SYNTHETIC_INSTRUCTION = "synthetic check: hold still"
_JPEG_MAGIC = b"\xff\xd8"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _bad(detail: str, hint: Optional[str] = None, **details: Any) -> ApiError:
    return ApiError("invalid_request", detail, hint=hint, details=details or None)


# ---------------------------------------------------------------- loading a policy file

def load_policy_class(file: str, class_name: Optional[str] = None) -> type:
    """Import ``file`` (its directory goes on sys.path) and return its @seq.policy class: the
    named one, or the only one the module defines. Raises FileNotFoundError, ImportError,
    LookupError (no / several / not-decorated class), or whatever the module raises on import
    (a DeclarationError for a malformed declaration)."""
    path = Path(file).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"policy file not found: {path}")
    directory = str(path.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module_name = path.stem
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    if class_name:
        cls = getattr(module, class_name, None)
        if cls is None:
            raise LookupError(f"{path.name} has no class {class_name!r}")
        if not is_policy(cls):
            raise LookupError(f"{path.name}:{class_name} is not decorated with @seq.policy")
        return cls
    found = [obj for obj in vars(module).values() if is_policy(obj) and obj.__module__ == module.__name__]
    if not found:
        raise LookupError(f"{path.name} defines no @seq.policy class")
    if len(found) > 1:
        names = ", ".join(sorted(c.__name__ for c in found))
        raise LookupError(f"{path.name} defines several @seq.policy classes ({names}); name one with --class")
    return found[0]


def export_compile_caches(cache_dir: str) -> dict[str, str]:
    """Point the torch inductor, Triton and JAX compilation caches at ``cache_dir`` (created),
    so what one worker compiled is read by the next. Sets and returns the variables."""
    root = Path(cache_dir)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"), "TRITON_CACHE_DIR": str(root / "triton"),
           "JAX_COMPILATION_CACHE_DIR": str(root / "jax")}
    for value in env.values():
        Path(value).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    return env


# ---------------------------------------------------------------- the /act body

def parse_act_body(raw: bytes, content_type: str = "application/json") -> tuple[dict, Optional[memoryview]]:
    """Split an /act body into its JSON object and, for the binary framing, the blob region.

    Binary framing: ``>I`` JSON length N, N bytes of UTF-8 JSON, then the blobs; each image's
    ``"blob": [offset, length]`` counts from the first byte after the JSON.
    Raises ApiError(invalid_request) naming what is malformed.
    """
    blobs: Optional[memoryview] = None
    if content_type.startswith(BINARY_CONTENT_TYPE):
        if len(raw) < 4:
            raise _bad(f"binary /act body is {len(raw)} bytes; it starts with a 4-byte JSON length",
                       hint="see docs/design.md: Binary /act body")
        (n,) = struct.unpack_from(">I", raw, 0)
        if n > len(raw) - 4:
            raise _bad(f"binary /act body declares {n} bytes of JSON but carries {len(raw) - 4} after the length",
                       hint="the length prefix is big-endian and counts only the JSON")
        text = bytes(memoryview(raw)[4:4 + n])
        blobs = memoryview(raw)[4 + n:]
    elif content_type.startswith("application/json") or not content_type:
        text = raw
    else:
        raise _bad(f"content type {content_type!r} is not accepted",
                   hint=f"send application/json or {BINARY_CONTENT_TYPE}")
    try:
        body = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: absurd nesting
        raise _bad(f"/act body is not valid JSON ({str(exc)[:200]})", hint="see docs/design.md for the /act body") from None
    if not isinstance(body, dict):
        raise _bad("/act body must be a JSON object", hint='send {"observation": {...}, "params": {}}')
    if "observation" not in body:
        raise _bad("/act body has no observation", hint='send {"observation": {...}, "params": {}}',
                   errors=["observation: Field required"])
    return body, blobs


def encode_binary_body(body: dict, frames: list[bytes]) -> bytes:
    """Build a binary /act body (tests and benchmarks): ``body``'s images already carry
    ``"blob": [offset, length]`` for ``frames`` in order."""
    text = json.dumps(body, separators=(",", ":")).encode()
    return struct.pack(">I", len(text)) + text + b"".join(frames)


def _frame_bytes(frame: dict, where: str, blobs: Optional[memoryview]) -> Any:
    """The frame's encoded bytes: a zero-copy view into the binary body's blobs, or base64-decoded."""
    if "blob" in frame:
        ref = frame["blob"]
        if blobs is None:
            raise _bad(f"{where}: blob references need the binary body ({BINARY_CONTENT_TYPE})")
        if (not isinstance(ref, list) or len(ref) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in ref)
                or ref[0] < 0 or ref[1] <= 0 or ref[0] + ref[1] > len(blobs)):
            raise _bad(f"{where}: blob {ref!r} is not an [offset, length] inside the {len(blobs)} blob bytes",
                       hint="offsets count from the first byte after the JSON")
        return blobs[ref[0]:ref[0] + ref[1]]
    data = frame.get("data")
    if not isinstance(data, str):
        raise _bad(f"{where}: frame has no data", hint='send "data": base64 of JPEG/PNG bytes (or "blob" in the binary body)')
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{where}: data is not valid base64", hint="send each frame as base64 of JPEG or PNG bytes") from None


def _size_mismatch(where: str, got: tuple[int, int], expect: tuple[int, int]) -> ApiError:
    w, h = expect
    return _bad(f"{where}: frame is {got[0]}x{got[1]}, this policy reads {w}x{h}",
                hint=f"resize the frame to {w}x{h} (width x height) before encoding it",
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


def _fits_float(value: Any) -> bool:
    """False for an int too large for a 64-bit float (JSON allows any number of digits)."""
    try:
        float(value)
    except OverflowError:
        return False
    except (TypeError, ValueError):
        return True       # not a number at all: the caller's own check names that
    return True


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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _fits_float(value) \
            or not np.isfinite(float(value)):
        raise _bad(f"{where}: timestamp_ms must be a finite number of milliseconds or null, got {str(value)[:40]}",
                   hint="send the capture time in ms (e.g. time.time() * 1000) or leave it out")
    return value


def parse_observation(raw: Any, spec: PolicySpec, episode_id: Optional[str],
                      blobs: Optional[memoryview] = None) -> tuple[seq.Observation, list[str]]:
    """Check a wire observation against the contract (if declared), then decode it.

    Checks, before any decoding: declared views present (undeclared ones dropped with a
    warning), at least ``history`` frames per view (older extras dropped), declared depth frames
    present, proprioception fields present with their declared widths and finite, instruction
    non-empty. Raises ApiError(invalid_request) naming what is wrong and what to send.
    """
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
    frames: dict[str, list[dict]] = {}
    for frame in images_in:
        frames.setdefault(frame["view"], []).append(frame)
    depth_frames = {d["view"]: d for d in depth_in}
    proprio = {name: _proprio(name, values) for name, values in proprio_in.items()}
    warnings: list[str] = []
    contract = spec.observation
    if contract is not None:
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

    images: dict[str, np.ndarray] = {}
    timestamps: dict[str, Optional[float]] = {}
    history = contract.history if contract is not None else 1
    for view, fs in frames.items():
        cam = contract.cameras.get(view) if contract is not None else None
        expect = (cam.width, cam.height) if cam is not None else None
        where = f"view {view!r}"
        arrays = [decode_image(_frame_bytes(f, where, blobs), where, expect) for f in fs]
        images[view] = arrays[0] if history == 1 and len(arrays) == 1 else np.stack(arrays)
        timestamps[view] = _timestamp(fs[-1].get("timestamp_ms"), where)
    depth: dict[str, np.ndarray] = {}
    for view, d in depth_frames.items():
        cam = contract.cameras.get(view) if contract is not None else None
        expect = (cam.width, cam.height) if cam is not None else None
        where = f"depth {view!r}"
        depth[view] = decode_depth(_frame_bytes(d, where, blobs), where, expect)
    obs = seq.Observation(images=images, proprio=proprio, instruction=instruction, episode_id=episode_id,
                          depth=depth, timestamps_ms=timestamps)
    return obs, warnings


# ---------------------------------------------------------------- checking the chunk

def _policy_error(detail: str, reason: str, **details: Any) -> ApiError:
    return ApiError("policy_error", detail, details={"reason": reason, **details},
                    hint="the chunk infer() returned does not fit the declared ActionContract")


def finish_chunk(result: Any, spec: PolicySpec) -> tuple[Optional[dict], list[str], Any]:
    """Check infer's result against the ActionContract; clip or refuse.

    -> (chunk dict for the wire or None, warnings, outputs). A policy with no contract whose
    infer is not written for Observation/ActionChunk gets its return value back as ``outputs``.
    Raises ApiError(policy_error) with ``details.reason`` in type | shape | action_dim |
    action_space | non_finite | open_loop_horizon | bounds.
    """
    if not isinstance(result, seq.ActionChunk):
        if spec.infer_mode == "raw" and spec.action is None:
            return None, [], result
        if isinstance(result, dict) and "actions" in result:
            try:
                result = seq.ActionChunk(result["actions"], result.get("open_loop_horizon"), result.get("action_space"))
            except (TypeError, ValueError) as exc:
                raise _policy_error(f"infer() returned an unusable chunk dict ({exc})", "type") from None
        elif isinstance(result, (np.ndarray, list, tuple)):
            try:
                result = seq.ActionChunk(result)
            except (TypeError, ValueError) as exc:
                raise _policy_error(f"infer() returned an array that is not numeric ({exc})", "type") from None
        else:
            raise _policy_error(f"infer() returned {type(result).__name__}; return seq.ActionChunk(actions=...)", "type")
    arr = np.array(result.actions, dtype=np.float64)
    action = spec.action
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise _policy_error(f"action chunk has shape {tuple(arr.shape)}; expected T x "
                            f"{action.action_dim if action else 'D'} with T >= 1", "shape", shape=list(arr.shape))
    if action is not None and arr.shape[1] != action.action_dim:
        raise _policy_error(f"action chunk rows have {arr.shape[1]} values; the contract declares action_dim={action.action_dim}",
                            "action_dim", shape=list(arr.shape))
    if action is not None and result.action_space is not None and result.action_space != action.action_space.value:
        raise _policy_error(f"action chunk is {result.action_space}; the contract declares {action.action_space.value}",
                            "action_space", got=result.action_space, expected=action.action_space.value)
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[:5].tolist()
        raise _policy_error(f"action chunk contains NaN or infinity at (step, dim) {bad}", "non_finite")
    olh = result.open_loop_horizon
    if olh is not None and not (1 <= olh <= arr.shape[0]):
        raise _policy_error(f"open_loop_horizon={olh} is outside 1..{arr.shape[0]} (the chunk's length)", "open_loop_horizon")
    warnings: list[str] = []
    if action is not None:
        violations: list[str] = []
        if action.bounds is not None:
            lo, hi = spec_bounds(action)
            outside = (arr < lo) | (arr > hi)
            if outside.any():
                for t, d in np.argwhere(outside).tolist():
                    violations.append(f"step {t} dim {d}: {arr[t, d]:.6g} outside [{lo[d]:.6g}, {hi[d]:.6g}]")
                arr = np.clip(arr, lo, hi)
        md = action.max_delta_per_dim()
        # max_delta follows the action space (the client's seam guard uses the same rule,
        # sequence_ai_core._limits.max_delta_rule): a delta row IS the step, so each value's
        # magnitude is bounded; any other row is a level, so the change between rows is.
        if md is not None and "delta" in action.action_space.value:
            limit = np.asarray(md)
            over = np.abs(arr) > limit
            if over.any():
                for t, d in np.argwhere(over).tolist():
                    violations.append(f"step {t} dim {d}: a step of {arr[t, d]:.6g}, max_delta {limit[d]:.6g}")
                arr = np.clip(arr, -limit, limit)
        elif md is not None and arr.shape[0] > 1:
            limit = np.asarray(md)
            if (np.abs(np.diff(arr, axis=0)) > limit).any():
                for t in range(1, arr.shape[0]):
                    step = arr[t] - arr[t - 1]
                    over = np.abs(step) > limit
                    if over.any():
                        for d in np.flatnonzero(over).tolist():
                            violations.append(f"step {t} dim {d}: moves {step[d]:.6g} from the previous step, "
                                              f"max_delta {limit[d]:.6g}")
                        arr[t] = arr[t - 1] + np.clip(step, -limit, limit)
        if violations:
            if action.on_violation == "refuse":
                raise ApiError("policy_error", f"action chunk violates the declared limits: {violations[0]}"
                               + (f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""),
                               details={"reason": "bounds", "violations": violations[:MAX_WARNINGS]},
                               hint='the contract says on_violation="refuse"; use "clip" to clip instead')
            warnings = [f"clipped {v}" for v in violations[:MAX_WARNINGS]]
            if len(violations) > MAX_WARNINGS:
                warnings.append(f"... and {len(violations) - MAX_WARNINGS} more clipped values")
    chunk = {
        "actions": arr.tolist(),
        "action_space": action.action_space.value if action else result.action_space,
        "robot": action.robot if action else None,
        "control_frequency_hz": action.control_frequency_hz if action else None,
        "open_loop_horizon": olh,
    }
    return chunk, warnings, None


_BOUNDS_CACHE: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def spec_bounds(action: Any) -> tuple[np.ndarray, np.ndarray]:
    key = id(action)
    cached = _BOUNDS_CACHE.get(key)
    if cached is None:
        cached = (np.array([b[0] for b in action.bounds]), np.array([b[1] for b in action.bounds]))
        _BOUNDS_CACHE[key] = cached
    return cached


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


# ---------------------------------------------------------------- the host

class PolicyError(Exception):
    """The policy's own code raised; carries the exception, its name and traceback, the stage."""

    def __init__(self, exc: BaseException, tb: str, stage: str):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc
        self.exception_type = type(exc).__name__
        self.remote_traceback = tb
        self.stage = stage

    def to_api_error(self) -> ApiError:
        """PolicyInputError -> 400 invalid_request with its message; anything else -> 500
        policy_error with ``details.exception_type``, ``details.builtin`` (a Python built-in
        exception the client may re-raise as itself), ``details.remote_traceback``."""
        if isinstance(self.exc, seq.PolicyInputError):
            return ApiError("invalid_request", str(self.exc) or "the policy refused this input",
                            details={"exception_type": self.exception_type},
                            hint="the policy's own check refused this request (a PolicyInputError, not a "
                                 "server fault); its message says what to change in what you sent")
        builtin = type(self.exc).__module__ == "builtins"
        return ApiError("policy_error", f"the policy raised {self.exception_type} in {self.stage}(): {self.exc}",
                        details={"exception_type": self.exception_type, "builtin": builtin,
                                 "exception_args": [str(a) for a in self.exc.args][:4] if builtin else None,
                                 "remote_traceback": self.remote_traceback},
                        hint="this is the policy's own error; fix it in the policy file (traceback in details.remote_traceback)")


@dataclass
class Prepared:
    """A checked, decoded request waiting for its replica."""

    observation: Any
    params: dict[str, Any]
    warnings: list[str]
    episode_id: Optional[str]
    end_episode: bool = False


@dataclass
class _Item:
    prepared: Optional[Prepared]
    future: concurrent.futures.Future
    episode_end: Optional[str] = None          # an on_episode call instead of an inference


@dataclass
class _Episode:
    replica: int
    last_seen: float


class _Replica:
    """One policy instance with its own thread and queue; runs acts alone or in batches."""

    def __init__(self, host: "PolicyHost", index: int):
        self.host = host
        self.index = index
        self.instance: Any = None
        self.queue: "queue.Queue[_Item]" = queue.Queue()
        self.busy = False
        self.busy_since = 0.0      # time.monotonic() when the current item started (valid while busy)
        self.thread: Optional[threading.Thread] = None

    def load_instance(self) -> None:
        self.instance = self.host.cls()
        try:
            self.instance.seq_replica = self.index
        except Exception:  # __slots__ or a property: the policy does not need to know
            pass

    def method(self, stage: str) -> Optional[Callable]:
        name = self.host.spec.methods.get(stage)
        return getattr(self.instance, name) if name else None

    def call(self, stage: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.method(stage)(*args, **kwargs)
        except Exception as exc:
            raise PolicyError(exc, traceback.format_exc(), stage) from exc

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"policy-{self.index}", daemon=True)
        self.thread.start()

    def load(self) -> None:
        """On the caller's thread, before the replica thread starts."""
        self.load_instance()

    def _gather(self, first: _Item) -> list[_Item]:
        batching = self.host.spec.batching
        items = [first]
        if batching is None or first.prepared is None:
            return items
        t0 = time.monotonic()
        if self.host.mode == "eval":
            quiet, deadline = batching.eval_wait_ms / 1000.0, t0 + EVAL_BATCH_DEADLINE_MS / 1000.0
        else:
            quiet, deadline = batching.serve_wait_ms / 1000.0, t0 + batching.serve_wait_ms / 1000.0
        while len(items) < batching.max_batch_size:
            try:
                item = self.queue.get_nowait()       # whatever already waits joins at no cost
            except queue.Empty:
                wait = min(quiet, deadline - time.monotonic())
                if wait <= 0:
                    break
                try:
                    item = self.queue.get(timeout=wait)
                except queue.Empty:
                    break
            if item.prepared is None:               # an episode end: run it after this batch
                self.queue.put(item)
                break
            items.append(item)
        return items

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            self.busy_since = time.monotonic()
            self.busy = True
            try:
                if first.episode_end is not None:
                    self._end_episode(first)
                    continue
                items = self._gather(first)
                live = [i for i in items if i.future.set_running_or_notify_cancel()]
                if live:
                    self._infer(live)
            finally:
                self.busy = False

    def _end_episode(self, item: _Item) -> None:
        try:
            if "on_episode" in self.host.spec.methods:
                self.call("on_episode", item.episode_end)
            item.future.set_result(None)
        except PolicyError as exc:
            log.warning("on_episode(%s) raised %s", item.episode_end, exc)
            item.future.set_exception(exc)

    def _infer(self, items: list[_Item]) -> None:
        fn = self.method("infer")
        t0 = time.perf_counter()
        try:
            if self.host.spec.batching is None:
                p = items[0].prepared
                results = [fn(p.observation, **p.params)]
            else:
                obs = [i.prepared.observation for i in items]
                params = {d.name: [i.prepared.params.get(d.name, d.default) for i in items] for d in self.host.spec.params}
                results = fn(obs, **params)
                if not isinstance(results, (list, tuple)) or len(results) != len(items):
                    got = f"{len(results)} result(s)" if isinstance(results, (list, tuple)) else type(results).__name__
                    err = _policy_error(f"batched infer() got {len(items)} request(s) and returned {got}; "
                                        "return a list with one chunk per request, in order", "batch")
                    for i in items:
                        i.future.set_exception(err)
                    return
        except Exception as exc:
            err = PolicyError(exc, traceback.format_exc(), "infer")
            for i in items:
                i.future.set_exception(err)
            return
        seconds = time.perf_counter() - t0
        self.host.batch_sizes.append(len(items))
        for i, r in zip(items, results):
            i.future.set_result((r, seconds, len(items)))


class PolicyHost:
    """Hosts one @seq.policy class: ``slots`` replicas (``@seq.concurrent``), each an instance
    with its own thread; requests are routed by episode (sticky) or to the least busy replica and
    batched per ``@seq.batched``.

    mode: "serve" (default: a batch never waits for more requests, except ``serve_wait_ms``) or
    "eval" (a batch closes after ``eval_wait_ms`` of quiet, when full, or 250 ms after its first
    request). episode_idle_s: an episode with no request for this long is ended (default 300 s).

    Lifecycle: ``start(weights_dir)`` constructs, loads, warms up and runs the synthetic check;
    ``prepare`` (any thread) checks/decodes a request; ``submit`` queues it and returns a Future of
    ``(result, inference seconds, batch size)``; ``finish_chunk`` checks the result; ``stop`` runs
    ``@seq.shutdown``.
    """

    def __init__(self, cls: type, name: Optional[str] = None, *, mode: str = "serve",
                 episode_idle_s: float = EPISODE_IDLE_S):
        if mode not in ("serve", "eval"):
            raise ValueError(f"mode must be 'serve' or 'eval', got {mode!r}")
        self.cls = cls
        self.spec: PolicySpec = get_spec(cls)
        self.name = name or cls.__name__
        self.mode = mode
        self.episode_idle_s = float(episode_idle_s)
        self.replicas = [_Replica(self, i) for i in range(self.spec.slots())]
        self.episodes: dict[str, _Episode] = {}
        self.lock = threading.Lock()
        self.timings: dict[str, float] = {}
        self.batch_sizes: list[int] = []
        self.ready = False
        self._stopped = False

    # -- lifecycle
    def start(self, weights_dir: Any, phase: Callable[[str], None] = lambda p: None) -> None:
        """Construct and load every replica, warm each up, then run one synthetic /act (black
        frames, zero vectors) through the whole path. Raises PolicyError (the policy's own
        error) or RuntimeError (the synthetic check failed)."""
        t0 = time.monotonic()
        phase("loading")
        for r in self.replicas:
            try:
                r.load_instance()
            except Exception as exc:
                raise PolicyError(exc, traceback.format_exc(), "__init__") from exc
            r.call("load", weights_dir)
        self.timings["load_s"] = time.monotonic() - t0
        if "warmup" in self.spec.methods:
            phase("warmup")
            t1 = time.monotonic()
            for r in self.replicas:
                r.call("warmup")
            self.timings["warmup_s"] = time.monotonic() - t1
        for r in self.replicas:
            r.start()
        if self.spec.observation is not None:
            phase("checking")
            t2 = time.monotonic()
            body = json.dumps({"observation": synthetic_observation(self.spec)}).encode()
            for r in self.replicas:
                try:
                    prepared = self.prepare(body)
                    result, _, _ = self.submit(prepared, replica=r.index).result()
                    finish_chunk(result, self.spec)
                except PolicyError as exc:
                    if not isinstance(exc.exc, seq.PolicyInputError):
                        raise
                    log.info("synthetic check: the policy refused the synthetic input (%s); accepted", exc)
                except ApiError as exc:
                    raise RuntimeError(f"synthetic /act check failed: {exc.detail}") from exc
            self.timings["check_s"] = time.monotonic() - t2
        self.ready = True

    def stop(self, timeout: float = 10.0) -> None:
        """End open episodes (on_episode), then run @seq.shutdown on each replica."""
        if self._stopped:
            return
        self._stopped = True
        with self.lock:
            open_episodes = list(self.episodes)
        for eid in open_episodes:
            try:
                self.end_episode(eid).result(timeout=timeout)
            except Exception:
                log.exception("ending episode %s at shutdown", eid)
        for r in self.replicas:
            if r.thread is not None:
                r.queue.put(None)
                r.thread.join(timeout=timeout)
            if r.instance is not None and "shutdown" in self.spec.methods:
                try:
                    r.call("shutdown")
                except Exception:
                    log.exception("@seq.shutdown raised")

    # -- requests
    def prepare(self, raw: bytes, content_type: str = "application/json") -> Prepared:
        """Parse and check one /act body and decode its frames (any thread; no policy code).
        Raises ApiError(invalid_request) for a malformed body, a contract mismatch or params."""
        body, blobs = parse_act_body(raw, content_type)
        episode_id = body.get("episode_id")
        if episode_id is not None and (not isinstance(episode_id, str) or not 0 < len(episode_id) <= 128):
            raise _bad("episode_id must be a string of 1 to 128 characters")
        given = body.get("params") or {}
        if isinstance(given, dict):
            for name, value in given.items():
                if isinstance(value, int) and not isinstance(value, bool) and not _fits_float(value):
                    raise ApiError("invalid_request", f"param {name!r} is a number too large for a 64-bit float",
                                   details={"reason": "params", "param": name}, hint="send a value in the declared range")
        try:
            params = cast_params(self.spec.params, given)
        except ParamError as exc:
            raise ApiError("invalid_request", str(exc), details={"reason": "params", "param": exc.name,
                           "declared": [p.to_dict() for p in self.spec.params]},
                           hint="send only the params infer() declares, with allowed values (seq policy status lists them)") from None
        end = body.get("end_episode", False)
        if not isinstance(end, bool):  # "false" is truthy: refuse anything but a JSON boolean
            raise _bad(f"end_episode must be true or false, got {end!r}", hint='send "end_episode": true')
        if self.spec.infer_mode == "raw":
            return Prepared(body["observation"], params, [], episode_id, end)
        obs, warnings = parse_observation(body["observation"], self.spec, episode_id, blobs)
        return Prepared(obs, params, warnings, episode_id, end)

    def _route(self, episode_id: Optional[str]) -> _Replica:
        if len(self.replicas) == 1 and episode_id is None:
            return self.replicas[0]
        now = time.monotonic()
        with self.lock:
            if episode_id is not None:
                ep = self.episodes.get(episode_id)
                if ep is None:
                    counts = [0] * len(self.replicas)
                    for e in self.episodes.values():
                        counts[e.replica] += 1
                    index = min(range(len(self.replicas)), key=lambda i: (counts[i], self.replicas[i].queue.qsize()))
                    ep = self.episodes[episode_id] = _Episode(index, now)
                ep.last_seen = now
                return self.replicas[ep.replica]
            return min(self.replicas, key=lambda r: r.queue.qsize() + r.busy)

    def oldest_request_s(self, now: Optional[float] = None) -> float:
        """Seconds the longest-running item (an inference or an episode end) has been running on
        any replica; 0.0 when every replica is idle. Read by /ping to report a jammed worker."""
        now = time.monotonic() if now is None else now
        ages = [now - r.busy_since for r in self.replicas if r.busy]
        return max(ages, default=0.0)

    def submit(self, prepared: Prepared, replica: Optional[int] = None) -> concurrent.futures.Future:
        """Queue a prepared request on its replica. -> Future of (result, seconds, batch size);
        the future raises PolicyError or ApiError(policy_error)."""
        target = self.replicas[replica] if replica is not None else self._route(prepared.episode_id)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        target.queue.put(_Item(prepared, fut))
        if prepared.end_episode and prepared.episode_id is not None:
            self.end_episode(prepared.episode_id)
        return fut

    def end_episode(self, episode_id: str) -> concurrent.futures.Future:
        """End an episode: ``@seq.on_episode(episode_id)`` runs on its replica after the acts
        already queued there. Unknown episodes end at once (a Future already done)."""
        with self.lock:
            ep = self.episodes.pop(episode_id, None)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if ep is None:
            fut.set_result(None)
            return fut
        self.replicas[ep.replica].queue.put(_Item(None, fut, episode_end=episode_id))
        return fut

    def reap_idle_episodes(self, now: Optional[float] = None) -> list[str]:
        """End every episode idle for ``episode_idle_s``; -> their ids."""
        now = time.monotonic() if now is None else now
        with self.lock:
            idle = [eid for eid, ep in self.episodes.items() if now - ep.last_seen >= self.episode_idle_s]
        for eid in idle:
            log.info("episode %s idle for %.0f s: ended by the worker", eid, self.episode_idle_s)
            self.end_episode(eid)
        return idle

    def act_blocking(self, body: dict) -> dict:
        """One request end to end on the calling thread (tests, other launchers) -> response dict."""
        prepared = self.prepare(json.dumps(body).encode())
        try:
            result, seconds, batch = self.submit(prepared).result()
        except PolicyError as exc:
            raise exc.to_api_error() from None
        chunk, more, outputs = finish_chunk(result, self.spec)
        return {"action_chunk": chunk, "warnings": prepared.warnings + more, "inference_ms": seconds * 1000.0,
                "request_id": new_request_id(), "outputs": outputs}
