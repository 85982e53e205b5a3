"""The catalogue behind ``GET /v1/models``: one row per deployment and one per ``seq init`` template.

A row carries, besides the declared contract itself, the per-model numbers a robot needs to build
a correct request and read the answer, read off that contract so a caller never has to dig::

    short_id              the name to pass (``connect(short_id)`` for a model, ``seq init short_id`` for a template)
    kind                  "model" (a deployment on this gateway) or "template" (with ``template_kind``)
    endpoint              "act" for a deployment; None for a template (deploy it first)
    camera_views          the declared camera names, in order
    state_dim             the proprioception width: the sum of ``state_layout``
    state_layout          {field: width}, e.g. {"joint_positions": 7, "gripper": 1}
    action_dim, action_space, robot, control_frequency_hz (Hz)
    delay_modes           what the policy does with the committed prefix: ["chunk"] (ignores it),
                          "guided" (inference-time inpainting), "trained" (conditioned on it)
    max_delay_steps       the largest inference delay it handles, control steps; None: no limit
    action_semantics      the controller interface the rows are for (the declared action space);
                          ``pass_raw`` is always True: nothing converts the rows on the way
    client_resize         {"size": [w, h], "filter": "bilinear"} when every camera has one size,
                          {"sizes": {view: [w, h]}, "filter": "bilinear"} when they differ
    input_aspect_ratio    width / height of that size (4 decimals); None when the cameras differ
    input_resize          "exact": the worker refuses any other frame size (``sequence_ai.encode``
                          resizes a native frame, refusing another aspect ratio)

A policy with no contract (its own inputs and outputs) has None in every one of those fields.
Template rows are read from the templates' declarations once per gateway process (their
``load``/``infer`` never run) and cached.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Optional

__all__ = ["contract_fields", "model_row", "template_rows", "filter_rows", "KINDS", "ENDPOINTS"]

log = logging.getLogger("sequence_ai_server")

KINDS = ("model", "template")
ENDPOINTS = ("act",)

_templates: Optional[list[dict[str, Any]]] = None
_templates_lock = threading.Lock()


def contract_fields(contract: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The catalogue's per-model numbers read off a contract dict (see the module docstring)."""
    action = (contract or {}).get("action") or {}
    observation = (contract or {}).get("observation") or {}
    cameras = observation.get("cameras") or {}
    layout = {k: int(v) for k, v in (observation.get("proprio") or {}).items()} if observation else None
    sizes = {view: [int(c["width"]), int(c["height"])] for view, c in cameras.items()
             if isinstance(c, dict) and c.get("width") and c.get("height")}
    distinct = {tuple(s) for s in sizes.values()}
    if len(distinct) == 1:
        w, h = distinct.pop()
        client_resize: Optional[dict[str, Any]] = {"size": [w, h], "filter": "bilinear"}
        aspect: Optional[float] = round(w / h, 4)
    elif distinct:
        client_resize, aspect = {"sizes": sizes, "filter": "bilinear"}, None
    else:
        client_resize, aspect = None, None
    space = action.get("action_space")
    return {
        "camera_views": list(cameras) if observation else None,
        "state_dim": sum(layout.values()) if layout is not None else None,
        "state_layout": layout,
        "action_dim": action.get("action_dim"),
        "action_space": space,
        "action_semantics": space,
        "robot": action.get("robot"),
        "control_frequency_hz": action.get("control_frequency_hz"),
        "delay_modes": list((action.get("delay") or {}).get("modes") or ["chunk"]) if action else None,
        "max_delay_steps": (action.get("delay") or {}).get("max_delay_steps") if action else None,
        "client_resize": client_resize,
        "input_aspect_ratio": aspect,
        "input_resize": "exact" if client_resize else None,
        "history": observation.get("history") if observation else None,
        "pass_raw": True,
    }


def model_row(name: str, version: int, status: str, contract: Optional[dict[str, Any]],
              params: list[dict[str, Any]]) -> dict[str, Any]:
    """A deployment's catalogue row."""
    return {"name": name, "short_id": name, "kind": "model", "template_kind": None, "endpoint": "act",
            "version": version, "status": status, "contract": contract, "params": params,
            "description": None, **contract_fields(contract)}


def _template_row(name: str, description: str, source: Any) -> Optional[dict[str, Any]]:
    from seq.spec import get_spec, load_policy_class
    path = source / "policy.py"
    if not path.is_file():      # a template that is no policy (toy-adapter: an adapter's files)
        return None
    try:
        spec = get_spec(load_policy_class(str(path)))
    except Exception as exc:  # noqa: BLE001 - a template that cannot be read is left out, and logged
        log.warning("template %s is left out of the catalogue: %s: %s", name, type(exc).__name__, exc)
        return None
    contract = {"action": spec.action.to_dict() if spec.action else None,
                "observation": spec.observation.to_dict() if spec.observation else None}
    return {"name": name, "short_id": name, "kind": "template", "template_kind": "policy", "endpoint": None,
            "version": None, "status": "template", "contract": contract,
            "params": [p.to_dict() for p in spec.params], "description": description,
            **contract_fields(contract)}


def template_rows() -> list[dict[str, Any]]:
    """One row per ``seq init`` template (``seq.spec.TEMPLATES``), read once and cached."""
    global _templates
    with _templates_lock:
        if _templates is None:
            from seq.spec import TEMPLATES
            rows = [_template_row(t.name, t.description, t.source) for t in TEMPLATES.values()]
            _templates = [r for r in rows if r is not None]
        return [dict(r) for r in _templates]


def filter_rows(rows: list[dict[str, Any]], kind: Optional[str], endpoint: Optional[str]) -> list[dict[str, Any]]:
    """Rows of that ``kind`` ("model" / "template") and serving that ``endpoint`` ("act"); None: any."""
    return [r for r in rows if (kind is None or r["kind"] == kind) and (endpoint is None or r["endpoint"] == endpoint)]
