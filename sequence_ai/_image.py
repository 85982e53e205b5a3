"""Frames in, wire-ready observations out: ``encode()``, ``observation()``, ``encode_jpeg()``.

The ``image`` extra (``pip install 'sequence-ai[image]'``): simplejpeg (libjpeg-turbo) encodes
JPEG on the robot's hot path; Pillow resizes a frame that is not already at the model's size,
accepts PIL images, and writes depth maps as 16-bit PNG. Both are imported lazily, so the
client itself needs only httpx.

Sizing follows the model's declaration: a camera declared ``width x height`` gets exactly that
size (the worker refuses any other); a frame of another aspect ratio is refused with a
ValueError naming both ratios, because which part of the scene to crop away is the caller's
decision. With no declared size the long edge is capped at 640 px. Quality is 95: lower
measurably degrades the policies we serve, higher only costs bytes.

One rule for both forms of ``observation()``: hand it the camera's native frame, never a frame
you shrank. With a model (or ``contract=``) each frame is resampled once, straight from the
native pixels, to its camera's declared size and encoded. Without one the frame is encoded at its
native size (long edge capped at 640) and keeps its native pixels beside the JPEG
(:class:`NativeJPEG`): a connected Policy that sends it to a deployment declaring another size
re-encodes it once from those pixels at the declared size (``fit_declared_sizes``, in the
client's contract check), so the wire carries exactly the declared size and the frame was
resampled once, from native.
"""
from __future__ import annotations

import base64
import copy
import io
import math
import warnings
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from sequence_ai_core import ContractMismatch, ImageFrame, Observation, Proprioception
from sequence_ai_core.protocol import Contract

__all__ = ["encode", "encode_jpeg", "encode_jpeg_bytes", "encode_depth_png", "observation", "NativeJPEG", "RawFrame"]

JPEG_QUALITY = 95
MAX_LONG_EDGE = 640
_ASPECT_TOLERANCE = 0.02  # relative difference in width/height accepted as "the same ratio"
_HINT = "pip install 'sequence-ai[image]'"


def _missing(what: str, needs: str) -> str:
    """The ImportError's text: what the call asked for, what it lacks, and the extra."""
    return f"{what} needs {needs} ({'neither is' if ' or ' in needs else 'it is not'} installed): {_HINT}"


def _numpy(what: str = "an array frame"):
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(_missing(what, "numpy")) from exc
    return numpy


