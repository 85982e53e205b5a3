"""A picture of one run: exterior-camera frames, and the commanded joints with chunk seams.

Writes ``run.png`` (a strip of frames above a plot of the 8 commanded dimensions over time, a
vertical line where each action chunk started) and ``run.gif`` (every recorded frame) beside it.
Needs matplotlib (the ``demo`` extra) and Pillow.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

DIM_NAMES = [f"joint{i}" for i in range(1, 8)] + ["gripper"]


def render_run_picture(result, path: Path, n_frames: int = 6) -> Path:
    """Render ``result`` (a ``demo.DemoResult``) to ``path`` (PNG) and a GIF beside it.

    Returns:
        ``path``.
    Raises:
        ValueError: the run recorded no frames and no commands (nothing to draw).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    frames, commands = result.frames, result.commands
    if not frames and not commands:
        raise ValueError("the run recorded no frames and no commands: nothing to draw")
    t0 = min([t for t, _ in frames] + [t for t, _ in commands])

    fig = plt.figure(figsize=(12, 6.5), dpi=100)
    grid = fig.add_gridspec(2, n_frames, height_ratios=[1, 1.3])
    picks = np.linspace(0, len(frames) - 1, n_frames).round().astype(int) if frames else []
    for col, idx in enumerate(picks):
        ax = fig.add_subplot(grid[0, col])
        t, rgb = frames[idx]
        ax.imshow(rgb)
        ax.set_title(f"t = {t - t0:.1f} s", fontsize=9)
        ax.axis("off")

    ax = fig.add_subplot(grid[1, :])
    if commands:
        ts = np.array([t - t0 for t, _ in commands])
        values = np.array([v for _, v in commands])
        for d in range(values.shape[1]):
            ax.plot(ts, values[:, d], label=DIM_NAMES[d] if d < len(DIM_NAMES) else f"dim{d}", lw=1.2)
        for k, i in enumerate(result.seams):
            if i < len(ts):
                ax.axvline(ts[i], color="0.6", lw=0.6, ls="--", label="chunk seam" if k == 0 else None)
        if result.hold_time is not None:
            ax.axvline(result.hold_time - t0, color="red", lw=1.2, label="hold")
    ax.set_xlabel("time since goal (s)")
    ax.set_ylabel("command (rad; gripper 0 open .. 1 closed)")
    if commands:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    else:
        ax.text(0.5, 0.5, "no command was published", ha="center", va="center", transform=ax.transAxes)
    o = result.outcome
    fig.suptitle(
        f"{result.instruction!r} (seed {result.seed}) -> {o['reason']}, {o['actions']} actions / "
        f"{o['chunks']} chunks, {'success' if result.success else 'no success'} "
        f"({result.distance_m * 100:.1f} cm)", fontsize=11,
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)

    if frames:
        images = [Image.fromarray(rgb) for _, rgb in frames]
        images[0].save(path.with_suffix(".gif"), save_all=True, append_images=images[1:], duration=250, loop=0)
    return path
