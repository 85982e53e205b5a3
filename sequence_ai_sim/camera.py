"""Camera geometry of the simulated cell: the pinhole :class:`CameraModel` and a look-at helper."""
from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["CameraModel", "lookat_xyaxes"]


def lookat_xyaxes(pos, target, up=(0.0, 0.0, 1.0)):
    """The x and y axes (world, unit (3,) each) of a MuJoCo camera at ``pos`` looking at ``target`` (m)."""
    f = np.asarray(target, float) - np.asarray(pos, float)
    f /= np.linalg.norm(f)
    x = np.cross(f, up)
    x /= np.linalg.norm(x)
    y = np.cross(x, f)
    return x, y


@dataclasses.dataclass(frozen=True)
class CameraModel:
    """Pinhole model of a rendered camera.

    Pixel coordinates (u, v): u = column, v = row (row 0 at the top of the image), measured
    in pixels with pixel centres at integer + 0.5 (so the image spans [0, width] x [0, height]).
    A world point p maps to camera coordinates c = R_wc^T (p - position), with the camera
    looking along +z_cam, x_cam to the right in the image, y_cam down (OpenCV convention);
    u = fx * c_x / c_z + cx, v = fy * c_y / c_z + cy.

    Fields: width, height (px); fx, fy, cx, cy (px); position (3,) world m;
    rotation (3, 3): columns are the OpenCV camera axes (x right, y down, z forward) in world.
    """
    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    position: tuple
    rotation: tuple  # 3x3 nested tuple

    @property
    def K(self) -> np.ndarray:
        """(3, 3) intrinsic matrix."""
        return np.array([[self.fx, 0, self.cx], [0, self.fy, self.cy], [0, 0, 1.0]])

    def project(self, p_world) -> np.ndarray:
        """(N, 3) world points -> (N, 2) pixel (u, v)."""
        p = np.atleast_2d(np.asarray(p_world, float))
        c = (p - np.asarray(self.position)) @ np.asarray(self.rotation)
        return np.stack([self.fx * c[:, 0] / c[:, 2] + self.cx,
                         self.fy * c[:, 1] / c[:, 2] + self.cy], axis=1)
