"""Flywheel step 3: train the learned pick-and-place policy from a LeRobot dataset.

    python examples/flywheel/train.py DATASET --out CHECKPOINT_DIR [--minutes 60 | --steps N]
                                      [--batch 64] [--lr 1e-3] [--successes-only] [--threads 2]
                                      [--save-every-min M] [--init CHECKPOINT [--flow-only]]

Reads the dataset ``sequence-ai bag export --format lerobot`` wrote (or the one ``.npz`` of
``record_inprocess.py``) (LeRobot v3.0) with pyarrow
(``meta/info.json``, ``meta/tasks.parquet``, ``meta/episodes/...``, ``data/...parquet``) and PyAV
(``videos/observation.images.<view>/...mp4``) -- no hub, nothing fetched. Every frame ``t`` is
one sample: both cameras (area-resized to 96x96), ``observation.state`` (8), the frame's task
index, and the target chunk ``action[t : t+16]`` (the episode's last row repeats past its end).
States and actions are normalised with the dataset's mean/std. Loss: L1 on the regression
chunk plus the flow-matching loss of the generative head (``model.FlowHead``, on the features,
which only the L1 trains). Images get a random shift of up to 4 px (pad + crop) while training.
``--init`` starts from a checkpoint's weights (layers it lacks start fresh) and its normalisation;
with ``--flow-only`` everything but the flow head stays frozen, the features are computed once per
frame, and only the flow head trains (minutes on a CPU). With 17 or more episodes, every 17th is held
out and its open-loop L1 is printed every ten log lines and stored as ``held_out_l1``.

Writes ``CHECKPOINT_DIR/policy.pt`` (config with the task strings, weights, normalisation) and
``CHECKPOINT_DIR/train.json`` (samples, steps, seconds, final loss).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))


class DatasetError(RuntimeError):
    """The folder is not a LeRobot v3.0 dataset this script can read (the message says why)."""


def _decode_video(path: Path, size: int) -> np.ndarray:
    """All frames of an mp4 as uint8 ``(T, size, size, 3)`` (area-resized like at inference)."""
    import av
    import torch

    from model import preprocess

    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    if not frames:
        raise DatasetError(f"{path}: no video frames")
    x = preprocess(torch.from_numpy(np.stack(frames)), size)              # (T, 3, S, S) in [-1, 1]
    return ((x + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def load_dataset(root: Path, views, image_size: int = 96, successes_only: bool = False) -> dict:
    """Read a LeRobot v3.0 dataset into memory.

    Returns ``{"images": {view: (N, S, S, 3) uint8}, "state": (N, 8) f32, "action": (N, 8) f32,
    "task": (N,) int64, "episode": (N,) int64, "frame": (N,) int64, "ep_end": (N,) int64 (index of
    the episode's last frame), "tasks": [str], "episodes": int, "fps": int}``.
    Raises DatasetError when files are missing or the version is not 3.0.
    """
    import pyarrow.parquet as pq

    info_path = root / "meta" / "info.json"
    if not info_path.exists():
        raise DatasetError(f"{root}: no meta/info.json (export one with `sequence-ai bag export ... --format lerobot`)")
    info = json.loads(info_path.read_text())
    if info.get("codebase_version") != "v3.0":
        raise DatasetError(f"{root}: LeRobot {info.get('codebase_version')}; this script reads v3.0 (export --version 3.0)")
    for v in views:
        if f"observation.images.{v}" not in info["features"]:
            raise DatasetError(f"{root}: no camera {v!r}; the dataset has "
                               f"{[k for k in info['features'] if k.startswith('observation.images.')]}")
    t = pq.read_table(root / "meta" / "tasks.parquet")
    tasks = [s for _, s in sorted(zip(t.column("task_index").to_pylist(), t.column("task").to_pylist()))]
    eps = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    data_cache: dict = {}
    parts = {k: [] for k in ("state", "action", "task", "episode", "frame", "ep_end")}
    images = {v: [] for v in views}
    success_col: dict = {}
    n = 0
    kept = 0
    for ep in sorted(eps, key=lambda r: r["episode_index"]):
        key = (ep["data/chunk_index"], ep["data/file_index"])
        if key not in data_cache:
            data_cache.clear()
            data_cache[key] = pq.read_table(root / info["data_path"].format(chunk_index=key[0], file_index=key[1]))
        table = data_cache[key]
        idx = np.asarray(table.column("episode_index").to_pylist())
        rows = np.nonzero(idx == ep["episode_index"])[0]
        success = bool(np.any(np.asarray(table.column("next.success").to_pylist())[rows]))
        success_col[ep["episode_index"]] = success
        if successes_only and not success:
            continue
        state = np.asarray(table.column("observation.state").to_pylist(), dtype=np.float32)[rows]
        action = np.asarray(table.column("action").to_pylist(), dtype=np.float32)[rows]
        task = np.asarray(table.column("task_index").to_pylist(), dtype=np.int64)[rows]
        T = len(rows)
        for v in views:
            k = f"observation.images.{v}"
            path = root / info["video_path"].format(video_key=k, chunk_index=ep[f"videos/{k}/chunk_index"],
                                                    file_index=ep[f"videos/{k}/file_index"])
            frames = _decode_video(path, image_size)
            start = int(round(float(ep[f"videos/{k}/from_timestamp"]) * info["fps"]))
            frames = frames[start:start + T]
            if len(frames) != T:
                raise DatasetError(f"{path}: {len(frames)} frames for an episode of {T}")
            images[v].append(frames)
        parts["state"].append(state)
        parts["action"].append(action)
        parts["task"].append(task)
        parts["episode"].append(np.full(T, ep["episode_index"]))
        parts["frame"].append(np.arange(T))
        parts["ep_end"].append(np.full(T, n + T - 1))
        n += T
        kept += 1
    if kept == 0:
        raise DatasetError(f"{root}: no episodes to train on" + (" (no successful ones)" if successes_only else ""))
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["images"] = {v: np.concatenate(f) for v, f in images.items()}
    out.update(tasks=tasks, episodes=kept, fps=int(info["fps"]),
               successes=sum(success_col.values()), total_episodes=len(eps))
    return out


def load_npz_dataset(path: Path, views, image_size: int = 96) -> dict:
    """Read demonstrations ``record_inprocess.py`` wrote (one ``.npz``) into :func:`load_dataset`'s
    dict, plus ``"sampled"`` (N,) bool: the frames that carry camera images (only those train).
    Raises DatasetError for a missing camera or another image size."""
    try:
        z = np.load(path, allow_pickle=False)
        out = {k: z[k] for k in ("state", "action", "task", "episode", "frame", "sampled")}
        out["images"] = {v: z[f"images_{v}"] for v in views}
        tasks = [str(x) for x in z["tasks"]]
    except (OSError, KeyError, ValueError) as exc:
        raise DatasetError(f"{path}: not a file record_inprocess.py wrote ({type(exc).__name__}: {exc})") from None
    if any(f.shape[1:3] != (image_size, image_size) for f in out["images"].values()):
        raise DatasetError(f"{path}: images are not {image_size}x{image_size}")
    ep = out["episode"]
    last = {e: int(np.nonzero(ep == e)[0][-1]) for e in np.unique(ep)}
    out["ep_end"] = np.asarray([last[e] for e in ep], dtype=np.int64)
    out.update(tasks=tasks, episodes=len(last), fps=15, successes=None, total_episodes=len(last))
    return out


def train(dataset: Path, out_dir: Path, *, minutes: float = None, steps: int = None, batch: int = 64,
          lr: float = 1e-3, successes_only: bool = False, threads: int = 2, seed: int = 0,
          log_every: int = 100, quiet: bool = False, save_every_min: float = None, init: Path = None,
          flow_only: bool = False) -> dict:
    """Train on ``dataset`` for ``steps`` optimiser steps or ``minutes`` of wall time (whichever
    is given; both: the first reached) and write ``out_dir/policy.pt``; returns the summary
    written to ``out_dir/train.json``. ``save_every_min``: also write ``policy.pt`` every that many
    minutes while training (replaced atomically; evaluate a run before it ends). ``init``: a
    ``policy.pt`` to start from (its tasks must cover the dataset's; its normalisation is kept);
    ``flow_only``: train the flow head alone on frozen features (needs ``init``). Raises
    ValueError when neither bound is given, or ``flow_only`` without ``init``."""
    import torch
    import torch.nn.functional as F

    from model import ModelConfig, VisuomotorPolicy, save_checkpoint

    if minutes is None and steps is None:
        raise ValueError("give minutes= or steps= (training is bounded)")
    if steps is not None and not steps > 0:
        raise ValueError(f"steps must be > 0, got {steps}")
    if minutes is not None and not minutes > 0:
        raise ValueError(f"minutes must be > 0, got {minutes}")
    if flow_only and init is None:
        raise ValueError("flow_only trains the flow head on a trained network's features: give init=CHECKPOINT")
    if save_every_min is not None and not save_every_min > 0:
        raise ValueError(f"save_every_min must be > 0 minutes, got {save_every_min}")
    torch.manual_seed(seed)
    torch.set_num_threads(max(1, int(threads)))
    rng = np.random.default_rng(seed)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    t_load = time.monotonic()
    cfg = ModelConfig()
    if Path(dataset).suffix == ".npz":
        data = load_npz_dataset(Path(dataset), cfg.views, cfg.image_size)
    else:
        data = load_dataset(dataset, cfg.views, cfg.image_size, successes_only)
    cfg.tasks = list(data["tasks"])
    n = len(data["state"])
    say(f"dataset {dataset}: {data['episodes']} episodes ({data['successes']} successful of {data['total_episodes']}), "
        f"{n} frames, {len(cfg.tasks)} tasks; loaded in {time.monotonic() - t_load:.1f} s")
    s_mean, s_std = data["state"].mean(0), data["state"].std(0) + 1e-3
    a_mean, a_std = data["action"].mean(0), data["action"].std(0) + 1e-3
    stats = {"state_mean": s_mean.tolist(), "state_std": s_std.tolist(),
             "action_mean": a_mean.tolist(), "action_std": a_std.tolist()}
    start = _initial_weights(init, cfg) if init is not None else None
    if start is not None:
        order = np.asarray([cfg.tasks.index(x) for x in data["tasks"]], dtype=np.int64)
        data["task"] = order[data["task"]]   # the dataset's task indices -> the checkpoint's
        stats = start["stats"]
        s_mean, s_std = (np.asarray(stats[k], np.float32) for k in ("state_mean", "state_std"))
        a_mean, a_std = (np.asarray(stats[k], np.float32) for k in ("action_mean", "action_std"))
    state_n = torch.from_numpy((data["state"] - s_mean) / s_std)
    action_n = torch.from_numpy((data["action"] - a_mean) / a_std)
    task = torch.from_numpy(data["task"])
    ep_end = data["ep_end"]
    imgs = {v: torch.from_numpy(f) for v, f in data["images"].items()}
    offsets = np.arange(cfg.horizon)
    # held-out episodes: every 17th when there are 17 or more (17 is prime to six, so from 102
    # episodes on every task has one); open-loop L1 on them checks that the net generalises to
    # layouts and light it has not seen
    held = (data["episode"] % 17 == 16) if data["episodes"] >= 17 else np.zeros(n, bool)
    usable = data.get("sampled", np.ones(n, bool))      # frames that carry images
    train_idx = np.nonzero(~held & usable)[0]
    val_idx = np.nonzero(held & usable)[0]
    if len(val_idx) > 1024:
        val_idx = np.sort(rng.choice(val_idx, 1024, replace=False))

    model = VisuomotorPolicy(cfg)
    if start is not None:
        model.load_state_dict(start["state_dict"], strict=False)
    n_params = sum(p.numel() for p in model.parameters())
    trained = list(model.flow.parameters()) if flow_only else list(model.parameters())
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=1e-4)
    say(f"model: {n_params / 1e6:.2f} M parameters; batch {batch}, lr {lr}, "
        f"{'%d steps' % steps if steps else ''}{' / ' if steps and minutes else ''}{'%.1f min' % minutes if minutes else ''}")

    def shift(x: torch.Tensor, pad: int = 4) -> torch.Tensor:
        b, c, h, w = x.shape
        x = F.pad(x, (pad, pad, pad, pad), mode="replicate")
        dx, dy = rng.integers(0, 2 * pad + 1, size=2)
        return x[:, :, dy:dy + h, dx:dx + w]

    def chunk_targets(idx: np.ndarray) -> torch.Tensor:
        return action_n[torch.from_numpy(np.minimum(idx[:, None] + offsets[None, :], ep_end[idx][:, None]))]

    def val_l1():       # float, or None when nothing is held out
        if len(val_idx) == 0:
            return None
        model.eval()
        total = 0.0
        with torch.no_grad():
            for k in range(0, len(val_idx), 256):
                idx = val_idx[k:k + 256]
                pred = model({v: preprocess_u8(f[idx], cfg.image_size) for v, f in imgs.items()},
                             state_n[idx], task[idx])
                total += F.l1_loss(pred, chunk_targets(idx), reduction="sum").item()
        model.train()
        return total / (len(val_idx) * cfg.horizon * cfg.action_dim)

    say(f"train on {len(train_idx)} frames, hold out {len(val_idx)} frames of "
        f"{len(np.unique(data['episode'][held]))} episodes")
    t0 = time.monotonic()
    deadline = t0 + minutes * 60.0 if minutes is not None else float("inf")
    max_steps = steps if steps is not None else 10 ** 9
    # cosine decay over the planned steps, or (time bound) over the time
    step, running, losses = 0, None, []
    out_dir.mkdir(parents=True, exist_ok=True)
    last_save = t0

    def save(extra: dict) -> None:
        tmp = out_dir / "policy.pt.tmp"
        model.eval()
        save_checkpoint(tmp, model, stats, extra)
        model.train()
        tmp.replace(out_dir / "policy.pt")

    feats = _frozen_features(model, imgs, state_n, task, cfg.image_size) if flow_only else None
    flow_running = None
    model.train()
    while step < max_steps and time.monotonic() < deadline:
        frac = step / max_steps if steps is not None else (time.monotonic() - t0) / (deadline - t0)
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1.0 + np.cos(np.pi * min(1.0, frac)))
        idx = train_idx[rng.integers(0, len(train_idx), size=batch)]
        target = chunk_targets(idx)
        if flow_only:
            z = feats[torch.from_numpy(idx)]
            with torch.no_grad():
                l1 = F.l1_loss(model.head(z).reshape(target.shape), target)
            flow = model.flow_loss(z, target)
            loss = flow
        else:
            images = {v: shift(preprocess_u8(f[idx], cfg.image_size)) for v, f in imgs.items()}
            z = model.features(images, state_n[idx], task[idx])
            l1 = F.l1_loss(model.head(z).reshape(target.shape), target)
            flow = model.flow_loss(z.detach(), target)
            loss = l1 + flow
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        running = l1.item() if running is None else 0.98 * running + 0.02 * l1.item()
        flow_running = flow.item() if flow_running is None else 0.98 * flow_running + 0.02 * flow.item()
        if step % log_every == 0 or step == 1:
            val = val_l1() if step % (10 * log_every) == 0 else None
            losses.append((step, running) if val is None else (step, running, val))
            say(f"  step {step:6d}  {time.monotonic() - t0:7.1f} s  L1 {running:.4f}  flow {flow_running:.4f}"
                + ("" if val is None else f"  held-out L1 {val:.4f}"))
        if save_every_min and time.monotonic() - last_save >= save_every_min * 60.0:
            last_save = time.monotonic()
            save({"train": {"steps": step, "partial": True, "l1": running}})
    train_s = time.monotonic() - t0
    final_val = val_l1()
    summary = {"dataset": str(dataset), "episodes": data["episodes"], "successful_episodes": data["successes"],
               "frames": n, "tasks": cfg.tasks, "parameters": n_params, "steps": step, "batch": batch,
               "train_s": round(train_s, 1), "final_l1": running, "final_flow_loss": flow_running,
               "init": str(init) if init is not None else None, "flow_only": bool(flow_only),
               "held_out_l1": final_val,
               "held_out_frames": int(len(val_idx)), "threads": int(threads), "losses": losses}
    save({"train": {k: v for k, v in summary.items() if k != "losses"}})
    (out_dir / "train.json").write_text(json.dumps(summary, indent=2))
    held_txt = "none held out" if final_val is None else f"held-out {final_val:.4f}"
    say(f"trained {step} steps in {train_s:.1f} s (L1 {running:.4f}, {held_txt}); wrote {out_dir / 'policy.pt'} "
        f"({(out_dir / 'policy.pt').stat().st_size / 1e6:.2f} MB)")
    return summary


def _initial_weights(path: Path, cfg) -> dict:
    """``{"state_dict", "stats"}`` of the checkpoint at ``path`` to start from; ``cfg.tasks`` takes
    its task order (the dataset's tasks must all be in it). Raises ValueError otherwise."""
    import torch

    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        tasks = list(ck["config"]["tasks"])
    except Exception as exc:  # noqa: BLE001 - name the file and why
        raise ValueError(f"--init {path}: not a checkpoint written by train.py ({type(exc).__name__})") from None
    missing = [x for x in cfg.tasks if x not in tasks]
    if missing:
        raise ValueError(f"--init {path} was trained on {tasks}; the dataset also has {missing}")
    cfg.tasks = tasks
    return {"state_dict": ck["state_dict"], "stats": ck["stats"]}


def _frozen_features(model, imgs: dict, state_n, task, size: int):
    """Features ``(N, C)`` of every frame (no augmentation), computed once for flow-only training."""
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for k in range(0, len(task), 256):
            sl = slice(k, k + 256)
            out.append(model.features({v: preprocess_u8(f[sl], size) for v, f in imgs.items()},
                                      state_n[sl], task[sl]))
    return torch.cat(out)


def preprocess_u8(frames, size: int):
    """uint8 ``(B, S, S, 3)`` tensor (already ``size``) -> float ``(B, 3, S, S)`` in [-1, 1]."""
    from model import preprocess

    return preprocess(frames, size)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train the learned pick-and-place policy from a LeRobot v3.0 dataset.")
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder (policy.pt, train.json)")
    ap.add_argument("--minutes", type=float, default=None, help="wall-time bound (min)")
    ap.add_argument("--steps", type=int, default=None, help="optimiser steps bound")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--successes-only", action="store_true", help="train on the successful episodes only")
    ap.add_argument("--save-every-min", type=float, default=None, help="also write policy.pt every N minutes")
    ap.add_argument("--init", type=Path, default=None, help="start from this policy.pt (its tasks and normalisation)")
    ap.add_argument("--flow-only", action="store_true", help="with --init: train only the flow head, features frozen")
    a = ap.parse_args(argv)
    if a.minutes is None and a.steps is None:
        a.minutes = 60.0
    try:
        train(a.dataset, a.out, minutes=a.minutes, steps=a.steps, batch=a.batch, lr=a.lr,
              successes_only=a.successes_only, threads=a.threads, save_every_min=a.save_every_min,
              init=a.init, flow_only=a.flow_only)
    except (DatasetError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
