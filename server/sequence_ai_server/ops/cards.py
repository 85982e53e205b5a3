"""Which worker holds which card: :class:`CardPool` gives each worker of a deployment specific card
indices of this machine (its inventory, gpus.py) and takes them back when the worker's process
has exited; :class:`CardPins` is what the supervisor calls around a worker's start.

The rules, kept simple on purpose:

* ``gpu="L4"`` / ``"L4:2"`` takes that many cards of that type; a fallback list
  (``gpu=["H100", "L4"]``) tries each type in order and takes the first that has room now
  (there is no minute of waiting per entry here: a local machine's cards do not come back by
  waiting a minute unless a worker stops).
* A free card (no holder) is taken first. A card already held only by the same deployment's
  workers (a build started beside its serving worker, a side version) is shared next: one
  deployment is one model, and a rolling deploy on a one-card machine must still work.
  ``replicas_per_gpu`` copies live inside one worker and never open a card to anyone else.
* A card held by another deployment is shared only when every worker on it, and the one asking,
  declares ``memory=`` (GiB; for ``(request, limit)`` the limit) and the sum fits in the card's
  memory. Undeclared memory counts as the whole card. ``memory=`` is the worker's own memory in
  the spec; read here as what it may use of the card too, it is the operator's promise, not a
  measurement.
* ``max_gpus`` caps the cards a deployment's serving and side workers hold at once (a build is
  not counted: it replaces the serving worker); ``limit`` caps the cards held on the machine.

A refusal is a :class:`CardRefused` (an ApiError) whose ``details["reason"]`` is the spec's:
``gpu_busy`` (every card of this machine is held), ``gpu_low_stock`` (every card of the listed
types is held while another type is free: list it in ``gpu=``), ``deployment_full`` (the
deployment holds its ``max_gpus``), ``gpu_limit_reached`` (the machine's card limit), or
``gpu_unavailable`` (this machine has no such card at all, the deploy-time check's reason).
The detail names the card type and what holds each card.

Claims are kept in a JSON file (``run/cards.json``) with each holder's pid and start time, so a
gateway restarted on the same data dir knows the cards its adopted workers hold.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.common.processes import process_start

log = logging.getLogger("sequence_ai_server.gateway")

__all__ = ["CardPool", "CardPins", "CardRefused", "Claim", "requested_cards", "declared_memory_mib"]


class CardRefused(ApiError):
    """No card for a worker now. ``reason``: gpu_busy | gpu_low_stock | deployment_full |
    gpu_limit_reached | gpu_unavailable (also ``details["reason"]``)."""

    _CODES = {"gpu_limit_reached": "gpu_limit_reached", "deployment_full": "deployment_full"}

    def __init__(self, reason: str, detail: str, *, hint: str, details: dict):
        super().__init__(self._CODES.get(reason, "unavailable"), detail, hint=hint,
                         details={"reason": reason, **details})
        self.reason = reason


def requested_cards(gpu: Any) -> tuple[list[str], int]:
    """``(card types in order, cards per worker)`` of a ``gpu=`` value: ``"L4"`` -> ``(["L4"], 1)``,
    ``"H100:2"`` -> ``(["H100"], 2)``, ``["H100", "L4"]`` -> both, 1; ``None`` / ``"cpu"`` ->
    ``([], 0)``. Raises ValueError naming an entry that is not ``TYPE`` or ``TYPE:N`` (N >= 1), or a
    list whose entries ask for different counts."""
    if gpu is None:
        return [], 0
    items = [gpu] if isinstance(gpu, str) else list(gpu) if isinstance(gpu, (list, tuple)) else None
    if items is None:
        raise ValueError(f"gpu={gpu!r} is not a card name or a list of them; write gpu=\"L4\", \"H100:2\", "
                         f"[\"H100\", \"L4\"] or \"cpu\"")
    types, counts = [], set()
    for item in items:
        kind, sep, n = str(item).strip().partition(":") if isinstance(item, str) else ("", "", "")
        if not kind.strip():
            raise ValueError(f"gpu= entry {item!r} names no card; write a type `seq gpus` lists, e.g. \"L4\" or \"L4:2\"")
        if kind.strip().lower() == "cpu":
            continue
        if sep and not (n.isdigit() and int(n) >= 1):
            raise ValueError(f"gpu= entry {item!r}: the count after ':' must be a whole number >= 1 (e.g. \"{kind}:2\")")
        types.append(kind.strip())
        counts.add(int(n) if sep else 1)
    if len(counts) > 1:
        raise ValueError(f"gpu={gpu!r}: every fallback entry needs the same card count (\"H100:2\" falls back to \"A100:2\")")
    return types, (counts.pop() if counts else 0)


def declared_memory_mib(memory: Any) -> Optional[int]:
    """``memory=`` (GiB, or ``(request, limit)``: the limit) in MiB; None when undeclared or not a
    positive number (read as: the whole card)."""
    if isinstance(memory, (list, tuple)) and memory:
        memory = memory[-1]
    if isinstance(memory, bool) or not isinstance(memory, (int, float)) or not memory > 0:
        return None
    return int(float(memory) * 1024)


@dataclass
class Claim:
    """The cards one worker holds. ``holder``: unique per launch; ``deployment``/``worker``/``role``:
    whose (``worker``: its key, e.g. ``pi05`` or ``pi05@v2``); ``memory_mib``: its declared share of
    each card (None: the whole card); ``pid``/``start``: its process once known (0 before)."""
    holder: str
    deployment: str
    worker: str
    role: str
    cards: tuple
    memory_mib: Optional[int] = None
    pid: int = 0
    start: Optional[int] = None
    handle: Any = field(default=None, repr=False, compare=False)

    def view(self) -> dict:
        return {"deployment": self.deployment, "worker": self.worker, "role": self.role, "pid": self.pid or None,
                "memory_mib": self.memory_mib}


def _alive_pid(pid: int, start: Optional[int]) -> bool:
    if pid <= 0:
        return False
    now = process_start(pid)
    return now is not None and (start is None or now == start)


class CardPool:
    """The cards of one machine and who holds them. ``cards``: the inventory's card dicts
    (``index``, ``type``, ``memory_mib``, ...). ``state_file``: where claims are kept across gateway
    restarts (None: in memory only). Thread-safe."""

    def __init__(self, cards: list[dict], state_file: Optional[Path] = None):
        self.cards = sorted((dict(c) for c in cards), key=lambda c: c["index"])
        self._by_index = {c["index"]: c for c in self.cards}
        self.state_file = state_file
        self._claims: dict[str, Claim] = {}
        self._lock = threading.Lock()
        self._load()

    # -- what is held
    def claims(self) -> list[Claim]:
        """Every live claim (claims of exited workers are dropped first)."""
        with self._lock:
            self._sweep()
            return list(self._claims.values())

    def holders(self, index: int) -> list[Claim]:
        """The live claims on card ``index``."""
        return [c for c in self.claims() if index in c.cards]

    def view(self) -> list[dict]:
        """The cards, each with ``held_by``: ``[{"deployment", "worker", "role", "pid", "memory_mib"}]``."""
        claims = self.claims()
        return [{**c, "held_by": [k.view() for k in claims if c["index"] in k.cards]} for c in self.cards]

    # -- taking and giving back
    def claim(self, holder: str, deployment: str, worker: str, role: str, gpu: Any, *, memory: Any = None,
              max_gpus: Optional[int] = None, limit: Optional[int] = None) -> tuple:
        """Give the worker ``holder`` (of ``deployment``; ``worker``: its key; ``role``) the cards its
        ``gpu=`` asks for, per the module's rules; returns their indices (``()`` for a CPU worker).
        ``memory``: its ``memory=``; ``max_gpus``: the most cards the deployment's serving and side
        workers may hold (None: no cap); ``limit``: the most cards held on the machine. Raises
        ValueError for a malformed ``gpu=`` and CardRefused when no card can be had now."""
        types, count = requested_cards(gpu)
        mem = declared_memory_mib(memory)
        with self._lock:
            self._sweep()
            self._claims.pop(holder, None)
            if not types:
                return ()
            tried = [self._try_type(t, count, deployment, mem, max_gpus, limit) for t in types]
            for kind, picked, _why in tried:
                if picked is not None:
                    self._claims[holder] = Claim(holder, deployment, worker, role, tuple(picked), mem)
                    self._save()
                    return tuple(picked)
            raise self._refusal(gpu, types, count, deployment, tried, max_gpus, limit)

    def bind(self, holder: str, handle: Any) -> None:
        """The worker ``holder`` started as ``handle`` (``poll()`` None while it runs, ``pid``): its
        cards are released once ``poll()`` says it exited."""
        with self._lock:
            c = self._claims.get(holder)
            if c is not None:
                c.handle = handle
                self._note_pid(c)
                self._save()

    def relabel(self, serving: dict) -> None:
        """``serving``: ``{deployment: pid of its serving worker}``. A claim made for a build (or
        side) worker whose process now serves its deployment (it took over) is labelled as the
        serving worker from here on, for the view and for ``max_gpus``."""
        with self._lock:
            changed = False
            for c in self._claims.values():
                pid = serving.get(c.deployment)
                if pid and c.pid == pid and c.role != "serving":
                    c.role, c.worker, changed = "serving", c.deployment, True
            if changed:
                self._save()

    def release(self, holder: str) -> None:
        """Give back the cards of ``holder`` now (its start failed); no-op when it holds none."""
        with self._lock:
            if self._claims.pop(holder, None) is not None:
                self._save()

    # -- inside (the lock held)
    def _try_type(self, kind: str, count: int, deployment: str, mem: Optional[int], max_gpus: Optional[int],
                  limit: Optional[int]) -> tuple[str, Optional[list], str]:
        """``(type, picked indices or None, why not)`` for ``count`` cards of ``kind``."""
        mine = {i for c in self._claims.values() if c.deployment == deployment and c.role != "build" for i in c.cards}
        held = {i for c in self._claims.values() for i in c.cards}
        room_new = None if max_gpus is None else max(0, max_gpus - len(mine))
        room_machine = None if limit is None else max(0, limit - len(held))
        free, own, fit = [], [], []
        of_type = [c for c in self.cards if c["type"].upper() == kind.upper()]
        if len(of_type) < count:
            return kind, None, "missing"
        for card in of_type:
            on = [c for c in self._claims.values() if card["index"] in c.cards]
            if not on:
                free.append(card["index"])
            elif all(c.deployment == deployment for c in on):
                own.append((len(on), card["index"]))
            elif mem is not None and card.get("memory_mib") and all(c.memory_mib is not None for c in on) \
                    and sum(c.memory_mib for c in on) + mem <= card["memory_mib"]:
                fit.append(card["index"])
        new_ok = min(x for x in (room_new, room_machine, count) if x is not None)
        picked = free[:new_ok]
        picked += [i for _n, i in sorted(own)][: count - len(picked)]
        extra = [i for i in fit if i not in picked]
        picked += extra[: max(0, min(count - len(picked), new_ok - len([i for i in picked if i in free])))]
        if len(picked) >= count:
            return kind, picked[:count], ""
        if room_machine is not None and room_machine < count and (free or fit):
            return kind, None, "limit"
        if room_new is not None and room_new < count and (free or fit):
            return kind, None, "max"
        return kind, None, "busy"

    def _held_text(self, kind: str) -> str:
        parts = []
        for card in self.cards:
            if card["type"].upper() != kind.upper():
                continue
            on = [c for c in self._claims.values() if card["index"] in c.cards]
            who = ", ".join(f"{c.deployment} ({c.role} worker {c.worker}" + (f", pid {c.pid})" if c.pid else ")")
                            for c in on)
            parts.append(f"card {card['index']} by {who}" if who else f"card {card['index']} free")
        return "; ".join(parts)

    def _refusal(self, gpu: Any, types: list, count: int, deployment: str, tried: list,
                 max_gpus: Optional[int], limit: Optional[int]) -> CardRefused:
        whys = {why for _k, _p, why in tried}
        asked = " or ".join(f"{t}:{count}" if count > 1 else t for t in types)
        holders = {k: self._held_text(k) for k, _p, why in tried if why != "missing"}
        details = {"declared": gpu, "deployment": deployment,
                   "held": {k: [{"index": c["index"], "held_by": [x.view() for x in self._claims.values()
                                                                  if c["index"] in x.cards]}
                                for c in self.cards if c["type"].upper() == k.upper()] for k in holders}}
        if whys == {"missing"}:
            have = ", ".join(sorted({c["type"] for c in self.cards})) or "no card (a CPU machine)"
            return CardRefused("gpu_unavailable", f"gpu={gpu!r} asks for {asked}, which this machine does not have; "
                               f"it has {have}", hint="declare a card `seq gpus` lists, or gpu=\"cpu\"", details=details)
        held_txt = "; ".join(f"{k}: {v}" for k, v in holders.items())
        if "limit" in whys:
            n = len({i for c in self._claims.values() for i in c.cards})
            return CardRefused("gpu_limit_reached", f"{deployment!r} cannot have {asked}: {n} cards are held and this "
                               f"machine allows {limit} at once ({held_txt})",
                               hint="stop a deployment (`seq policy stop NAME`) or raise the card limit",
                               details={**details, "limit": limit, "held_cards": n})
        if "max" in whys:
            return CardRefused("deployment_full", f"{deployment!r} already holds its max_gpus={max_gpus} and cannot "
                               f"have {asked} more ({held_txt})",
                               hint="raise max_gpus in @seq.policy, or stop one of its workers",
                               details={**details, "max_gpus": max_gpus})
        busy = {i for c in self._claims.values() for i in c.cards}
        wanted = {t.upper() for t in types}
        free_asked = [c for c in self.cards if c["index"] not in busy and c["type"].upper() in wanted]
        if free_asked:           # some are free, but fewer than one worker needs
            return CardRefused("gpu_busy", f"{asked} cannot be had now: only {len(free_asked)} such card(s) "
                               f"free ({held_txt})",
                               hint="stop a deployment (`seq policy stop NAME`) to free its cards, or ask for fewer",
                               details={**details, "free_cards": [c["index"] for c in free_asked]})
        other_free = sorted({c["type"] for c in self.cards if c["index"] not in busy
                             and c["type"].upper() not in {t.upper() for t in types}})
        if other_free:
            return CardRefused("gpu_low_stock", f"every {asked} card of this machine is held ({held_txt}); "
                               f"free now: {', '.join(other_free)}",
                               hint=f"list a free type as a fallback, e.g. gpu={[*types, other_free[0]]!r}, or stop "
                                    f"the deployment that holds the card", details={**details, "free_types": other_free})
        return CardRefused("gpu_busy", f"every card of this machine is held; {asked} cannot be had now ({held_txt})",
                           hint="stop a deployment (`seq policy stop NAME`) to free its cards, then try again",
                           details=details)

    def _note_pid(self, c: Claim) -> bool:
        pid = int(getattr(c.handle, "pid", 0) or 0)
        if pid and pid != c.pid:
            c.pid, c.start = pid, process_start(pid)
            return True
        return False

    def _alive(self, c: Claim) -> bool:
        if c.handle is not None:
            return c.handle.poll() is None
        if c.pid:
            return _alive_pid(c.pid, c.start)
        return True          # claimed, its process not started yet

    def _sweep(self) -> None:
        changed = False
        for holder, c in list(self._claims.items()):
            if c.handle is not None:
                changed |= self._note_pid(c)
            if not self._alive(c):
                del self._claims[holder]
                changed = True
        if changed:
            self._save()

    def _save(self) -> None:
        if self.state_file is None:
            return
        rows = [{k: v for k, v in asdict(replace(c, handle=None)).items() if k != "handle"}
                for c in self._claims.values()]
        tmp = Path(f"{self.state_file}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(rows, sort_keys=True))
            os.replace(tmp, self.state_file)

    def _load(self) -> None:
        """Claims a previous gateway left whose process still runs (an adopted worker's)."""
        if self.state_file is None:
            return
        try:
            rows = json.loads(Path(self.state_file).read_text())
        except (OSError, ValueError):
            return
        for r in rows if isinstance(rows, list) else []:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                c = Claim(str(r["holder"]), str(r["deployment"]), str(r["worker"]), str(r["role"]),
                          tuple(int(i) for i in r["cards"]), r.get("memory_mib"), int(r.get("pid") or 0), r.get("start"))
                if c.pid and _alive_pid(c.pid, c.start) and all(i in self._by_index for i in c.cards):
                    self._claims[c.holder] = c
        self._save()


class CardPins:
    """What the supervisor calls around one worker's start: :meth:`pin` (under its lock, before
    the process starts: the spec with its cards), then :meth:`bind` with the started handle, or
    :meth:`release` when the start failed. ``pool``: the machine's CardPool; ``unknown(gpu)``: why a
    ``gpu=`` names no card here (gpus.gpu_refusal), or None. ``serving()``: ``{deployment: pid of
    its serving worker}`` (CardPool.relabel)."""

    def __init__(self, pool: CardPool, unknown: Callable[[Any], Optional[dict]],
                 serving: Callable[[], dict] = dict):
        self.pool, self._unknown, self._serving = pool, unknown, serving

    def view(self) -> list[dict]:
        """The pool's cards with their holders (CardPool.view), the serving workers labelled as such."""
        self.pool.relabel(self._serving())
        return self.pool.view()

    def pin(self, spec: Any, key: str) -> Any:
        """``spec`` (a WorkerLaunchSpec) with ``cards`` set: ``()`` for a CPU worker (``gpu="cpu"``
        or no ``gpu=``: it sees no card), the claimed indices otherwise. A ``gpu=`` the gateway
        could not read, or one naming a card this machine lacks, is left unpinned (``None``):
        the load-time check refuses the latter with its reason. Raises CardRefused (or
        ApiError invalid_request for a malformed ``gpu=``)."""
        res = spec.resources or {}
        gpu = res.get("gpu")
        if gpu is not None and self._unknown(gpu) is not None:
            return spec
        self.pool.relabel(self._serving())
        try:
            cards = self.pool.claim(spec.run_key, spec.name, key, spec.role, gpu, memory=res.get("memory"),
                                    max_gpus=None if spec.role == "build" else res.get("max_gpus"))
        except ValueError as exc:
            raise ApiError("invalid_request", str(exc), hint="fix gpu= in @seq.policy and deploy again",
                           details={"field": "gpu"}) from None
        if cards:
            log.info("%s (%s worker %s) pinned to card(s) %s", spec.name, spec.role, key, ",".join(map(str, cards)))
        return replace(spec, cards=tuple(cards))

    def bind(self, spec: Any, handle: Any) -> None:
        """The worker of ``spec`` started as ``handle``."""
        self.pool.bind(spec.run_key, handle)

    def release(self, spec: Any) -> None:
        """The worker of ``spec`` did not start: its cards are free again."""
        self.pool.release(spec.run_key)
