"""Slots and the waiting line of the local gateway.

A worker has ``slots`` = model copies x replicas per copy (``@seq.concurrent(replicas_per_gpu=)``;
a self-hosted worker has one card, so slots = replicas_per_gpu, default 1). A robot session
holds one slot from connect until it closes, its lease runs out or the worker stops. The local
gateway runs one worker per deployment, so once its slots are taken no further worker may
start for it (the machine's GPU limit), and a new robot is

  - put in line when the policy declares ``on_full="queue"`` (the default): its connect answers
    503 ``queued`` + Retry-After with ``details.position`` (1 = next), ``details.estimate_s`` and
    ``details.ticket``; it keeps its place by connecting again (sending ``"ticket"`` in the body,
    else its API key identifies it) and is refused with ``queue_timeout`` once it waited
    ``queue_timeout_s`` (default 120 s);
  - refused at once with ``deployment_full`` under ``on_full="reject"``.

A robot that stops asking for ABANDON_S is dropped from the line; one that gives up sooner
closes its ticket (``DELETE /v1/sessions/{ticket}``, ``SlotQueue.leave``) and is out at once.
Connecting to a stopped deployment while ``$SEQ_MAX_GPUS`` workers already run answers ``gpu_limit_reached``.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Optional

from sequence_ai_server.common.errors import ApiError

__all__ = ["SlotQueue", "slots_of", "ABANDON_S"]

ABANDON_S = 15.0          # a queued robot that has not asked again for this long loses its place
RETRY_S = 1.0             # how often a queued robot is told to ask again (Retry-After, s)


def slots_of(spec: Optional[dict]) -> int:
    """Robot slots of one worker from a stored spec dict: copies (1 card here) x replicas_per_gpu."""
    conc = (spec or {}).get("concurrency") or {}
    replicas = int(conc.get("replicas_per_gpu") or 1)
    per = int(conc.get("gpus_per_replica") or 1)
    return max(1, 1 // per) * replicas


@dataclass
class _Ticket:
    id: str
    holder: str
    since: float          # unix s, when it joined the line
    seen: float           # unix s, its last connect


class SlotQueue:
    """One waiting line per deployment. Thread-safe; times are unix seconds."""

    def __init__(self) -> None:
        self._lines: dict[str, list[_Ticket]] = {}
        self._lock = threading.Lock()
        self.admitted_from_queue = 0
        self.timeouts = 0

    def depth(self, model: Optional[str] = None) -> int:
        """Robots waiting for ``model`` (all deployments when None)."""
        with self._lock:
            lines = [self._lines.get(model, [])] if model else list(self._lines.values())
            return sum(len(x) for x in lines)

    def leave(self, ticket: str, holder: str) -> bool:
        """Take ``ticket`` out of its line at once (its robot gave up waiting); True when it was
        there. Only the key that queued it may: ``holder`` is that key's id ("" without keys)."""
        with self._lock:
            for line in self._lines.values():
                for t in line:
                    if t.id == ticket and t.holder == holder:
                        line.remove(t)
                        return True
        return False

    def admit(self, model: str, holder: str, ticket: Optional[str], *, capacity: int, held: int,
              on_full: str, queue_timeout_s: float, mean_session_s: float, now: Optional[float] = None,
              reason: Optional[str] = None, extra: Optional[dict] = None) -> None:
        """Return when the robot may take a slot now; else raise ApiError ``queued`` (503,
        retryable, details position/estimate_s/ticket), ``queue_timeout`` or ``deployment_full``.
        ``held``: robots admitted now; ``capacity``: those plus the robots that may still join;
        ``mean_session_s``: typical session length, for the estimate. ``reason``: why no more
        may join when it is not that every slot is taken (admission's deadline check), put in
        the refusal's message; ``extra``: added to its details."""
        now = time.time() if now is None else now
        with self._lock:
            line = [t for t in self._lines.get(model, []) if now - t.seen <= ABANDON_S]
            # a ticket is its holder's own: another robot's ticket number keeps no place in line (an
            # unknown one counts as none: the holder's own place, else a new one)
            mine = next((t for t in line if t.holder == holder and ticket and t.id == ticket), None) \
                or next((t for t in line if t.holder == holder), None)
            free = capacity - held
            if mine is None and not line and free > 0:
                self._lines[model] = line
                return
            if mine is not None and line.index(mine) < free:
                line.remove(mine)
                self._lines[model] = line
                self.admitted_from_queue += 1
                return
            why = reason or f"every slot of {model!r} is taken ({held} of {capacity})"
            if on_full == "reject":
                self._lines[model] = line
                raise ApiError("deployment_full", f"{model!r} takes no more robots now: {why}, and no other worker "
                               "may start on this machine",
                               hint="retry later, or declare on_full=\"queue\" to wait in line",
                               details={"slots": capacity, "held": held, **(extra or {})})
            if mine is None:
                mine = _Ticket("q_" + secrets.token_hex(6), holder, now, now)
                line.append(mine)
            mine.seen = now
            self._lines[model] = line
            waited = now - mine.since
            if waited > queue_timeout_s:
                line.remove(mine)
                self.timeouts += 1
                raise ApiError("queue_timeout", f"waited {waited:.0f} s for a slot of {model!r} "
                               f"(queue_timeout_s {queue_timeout_s:g} s)",
                               hint="every slot stayed taken; retry later or raise queue_timeout_s",
                               details={"waited_s": round(waited, 1), "queue_timeout_s": queue_timeout_s})
            position = line.index(mine) + 1
            estimate = round(max(RETRY_S, position * mean_session_s / max(1, capacity)), 1)
            raise ApiError("queued", f"queued for a slot of {model!r}: position {position}, about {estimate:.0f} s"
                           + (f" ({reason})" if reason else ""),
                           retry_after_s=RETRY_S,
                           hint="connect again after Retry-After with the same ticket to keep your place",
                           details={"position": position, "estimate_s": estimate, "ticket": mine.id,
                                    "slots": capacity, "held": held, "waited_s": round(waited, 1),
                                    "queue_timeout_s": queue_timeout_s, **(extra or {})})
