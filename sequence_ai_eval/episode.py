"""The env process side of an eval: one benchmark instance driving episodes through the client.

Each env process (:func:`env_main`, spawned by ``sequence_ai_eval.runner.run_eval``) builds the
benchmark, takes episodes off the jobs queue, drives each with the ``sim`` loop (``predict`` per
chunk), the ``realtime`` loop (``policy.act``) or through an adapter, and puts the result on the
results queue (episode metrics, steps, requests, an optional GIF).
"""
from __future__ import annotations

import importlib
import math
import os
import re
import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from seq.spec import AdapterRuntime, get_adapter_spec, get_benchmark_spec

from .plan import EvalError, _load_adapter, load_benchmark

__all__ = ["env_main", "video_path"]


def _load_ref(ref: str) -> type:
    target, _, cls_name = ref.rpartition(":")
    if target.endswith(".py"):
        cls, _ = load_benchmark(f"{target}:{cls_name}")
        return cls
    return getattr(importlib.import_module(target), cls_name)


def _to_observation(raw: dict, instruction: str):
    import numpy as np
    from sequence_ai import ImageFrame, Observation, encode_jpeg

    images = [ImageFrame(view=view, data=encode_jpeg(np.ascontiguousarray(frame, dtype=np.uint8)))
              for view, frame in (raw.get("images") or {}).items()]
    proprio = {k: [float(x) for x in (v if hasattr(v, "__len__") else [v])] for k, v in (raw.get("proprio") or {}).items()}
    return Observation(images=images, proprioception=proprio, instruction=instruction)


class _Env:
    """One benchmark instance inside an env process, re-set-up when an arm's benchmark params differ."""

    def __init__(self, cls: type):
        self.cls = cls
        self.spec = get_benchmark_spec(cls)
        self.inst = None
        self.params: Optional[dict] = None

    def ensure(self, params: dict):
        if self.inst is None or params != self.params:
            self.close()
            self.inst = self.cls()
            if "setup" in self.spec.methods:
                getattr(self.inst, self.spec.methods["setup"])(**params)
            self.params = dict(params)
        return self.inst

    def call(self, stage: str, *args):
        return getattr(self.inst, self.spec.methods[stage])(*args)

    def close(self) -> None:
        if self.inst is not None and hasattr(self.inst, "close"):
            try:
                self.inst.close()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self.inst = None


def _path_part(text: Any) -> str:
    """One file-name part from an arm or task name: characters other than letters, digits, ``_``,
    ``.`` and ``-`` become ``_``, leading dots go (no ``..``, no hidden files); never empty."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).lstrip(".")[:120] or "_"


def video_path(videos_dir: Path, arm: str, task: str, seed: int) -> Path:
    """Where an episode's GIF goes: ``<videos_dir>/<arm>/<task>_seed<seed>.gif``, each name made
    safe by :func:`_path_part`. Raises EvalError(invalid_request) if the result would still land
    outside ``videos_dir`` (a link planted there)."""
    path = Path(videos_dir) / _path_part(arm) / f"{_path_part(task)}_seed{int(seed)}.gif"
    root = Path(videos_dir).resolve()
    if root not in path.resolve().parents:
        raise EvalError("invalid_request", f"video {path} resolves outside the eval's videos folder {root}",
                        "remove the link under the videos folder")
    return path


def _write_gif(frames: list, path: Path, fps: float) -> None:
    """Write ``frames`` (HxWx3 uint8) as a looping GIF at ``fps``, to a temp file beside ``path``
    renamed into place (no half-written GIF)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(f) for f in frames]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:],
                       duration=int(round(1000.0 / fps)), loop=0, optimize=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _ask_own(own: dict, policy_name: str, inputs: Any, params: dict) -> Any:
    """One request to a policy with its own inputs and outputs (``policy_io="own"``), through
    the gateway's ``POST /v1/act``: ``inputs`` is sent as the observation, unchanged; returns
    what infer returned. Raises RuntimeError naming the gateway's error."""
    r = own["http"].post("/v1/act", json={"model": policy_name, "observation": inputs, "params": params or {}})
    try:
        body = r.json()
    except ValueError:
        body = {"detail": r.text[:300]}
    if r.status_code != 200:
        raise RuntimeError(f"{policy_name} answered {r.status_code} {body.get('code')}: {body.get('detail')}")
    return body.get("outputs")


