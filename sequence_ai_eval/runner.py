"""The eval runner: score deployed policies on a ``@seq.benchmark`` through the normal client.

Where it sits: ``seq eval run`` (``seq/_cli_eval.py``) plans an eval here, then runs it. The
platform owns the loop; the benchmark only resets, steps, observes and checks. Each env is its
own process (a simulator each, spawned) that takes episodes off a shared queue and drives them
through ``sequence_ai.connect(policy)`` -- the gateway handshake, the worker's ``/act``, the
contract check and the declared bounds, exactly what a robot gets. Two loops:

- ``sim`` (default): observe -> ``policy.predict`` -> step the chunk's ``open_loop_horizon`` rows
  (or ``eval.steps_per_query``), checking after every step. A simulator waits for each action,
  so this runs as fast as the sim and the policy allow, and an episode's outcome does not depend
  on how loaded the machine is.
- ``realtime`` (``--realtime``): ``policy.act(...)`` with observe/act callables backed by the
  sim: the robot loop itself (prefetch, pacing at the control frequency, seams), each act()
  stepping the sim one control period.

The plan (arms, parameters, contracts) is ``plan``; the env process side is ``episode``.
Every arm (the policy, a ``--compare`` policy, each ``--sweep`` value) runs the same
(task, seed) episodes. Episode seeds are ``seed + k`` for k in 0..episodes-1, the same for
every task.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import queue
import re
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

from seq.spec import BenchmarkSpec

from .episode import _to_observation, _write_gif, env_main, video_path  # noqa: F401 - re-exported
from .plan import (BUILTIN_BENCHMARKS, EVAL_PARAMS, Arm, EvalError, EvalPlan, load_benchmark,  # noqa: F401
                   plan_eval)
from sequence_ai_data.evals import EvalStore

__all__ = ["BUILTIN_BENCHMARKS", "EvalError", "Arm", "EvalPlan", "Gate", "load_benchmark", "plan_eval",
           "run_eval", "summarize", "parse_gate", "check_gates", "EVAL_PARAMS"]


# ------------------------------------------------------------------------------------ gates

@dataclass
class Gate:
    """A bar a metric's overall value must meet, e.g. ``success>=0.9``."""

    metric: str
    op: str
    value: float

    def passes(self, x: Optional[float]) -> bool:
        if x is None or math.isnan(x):
            return False
        return {">=": x >= self.value, ">": x > self.value, "<=": x <= self.value,
                "<": x < self.value, "==": x == self.value}[self.op]

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


_GATE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(>=|<=|==|>|<)\s*([-+0-9.eE]+)\s*$")


def parse_gate(text: str, bench: BenchmarkSpec) -> Gate:
    """``"success>=0.9"`` -> Gate; EvalError(invalid_request) on a malformed bar or a metric the
    benchmark does not report (when it lists its metrics)."""
    m = _GATE.match(text or "")
    if not m:
        raise EvalError("invalid_request", f"--gate {text!r} is not <metric><op><number>",
                        "write e.g. --gate success>=0.9 (ops: >= > <= < ==)")
    gate = Gate(m.group(1), m.group(2), float(m.group(3)))
    if bench.metrics and gate.metric not in bench.metrics:
        raise EvalError("invalid_request", f"--gate: {bench.name} reports no metric {gate.metric!r}",
                        f"its metrics: {', '.join(bench.metrics)}")
    return gate


def check_gates(report: dict, gates: list[Gate], policy: str) -> list[dict]:
    """Each gate against every arm of the policy under test (not --compare arms).

    An arm with errored episodes misses every gate: its score would leave them out."""
    results = []
    for arm in report["arms"]:
        if arm["policy"] != policy:
            continue
        for gate in gates:
            value = (arm["metrics"].get(gate.metric) or {}).get("overall")
            ok = gate.passes(value) and arm["errors"] == 0
            results.append({"arm": arm["name"], "gate": str(gate), "value": value, "passed": ok,
                            "errors": arm["errors"]})
    return results


# --------------------------------------------------------------------------------- summary

