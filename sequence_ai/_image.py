"""encode_jpeg: camera frame (HxWx3 uint8 array or PIL image) -> base64 JPEG text for ImageFrame.data.

Pillow is imported lazily: the client itself needs only httpx.
"""
from __future__ import annotations

import base64
import io
from typing import Any

__all__ = ["encode_jpeg"]

_INSTALL_HINT = "encode_jpeg() needs Pillow: pip install 'sequence-ai[image]'"


def encode_jpeg(image: Any, quality: int = 95) -> str:
    """Encode one frame as base64 JPEG text (what ``ImageFrame.data`` carries).

    Args:
        image: a PIL image, or an HxWx3 (RGB) / HxW (grey) uint8 array-like (numpy).
        quality: JPEG quality 1-95; keep 90 or above (95, the default, is indistinguishable
            from lossless for the policies measured; 85 and below degrades them).

    Returns:
        base64 text, ASCII.

    Raises:
        ImportError: Pillow is not installed (``pip install 'sequence-ai[image]'``).
        ValueError: the array is not HxW or HxWx3 uint8.
    """
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(_INSTALL_HINT) from exc
    if not isinstance(image, Image.Image):
        shape = getattr(image, "shape", None)
        dtype = str(getattr(image, "dtype", ""))
        if shape is None or len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] != 3):
            raise ValueError(f"expected an HxWx3 RGB or HxW array, got shape {shape}")
        if dtype != "uint8":
            raise ValueError(f"expected uint8 pixels, got {dtype or type(image).__name__}")
        image = Image.fromarray(image)
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=int(quality))
    return base64.b64encode(buf.getvalue()).decode("ascii")
