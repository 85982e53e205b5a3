"""The learned pick-and-place policy's network, shared by ``train.py`` and ``learned_policy.py``.

A small visuomotor policy: per camera a CNN whose last layer is a set of keypoint heat maps read
out by a spatial softmax (expected x, y per keypoint; the middle features are modulated by the
task embedding, FiLM), the proprio vector (7 joints rad +
gripper 0..1, normalised), and a learned embedding of the task string; an MLP maps them to a
chunk of ``horizon`` future joint-target rows (8 values each, normalised). Trained with L1.

The generative action head (:class:`FlowHead`, flow matching): a velocity field over the chunk's
residual around that regression chunk, conditioned on the same features. :meth:`VisuomotorPolicy.sample`
integrates it from the noise mean (temperature 0: the same observation gives the same chunk) and,
given the committed prefix, applies real-time-chunking guidance (Black, Galliker, Levine 2025):
at each integration step the predicted clean chunk is pulled toward the prefix under a soft mask
(1 over the ``delay`` committed rows, decaying over the rest of the prefix, 0 after), through the
vector-Jacobian product of the denoiser, with the guidance weight clipped at ``beta``.

Images enter as uint8 ``(B, H, W, 3)`` at any size and are area-resized to ``image_size``
(96) by :func:`preprocess` -- the same function at training and at inference.
"""
from __future__ import annotations

import math
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
    flow_hidden: int = 256     # width of the flow head's MLP
    flow_steps: int = 10       # Euler steps when sampling (noise at tau=0 -> chunk at tau=1)
    residual_scale: float = 0.1  # the flow models (chunk - regression chunk) / residual_scale, normalised units


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


class FlowHead(nn.Module):
    """Velocity field ``v(x_tau, tau, cond)``: ``x_tau`` ``(B, D)`` (D = horizon * action_dim), ``tau``
    ``(B,)`` in [0, 1], ``cond`` ``(B, C)`` -> ``(B, D)``. Flow matching: ``x_tau = tau x1 + (1 - tau) x0``,
    ``x0 ~ N(0, I)``, target velocity ``x1 - x0``."""

    def __init__(self, d: int, cond: int, hidden: int, freqs: int = 16):
        super().__init__()
        self.register_buffer("freqs", torch.exp(torch.linspace(0.0, 6.0, freqs)), persistent=False)
        self.net = nn.Sequential(
            nn.Linear(d + cond + 2 * freqs, hidden), nn.SiLU(),
            nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, d),
        )

    def forward(self, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        ang = tau[:, None] * self.freqs[None, :]
        return self.net(torch.cat([x, cond, torch.sin(ang), torch.cos(ang)], dim=-1))


def prefix_weights(horizon: int, delay: int, known: int) -> torch.Tensor:
    """The soft guidance mask ``(horizon,)``: 1 over the first ``delay`` rows (committed), then
    decaying ``c (e^c - 1) / (e - 1)`` with ``c`` going linearly from 1 to 0 over the rest of the
    ``known`` prefix rows, 0 after (Black et al. 2025, eq. 5)."""
    w = torch.zeros(horizon)
    d, k = max(0, min(delay, horizon)), max(0, min(known, horizon))
    w[:d] = 1.0
    span = k - d
    for i in range(d, k):
        c = (k - i) / (span + 1)
        w[i] = c * (math.exp(c) - 1.0) / (math.e - 1.0)
    return w


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
        self.flow = FlowHead(cfg.horizon * cfg.action_dim, d_in + cfg.horizon * cfg.action_dim, cfg.flow_hidden)

    def features(self, images: dict, state: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        """``(B, C)``: keypoints of every camera, the task embedding and the normalised state."""
        emb = self.task_embedding(task)
        feats = [self.encoders[v](images[v], emb) for v in self.cfg.views]
        return torch.cat(feats + [emb, state], dim=-1)

    def forward(self, images: dict, state: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        """The regression chunk ``(B, horizon, action_dim)``, normalised."""
        return self.head(self.features(images, state, task)).reshape(-1, self.cfg.horizon, self.cfg.action_dim)

    def flow_condition(self, z: torch.Tensor) -> tuple:
        """``(cond (B, C + D), regression chunk (B, D))`` for the flow head from features ``z``."""
        reg = self.head(z)
        return torch.cat([z, reg], dim=-1), reg

    def flow_loss(self, z: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Flow-matching loss for normalised target chunks ``(B, horizon, action_dim)`` given features
        ``z`` (the regression head is not trained through it)."""
        cond, reg = self.flow_condition(z)
        cond, reg = cond.detach(), reg.detach()
        x1 = (target.reshape(len(z), -1) - reg) / self.cfg.residual_scale
        x0 = torch.randn_like(x1)
        tau = torch.rand(len(z), device=z.device)
        x = tau[:, None] * x1 + (1.0 - tau[:, None]) * x0
        return F.mse_loss(self.flow(x, tau, cond), x1 - x0)

    def sample(self, z: torch.Tensor, prefix: torch.Tensor = None, delay: int = 0, known: int = None,
               steps: int = None, beta: float = 5.0) -> torch.Tensor:
        """A chunk ``(B, horizon, action_dim)`` (normalised) from features ``z`` by the flow head,
        starting from the noise mean (temperature 0: the same observation gives the same chunk).

        ``prefix``: ``(B, k, action_dim)`` normalised committed rows (or None: no guidance);
        ``delay``: how many of them are committed (mask 1); ``known``: how many prefix rows are
        real (default k; the soft mask decays over rows ``delay .. known-1``). Guidance (RTC):
        ``v += min(beta, (1 - tau) / (tau r^2)) * J^T (W * (Y - x1_hat))`` with
        ``r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2)``.
        """
        cfg = self.cfg
        n = steps or cfg.flow_steps
        d_all = cfg.horizon * cfg.action_dim
        with torch.no_grad():
            cond, reg = self.flow_condition(z)
        x = torch.zeros(len(z), d_all)
        guide = prefix is not None and prefix.shape[1] > 0
        if guide:
            k = prefix.shape[1]
            y = torch.cat([prefix, prefix[:, -1:].expand(-1, cfg.horizon - k, -1)], dim=1)[:, :cfg.horizon] \
                if k < cfg.horizon else prefix[:, :cfg.horizon]
            y = (y.reshape(len(z), -1) - reg) / cfg.residual_scale
            w = prefix_weights(cfg.horizon, delay, known if known is not None else k)
            w = w[:, None].expand(-1, cfg.action_dim).reshape(1, -1)
        for i in range(n):
            tau = torch.full((len(z),), i / n)
            if not guide:
                with torch.no_grad():
                    x = x + self.flow(x, tau, cond) / n
                continue
            t = i / n
            with torch.enable_grad():
                xg = x.detach().requires_grad_(True)
                v = self.flow(xg, tau, cond)
                x1_hat = xg + (1.0 - t) * v
                err = (y - x1_hat) * w
                (g,) = torch.autograd.grad(x1_hat, xg, grad_outputs=err)
            r2 = (1.0 - t) ** 2 / (t ** 2 + (1.0 - t) ** 2)
            weight = beta if t == 0 else min(beta, (1.0 - t) / (t * r2))
            x = (x + (v.detach() + weight * g) / n).detach()
        out = reg + cfg.residual_scale * x
        return out.reshape(-1, cfg.horizon, cfg.action_dim)


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