def summarize(record: dict, episodes: list[dict]) -> dict:
    """The report: each metric's mean overall and per task, with episode counts, per arm."""
    order = list(record.get("metrics") or [])
    arms_out = []
    for arm in record["arms"]:
        eps = [e for e in episodes if e["arm"] == arm["name"]]
        ok = [e for e in eps if not e.get("error")]
        names = order + sorted({k for e in ok for k in e["metrics"] if k not in order})
        metrics = {}
        for name in names:
            vals = [e["metrics"][name] for e in ok if name in e["metrics"]]
            per_task = {}
            for task in record["tasks"]:
                tv = [e["metrics"][name] for e in ok if e["task"] == task and name in e["metrics"]]
                per_task[task] = {"value": statistics.fmean(tv) if tv else None, "episodes": len(tv)}
            metrics[name] = {"overall": statistics.fmean(vals) if vals else None, "episodes": len(vals),
                             "per_task": per_task}
        walls = [e["wall_s"] for e in eps if e.get("wall_s")]
        arms_out.append({
            "name": arm["name"], "policy": arm["policy"], "version": arm.get("version"),
            "params": {"policy": arm["policy_params"], "benchmark": arm["bench_params"], "eval": arm["eval_params"],
                       **({"adapter": arm["adapter_params"]} if arm.get("adapter_params") else {})},
            "defaults": arm.get("defaults", {}), "episodes": len(eps), "errors": len(eps) - len(ok),
            "error_messages": sorted({e["error"] for e in eps if e.get("error")})[:5],
            "metrics": metrics,
            "wall_s_per_episode": statistics.median(walls) if walls else None,
            "requests": sum(e.get("requests", 0) for e in eps),
            "videos": [e["video"] for e in eps if e.get("video")],
        })
    adapter = record.get("adapter")
    return {"id": record["id"], "benchmark": record["benchmark"], "tasks": record["tasks"],
            "episodes_per_task": record["episodes"], "seeds": record["seeds"], "envs": record["envs"],
            "loop": record["loop"], "arms": arms_out,
            "adapter": ({"name": adapter["name"], "version": adapter["version"],
                         "policy_io": adapter.get("policy_io")} if adapter else None),
            "adapter_lossy": list((adapter or {}).get("lossy") or [])}


# ------------------------------------------------------------------------------------ run

def run_eval(plan: EvalPlan, store: EvalStore, eval_id: str, *, gateway_url: str, api_key: str,
             on_episode: Optional[Callable[[dict, int, int], None]] = None) -> dict:
    """Run ``plan`` (already recorded in ``store`` as ``eval_id``); return the final record.

    Spawns ``min(envs, episodes)`` env processes; each builds the benchmark once and runs the
    episodes it takes off the queue. ``seq eval cancel`` (the store's cancel flag) stops them
    between polls (0.2 s): the record ends ``canceled`` with the episodes finished so far.
    ``on_episode(episode, done, total)`` is called in this process as each one lands.
    """
    ctx = mp.get_context("spawn")
    jobs_q, results_q = ctx.Queue(), ctx.Queue()
    jobs = plan.jobs()
    for job in jobs:
        jobs_q.put(job)
    n_envs = min(plan.envs, len(jobs))
    for _ in range(n_envs):
        jobs_q.put(None)
    videos_dir = store.folder(eval_id) / "videos" if plan.videos else None
    config = {
        "benchmark_ref": plan.benchmark_ref, "gateway_url": gateway_url, "api_key": api_key,
        "arms": {a.name: {"policy": a.policy, "policy_params": a.policy_params, "bench_params": a.bench_params,
                          "eval_params": a.eval_params, "adapter_params": a.adapter_params} for a in plan.arms},
        "adapter": ({k: plan.adapter[k] for k in ("name", "version", "path", "class_name", "policy_io")}
                    if plan.adapter else None),
        "videos_dir": str(videos_dir) if videos_dir else None, "realtime": plan.realtime,
    }
    procs = [ctx.Process(target=env_main, args=(i, config, jobs_q, results_q), daemon=True,
                         name=f"seq-eval-env{i}") for i in range(n_envs)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    done, status, failure = 0, "done", None
    try:
        while done < len(jobs):
            if store.cancel_requested(eval_id):
                status = "canceled"
                break
            try:
                msg = results_q.get(timeout=0.2)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    try:
                        msg = results_q.get(timeout=1.0)
                    except queue.Empty:
                        status, failure = "failed", "every env process exited before the episodes were done"
                        break
                else:
                    continue
            if msg["type"] == "fatal":
                status, failure = "failed", msg["error"]
                break
            episode = msg["episode"]
            store.add_episode(eval_id, episode)
            done += 1
            store.update(eval_id, done_episodes=done)
            if on_episode is not None:
                on_episode(episode, done, len(jobs))
    finally:
        for p in procs:
            if p.is_alive() and status != "done":
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    record = store.load(eval_id)
    report = summarize(record, store.episodes(eval_id))
    return store.update(eval_id, status=status, error=failure, finished_at=time.time(),
                        wall_s=time.monotonic() - t0, report=report)
