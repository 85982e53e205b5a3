"""``sequence-ai`` (alias ``seqai``): the robot-side command line.

Kept to the standard library (argparse) so the client's footprint stays httpx only; the
authoring and server commands live in ``seq``.

    sequence-ai doctor [--model NAME] [--gateway URL] [--calls N]   # key, gateway, a real connect, latency
    sequence-ai models [--gateway URL] [--kind model|template]   # the catalogue: deployments and templates
    sequence-ai account [--gateway URL]    # usage and configured limits of the key's account
    sequence-ai version
    sequence-ai bag export|repair|info ...   # needs the data extra (sequence_ai_ros.bag.cli)
    sequence-ai mcp [--model NAME | --ros] [--http]   # MCP tools: act, snapshot, ... (the mcp extra)

Commands from other installed packages join by entry point: a ``sequence_ai.commands`` entry
``NAME = module:main`` makes ``sequence-ai NAME ARGS...`` call ``main(ARGS)`` (``bag`` is one,
registered by this distribution's ``setup.py``), so this module imports none of them.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable, List, Optional

import httpx

from sequence_ai_core import resolve_api_key, resolve_gateway_url
from sequence_ai_core.protocol import Contract

from . import InvalidRequest, PolicyError, SequencesError, __version__, account, connect, models


def _describe_contract(contract) -> str:
    if not contract:
        return "no contract (own inputs/outputs)"
    view = Contract.from_wire(contract)
    parts = []
    obs = view.observation
    if obs is not None and obs.cameras:
        parts.append(", ".join(f"{v} {c.width}x{c.height}" for v, c in obs.cameras.items()))
    if obs is not None and obs.proprio:
        parts.append(" · ".join(f"{k}[{w}]" for k, w in obs.proprio.items()))
    act = view.action
    if act is not None:
        parts.append(f"-> {act.action_space} x{act.action_dim} @ {act.control_frequency_hz} Hz ({act.robot})")
    return "  ".join(parts)


def account_lines(a: dict) -> List[str]:
    """The lines ``seq account`` / ``sequence-ai account`` print for a ``GET /v1/account`` body."""
    k, u, lim = a.get("key") or {}, a.get("usage") or {}, a.get("limits") or {}

    def n(v) -> str:
        return "unknown" if v is None else str(v)
    lines = [f"key         {k.get('id')}" + (f" ({k['name']})" if k.get("name") else "")
             + (f", bound to {k['deployment']}" if k.get("deployment") else ", account-wide")]
    if a.get("balance") is None:
        lines.append("balance     none: a self-hosted gateway meters nothing in money")
    else:
        lines.append(f"balance     {a['balance']}")
    lines.append(f"policies    {n(u.get('policies'))} deployed, {n(u.get('running_workers'))} running, "
                 f"{n(u.get('sessions'))} sessions")
    lines.append(f"benchmarks  {n(u.get('benchmarks'))} available, {n(u.get('evals_running'))} evals running")
    gpus = lim.get("max_gpus")
    lines.append(f"limits      workers {'no cap' if gpus is None else gpus} (SEQ_MAX_GPUS), lease "
                 f"{lim.get('lease_ttl_s', 0):g} s, request body {lim.get('max_body_bytes', 0) / 2**20:g} MiB")
    for q in lim.get("quotas") or []:
        set_ = [f"{k} {q['used'][k]:g}/{q[k]:g}" for k in ("max_workers", "max_cards", "worker_hours_per_day")
                if q.get(k) is not None]
        lines.append(f"quota       {q['scope']}: {', '.join(set_) or 'none'}")
    for name, d in sorted((u.get("deployments") or {}).items()):
        t = d.get("total") or {}
        cards = ", ".join(f"{c} {s:.1f} s" for c, s in sorted((t.get("worker_s") or {}).items())) or "0 s"
        lines.append(f"usage       {name}: {cards}; {t.get('requests', 0)} requests ({t.get('errors', 0)} errors), "
                     f"{t.get('bytes_in', 0)} B in, {t.get('bytes_out', 0)} B out, {d.get('captured_bytes', 0)} B captured")
    return lines


def _mask(key: str) -> str:
    return f"{key[:9]}…{key[-4:]}" if len(key) > 16 else "…" + key[-4:]


def _median_ms(fn: Callable[[], Any], calls: int) -> float:
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(samples)


def _synthetic_observation(contract: Any) -> tuple[Optional[Any], Optional[str], Optional[str]]:
    """``(observation, None, None)``: black frames and zero vectors shaped by the contract; or
    ``(None, why, hint)`` when doctor cannot build one: the image extra is missing (numpy, Pillow
    or a JPEG codec; the hint installs it), or a contract it does not know how to fill."""
    obs = Contract.from_wire(contract).observation
    try:
        import numpy as np

        from ._image import observation as build
        images = {v: np.zeros((int(c.height), int(c.width), 3), np.uint8) for v, c in obs.cameras.items()}
        widths = obs.proprio or {"joint_positions": 7}
        return build(contract, images=images, joints=[0.0] * int(widths.get("joint_positions", 7)),
                     gripper=[0.0] * int(widths["gripper"]) if "gripper" in widths else None,
                     instruction="sequence-ai doctor"), None, None
    except ImportError as exc:   # a client-only install: no image extra
        missing = exc.name or getattr(exc.__cause__, "name", None)
        lacks = f"{missing} is not installed" if missing else str(exc)
        return None, (f"it has a contract, but doctor's synthetic observation for it needs the image extra "
                      f"({lacks})"), "pip install 'sequence-ai[image]', then doctor times POST /act"
    except Exception as exc:  # noqa: BLE001 - an unusual contract: time /ping instead
        return None, f"doctor cannot build an observation for its contract ({type(exc).__name__}: {exc})", None


def _doctor_key(api_key: Optional[str]) -> Optional[str]:
    """The key check: the resolved API key (printed masked), or None after printing why it is missing."""
    try:
        key = resolve_api_key(api_key)
        print(f"  key           SEQUENCES_API_KEY  ({_mask(key)})")
        return key
    except SequencesError as exc:
        print(f"  key           missing: {exc.message}\n  hint          {exc.hint}")
        return None


def _doctor_gateway(url: str, key: str) -> tuple[Optional[list], bool, bool]:
    """The gateway checks: up, key valid, credit. Returns (the deployed models, or None when the
    gateway is down; whether the key is valid; whether the credit check passed)."""
    with httpx.Client(timeout=10.0, trust_env=False) as http:
        try:
            t0 = time.perf_counter()
            r = http.get(f"{url}/v1/models")
            ms = (time.perf_counter() - t0) * 1000.0
            print(f"  gateway       up   {url}  ({ms:.1f} ms)")
            catalogue = [m for m in r.json().get("models") or [] if m.get("kind", "model") == "model"]
        except (httpx.HTTPError, ValueError) as exc:
            print(f"  gateway       DOWN {url}: {exc!r}\n  hint          `seq serve` starts it; "
                  "SEQUENCES_GATEWAY_URL points elsewhere")
            return None, False, False
        r = http.get(f"{url}/v1/deployments", headers={"Authorization": f"Bearer {key}"})
        valid = r.status_code == 200
        print(f"  key valid     {'yes' if valid else f'NO (HTTP {r.status_code})'}")
        r = http.get(f"{url}/v1/account", headers={"Authorization": f"Bearer {key}"})
        credit = True
        if r.status_code == 200:
            print(f"  credit        {'available' if r.json().get('limits') is not None else 'unlimited'}"
                  " (self-hosted: quota, not money)")
        elif r.status_code == 402:
            print("  credit        EXHAUSTED (quota used up)")
            credit = False
        else:
            print("  credit        n/a (this gateway keeps no account)")
    return catalogue, valid, credit


def _doctor_model(model: Optional[str], catalogue: list) -> tuple[Optional[str], Optional[int]]:
    """The deployment to connect to: ``model``, else the only one. Returns (name, None), or
    (None, exit status) after printing why none was chosen (2: several, 1: none)."""
    if model is None and len(catalogue) > 1:
        print(f"\n  model         not chosen: {len(catalogue)} deployments, pick one with --model NAME")
        for m in catalogue:
            print(f"                {m.get('name')}  v{m.get('version')}  {m.get('status')}")
        print(f"  hint          sequence-ai doctor --model {catalogue[0].get('name')}")
        return None, 2
    if model is None and catalogue:
        model = catalogue[0].get("name")
        print(f"\n  model         {model} (the only deployment)")
    elif model is not None:
        print(f"\n  model         {model}")
    if model is None:
        print("\n  connect       no deployment to connect to: seq deploy <policy file>")
        return None, 1
    return model, None


def _doctor_act_latency(policy, model: str, obs: dict, calls: int) -> Optional[tuple[float, float]]:
    """Median ms of ``calls`` synthetic ``/act`` calls on a new connection each and on one reused
    connection, or None after printing a policy error (5xx). A refusal (400) is noted and timed."""
    def act_once() -> None:
        # A policy may refuse black frames and a made-up instruction (400): that is still a
        # full round trip through the worker's handler, which is what is timed here.
        try:
            policy.predict(obs)
        except InvalidRequest:
            pass

    try:
        policy.predict(obs)  # warm the path once
    except InvalidRequest as exc:
        print(f"  note          {model} refused doctor's synthetic observation (black frames, zero "
              f"vectors), error[{exc.code}]: {exc.message}\n"
              "                not a broken deployment: a real robot's observation may pass; "
              "timing its refusals")
    except PolicyError as exc:
        print(f"  act           {model}: FAILED error[{exc.code}]: {exc.message}")
        if exc.hint:
            print(f"  hint          {exc.hint}")
        return None
    reused = _median_ms(act_once, calls)

    def fresh() -> None:
        policy._call(policy._engine._wire.aclose_http())
        act_once()
    return _median_ms(fresh, calls), reused


def _doctor_ping_latency(worker_url: str, calls: int) -> tuple[float, float]:
    """Median ms of ``calls`` ``GET /ping`` to the worker on a new connection each and on one reused one."""
    ping = f"{worker_url}/ping"
    with httpx.Client(trust_env=False) as one:
        one.get(ping)
        reused = _median_ms(lambda: one.get(ping), calls)

    def fresh_ping() -> None:
        with httpx.Client(trust_env=False) as c:
            c.get(ping)
    return _median_ms(fresh_ping, calls), reused


def _doctor_connect(model: str, key: str, url: str, calls: int) -> Optional[tuple[float, float, str]]:
    """Connect to MODEL, wait until it is ready, and time it (``_doctor_act_latency``, or the
    worker's /ping for a policy with no contract, or when doctor cannot build an observation for
    its contract: no image extra). Returns (new ms, reused ms, what was timed), or None after
    printing what failed. The session is closed on every path (``with policy``)."""
    try:
        t0 = time.perf_counter()
        policy = connect(model, api_key=key, gateway_url=url)
    except SequencesError as exc:
        print(f"  connect       {model}: FAILED error[{exc.code}]: {exc.message}")
        if exc.hint:
            print(f"  hint          {exc.hint}")
        return None
    with policy:
        try:
            policy.wait_until_ready(timeout_s=300)
        except SequencesError as exc:
            print(f"  connect       {model}: not ready: {exc.message}")
            return None
        session = policy._engine._wire.session
        lease = (session.lease or {}) if session else {}
        print(f"  connect       {model}  ->  worker up at {session.worker_url if session else '?'}, "
              f"lease {lease.get('ttl_s', '?')}s  ({(time.perf_counter() - t0) * 1000.0:.0f} ms)")
        # no contract: the policy defines its own inputs, so no synthetic observation fits it
        declared = Contract.from_wire(policy.contract).observation is not None
        obs, why, hint = _synthetic_observation(policy.contract) if declared else (None, None, None)
        if obs is None:
            why = why or "no contract (the policy defines its own inputs)"
            print(f"  note          {why}: timing its worker's GET /ping, not /act")
            if hint:
                print(f"  hint          {hint}")
            return (*_doctor_ping_latency(session.worker_url, calls), "GET /ping")
        timed = _doctor_act_latency(policy, model, obs, calls)
        if timed is None:
            print("\nnot ready")
            return None
        return (*timed, "POST /act")


def doctor(model: Optional[str], gateway: Optional[str], calls: int, api_key: Optional[str] = None) -> int:
    """Check the key, the gateway, a real connect and the connection reuse; print a report.

    ``model`` None checks the only deployment; with several it lists them and asks for
    ``--model NAME`` (returns 2) rather than guessing. A policy that refuses the synthetic
    observation (400) is noted, not failed; a policy error (5xx) on it fails the check. A policy
    with no contract (its own inputs) gets its worker's ``GET /ping`` timed instead of ``/act``, as
    does one whose contract needs the image extra to fill when it is not installed (the note says
    so, with the pip line).

    Returns 0 when every check passed (prints ``ready``), 1 otherwise, 2 when the model to
    check is ambiguous.
    """
    url = resolve_gateway_url(gateway)
    print(f"sequence-ai {__version__}\n")
    key = _doctor_key(api_key)
    if key is None:
        return 1
    catalogue, valid, ok = _doctor_gateway(url, key)
    if catalogue is None or not valid:
        return 1
    model, status = _doctor_model(model, catalogue)
    if model is None:
        return status
    timed = _doctor_connect(model, key, url, calls)
    if timed is None:
        return 1
    new, reused, what = timed
    print(f"  latency       new connection each call      {new:7.2f} ms  (median of {calls}, {what})")
    print(f"                one reused connection         {reused:7.2f} ms")
    print(f"                saved by keeping it open      {new - reused:7.2f} ms")
    print("\nready" if ok else "\nnot ready")
    return 0 if ok else 1


#: Entry-point group of commands other packages add to ``sequence-ai``.
PLUGIN_GROUP = "sequence_ai.commands"
_PLUGIN_HELP = {"bag": "episode bags: export to LeRobot datasets, repair (sequence-ai bag -h)",
                "mcp": "serve the robot as MCP tools for a language model (sequence-ai mcp -h)"}
#: the extra each plugin command needs (its line when a library is missing; mcp's Python mode on
#: the simulated cell also needs the sim extra, which the line names when mujoco is the one missing)
_PLUGIN_EXTRA = {"bag": "data", "mcp": "mcp"}


def _plugin_commands() -> dict:
    """``{name: EntryPoint}`` of the installed :data:`PLUGIN_GROUP` entries (none loaded)."""
    from importlib.metadata import entry_points

    eps = entry_points()
    found = eps.select(group=PLUGIN_GROUP) if hasattr(eps, "select") else eps.get(PLUGIN_GROUP, ())
    return {ep.name: ep for ep in found}


def main(argv=None) -> int:
    """Entry point; returns the process exit code (0 ok, 1 a typed error, 2 usage)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    plugins = _plugin_commands()
    if argv[:1] and argv[0] in plugins:   # imported only when asked for (the bag tools need the data extra)
        # a missing library (at load or while it runs) is one line naming the extra
        # (sequence_ai.extras), not a traceback
        from .extras import guarded
        name = argv[0]

        def run_plugin() -> int:
            return plugins[name].load()(argv[1:])
        return guarded(lambda: run_plugin, f"sequence-ai {name}", _PLUGIN_EXTRA.get(name, name))
    parser = argparse.ArgumentParser(prog="sequence-ai", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in sorted(plugins):
        sub.add_parser(name, help=_PLUGIN_HELP.get(name, f"see sequence-ai {name} -h"))
    p_models = sub.add_parser("models", help="list the catalogue (needs no key)")
    p_models.add_argument("--gateway", default=None, help="gateway URL (default $SEQUENCES_GATEWAY_URL or local)")
    p_models.add_argument("--kind", default=None, choices=("model", "template"),
                          help="deployments only (model) or templates only (template); default both")
    p_acct = sub.add_parser("account", help="usage and configured limits of the key's account")
    p_acct.add_argument("--gateway", default=None, help="gateway URL (default $SEQUENCES_GATEWAY_URL or local)")
    p_acct.add_argument("--api-key", default=None, help="API key (default $SEQUENCES_API_KEY)")
    sub.add_parser("version", help="print the client version")
    p_doc = sub.add_parser("doctor", help="check key, gateway, a real connect, and connection reuse")
    p_doc.add_argument("--model", default=None, help="deployment to check (default: the only one; "
                       "with several, they are listed and doctor asks for this)")
    p_doc.add_argument("--gateway", default=None, help="gateway URL (default $SEQUENCES_GATEWAY_URL or local)")
    p_doc.add_argument("--calls", type=int, default=20, help="calls per latency figure (default 20)")
    p_doc.add_argument("--api-key", default=None, help="API key (default $SEQUENCES_API_KEY)")
    args = parser.parse_args(argv)
    if args.command == "version":
        print(f"sequence-ai {__version__}")
        return 0
    if args.command == "doctor":
        try:
            return doctor(args.model, args.gateway, max(1, args.calls), args.api_key)
        except SequencesError as exc:
            print(f"error[{exc.code}]: {exc}", file=sys.stderr)
            return 1
    if args.command == "account":
        try:
            for line in account_lines(account(api_key=args.api_key, gateway_url=args.gateway)):
                print(line)
            return 0
        except SequencesError as exc:
            print(f"error[{exc.code}]: {exc}", file=sys.stderr)
            if exc.hint:
                print(f"hint: {exc.hint}", file=sys.stderr)
            return 1
    try:
        rows = models(gateway_url=args.gateway, kind=args.kind)
    except SequencesError as exc:
        print(f"error[{getattr(exc, 'code', 'error')}]: {exc}", file=sys.stderr)
        hint = getattr(exc, "hint", None)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        return 1
    if not any(r.kind == "model" for r in rows) and args.kind != "template":
        print("no deployments yet: seq deploy <policy file>")
    for row in rows:
        what = row.kind if row.kind == "model" else f"template ({row.template_kind or 'policy'}: seq init {row.short_id})"
        print(f"{row.short_id:24} {row.status or '?':9} {what:8}  {_describe_contract(row.contract)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
