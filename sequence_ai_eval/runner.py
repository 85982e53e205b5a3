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

Every arm (the policy, a ``--compare`` policy, each ``--sweep`` value) runs the same
(task, seed) episodes. Episode seeds are ``seed + k`` for k in 0..episodes-1, the same for
every task.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import multiprocessing as mp
import os
import queue
import re
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from seq.spec import (AdapterRuntime, BenchmarkSpec, InferParam, ParamError, check_adapter, contract_problems,
                      BUILTIN_BENCHMARKS, get_adapter_spec, get_benchmark_spec, is_benchmark, load_adapter_file)

from sequence_ai_data.evals import EvalStore

__all__ = ["BUILTIN_BENCHMARKS", "EvalError", "Arm", "EvalPlan", "Gate", "load_benchmark", "plan_eval",
           "run_eval", "summarize", "parse_gate", "check_gates", "EVAL_PARAMS"]


#: The eval's own parameters (``--param eval.<name>=v``).
EVAL_PARAMS = [
    InferParam("steps_per_query", "int", None, nullable=True),   # rows played per request (None: the chunk's horizon)
    InferParam("max_steps", "int", 3000),                        # hard cap on steps per episode
]


class EvalError(Exception):
    """An eval that cannot run as asked. ``code`` is the CLI's error code, ``hint`` what to do."""

    def __init__(self, code: str, detail: str, hint: Optional[str] = None):
        super().__init__(detail)
        self.code, self.detail, self.hint = code, detail, hint


# ------------------------------------------------------------------------------- benchmarks

