"""Frames fitted to the declared camera sizes in the client's contract check (``AsyncPolicy._check``).

A frame built without a model (``sequence_ai.observation()`` with no contract) is encoded at its
native size, long edge capped at 640 px, and its bytes keep the native pixels (an object with
``at_size(width, height) -> bytes``: ``sequence_ai.NativeJPEG``). Once the client knows the
deployment's contract, each such frame whose camera declares a size is re-encoded from those
native pixels at exactly that size: one resample, from native, and the worker gets the size it
reads. Frames without native pixels (bytes or base64 text you encoded yourself) are left as they
are; the contract check reports a wrong size.

Standard library only (duck-typed): the core imports no codec.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = ["fit_declared_sizes"]


def fit_declared_sizes(wire: Dict[str, Any], observation: Any) -> Dict[str, Any]:
    """``wire`` with every frame that carries native pixels re-encoded at its view's declared size.

    Args:
        wire: the observation's wire dict (``observation_to_wire``); changed in place.
        observation: the contract's ``ObservationSpec`` (``contract_spec.observation``), or None.

    Raises:
        ValueError: a native frame's aspect ratio differs from its declared camera's (crop first).
    """
    cameras = getattr(observation, "cameras", None) or {}
    if not cameras:
        return wire
    for frame in wire.get("images") or []:
        if not isinstance(frame, dict):
            continue
        resize = getattr(frame.get("data"), "at_size", None)
        cam = cameras.get(frame.get("view"))
        size: Optional[tuple] = getattr(cam, "size", None) if cam is not None else None
        if resize is not None and size:
            frame["data"] = resize(int(cam.width), int(cam.height))
    return wire
