"""The action buffer: the playing chunk, the chunks queued behind it, and the seam between them.

Each chunk contributes its first ``open_loop_horizon`` rows (all rows when it declares none):
those are played, then the next chunk takes over and the rest of the old one is dropped
unplayed. ``lookahead`` bounds how many chunks may wait behind the playing one (the loop also
counts a request in flight against it, and with ``lookahead`` >= 2 fills every free slot at
once: ``_loop._prefetch_at``).

Queued chunks are played in the order they arrived, each in full (its playable rows), although
each was planned from an observation taken before the chunks ahead of it had played (open loop
over them): a queued chunk is never dropped or re-ordered because a newer one landed behind it. The seam is handled
at every boundary the same way, queued or not: when a chunk starts, the buffer measures the
jump from the last executed action to its first row and, only if asked and allowed, smooths its
lead-in (``_seam.py``). So with a deeper queue ``max_seam_jump`` reports what the older
observations cost at the seams; only ``clear()`` (an interrupt, a run's end) drops queued chunks.

``merge_aligned`` is the other way in (``run(merge="aligned" | "aligned_blend")``): the new
chunk's row 0 is due at its observation, so the rows the robot executed while it was in flight
are dropped (``consumed``), and the row due now replaces whatever the buffer would have played
next; the old plan's tail and queued chunks are dropped. ``aligned_blend`` also cross-fades its
first rows from the old plan on the named continuous dimensions (never a delta space). Every
seam leaves a ``_seam.SeamRecord`` in ``seams``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, List, Optional, Sequence, Tuple

from ._seam import SeamRecord, blend, seam_jump, should_smooth, smooth
from ._types import ActionChunk

__all__ = ["ChunkBuffer", "Entry"]


@dataclass
class Entry:
    """A chunk in the buffer with the rows that will be played and what the loop tagged it with."""

    chunk: ActionChunk
    rows: List[List[float]]
    tag: Any = None
    next_row: int = 0
    seam_jump: float = 0.0
    first_action_index: Optional[int] = None
    delay_steps: int = 0            # the delay its request was sent with (steps)
    consumed: int = 0               # actions executed while its request was in flight
    trimmed: int = 0                # rows dropped by an aligned merge
    blended: int = 0                # rows changed by an aligned blend
    arrival_left_s: float = 0.0     # motion still buffered when it arrived (s)
    merged: bool = False            # aligned: rows already final, no seam ramp at start

    @property
    def remaining(self) -> int:
        return len(self.rows) - self.next_row


@dataclass
class ChunkBuffer:
    """Rows waiting to be executed, chunk by chunk.

    Args:
        smooth_seam: ramp the first N rows of every chunk after the first out of the last
            executed action; absolute action spaces only. 0 (default) changes nothing.
    """

    smooth_seam: int = 0
    current: Optional[Entry] = None
    queued: Deque[Entry] = field(default_factory=deque)
    last_action: Optional[List[float]] = None
    chunks_started: int = 0
    max_seam_jump: float = 0.0
    seams: List[SeamRecord] = field(default_factory=list)

    def push(self, chunk: ActionChunk, tag: Any = None, **info: Any) -> None:
        """Queue a chunk behind whatever is playing; only its first ``playable`` rows are kept.
        ``info``: Entry fields for the seam record (delay_steps, consumed, arrival_left_s)."""
        rows = [list(row) for row in chunk.actions[: chunk.playable]]
        if rows:
            self.queued.append(Entry(chunk=chunk, rows=rows, tag=tag, **info))

    def upcoming(self) -> List[List[float]]:
        """The rows still to play, in order: the playing chunk's rest, then the queued ones."""
        rows = list(self.current.rows[self.current.next_row:]) if self.current is not None else []
        for e in self.queued:
            rows.extend(e.rows[e.next_row:])
        return [list(r) for r in rows]

    def merge_aligned(self, chunk: ActionChunk, tag: Any = None, *, consumed: int,
                      blend_dims: Sequence[int] = (), blend_steps: int = 0, **info: Any) -> bool:
        """Make ``chunk`` the plan from now on: drop its first ``consumed`` rows (their time has
        passed: the robot executed that many actions since its observation) and play its row
        due now next, in place of everything buffered. With ``blend_dims`` and ``blend_steps``
        > 0 (absolute spaces only; a delta chunk is never changed) its first rows are
        cross-faded from the old plan on those dimensions (``_seam.blend``).

        Returns False, changing nothing, when every playable row's time has already passed."""
        rows = [list(row) for row in chunk.actions[: chunk.playable]]
        trimmed = max(0, int(consumed))
        if trimmed >= len(rows):
            return False
        rows = rows[trimmed:]
        jump_before = seam_jump(self.last_action, rows[0])
        blended = 0
        old = self.upcoming()
        if blend_dims and blend_steps > 0 and chunk.is_absolute and old and self.chunks_started:
            rows = blend(rows, old, blend_dims, blend_steps)
            blended = min(blend_steps, len(rows))
        self.clear()
        entry = Entry(chunk=chunk, rows=rows, tag=tag, trimmed=trimmed, consumed=consumed,
                      blended=blended, merged=True, **info)
        entry.seam_jump = jump_before
        self.queued.append(entry)
        return True

    def __len__(self) -> int:
        """Actions left to play, over the playing chunk and the queued ones."""
        playing = self.current.remaining if self.current is not None else 0
        return playing + sum(e.remaining for e in self.queued)

    @property
    def chunks_queued(self) -> int:
        """Chunks waiting behind the playing one."""
        return len(self.queued)

    def seconds_left(self, default_period_s: float) -> float:
        """Seconds of motion left in the buffer, each row at its own chunk's rate."""
        total = 0.0
        entries: Sequence[Entry] = ([self.current] if self.current else []) + list(self.queued)
        for e in entries:
            hz = e.chunk.control_frequency_hz
            total += e.remaining * (1.0 / hz if hz else default_period_s)
        return total

    def pop(self, action_index: int) -> Tuple[List[float], Optional[Entry]]:
        """The next row to execute, and the Entry when this row starts a new chunk (else None).

        Raises:
            IndexError: the buffer is empty.
        """
        started: Optional[Entry] = None
        if self.current is None or self.current.remaining == 0:
            if not self.queued:
                raise IndexError("action buffer is empty")
            started = self._start(self.queued.popleft(), action_index)
        row = self.current.rows[self.current.next_row]
        self.current.next_row += 1
        return row, started

    def executed(self, row: Sequence[float]) -> None:
        """Record the row that actually reached the robot: the reference for the next seam."""
        self.last_action = list(row)

    def clear(self) -> None:
        """Drop every buffered row (interrupt, run start). Seam statistics are kept."""
        self.current = None
        self.queued.clear()

    def reset(self) -> None:
        """Forget everything, statistics and last action included: a new run."""
        self.clear()
        self.last_action = None
        self.chunks_started = 0
        self.max_seam_jump = 0.0
        self.seams = []

    def _start(self, entry: Entry, action_index: int) -> Entry:
        first_chunk = self.chunks_started == 0 or self.last_action is None
        if not entry.merged:   # an aligned merge measured it before its blend
            entry.seam_jump = seam_jump(self.last_action, entry.rows[0]) if not first_chunk else 0.0
        self.max_seam_jump = max(self.max_seam_jump, entry.seam_jump if not first_chunk else 0.0)
        if not entry.merged and should_smooth(self.smooth_seam, absolute=entry.chunk.is_absolute,
                                              first_chunk=first_chunk):
            entry.rows = smooth(entry.rows, self.last_action, self.smooth_seam)
            entry.blended = min(self.smooth_seam, len(entry.rows))
        if not first_chunk:
            self.seams.append(SeamRecord(
                delay_steps=entry.delay_steps, consumed=entry.consumed, trimmed=entry.trimmed,
                jump_before=entry.seam_jump, jump_after=seam_jump(self.last_action, entry.rows[0]),
                playback_left_s=entry.arrival_left_s, blended=entry.blended))
        entry.first_action_index = action_index
        self.chunks_started += 1
        self.current = entry
        return entry
