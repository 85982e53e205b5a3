"""One worked loop per shipped policy template, each checked against the live catalogue.

    from sequence_ai import recipes
    recipe = recipes.for_model(model)        # a ModelInfo from sequence_ai.models(), or a name
    recipe.check(model)                      # [] when the live entry still matches the recipe

Modules (one per ``seq init`` policy template; ``toy-adapter`` is not a model, so it has none):

- ``pick_place`` -- the demo: absolute joint targets, sent raw; no conversion (rows are targets).
- ``pi05_droid`` -- pi0.5 on DROID: rows for a ``joint_velocity`` controller, sent raw with the
  gripper binarised; for a position controller, ``to_joint_positions`` offsets one ``q_ref``.
- ``toy_policy`` -- its own inputs and outputs: ``{"state": [x], "target": [t]}`` -> ``{"delta": [dx]}``.

Each module has ``TEMPLATE`` (the template name), ``EXPECT`` (the contract the recipe was
written for, in the catalogue's wire form; None for a policy with its own I/O), ``GRIPPER``
(``{"dim", "binarize_at"}`` or None), ``CONVERSION`` (``"offset_from_q_ref"`` or None) with
``CONVERSION_NOTE``, ``loop(...)`` (the worked loop) and ``check(model)``.

``for_model(model)`` returns the module whose template the catalogue entry is: its name (a
deployment named after the template) or the ``template`` field a catalogue entry carries; None
for every other model. It never guesses from a contract that merely looks alike.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Dict, Optional

from . import pi05_droid, pick_place, toy_policy

__all__ = ["RECIPES", "for_model", "check", "pi05_droid", "pick_place", "toy_policy"]

#: template name -> recipe module
RECIPES: Dict[str, ModuleType] = {m.TEMPLATE: m for m in (pick_place, pi05_droid, toy_policy)}


def _names(model: Any) -> list:
    if isinstance(model, str):
        return [model]
    names = [getattr(model, "name", None), getattr(model, "model", None)]
    extra = getattr(model, "extra", None) or {}
    names += [getattr(model, "template", None), getattr(model, "short_id", None),
              extra.get("template"), extra.get("short_id")]
    if isinstance(model, dict):
        names += [model.get("name"), model.get("template"), model.get("short_id")]
    return [n for n in names if isinstance(n, str)]


def for_model(model: Any) -> Optional[ModuleType]:
    """The recipe module for ``model`` (a ``ModelInfo``, a connected policy, or a name), or None.

    Matched by name: the entry's name, or the ``template`` / ``short_id`` it carries, equals a
    template's name (``"pi05-droid"``, ``"pick-place"``, ``"toy-policy"``; ``_`` and ``-`` alike).
    """
    for name in _names(model):
        recipe = RECIPES.get(name.replace("_", "-"))
        if recipe is not None:
            return recipe
    return None


def check(model: Any, *, gateway_url: Optional[str] = None) -> list:
    """``for_model(model).check(model)``: the differences between the live catalogue entry and
    what its recipe was written for ([] when it matches). Raises LookupError when ``model`` has
    no recipe or is not in the catalogue."""
    recipe = for_model(model)
    if recipe is None:
        raise LookupError(f"{_names(model)[:1] or [model]} has no recipe; recipes: {', '.join(RECIPES)}")
    return recipe.check(model, gateway_url=gateway_url)