def _play(rows, n, state: dict, do_step) -> None:
    """Play the first ``n`` rows (at least one, at most all) until the episode is done."""
    for row in rows[:max(1, min(int(n), len(rows)))]:
        do_step(row)
        if state["done"]:
            break


def _drive_realtime(env: _Env, policy, arm: dict, instruction: str, state: dict, do_step, max_steps: int) -> dict:
    """``--realtime``: the client's own control loop (``policy.act``) at the control frequency;
    returns the run's outcome fields."""
    def observe():
        state["requests"] += 1
        return _to_observation(env.call("observe"), instruction)

    period = 1.0 / env.spec.action.control_frequency_hz
    outcome = policy.act(instruction, observe=observe, act=do_step, until=lambda: state["done"],
                         validate=lambda row: all(math.isfinite(x) for x in row), hold=lambda: None,
                         max_seconds=max_steps * period * 4 + 5.0, max_actions=max_steps,
                         params=arm["policy_params"], progress=False)
    return {"outcome": {"reason": outcome.reason, "actions": outcome.actions, "chunks": outcome.chunks,
                        "underruns": outcome.underruns, "late_ticks": getattr(outcome, "late_ticks", None),
                        "max_seam_jump": outcome.max_seam_jump}}


def _drive_adapter(env: _Env, policy, arm: dict, instruction: str, state: dict, do_step,
                   adapter: AdapterRuntime, own: Optional[dict], per_query) -> None:
    """Benchmark observation -> adapter -> policy -> adapter -> benchmark rows, until done."""
    while not state["done"]:
        raw = dict(env.call("observe"))
        raw.setdefault("instruction", instruction)
        inputs = adapter.to_policy(raw)
        horizon = None
        if adapter.spec.policy_io == "own":
            answer = _ask_own(own, arm["policy"], inputs, arm["policy_params"])
        else:
            obs = _to_observation(inputs, inputs.get("instruction") or instruction)
            pred = policy.predict(obs, params=arm["policy_params"])
            if pred.inference_ms is not None:
                state["infer_ms"].append(pred.inference_ms)
            answer, horizon = pred.action_chunk.actions, pred.action_chunk.open_loop_horizon
        state["requests"] += 1
        rows = adapter.to_benchmark(answer)
        _play(rows, per_query or horizon or len(rows), state, do_step)


def _drive_chunks(env: _Env, policy, arm: dict, instruction: str, state: dict, do_step, per_query) -> None:
    """One ``predict`` per chunk; play ``steps_per_query`` rows (default the open-loop horizon)."""
    while not state["done"]:
        obs = _to_observation(env.call("observe"), instruction)
        pred = policy.predict(obs, params=arm["policy_params"])
        state["requests"] += 1
        if pred.inference_ms is not None:
            state["infer_ms"].append(pred.inference_ms)
        rows = pred.action_chunk.actions
        if not rows:
            raise RuntimeError("the policy returned an empty action chunk")
        _play(rows, per_query or pred.action_chunk.open_loop_horizon or len(rows), state, do_step)


