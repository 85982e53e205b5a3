"""The learned pick-and-place policy's network, shared by ``train.py`` and ``learned_policy.py``.

A small visuomotor policy: per camera a CNN whose last layer is a set of keypoint heat maps read
out by a spatial softmax (expected x, y per keypoint; the middle features are modulated by the
task embedding, FiLM), the proprio vector (7 joints rad +
gripper 0..1, normalised), and a learned embedding of the task string; an MLP maps them to a
chunk of ``horizon`` future joint-target rows (8 values each, normalised). Trained with L1.

Images enter as uint8 ``(B, H, W, 3)`` at any size and are area-resized to ``image_size``
(96) by :func:`preprocess` -- the same function at training and at inference.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ModelConfig:
    """Shapes of :class:`VisuomotorPolicy` (stored in the checkpoint)."""

    views: List[str] = field(default_factory=lambda: ["exterior_1", "wrist_left"])
    tasks: List[str] = field(default_factory=list)     # the dataset's task strings, in task_index order
    image_size: int = 96       # px, square
    keypoints: int = 32        # per camera
    task_dim: int = 32
    state_dim: int = 8         # 7 joints (rad) + gripper
    action_dim: int = 8
    horizon: int = 16          # rows per predicted chunk
    hidden: int = 512


def preprocess(frames: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``(B, H, W, 3)`` RGB -> float ``(B, 3, size, size)`` in [-1, 1] (area resize)."""
    x = frames.permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="area")
    return x


class SpatialSoftmax(nn.Module):
    """``(B, K, H, W)`` maps -> ``(B, 2K)`` expected image coordinates in [-1, 1] per map."""

    def __init__(self, h: int, w: int):
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        self.register_buffer("grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1), persistent=False)
        self.temperature = nn.Parameter(torch.ones(1))

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        b, k, h, w = maps.shape
        attn = torch.softmax(maps.reshape(b, k, h * w) / self.temperature, dim=-1)
        return (attn @ self.grid).reshape(b, 2 * k)


class KeypointEncoder(nn.Module):
    """One camera: a 4-layer CNN (96 -> 24 px, about 16 M multiply-adds) -> ``keypoints`` heat maps
    -> spatial softmax. The task embedding modulates the middle features (FiLM: ``x * (1 + g) + b``,
    ``g, b`` linear in the embedding, zero at init), so the keypoints can follow the cube and pad
    the instruction names rather than all six objects."""

    def __init__(self, image_size: int, keypoints: int, task_dim: int):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(),                        # 96 -> 48
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GroupNorm(4, 32), nn.ReLU(),  # 48 -> 24
        )
        self.film = nn.Linear(task_dim, 2 * 32)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)
        self.head = nn.Sequential(
            nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(),
            nn.Conv2d(32, keypoints, 1),
        )
        side = image_size // 4
        self.softmax = SpatialSoftmax(side, side)

    def forward(self, x: torch.Tensor, task_emb: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        g, b = self.film(task_emb).chunk(2, dim=-1)
        h = h * (1.0 + g[:, :, None, None]) + b[:, :, None, None]
        return self.softmax(self.head(h))


class VisuomotorPolicy(nn.Module):
    """images ``{view: (B, 3, S, S)}``, state ``(B, 8)`` normalised, task ``(B,)`` int64 ->
    ``(B, horizon, action_dim)`` normalised joint targets."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.encoders = nn.ModuleDict({v: KeypointEncoder(cfg.image_size, cfg.keypoints, cfg.task_dim)
                                       for v in cfg.views})
        self.task_embedding = nn.Embedding(max(1, len(cfg.tasks)), cfg.task_dim)
        d_in = 2 * cfg.keypoints * len(cfg.views) + cfg.task_dim + cfg.state_dim
        self.head = nn.Sequential(
            nn.Linear(d_in, cfg.hidden), nn.ReLU(),
            nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(),
            nn.Linear(cfg.hidden, cfg.horizon * cfg.action_dim),
        )

    def forward(self, images: dict, state: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        emb = self.task_embedding(task)
        feats = [self.encoders[v](images[v], emb) for v in self.cfg.views]
        z = torch.cat(feats + [emb, state], dim=-1)
        return self.head(z).reshape(-1, self.cfg.horizon, self.cfg.action_dim)


def save_checkpoint(path, model: VisuomotorPolicy, stats: dict, extra: dict) -> None:
    """Write ``{"config", "state_dict", "stats", "extra"}`` with ``torch.save`` (float32)."""
    torch.save({"config": asdict(model.cfg), "state_dict": model.state_dict(), "stats": stats, "extra": extra}, path)


def load_checkpoint(path) -> tuple:
    """``(model in eval mode, stats, extra)`` from a file written by :func:`save_checkpoint`.

    ``stats``: ``{"state_mean", "state_std", "action_mean", "action_std"}`` (lists of 8 floats).
    """
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        cfg = ModelConfig(**ck["config"])
        ck["state_dict"], ck["stats"]
    except Exception as exc:   # noqa: BLE001 - unpickling errors, a dict of something else, bad config
        raise RuntimeError(f"{path} is not a checkpoint written by train.py ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    model = VisuomotorPolicy(cfg)
    try:
        model.load_state_dict(ck["state_dict"])
    except RuntimeError as exc:
        raise RuntimeError(f"{path} was written by another version of model.py (its layers do not match this "
                           f"network: {str(exc).splitlines()[0]}); retrain it with train.py") from None
    model.eval()
    return model, ck["stats"], ck.get("extra", {})