def load_benchmark(ref: str) -> tuple[type, str]:
    """The benchmark class for ``ref`` and the import reference an env process reloads it by.

    ``ref`` is a built-in name (``"pick-place"``), ``"module:Class"``, or ``"path/to/file.py"``
    (``[:Class]`` when the file has several). Raises EvalError(not_found) when it cannot be found.
    """
    target = BUILTIN_BENCHMARKS.get(ref, ref)
    path_part, _, cls_name = target.partition(":") if not re.match(r"^[A-Za-z]:\\", target) else (target, "", "")
    if path_part.endswith(".py"):
        path = Path(path_part).expanduser().resolve()
        if not path.is_file():
            raise EvalError("not_found", f"no benchmark file {path_part}",
                            f"built-in benchmarks: {', '.join(BUILTIN_BENCHMARKS)}")
        spec = importlib.util.spec_from_file_location(f"_seq_benchmark_{abs(hash(str(path)))}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        ref_out = f"{path}:{{cls}}"
    elif cls_name:
        try:
            module = importlib.import_module(path_part)
        except ImportError as exc:
            raise EvalError("not_found", f"cannot import benchmark module {path_part}: {exc}",
                            "install the sim extra (pip install 'sequence-ai[sim]') for the built-in benchmarks") from None
        ref_out = f"{path_part}:{{cls}}"
    else:
        raise EvalError("not_found", f"unknown benchmark {ref!r}",
                        f"built-in benchmarks: {', '.join(BUILTIN_BENCHMARKS)}; or give path/to/benchmark.py")
    classes = [v for v in vars(module).values() if is_benchmark(v) and v.__module__ == module.__name__]
    if cls_name:
        classes = [c for c in classes if c.__name__ == cls_name]
    if len(classes) != 1:
        raise EvalError("not_found", f"{target} has {len(classes)} @seq.benchmark classes",
                        "name one: file.py:ClassName")
    return classes[0], ref_out.format(cls=classes[0].__name__)


# ------------------------------------------------------------------------------------ plan

@dataclass
class Arm:
    """One side of an eval: a deployed policy with its parameters in force."""

    name: str                                   # label in the report (policy, or policy[k=v])
    policy: str                                 # deployment name
    policy_params: dict                         # sent with every request
    bench_params: dict                          # @seq.setup keywords
    eval_params: dict                           # steps_per_query, max_steps
    defaults: dict = field(default_factory=dict)  # name -> value left at its declared default
    version: Optional[int] = None
    adapter_params: dict = field(default_factory=dict)  # the adapter's __init__ keywords


@dataclass
class EvalPlan:
    """What ``seq eval run`` will do; ``--dry-run`` prints it."""

    benchmark: BenchmarkSpec
    benchmark_ref: str
    arms: list[Arm]
    tasks: list[str]
    episodes: int                               # per task and arm
    seed: int
    envs: int
    videos: bool
    realtime: bool
    estimate_episode_s: float
    estimate_source: str
    adapter: Optional[dict] = None              # the registered version: name, version, path, class_name, spec

    @property
    def total_episodes(self) -> int:
        return len(self.arms) * len(self.tasks) * self.episodes

    def estimate_wall_s(self) -> float:
        """Estimated wall-clock (s): the episodes spread over the envs, plus ~5 s of start-up."""
        waves = math.ceil(self.total_episodes / max(1, min(self.envs, self.total_episodes)))
        return 5.0 + waves * self.estimate_episode_s

    def jobs(self) -> list[dict]:
        """Episodes in run order: seed-major, so arms and tasks progress side by side."""
        return [{"arm": a.name, "task": t, "seed": self.seed + k, "episode": k}
                for k in range(self.episodes) for t in self.tasks for a in self.arms]


def _parse_kv(items: list[str], what: str) -> list[tuple[str, str]]:
    out = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise EvalError("invalid_request", f"{what} {item!r} is not name=value", f"write e.g. {what} replan_steps=3")
        out.append((key.strip(), value.strip()))
    return out


def _classify(name: str, bench: BenchmarkSpec, policy_params: list[InferParam],
              adapter_params: Optional[list[InferParam]] = None) -> tuple[str, InferParam]:
    scope, dot, bare = name.partition(".")
    tables = {"eval": EVAL_PARAMS, "benchmark": bench.params, "policy": policy_params}
    if adapter_params is not None:
        tables["adapter"] = adapter_params
    if dot and scope in tables:
        for p in tables[scope]:
            if p.name == bare:
                return scope, p
        known = ", ".join(p.name for p in tables[scope]) or "none"
        raise EvalError("invalid_request", f"{scope} has no parameter {bare!r}", f"{scope} declares: {known}")
    hits = [(s, p) for s, t in tables.items() if s != "eval" for p in t if p.name == name]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise EvalError("invalid_request", f"{' and '.join(s for s, _ in hits)} all declare {name!r}",
                        f"write {hits[0][0]}.{name}=... (or another scope)")
    known = [f"policy.{p.name}" for p in policy_params] + [f"benchmark.{p.name}" for p in bench.params] + \
            [f"adapter.{p.name}" for p in adapter_params or []] + [f"eval.{p.name}" for p in EVAL_PARAMS]
    raise EvalError("invalid_request", f"unknown parameter {name!r}", f"known: {', '.join(known)}")


def plan_eval(*, bench_cls: type, benchmark_ref: str, policy: str, deployments: dict[str, dict],
              compare: list[str], params: list[str], sweep: list[str], tasks: Optional[str], episodes: int,
              seed: int, envs: int, videos: bool, realtime: bool, past_episode_s: list[float],
              adapter: Optional[dict] = None) -> EvalPlan:
    """Check everything an eval needs and lay it out; nothing runs and nothing is reserved.

    ``deployments`` maps each policy name (the policy and every ``--compare``) to its gateway
    record (``GET /v1/deployments/<name>``: contract, params, version). ``adapter`` is a
    registered adapter version (``GET /v1/adapters/<name>/versions/<v>``: name, version, path,
    class_name, spec) that every arm runs through, or None. Raises EvalError with code
    ``contract_mismatch`` when a policy's contract disagrees with the benchmark's
    observation/action and no adapter is given, or when a sample of each side does not fit
    through the adapter (``seq.check_adapter``); ``invalid_request`` for a bad parameter, task
    or count, or ``--realtime`` with an adapter.
    """
    bench = get_benchmark_spec(bench_cls)
    adapter_cls, adapter_declared = _check_request(bench, policy, compare, deployments, episodes, envs, videos,
                                                   realtime, adapter)
    chosen = _choose_tasks(bench, tasks)
    policy_declared = _declared(deployments, policy)
    base, variants = _parse_params(params, sweep, bench, policy_declared, adapter_declared)

    def make_arm(name: str, label: str, over: dict, policy_scope: bool) -> Arm:
        return _make_arm(name, label, over, policy_scope, base=base, bench=bench, deployments=deployments,
                         adapter_declared=adapter_declared)

    arms = [make_arm(policy, f"{policy}[{label}]" if label else policy, over, True) for label, over in variants]
    for other in compare:
        if other == policy:
            raise EvalError("invalid_request", "--compare names the policy under test", "compare it with another deployment")
        arms.append(make_arm(other, other, {}, False))
    if adapter_cls is not None:
        _check_arms_fit(adapter_cls, adapter, bench, arms, deployments)
    est_scaled, source = _estimate_episode_s(bench, past_episode_s, envs, len(arms) * len(chosen) * episodes)
    return EvalPlan(benchmark=bench, benchmark_ref=benchmark_ref, arms=arms, tasks=chosen, episodes=episodes,
                    seed=seed, envs=envs, videos=videos, realtime=realtime,
                    estimate_episode_s=est_scaled, estimate_source=source,
                    adapter={k: v for k, v in adapter.items() if k != "source"} if adapter else None)


def _declared(deployments: dict[str, dict], name: str) -> list[InferParam]:
    """The params deployment ``name`` declares (from its gateway record)."""
    return [InferParam.from_dict(p) for p in deployments[name].get("params") or []]


def _check_request(bench: BenchmarkSpec, policy: str, compare: list[str], deployments: dict[str, dict],
                   episodes: int, envs: int, videos: bool, realtime: bool,
                   adapter: Optional[dict]) -> tuple[Optional[type], Optional[list[InferParam]]]:
    """Counts, videos, the adapter and each policy's contract (see :func:`plan_eval`); returns the
    adapter class and its declared params (``(None, None)`` without an adapter)."""
    if episodes < 1 or envs < 1:
        raise EvalError("invalid_request", f"--episodes and --envs must be >= 1 (got {episodes}, {envs})")
    if videos and "render" not in bench.methods:
        raise EvalError("invalid_request", f"{bench.name} has no @seq.render method, so it cannot record videos",
                        "drop --videos, or add a @seq.render method to the benchmark")
    adapter_cls = None
    adapter_declared: Optional[list[InferParam]] = None
    if adapter is not None:
        if realtime:
            raise EvalError("invalid_request", "--realtime does not take an adapter yet",
                            "drop --realtime: the sim loop runs every action step of the adapter")
        adapter_cls = _load_adapter(adapter)
        adapter_declared = list(get_adapter_spec(adapter_cls).params)
    for name in [policy, *compare]:
        d = deployments[name]
        if adapter is None:
            problems = contract_problems(bench, d.get("contract"))
            if problems:
                raise EvalError("contract_mismatch",
                                f"{name} cannot run on {bench.name} as deployed: " + "; ".join(problems),
                                "pass --adapter NAME[@vN] (a @seq.adapter registered with `seq deploy adapter.py`) "
                                f"that bridges them, or deploy a policy whose contract matches {bench.name}'s")
    return adapter_cls, adapter_declared


def _choose_tasks(bench: BenchmarkSpec, tasks: Optional[str]) -> list[str]:
    """``--tasks``: a count (the first N), names separated by commas, or None (all)."""
    all_tasks = list(bench.tasks)
    if not tasks:
        return all_tasks
    if tasks.isdigit():
        n = int(tasks)
        if not 1 <= n <= len(all_tasks):
            raise EvalError("invalid_request", f"--tasks {n}: {bench.name} has {len(all_tasks)} tasks")
        return all_tasks[:n]
    chosen = [t.strip() for t in tasks.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in bench.tasks]
    if unknown:
        raise EvalError("invalid_request", f"unknown task(s) {unknown}", f"{bench.name}'s tasks: {', '.join(all_tasks)}")
    return chosen


def _parse_params(params: list[str], sweep: list[str], bench: BenchmarkSpec, policy_declared: list[InferParam],
                  adapter_declared: Optional[list[InferParam]]) -> tuple[dict, list[tuple[str, dict]]]:
    """``--param`` values by scope, and the ``--sweep`` variants: ``[(label, {(scope, name): v})]``."""
    base: dict[str, dict] = {"policy": {}, "benchmark": {}, "eval": {}, "adapter": {}}
    for key, raw in _parse_kv(params, "--param"):
        scope, p = _classify(key, bench, policy_declared, adapter_declared)
        try:
            base[scope][p.name] = p.cast(raw)
        except ParamError as exc:
            raise EvalError("invalid_request", str(exc)) from None
    variants: list[tuple[str, dict]] = [("", {})]
    for key, raw in _parse_kv(sweep, "--sweep"):
        scope, p = _classify(key, bench, policy_declared, adapter_declared)
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if len(values) < 2:
            raise EvalError("invalid_request", f"--sweep {key} needs two or more values", f"write --sweep {key}=a,b")
        try:
            cast = [p.cast(v) for v in values]
        except ParamError as exc:
            raise EvalError("invalid_request", str(exc)) from None
        variants = [(f"{label},{p.name}={v}".lstrip(","), {**over, (scope, p.name): v})
                    for label, over in variants for v in cast]
    return base, variants


def _make_arm(name: str, label: str, over: dict, policy_scope: bool, *, base: dict, bench: BenchmarkSpec,
              deployments: dict[str, dict], adapter_declared: Optional[list[InferParam]]) -> Arm:
    """One arm: ``base`` params (not the policy's for a ``--compare`` policy), the sweep's
    ``over``, then every declared default not given (recorded in ``defaults``)."""
    given = {s: dict(v) for s, v in base.items()}
    if not policy_scope:
        given["policy"] = {}  # a --compare policy runs with its own defaults
    for (scope, key), v in over.items():
        given[scope][key] = v
    defaults = {}
    for p in _declared(deployments, name):
        if p.name not in given["policy"]:
            defaults[f"policy.{p.name}"] = p.default
    for scope, declared in (("benchmark", bench.params), ("eval", EVAL_PARAMS), ("adapter", adapter_declared or [])):
        for p in declared:
            if p.name not in given[scope]:
                given[scope][p.name] = p.default
                defaults[f"{scope}.{p.name}"] = p.default
    return Arm(name=label, policy=name, policy_params=given["policy"], bench_params=given["benchmark"],
               eval_params=given["eval"], defaults=defaults, version=deployments[name].get("version"),
               adapter_params=given["adapter"])


def _check_arms_fit(adapter_cls: type, adapter: dict, bench: BenchmarkSpec, arms: list[Arm],
                    deployments: dict[str, dict]) -> None:
    """A sample of each side through the adapter, per policy: refuse up front what cannot fit."""
    for arm in arms:
        found = check_adapter(adapter_cls, bench, deployments[arm.policy].get("contract"), arm.adapter_params)
        if found["problems"]:
            raise EvalError("contract_mismatch",
                            f"{arm.policy} cannot run on {bench.name} through {adapter['name']}@v{adapter['version']}: "
                            + "; ".join(found["problems"]),
                            f"`seq adapter check {adapter.get('path')} --benchmark {bench.name} --policy {arm.policy}` "
                            "shows where they do not fit")


def _estimate_episode_s(bench: BenchmarkSpec, past_episode_s: list[float], envs: int,
                        total_episodes: int) -> tuple[float, str]:
    """Seconds per episode (and where the figure comes from), scaled for envs beyond the cores."""
    if past_episode_s:
        est, source = statistics.median(past_episode_s), f"median of {len(past_episode_s)} earlier episodes"
    else:
        est, source = bench.episode_s_estimate, "the benchmark's declared estimate"
    # The envs share the machine's cores with the policy workers: more envs than cores run slower each.
    cores = os.cpu_count() or 1
    return est * max(1.0, min(envs, total_episodes) / cores), source


def _load_adapter(adapter: dict) -> type:
    """The class of a registered adapter version (imported from the gateway's copy)."""
    try:
        return load_adapter_file(adapter["path"], adapter["class_name"],
                                 module_name=f"_seq_adapter_{adapter['name'].replace('-', '_')}_v{adapter['version']}")
    except Exception as exc:  # noqa: BLE001 - the file is the user's: say which and why
        raise EvalError("invalid_request", f"adapter {adapter['name']}@v{adapter['version']} cannot be loaded: "
                        f"{type(exc).__name__}: {exc}", "`seq adapter pull` it, fix it and `seq deploy` it again") from None


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
    procs = [ctx.Process(target=_env_main, args=(i, config, jobs_q, results_q), daemon=True,
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


# ---------------------------------------------------------------------- env process side

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


def _env_main(index: int, config: dict, jobs_q, results_q) -> None:
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
                                        headers={"Authorization": f"Bearer {config['api_key']}"})}
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