def _pil(what: str, needs: str = "Pillow"):
    """PIL.Image, or an ImportError naming ``what`` (the thing asked for that needs Pillow)."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(_missing(what, needs)) from exc
    return Image


def _as_array(image: Any):
    """HxWx3 uint8 (or HxW grey) numpy array from an array-like or a PIL image."""
    np = _numpy()
    if hasattr(image, "mode") and hasattr(image, "size") and not hasattr(image, "shape"):
        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        return np.asarray(image)
    arr = np.asarray(image)
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 3)):
        raise ValueError(f"expected an HxWx3 RGB or HxW grey frame, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"expected a frame of at least 1x1 px, got shape {arr.shape} (an empty capture?)")
    if arr.dtype != np.uint8:
        raise ValueError(f"expected uint8 pixels, got {arr.dtype}; convert with "
                         "(frame * 255).clip(0, 255).astype('uint8') for 0..1 floats")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    return arr


def _declared_sizes(contract: Contract) -> Dict[str, Tuple[int, int, bool]]:
    """``{view: (width, height, depth)}`` of the declared cameras that give a size."""
    cams = contract.observation.cameras if contract.observation is not None else {}
    return {view: (cam.width, cam.height, cam.depth) for view, cam in cams.items() if cam.size}


def _contract_of(model: Any) -> Contract:
    """The typed contract of a ModelInfo, a Policy, a contract dict, a deployment name (looked
    up in the catalogue) or None (``Contract()``: nothing declared)."""
    if model is None:
        return Contract()
    if isinstance(model, str):
        from ._connect import models
        rows = {m.short_id: m for m in models(kind="model")}
        if model not in rows:
            raise ContractMismatch(f"no deployment named {model!r} in the catalogue "
                                   f"(have: {sorted(rows)})", code="not_found")
        model = rows[model]
    contract = getattr(model, "contract", model)
    if contract is not None and not isinstance(contract, Mapping):
        raise TypeError("model must be a sequence_ai.ModelInfo (sequence_ai.models()), a Policy, "
                        f"a contract dict or a deployment name, not {type(model).__name__}")
    return _parsed(contract)


# The last contract dict read and its typed view: a robot loop builds every observation against
# the same contract, and reading it (Contract.from_wire) was a sixth of observation()'s time.
_LAST_CONTRACT: Tuple[Any, Any] = (None, None)


def _parsed(contract: Any) -> Contract:
    """``Contract.from_wire(contract)``, kept for the last contract read: a dict equal to it
    (``==``: compared with a deep copy taken when it was read, so one changed in place since is
    read again) gets the same view."""
    global _LAST_CONTRACT
    seen, parsed = _LAST_CONTRACT
    if contract is not None and seen is not None and contract == seen:
        return parsed
    parsed = Contract.from_wire(contract)
    if contract is not None:
        _LAST_CONTRACT = (copy.deepcopy(contract), parsed)
    return parsed


def _target_size(arr: Any, size: Optional[Tuple[int, int]], view: str) -> Tuple[int, int]:
    h, w = arr.shape[:2]
    if size is None:
        scale = min(1.0, MAX_LONG_EDGE / max(h, w))
        return max(1, round(w * scale)), max(1, round(h * scale))
    tw, th = size
    if (w, h) != (tw, th):
        have, want = w / h, tw / th
        if abs(have - want) / want > _ASPECT_TOLERANCE:
            raise ValueError(
                f"view {view!r}: frame is {w}x{h} (aspect {have:.4f}) but the model reads "
                f"{tw}x{th} (aspect {want:.4f}); crop the frame to {want:.4f} first "
                "(padding or stretching would shift what the model sees)")
    return tw, th


def encode_jpeg_bytes(image: Any, quality: int = JPEG_QUALITY,
                      size: Optional[Tuple[int, int]] = None, view: str = "frame") -> bytes:
    """Raw JPEG bytes for one frame, resized to ``size`` (width, height) when it differs.

    simplejpeg (libjpeg-turbo) when installed, else Pillow.

    Raises:
        ValueError: not an HxWx3/HxW uint8 frame, or the aspect ratio does not match ``size``.
        ImportError: neither codec is installed (``pip install 'sequence-ai[image]'``).
    """
    arr = _as_array(image)
    target = _target_size(arr, size, view)
    if (arr.shape[1], arr.shape[0]) != target:
        Image = _pil(f"resizing a {arr.shape[1]}x{arr.shape[0]} frame to {target[0]}x{target[1]}")
        arr = _numpy().asarray(Image.fromarray(arr).resize(target, Image.BILINEAR))
    try:
        import simplejpeg
    except ImportError:
        simplejpeg = None
    if simplejpeg is not None:
        np = _numpy()
        if arr.ndim == 2:
            return simplejpeg.encode_jpeg(np.ascontiguousarray(arr[:, :, None]), quality=int(quality),
                                          colorspace="GRAY", colorsubsampling="Gray")
        return simplejpeg.encode_jpeg(np.ascontiguousarray(arr), quality=int(quality),
                                      colorspace="RGB", colorsubsampling="420")
    Image = _pil("JPEG encoding", "simplejpeg or Pillow")
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=int(quality))
    return buf.getvalue()


class NativeJPEG(bytes):
    """JPEG bytes of a frame encoded at its native size (long edge capped at 640 px) that keep
    the native pixels, so a client that learns the declared size later encodes it once from them.

    Attributes:
        pixels: a copy of the native HxWx3 / HxW uint8 array (the caller's buffer may be reused
            for the next frame). quality: the JPEG quality used (1-100).
        view: the camera view (for error messages).
    """

    pixels: Any
    quality: int
    view: str

    @classmethod
    def of(cls, pixels: Any, quality: int = JPEG_QUALITY, view: str = "frame") -> "NativeJPEG":
        """Encode ``pixels`` (any frame ``encode_jpeg_bytes`` takes) with no declared size."""
        arr = _as_array(pixels)
        out = cls(encode_jpeg_bytes(arr, quality, None, view))
        # a copy: a camera loop that reuses its buffer must not change the frame observed here
        out.pixels, out.quality, out.view = arr.copy(), int(quality), view
        return out

    @property
    def size(self) -> Tuple[int, int]:
        """``(width, height)`` of the encoded frame (px)."""
        return _target_size(self.pixels, None, self.view)

    def at_size(self, width: int, height: int) -> bytes:
        """JPEG bytes at ``width x height`` (px), resampled once from the native pixels; these
        bytes when they already are that size.

        Raises:
            ValueError: the native aspect ratio differs from ``width:height`` (crop first).
        """
        if self.size == (int(width), int(height)):
            return self
        return encode_jpeg_bytes(self.pixels, self.quality, (int(width), int(height)), self.view)


class RawFrame(bytes):
    """A frame's raw pixels with no codec: H x W x 3 uint8 RGB, row after row (the same-host
    path's fidelity choice: the model sees the camera's pixels, not a JPEG of them; the wire
    marks it ``"encoding": "rgb8"``). ``observation(codec="raw")`` builds them.

    Attributes:
        pixel_shape: ``(H, W, 3)``. view: the camera view (for error messages).
    """

    pixel_shape: Tuple[int, int, int]
    view: str

    @classmethod
    def of(cls, image: Any, size: Optional[Tuple[int, int]] = None, view: str = "frame") -> "RawFrame":
        """The pixels of ``image`` (any frame ``encode_jpeg_bytes`` takes; gray is made RGB),
        resampled to ``size`` (width, height) when given and different (bilinear), else at its
        own size with the long edge capped at 640 px. Raises ValueError as ``encode_jpeg_bytes``."""
        np = _numpy()
        arr = _as_array(image)
        target = _target_size(arr, size, view)
        if (arr.shape[1], arr.shape[0]) != target:
            Image = _pil(f"resizing a {arr.shape[1]}x{arr.shape[0]} frame to {target[0]}x{target[1]}")
            arr = np.asarray(Image.fromarray(arr).resize(target, Image.BILINEAR))
        if arr.ndim == 2:
            arr = np.repeat(arr[:, :, None], 3, axis=2)
        out = cls(np.ascontiguousarray(arr).tobytes())   # a copy: the camera's buffer may be reused
        out.pixel_shape, out.view = (int(arr.shape[0]), int(arr.shape[1]), 3), view
        return out

    @property
    def size(self) -> Tuple[int, int]:
        """``(width, height)`` (px)."""
        return self.pixel_shape[1], self.pixel_shape[0]

    def at_size(self, width: int, height: int) -> "RawFrame":
        """These pixels at ``width x height`` (px): itself when already that size, else resampled.
        Raises ValueError: the aspect ratio differs from ``width:height`` (crop first)."""
        if self.size == (int(width), int(height)):
            return self
        pixels = _numpy().frombuffer(self, dtype="uint8").reshape(self.pixel_shape)
        return RawFrame.of(pixels, (int(width), int(height)), self.view)


def encode_jpeg(image: Any, quality: int = JPEG_QUALITY) -> str:
    """One frame as base64 JPEG text (what ``ImageFrame.data`` carries), at its own size.

    Args:
        image: a PIL image, or an HxWx3 (RGB) / HxW (grey) uint8 array (numpy).
        quality: JPEG quality 1-100, default 95.

    Raises ValueError for a frame that is not HxWx3/HxW uint8; ImportError without the extra.
    """
    arr = _as_array(image)
    return base64.b64encode(
        encode_jpeg_bytes(arr, quality, size=(arr.shape[1], arr.shape[0]))).decode("ascii")


def encode(frame: Any, model: Any = None, *, view: Optional[str] = None,
           quality: int = JPEG_QUALITY) -> str:
    """Size and encode one camera frame the way ``model`` reads it; base64 JPEG text.

    Args:
        frame: HxWx3 uint8 RGB array (numpy) or a PIL image, at the camera's native size.
        model: a ``ModelInfo`` (``sequence_ai.models()``), a connected Policy, its contract dict,
            or None (long edge capped at 640 px).
        view: which declared camera this frame is for; needed when the cameras' sizes differ.
        quality: JPEG quality, default 95.

    Raises:
        ValueError: aspect ratio differs from the declared size (crop first), or bad pixels.
        ContractMismatch: ``view`` is not declared by the model.
    """
    sizes = _declared_sizes(_contract_of(model))
    size: Optional[Tuple[int, int]] = None
    if sizes:
        if view is not None:
            if view not in sizes:
                raise ContractMismatch(f"view {view!r} is not declared by the model "
                                       f"(declared: {sorted(sizes)})")
            size = sizes[view][:2]
        else:
            distinct = {s[:2] for s in sizes.values()}
            if len(distinct) > 1:
                raise ValueError(f"the model's cameras have different sizes {sorted(distinct)}: "
                                 "pass view= to say which one this frame is")
            size = distinct.pop()
    return base64.b64encode(encode_jpeg_bytes(frame, quality, size, view or "frame")).decode("ascii")


def encode_depth_png(depth: Any, unit: str = "m") -> bytes:
    """A depth map as 16-bit PNG bytes of millimetres (lossless).

    Args:
        depth: HxW float or integer array; metres by default.
        unit: ``"m"`` (default: multiplied by 1000) or ``"mm"`` (already millimetres).

    Values are rounded and clipped to 0..65535 mm; NaN/inf become 0 ("no reading").
    """
    if unit not in ("m", "mm"):
        raise ValueError(f'depth unit must be "m" or "mm", not {unit!r}')
    np = _numpy("a depth PNG")
    arr = np.asarray(depth, dtype=np.float64)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim != 2:
        raise ValueError(f"expected an HxW depth map, got shape {arr.shape}")
    mm = arr * (1000.0 if unit == "m" else 1.0)
    mm = np.where(np.isfinite(mm), mm, 0.0)
    mm16 = np.clip(np.rint(mm), 0, 65535).astype(np.uint16)
    Image = _pil("a depth PNG")
    buf = io.BytesIO()
    Image.fromarray(mm16).save(buf, format="PNG")
    return buf.getvalue()


def _widths(contract: Contract) -> Dict[str, int]:
    proprio = contract.observation.proprio if contract.observation is not None else {}
    return {k: int(v) for k, v in proprio.items() if isinstance(v, int)}


def _frames_of(view: str, given: Any, history: int) -> list:
    """A view's frames, oldest first: one frame, or a list/tuple of frames (``history`` > 1)."""
    if isinstance(given, (list, tuple)) and given and all(
            hasattr(f, "shape") or (hasattr(f, "mode") and hasattr(f, "size")) for f in given):
        frames = list(given)
    else:
        frames = [given]
    if len(frames) < history:
        raise ContractMismatch(
            f"view {view!r} has {len(frames)} frame(s); the model reads {history} per view (history={history})",
            hint=f"pass images={{{view!r}: [the last {history} frames, oldest first]}}")
    return frames[-history:]


