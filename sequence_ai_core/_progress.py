"""The one progress line ``run()`` / ``act()`` write to stderr: lifecycle, not telemetry.

On a terminal it is a single line rewritten in place (carriage return, erase to the end of the
line) as the run goes ``starting …`` -> ``running …`` -> ``done: RunOutcome(...)``, and ended
with a newline once the run is over, however it ends. A note (a worker warning) is printed on a
line of its own above it. ``progress="auto"`` (the default) writes only when stderr is a
terminal -- nothing in a script, a pipe or a log file; ``progress=True`` on a stream that is not
a terminal writes one plain line per change instead (a log file keeps each); False is silent.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, TextIO

__all__ = ["ProgressLine", "progress_line"]

PREFIX = "[sequences] "
_ERASE = "\r\x1b[K"


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class ProgressLine:
    """Writes status text to ``stream`` (None: silent); ``in_place`` rewrites one line."""

    def __init__(self, stream: Optional[TextIO], in_place: bool) -> None:
        self.stream = stream
        self.in_place = in_place
        self._open = False          # a line is shown and not yet ended with a newline
        self._last = ""

    def _write(self, text: str) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):   # a closed or broken stderr never stops the robot
            self.stream = None

    def __call__(self, text: str) -> None:
        """Show ``text`` as the current status."""
        if self.stream is None:
            return
        self._last = text
        if self.in_place:
            self._write(_ERASE + PREFIX + text)
            self._open = True
        else:
            self._write(PREFIX + text + "\n")

    def note(self, text: str) -> None:
        """A line that stays (a worker warning), printed above the status line."""
        if self.stream is None:
            return
        if self.in_place and self._open:
            self._write(_ERASE + PREFIX + text + "\n" + PREFIX + self._last)
        else:
            self._write(PREFIX + text + "\n")

    def end(self) -> None:
        """End the status line with a newline (the run is over); idempotent."""
        if self._open:
            self._write("\n")
            self._open = False


def progress_line(progress: Any, stream: Optional[TextIO] = None) -> ProgressLine:
    """The ProgressLine for ``run(progress=...)``: "auto" writes to a terminal only, True always,
    False never. ``stream`` defaults to ``sys.stderr`` (read at call time)."""
    stream = sys.stderr if stream is None else stream
    terminal = _is_terminal(stream)
    enabled = terminal if progress == "auto" else bool(progress)
    return ProgressLine(stream if enabled else None, in_place=terminal)
