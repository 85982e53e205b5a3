"""Recipe ``toy-policy`` (``seq init toy-policy``): a policy with its own inputs and outputs.

It takes ``{"state": [x], "target": [t]}`` and answers ``{"delta": [dx]}`` (|dx| <= max_step):
no action rows, so neither ``prepare`` nor ``to_joint_positions`` applies. The loop sends the
dict raw through the gateway's ``POST /v1/act`` and applies each delta until x reaches t.
"""
from __future__ import annotations

from typing import Any, Optional

from ._base import check_entry, find_entry

TEMPLATE = "toy-policy"
EXPECT = None                      # its own I/O: no contract to compare
GRIPPER = None
CONVERSION = None
CONVERSION_NOTE = "it returns {'delta': [dx]}, not action rows"


def loop(model: str = TEMPLATE, *, x: float = 0.0, target: float = 0.5, steps: int = 20,
         gateway_url: Optional[str] = None, api_key: Optional[str] = None) -> list:
    """The worked loop: ask for a delta, apply it, repeat ``steps`` times (or until x == target).
    Returns the visited x values. Raises SequencesError subclasses as the gateway answers."""
    import httpx

    from sequence_ai_core import from_response, resolve_api_key, resolve_gateway_url

    url = resolve_gateway_url(gateway_url)
    key = resolve_api_key(api_key)
    xs = [x]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30.0, trust_env=False) as http:
        for _ in range(steps):
            r = http.post("/v1/act", json={"model": model, "observation": {"state": [x], "target": [target]}})
            if r.status_code != 200:
                raise from_response(r)
            x += float(r.json()["outputs"]["delta"][0])
            xs.append(x)
            if abs(x - target) < 1e-12:
                break
    return xs


def check(model: Any = None, *, gateway_url: Optional[str] = None) -> list:
    """[] when the live entry declares no contract (its own I/O), else the difference."""
    return check_entry(find_entry(model, TEMPLATE, gateway_url), EXPECT, TEMPLATE)