def _check_views(sizes: Dict[str, Tuple[int, int, bool]], images: Mapping[str, Any],
                 depth: Optional[Mapping[str, Any]]) -> None:
    """Every declared view (and declared depth frame) is given; undeclared views are warned
    about (``observation`` drops them). Raises ContractMismatch naming what is missing."""
    undeclared = [v for v in images if v not in sizes]
    if undeclared:
        warnings.warn(f"dropping view(s) {undeclared}: the model does not declare them "
                      f"(declared: {sorted(sizes)})", UserWarning, stacklevel=3)
    missing = [v for v in sizes if v not in images]
    if missing:
        raise ContractMismatch(f"missing view(s) {missing}: the model reads {sorted(sizes)}",
                               hint="a missing camera cannot be replaced by another one")
    missing_depth = [v for v, s in sizes.items() if s[2] and v not in (depth or {})]
    if missing_depth:
        raise ContractMismatch(f"missing depth frame(s) for view(s) {missing_depth}",
                               hint="pass depth={view: HxW map in metres}")


def _check_proprio(contract: Contract, fields: Mapping[str, Any]) -> None:
    """Each declared proprioception field is given with its declared width and finite values.
    Raises ContractMismatch naming the field and the declared width."""
    for name, width in _widths(contract).items():
        value = fields.get(name)
        values = None if value is None else list(value.tolist() if hasattr(value, "tolist") else value)
        have = None if values is None else len(values)
        if have != width:
            raise ContractMismatch(
                f"proprioception.{name} has {have if have is not None else 'no'} value(s); "
                f"the model reads {width}",
                hint=f"declared: {_widths(contract)}; the gripper is its own field, not a joint")
        if not all(math.isfinite(float(v)) for v in values):
            raise ContractMismatch(f"proprioception.{name} contains NaN or infinity: {values}",
                                   hint="send the last valid reading, or stop: the worker refuses it")


