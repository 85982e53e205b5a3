"""Planning an eval: load a benchmark, check each policy's contract and parameters, lay out the arms.

Nothing here runs or reserves anything: :func:`plan_eval` returns an :class:`EvalPlan` that
``sequence_ai_eval.runner.run_eval`` runs (``seq eval run --dry-run`` prints it).
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from seq.spec import (BUILTIN_BENCHMARKS, BenchmarkSpec, InferParam, ParamError, check_adapter, contract_problems, get_adapter_spec,
                      get_benchmark_spec, is_benchmark, load_adapter_file)

__all__ = ["BUILTIN_BENCHMARKS", "EVAL_PARAMS", "EvalError", "Arm", "EvalPlan", "load_benchmark", "plan_eval"]

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
