"""What every recipe shares: find a model's live catalogue entry, compare it with ``EXPECT``, and
the worked loop of the action-row recipes (``chunk_loop``)."""
from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional

__all__ = ["find_entry", "check_entry", "chunk_loop"]


def find_entry(model: Any, template: str, gateway_url: Optional[str] = None) -> Any:
    """The live catalogue entry for ``model``: a ``ModelInfo`` is re-read from
    ``sequence_ai.models()`` by its name (so ``check`` compares against the catalogue as it is
    now, not a stale copy); a name is looked up; None means the template's own name. Raises
    LookupError when the catalogue has no such entry, TransportError when it cannot be read."""
    from .._connect import models

    if model is None:
        name = template
    elif isinstance(model, str):
        name = model
    else:
        name = getattr(model, "name", None) or getattr(model, "model", None) or template
    for entry in models(gateway_url):
        if entry.name == name:
            return entry
    raise LookupError(f"the catalogue has no model named {name!r} (seq deploy the {template} template first)")


def check_entry(entry: Any, expect: Optional[Mapping[str, Any]], template: str) -> List[str]:
    """Each way ``entry``'s declared contract differs from ``expect`` (the recipe's), as sentences."""
    contract = getattr(entry, "contract", None) or {}
    problems: List[str] = []
    if expect is None:
        if contract.get("action") or contract.get("observation"):
            problems.append(f"{entry.name} declares a contract; the {template} recipe is for a policy with "
                            "its own inputs and outputs")
        return problems
    act, want_act = contract.get("action") or {}, expect.get("action") or {}
    for key in ("action_space", "action_dim", "control_frequency_hz"):
        if act.get(key) != want_act.get(key):
            problems.append(f"action {key}: the catalogue says {act.get(key)!r}, the recipe was written for "
                            f"{want_act.get(key)!r}")
    obs, want_obs = contract.get("observation") or {}, expect.get("observation") or {}
    cams = {v: (c.get("width"), c.get("height")) for v, c in (obs.get("cameras") or {}).items()}
    want_cams = {v: (c["width"], c["height"]) for v, c in (want_obs.get("cameras") or {}).items()}
    if cams != want_cams:
        problems.append(f"cameras: the catalogue says {cams}, the recipe was written for {want_cams}")
    if dict(obs.get("proprio") or {}) != dict(want_obs.get("proprio") or {}):
        problems.append(f"state layout: the catalogue says {dict(obs.get('proprio') or {})}, the recipe was "
                        f"written for {dict(want_obs.get('proprio') or {})}")
    return problems


def chunk_loop(policy: Any, model: Any, *, observe: Callable[[], Any], step: Callable[[list], Any],
               instruction: str, chunks: int = 10) -> int:
    """The worked loop of a recipe whose rows go to the controller as they are: set the
    instruction, then ``chunks`` times observe, predict, and ``step(prepare(chunk, model, i))``
    for the chunk's ``open_loop_horizon`` rows (all rows when it has none).

    ``observe()`` returns an Observation (``sequence_ai.observation(model, ...)``); ``step(row)``
    commands one row and waits one control period. Returns the rows stepped. Raises what
    ``policy.predict`` and ``prepare`` raise."""
    from .._prepare import prepare

    policy.set_instruction(instruction)
    n = 0
    for _ in range(chunks):
        chunk = policy.predict(observe()).action_chunk
        for i in range(chunk.open_loop_horizon or len(chunk.actions)):
            step(prepare(chunk, model, i))
            n += 1
    return n