def _encoded(images: Mapping[str, Any], sizes: Dict[str, Tuple[int, int, bool]], history: int, quality: int,
             codec: str, timestamp_ms: Optional[float]) -> list:
    """``observation()``'s frames: each declared (or, with no declaration, every) view's frames
    encoded at its declared size -- JPEG, or raw pixels for ``codec="raw"``."""
    frames = []
    for view, given in images.items():
        if sizes and view not in sizes:
            continue
        size = sizes[view][:2] if view in sizes else None
        for frame in _frames_of(view, given, history if view in sizes else 1):
            if codec == "raw":
                data: Any = RawFrame.of(frame, size, view)
            else:
                data = (encode_jpeg_bytes(frame, quality, size, view) if size is not None
                        else NativeJPEG.of(frame, quality, view))
            frames.append(ImageFrame(view=view, data=data, timestamp_ms=timestamp_ms))
    return frames


def observation(model: Any = None, *, images: Mapping[str, Any], joints: Sequence[float],
                gripper: Optional[Sequence[float]] = None, instruction: str = "",
                contract: Optional[Mapping[str, Any]] = None,
                depth: Optional[Mapping[str, Any]] = None, depth_unit: str = "m",
                joint_velocities: Optional[Sequence[float]] = None,
                end_effector_pose: Optional[Sequence[float]] = None,
                timestamp_ms: Optional[float] = None,
                quality: int = JPEG_QUALITY, codec: str = "jpeg") -> Observation:
    """Build an ``Observation``; with a model or a contract, checked against its declaration locally.

    Three forms::

        observation(images=..., joints=..., gripper=..., instruction=...)     # no check
        observation(images=..., ..., contract=policy.contract)                # a connected Policy's
        observation(model_row, images=..., ...)                               # a catalogue row

    Each frame is JPEG-encoded at quality 95 and kept as raw JPEG bytes (the binary /act body
    sends them as is; JSON base64-encodes them). With a declaration each frame is resampled once
    from the native pixels to its declared camera's size (the worker refuses any other size);
    without one, the long edge is capped at 640 px, the frame's own size is kept below that, and
    the native pixels stay with the bytes (:class:`NativeJPEG`): a connected Policy whose
    deployment declares another size re-encodes the frame from them once, at that size, before
    sending. Either way: pass the native frame, do not downscale it first.

    Args:
        model: ``ModelInfo`` (``sequence_ai.models()``), connected Policy, contract dict or
            deployment name; None (default) checks nothing unless ``contract`` is given.
        images: ``{view: HxWx3 uint8 array or PIL image}`` at the cameras' native size; for a
            model declaring ``history`` N > 1, a list of the last N frames (oldest first).
        joints: joint positions (rad), the model's ``proprio["joint_positions"]`` wide.
        gripper: gripper state list (a dual-arm robot reports two), when the model reads one.
        instruction: the task sentence. Not checked here: ``act()`` and ``set_instruction()``
            fill it in on the copy that is sent.
        contract: the declaration to check against, e.g. ``policy.contract`` (the handshake's
            ``{"action": ..., "observation": ...}``); exclusive with ``model``.
        depth: ``{view: HxW depth map}`` for cameras declared ``depth=True``.
        depth_unit: ``"m"`` (default) or ``"mm"``: the unit of the depth maps given.
        joint_velocities, end_effector_pose: optional proprioception fields.
        timestamp_ms: capture time stamped on every frame (ms), optional.
        codec: ``"jpeg"`` (default, quality ``quality``) or ``"raw"``: each frame's pixels with
            no codec (:class:`RawFrame`, at the declared size as above). Raw is a fidelity
            choice for the same-host path (``connect(body_format="shm")``): the model sees the
            camera's pixels rather than a JPEG of them, so a model served remotely and locally
            no longer sees the same input; a raw frame is ~10x a JPEG's bytes on a network.

    Raises (all before anything is encoded or sent):
        ContractMismatch: what the worker would refuse: a declared view or depth frame missing,
            too few frames for ``history``, a proprioception field missing or of the wrong width
            (named, with the declared width), a NaN or infinity in one.
        ValueError: a frame's aspect ratio differs from its camera's (crop first), bad pixels.
        TypeError: both ``model`` and ``contract`` given.
        ValueError: a ``codec`` other than ``"jpeg"`` or ``"raw"``.

    A view the declaration does not name is dropped with a warning naming it, not sent.
    """
    if model is not None and contract is not None:
        raise TypeError("pass the model or contract=, not both")
    if codec not in ("jpeg", "raw"):
        raise ValueError(f'codec must be "jpeg" or "raw", not {codec!r}')
    contract = _contract_of(model if contract is None else contract)
    sizes = _declared_sizes(contract)
    history = contract.observation.history if contract.observation is not None else 1
    if sizes:
        _check_views(sizes, images, depth)
    _check_proprio(contract, {"joint_positions": joints, "gripper": gripper,
                              "joint_velocities": joint_velocities, "end_effector_pose": end_effector_pose})
    obs = Observation(
        images=_encoded(images, sizes, history, quality, codec, timestamp_ms),
        proprioception=Proprioception(joint_positions=joints, gripper=gripper,
                                      joint_velocities=joint_velocities,
                                      end_effector_pose=end_effector_pose),
        instruction=instruction,
    )
    if depth:
        obs.depth = [{"view": v, "data": encode_depth_png(d, depth_unit)}  # type: ignore[attr-defined]
                     for v, d in depth.items() if not sizes or v in sizes]
    return obs
