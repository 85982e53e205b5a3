"""Find a named cube or pad in the exterior camera image and locate it on the table.

Colour segmentation in HSV. Cubes and pads share hues (red, green, blue) but differ in
saturation: cubes are saturated (S ~0.9), pads are pale (S ~0.45), the table is nearly grey
(S ~0.13). Pixels of the wanted hue are split into cube pixels (S >= CUBE_MIN_S) and pad
pixels (PAD_MIN_S <= S < CUBE_MIN_S, bright); the largest 4-connected blob of each class
is taken (small specks, such as JPEG fringes around a cube, are ignored), and its centroid is
back-projected through the exterior camera's pinhole model onto a horizontal plane: the pad
top (z = 0.004 m) for pads, the cube's mid-height (z = 0.0225 m) for cubes, then a small
fixed xy correction measured in the sim (over seeds 0..9 after JPEG q95: cube error <= 1.3 mm,
pad error <= 1 mm after the correction).

Camera constants below match ``sequence_ai_sim.panda_sim``'s ``exterior_1`` camera (a test
checks it). Pixel convention: u = column + 0.5, v = row + 0.5, OpenCV camera axes.
"""
from __future__ import annotations

import dataclasses

import numpy as np

COLOURS = ("red", "green", "blue")

# exterior_1 camera, 224 x 224 (intrinsics from fovy = 52 deg: f = 112 / tan(26 deg)).
IMAGE_SIZE = 224
FX = FY = 229.63403025688118
CX = CY = 112.0
CAM_POS = np.array([0.60, 0.15, 0.65])
# Columns: camera x (image right), y (image down), z (viewing direction) in world axes.
CAM_ROT = np.array([
    [-0.2676438637860947, 0.7297217500532354, -0.6291843368019375],
    [0.9635179096299407, 0.20270048612589886, -0.17477342688942715],
    [0.0, -0.6530074122271261, -0.7573515165208506],
])

TABLE_Z = 0.0
CUBE_CENTRE_Z = TABLE_Z + 0.0225
PAD_TOP_Z = TABLE_Z + 0.004

# HSV thresholds (H, S, V in [0, 1]).
HUE_RANGES = {"red": ((0.95, 1.0), (0.0, 0.05)), "green": ((0.25, 0.45),),
              "blue": ((0.55, 0.72),)}
CUBE_MIN_S = 0.68
CUBE_MIN_V = 0.12
PAD_MIN_S = 0.30
PAD_MIN_V = 0.55
MIN_CUBE_PIXELS = 12
MIN_PAD_PIXELS = 40
# World-frame xy correction added to back-projected cube centroids (m), measured in the sim.
CUBE_XY_CORRECTION = np.array([0.0, 0.0])
PAD_XY_CORRECTION = np.array([-0.0023, -0.0007])


@dataclasses.dataclass
class Detection:
    """A found object: world ``xy`` (2,) m, blob ``pixels`` count, image ``uv`` centroid."""
    xy: np.ndarray
    pixels: int
    uv: tuple


