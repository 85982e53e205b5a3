"""``sequence-ai`` (alias ``seqai``): the robot-side command line.

Kept to the standard library (argparse) so the client's footprint stays httpx only; the
authoring and server commands live in ``seq``.

    sequence-ai models [--gateway URL]     # the catalogue: deployments and what they read/return
    sequence-ai version
"""
from __future__ import annotations

import argparse
import sys

from . import SequencesError, __version__, models


def _describe_contract(contract) -> str:
    if not contract:
        return "no contract (own inputs/outputs)"
    parts = []
    obs = contract.get("observation") or {}
    cams = obs.get("cameras") or {}
    if cams:
        parts.append(", ".join(f"{v} {c.get('width')}x{c.get('height')}" for v, c in cams.items()))
    proprio = obs.get("proprio") or {}
    if proprio:
        parts.append(" · ".join(f"{k}[{w}]" for k, w in proprio.items()))
    act = contract.get("action") or {}
    if act:
        parts.append(
            f"-> {act.get('action_space')} x{act.get('action_dim')} @ {act.get('control_frequency_hz')} Hz"
            f" ({act.get('robot')})"
        )
    return "  ".join(parts)


def main(argv=None) -> int:
    """Entry point; returns the process exit code (0 ok, 1 a typed error, 2 usage)."""
    parser = argparse.ArgumentParser(prog="sequence-ai", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_models = sub.add_parser("models", help="list the catalogue (needs no key)")
    p_models.add_argument("--gateway", default=None, help="gateway URL (default $SEQUENCES_GATEWAY_URL or local)")
    sub.add_parser("version", help="print the client version")
    args = parser.parse_args(argv)
    if args.command == "version":
        print(f"sequence-ai {__version__}")
        return 0
    try:
        rows = models(gateway_url=args.gateway)
    except SequencesError as exc:
        print(f"error[{getattr(exc, 'code', 'error')}]: {exc}", file=sys.stderr)
        hint = getattr(exc, "hint", None)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        return 1
    if not rows:
        print("no deployments yet: seq deploy <policy file>")
    for row in rows:
        print(f"{row.name:24} {row.status or '?':9} {_describe_contract(row.contract)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