def _episode(env: _Env, policy, arm: dict, job: dict, instruction: str, videos_dir: Optional[Path],
             realtime: bool, adapter: Optional[AdapterRuntime] = None, own: Optional[dict] = None) -> dict:
    spec = env.spec
    env.ensure(arm["bench_params"])
    env.call("reset", job["task"], job["seed"])
    max_steps = int(arm["eval_params"].get("max_steps") or 3000)
    per_query = arm["eval_params"].get("steps_per_query")
    every = max(1, int(round(spec.action.control_frequency_hz / spec.video_fps)))
    frames: list = []
    state = {"steps": 0, "done": False, "metrics": {}, "requests": 0, "infer_ms": []}
    if videos_dir is not None:
        frames.append(env.call("render"))

    def do_step(row) -> None:
        env.call("step", list(row))
        state["steps"] += 1
        if videos_dir is not None and state["steps"] % every == 0:
            frames.append(env.call("render"))
        done, metrics = env.call("check")
        state["metrics"] = dict(metrics)
        state["done"] = bool(done) or state["steps"] >= max_steps

    t0 = time.monotonic()
    if realtime:
        extra = _drive_realtime(env, policy, arm, instruction, state, do_step, max_steps)
    elif adapter is not None:
        _drive_adapter(env, policy, arm, instruction, state, do_step, adapter, own, per_query)
        extra = {}
    else:
        _drive_chunks(env, policy, arm, instruction, state, do_step, per_query)
        extra = {}
    metrics = state["metrics"]
    if "score" in spec.methods:
        metrics = dict(env.call("score", dict(metrics)))
    video = None
    if videos_dir is not None and frames:
        path = video_path(videos_dir, job["arm"], job["task"], job["seed"])
        _write_gif(frames, path, spec.video_fps)
        video = str(path)
    return {"arm": job["arm"], "task": job["task"], "seed": job["seed"], "episode": job["episode"],
            "metrics": {k: float(v) for k, v in metrics.items()}, "steps": state["steps"],
            "requests": state["requests"], "wall_s": time.monotonic() - t0,
            "infer_ms": statistics.median(state["infer_ms"]) if state["infer_ms"] else None,
            "video": video, "error": None, **extra}


def env_main(index: int, config: dict, jobs_q, results_q) -> None:
    """Entry point of one env process: set up the benchmark, run episodes until the sentinel."""
    import sequence_ai

    try:
        cls = _load_ref(config["benchmark_ref"])
        env = _Env(cls)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as the eval's failure
        results_q.put({"type": "fatal", "error": f"env {index}: cannot load the benchmark: {exc!r}"})
        return
    policies: dict = {}
    adapters: dict = {}
    own: Optional[dict] = None
    adapter_ref = config.get("adapter")
    adapter_cls = None
    if adapter_ref is not None:
        try:
            adapter_cls = _load_adapter(adapter_ref)
        except EvalError as exc:
            results_q.put({"type": "fatal", "error": f"env {index}: {exc.detail}"})
            return
        if get_adapter_spec(adapter_cls).policy_io == "own":
            import httpx
            own = {"http": httpx.Client(base_url=config["gateway_url"], timeout=httpx.Timeout(600.0, connect=10.0),
                                        headers={"Authorization": f"Bearer {config['api_key']}"}, trust_env=False)}
    videos_dir = Path(config["videos_dir"]) if config["videos_dir"] else None
    try:
        while True:
            job = jobs_q.get()
            if job is None:
                break
            arm = config["arms"][job["arm"]]
            instruction = env.spec.tasks[job["task"]]
            t0 = time.monotonic()
            try:
                adapter = None
                if adapter_cls is not None:      # one instance per arm's parameters, kept across episodes
                    key = repr(sorted((arm.get("adapter_params") or {}).items()))
                    adapter = adapters.get(key)
                    if adapter is None:
                        adapter = adapters[key] = AdapterRuntime(adapter_cls, arm.get("adapter_params"))
                    if own is not None:
                        result = _episode(env, None, arm, job, instruction, videos_dir, False, adapter, own)
                        results_q.put({"type": "episode", "episode": result})
                        continue
                policy = policies.get(arm["policy"])
                if policy is None:
                    policy = sequence_ai.connect(arm["policy"], api_key=config["api_key"],
                                                 gateway_url=config["gateway_url"], validate="strict")
                    policy.wait_until_ready(timeout_s=600.0)
                    policies[arm["policy"]] = policy
                result = _episode(env, policy, arm, job, instruction, videos_dir, config["realtime"], adapter)
            except Exception as exc:  # noqa: BLE001 - one failed episode is reported, the eval goes on
                result = {"arm": job["arm"], "task": job["task"], "seed": job["seed"], "episode": job["episode"],
                          "metrics": {}, "steps": 0, "requests": 0, "wall_s": time.monotonic() - t0, "video": None,
                          "error": f"{type(exc).__name__}: {exc}",
                          "traceback": traceback.format_exc(limit=6)}
            results_q.put({"type": "episode", "episode": result})
    finally:
        for p in policies.values():
            try:
                p.close()
            except Exception:  # noqa: BLE001
                pass
        if own is not None:
            own["http"].close()
        env.close()