def rgb_to_hsv(img: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (H, W, 3) float32 HSV in [0, 1].

    Works on contiguous channel planes (a max over a length-3 last axis is several times
    slower in numpy); the values are bit-identical to the straightforward per-pixel form.
    """
    x = np.moveaxis(np.asarray(img), -1, 0).astype(np.float32)
    x /= np.float32(255.0)
    r, g, b = x
    mx = np.maximum(np.maximum(r, g), b)
    mn = np.minimum(np.minimum(r, g), b)
    d = mx - mn
    s = np.where(mx > 1e-6, d / np.maximum(mx, 1e-6), 0.0)
    dd = np.maximum(d, 1e-6)
    h = np.where(mx == r, ((g - b) / dd) % 6.0,
                 np.where(mx == g, (b - r) / dd + 2.0, (r - g) / dd + 4.0)) / 6.0
    h = np.where(d > 1e-6, h, 0.0)
    return np.stack([h, s, mx], axis=-1)


def colour_masks(img: np.ndarray, colour: str,
                 hsv: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Boolean (H, W) masks (cube pixels, pad pixels) of ``colour`` in an RGB image.

    ``hsv``: ``rgb_to_hsv(img)`` when the caller already has it (it is the costly part).
    """
    if colour not in HUE_RANGES:
        raise ValueError(f"unknown colour {colour!r}; known colours: {', '.join(COLOURS)}")
    if hsv is None:
        hsv = rgb_to_hsv(img)
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    hue = np.zeros(h.shape, bool)
    for lo, hi in HUE_RANGES[colour]:
        hue |= (h >= lo) & (h <= hi)
    cube = hue & (s >= CUBE_MIN_S) & (v >= CUBE_MIN_V)
    pad = hue & (s >= PAD_MIN_S) & (s < CUBE_MIN_S) & (v >= PAD_MIN_V)
    return cube, pad


def largest_blob(mask: np.ndarray) -> np.ndarray | None:
    """(N, 2) (row, col) pixels of the largest 4-connected component, or None if empty."""
    pts = np.argwhere(mask)
    if len(pts) == 0:
        return None
    remaining = set(map(tuple, pts.tolist()))
    best: list = []
    while remaining:
        seed = remaining.pop()
        comp = [seed]
        stack = [seed]
        while stack:
            r, c = stack.pop()
            for nb in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                if nb in remaining:
                    remaining.remove(nb)
                    comp.append(nb)
                    stack.append(nb)
        if len(comp) > len(best):
            best = comp
    return np.array(best)


def pixel_to_plane(u: float, v: float, z: float) -> np.ndarray:
    """Back-project pixel (u, v) onto the world plane at height ``z``: world xy (2,) m."""
    ray = CAM_ROT @ np.array([(u - CX) / FX, (v - CY) / FY, 1.0])
    t = (z - CAM_POS[2]) / ray[2]
    return (CAM_POS + t * ray)[:2]


def project(p_world) -> np.ndarray:
    """(N, 3) world points -> (N, 2) pixel (u, v)."""
    p = np.atleast_2d(np.asarray(p_world, float))
    c = (p - CAM_POS) @ CAM_ROT
    return np.stack([FX * c[:, 0] / c[:, 2] + CX, FY * c[:, 1] / c[:, 2] + CY], axis=1)


def _detect(blob: np.ndarray | None, min_pixels: int, z: float) -> Detection | None:
    if blob is None or len(blob) < min_pixels:
        return None
    v = float(blob[:, 0].mean()) + 0.5
    u = float(blob[:, 1].mean()) + 0.5
    return Detection(xy=pixel_to_plane(u, v, z), pixels=int(len(blob)), uv=(u, v))


def find_cube(img: np.ndarray, colour: str, hsv: np.ndarray | None = None) -> Detection | None:
    """Locate the ``colour`` cube in the exterior image (224x224x3 uint8 RGB), or None.

    ``hsv``: optional precomputed ``rgb_to_hsv(img)`` (share it with ``find_pad``)."""
    cube, _ = colour_masks(img, colour, hsv)
    det = _detect(largest_blob(cube), MIN_CUBE_PIXELS, CUBE_CENTRE_Z)
    if det is not None:
        det.xy = det.xy + CUBE_XY_CORRECTION
    return det


def find_pad(img: np.ndarray, colour: str, hsv: np.ndarray | None = None) -> Detection | None:
    """Locate the ``colour`` pad in the exterior image (224x224x3 uint8 RGB), or None.

    ``hsv``: optional precomputed ``rgb_to_hsv(img)`` (share it with ``find_cube``)."""
    _, pad = colour_masks(img, colour, hsv)
    det = _detect(largest_blob(pad), MIN_PAD_PIXELS, PAD_TOP_Z)
    if det is not None:
        det.xy = det.xy + PAD_XY_CORRECTION
    return det
