"""What to do with the rows that come back: ``prepare()`` and ``to_joint_positions()``.

Send rows raw. ``prepare(chunk, model, i)`` is row ``i`` exactly as the model's own reference
loop hands it to the controller: clipped into the model's declared bounds and, where the model's
recipe says its reference loop does so, with the gripper binarised. Nothing else is added.

``to_joint_positions(chunk, q_ref, model)`` is for a position controller driving a model whose
rows are not targets, and only where a recipe (``sequence_ai.recipes``) declares a verified
conversion for that model and its ``check()`` against the live catalogue passes. Every row
offsets the same ``q_ref`` (read once, before the chunk was requested): the rows are cumulative
displacements, so re-reading the live pose each step would integrate them and overshoot. A model
without a verified conversion is refused (a ``ValueError`` naming why) rather than converted by
guess: a model whose rows are already targets (``joint_absolute``) needs no conversion at all.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

__all__ = ["prepare", "to_joint_positions", "contract_of", "rows_of"]


def contract_of(model: Any) -> Mapping[str, Any]:
    """The ``{"action": ..., "observation": ...}`` contract of ``model``: a ``ModelInfo`` (from
    ``sequence_ai.models()``), a connected ``Policy`` / ``AsyncPolicy``, or the contract dict."""
    if isinstance(model, Mapping):
        return model.get("contract", model) if "contract" in model else model
    contract = getattr(model, "contract", None)
    return contract or {}


def rows_of(chunk: Any) -> List[List[float]]:
    """The rows of an ``ActionChunk``, a ``Prediction`` or a plain list of rows, as floats."""
    inner = getattr(chunk, "action_chunk", chunk)
    rows = getattr(inner, "actions", inner)
    if isinstance(rows, Mapping):
        rows = rows.get("actions")
    if rows is None:
        raise TypeError(f"{type(chunk).__name__} holds no action rows (a policy with its own outputs?)")
    return [[float(x) for x in row] for row in rows]


def prepare(chunk: Any, model: Any, i: int) -> List[float]:
    """Row ``i`` of ``chunk`` as the model's reference loop sends it: clipped into the declared
    ``bounds`` and, when the model's recipe binarises a gripper, that value set to 0.0 or 1.0.

    Args:
        chunk: an ``ActionChunk``, a ``Prediction`` or a list of rows.
        model: a ``ModelInfo``, a connected policy, or a contract dict (``bounds`` come from
            its action contract; the gripper rule from ``sequence_ai.recipes.for_model``).
        i: the row, 0 <= i < len(chunk) (play ``range(chunk.open_loop_horizon or len(chunk))``).

    Returns:
        A new list of floats, the action space's units.

    Raises:
        IndexError: ``i`` is outside the chunk. TypeError: the chunk has no rows.
    """
    rows = rows_of(chunk)
    if not -len(rows) <= i < len(rows):
        raise IndexError(f"row {i} of a {len(rows)}-row chunk")
    row = list(rows[i])
    action = contract_of(model).get("action") or {}
    bounds = action.get("bounds")
    if bounds:
        row = [min(max(v, float(bounds[j][0])), float(bounds[j][1])) if j < len(bounds) else v
               for j, v in enumerate(row)]
    from . import recipes
    recipe = recipes.for_model(model)
    gripper = getattr(recipe, "GRIPPER", None) if recipe is not None else None
    if gripper and gripper.get("binarize_at") is not None and gripper["dim"] < len(row):
        d = gripper["dim"]
        row[d] = 1.0 if row[d] > float(gripper["binarize_at"]) else 0.0
    return row


def to_joint_positions(chunk: Any, q_ref: Sequence[float], model: Any, *,
                       gateway_url: Optional[str] = None) -> List[List[float]]:
    """Joint-position targets for a position controller: ``q_ref + row[:len(q_ref)]`` for every
    row, each offsetting the same ``q_ref``.

    Args:
        chunk: an ``ActionChunk``, a ``Prediction`` or a list of rows.
        q_ref: the joint positions (rad) read ONCE, before the chunk was requested.
        model: a ``ModelInfo`` from ``sequence_ai.models()`` (or a connected policy).
        gateway_url: where the live catalogue is read for the recipe's check (default
            ``$SEQUENCES_GATEWAY_URL``, then ``http://127.0.0.1:8470``).

    Returns:
        One list of ``len(q_ref)`` targets (rad) per row. The gripper column is not a joint:
        take it from ``prepare()``.

    Raises:
        ValueError: the model has no recipe, its recipe declares no verified conversion (its rows
            are already targets, or nobody verified one), or the live catalogue no longer matches
            what the recipe was verified against (``recipe.check(model)`` names each difference);
            or ``q_ref`` is wider than a row.
    """
    from . import recipes
    recipe = recipes.for_model(model)
    name = getattr(model, "name", None) or "this model"
    if recipe is None:
        raise ValueError(f"{name} has no recipe in sequence_ai.recipes, so no verified conversion to joint "
                         "positions: send its rows to the controller interface its action space names")
    conversion = getattr(recipe, "CONVERSION", None)
    if conversion != "offset_from_q_ref":
        raise ValueError(f"{name} ({recipe.TEMPLATE}) declares no verified conversion to joint positions: "
                         f"{recipe.CONVERSION_NOTE}")
    problems = recipe.check(model, gateway_url=gateway_url)
    if problems:
        raise ValueError(f"{name} no longer matches the {recipe.TEMPLATE} recipe the conversion was verified for: "
                         + "; ".join(problems))
    q = [float(x) for x in q_ref]
    rows = rows_of(chunk)
    if rows and len(q) > len(rows[0]):
        raise ValueError(f"q_ref has {len(q)} joints but each row has {len(rows[0])} values")
    return [[q[j] + row[j] for j in range(len(q))] for row in rows]
