"""The pick-and-place task's language: which cube goes on which pad.

The simulated scene (``panda_sim``) owns the task, so the success check reads the instruction
here. The demo *policy* parses the instruction with its own code, as a real policy would: this
module is the benchmark's grammar, not the policy's.
"""
from __future__ import annotations

import re

#: Colours of the cubes and pads in the scene.
COLOURS = ("red", "green", "blue")

_PATTERN = re.compile(
    r"\b(?P<cube>red|green|blue)\s+(?:cube|block|box)\b.*?\b(?P<pad>red|green|blue)\s+(?:pad|target|square|mat)\b",
    re.IGNORECASE,
)


class TaskError(ValueError):
    """The instruction does not name a cube and a pad this scene has."""


def parse_pick_place(instruction: str) -> tuple[str, str]:
    """Return ``(cube_colour, pad_colour)`` from e.g. ``"put the red cube on the green pad"``.

    Raises:
        TaskError: no "<colour> cube ... <colour> pad" phrase with colours from :data:`COLOURS`.
    """
    match = _PATTERN.search(instruction or "")
    if match is None:
        raise TaskError(
            f"cannot read a task from {instruction!r}: say 'put the <colour> cube on the <colour> pad' "
            f"with colours from {list(COLOURS)}"
        )
    return match.group("cube").lower(), match.group("pad").lower()
