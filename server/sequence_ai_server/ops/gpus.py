"""The machine's card inventory (``seq gpus``, ``GET /v1/gpus``) and the check of a policy's
``gpu=`` declaration against it.

The inventory comes from ``nvidia-smi`` when it is on the PATH (one CSV query, parsed by
:func:`parse_nvidia_smi_csv`), else the machine is a CPU box: no cards, its cores and memory.
A card's *type* is its marketing name without the vendor words (``"NVIDIA H200"`` -> ``H200``,
``"NVIDIA A100-SXM4-80GB"`` -> ``A100``), which is what ``gpu="H200"`` / ``gpu="A100:2"`` name.
``gpu="cpu"`` (or no ``gpu=``) needs no card. What each deployment holds is its running
workers' declared cards; free is the machine's cards of each type less what is held.
"""
from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
from typing import Any, Optional

__all__ = ["NVIDIA_SMI_QUERY", "parse_nvidia_smi_csv", "card_type", "inventory", "declared_cards",
           "gpu_refusal", "holdings"]

NVIDIA_SMI_QUERY = ["--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits"]
"""The arguments ``inventory`` runs nvidia-smi with (memory.total in MiB)."""

_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}


def card_type(name: str) -> str:
    """The card type ``gpu=`` names for an nvidia-smi card name: vendor words dropped, the
    first remaining word, cut at its first ``-`` (``"NVIDIA A100-SXM4-80GB"`` -> ``"A100"``;
    ``"NVIDIA GeForce RTX 4090"`` -> ``"RTX4090"``: a series word joins its model number)."""
    words = [w for w in name.split() if w.lower() not in _VENDOR_WORDS]
    if not words:
        return name.strip()
    if words[0].upper() in ("RTX", "GTX", "TITAN") and len(words) > 1:
        return (words[0] + words[1]).split("-")[0]
    return words[0].split("-")[0]


def parse_nvidia_smi_csv(text: str) -> list[dict]:
    """Cards from the output of ``nvidia-smi`` run with :data:`NVIDIA_SMI_QUERY`: one
    ``{"index": int, "name": str, "type": str, "memory_mib": int | None, "uuid": str}`` per line.
    Blank lines are skipped. Raises ValueError naming the line that does not have the four fields
    or whose index is not a number."""
    cards = []
    for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 4:
            raise ValueError(f"nvidia-smi line {n} has {len(row)} fields, expected 4 (index, name, memory.total, uuid): {row!r}")
        index, name, mem, uuid = (c.strip() for c in row)
        try:
            idx = int(index)
        except ValueError:
            raise ValueError(f"nvidia-smi line {n}: index {index!r} is not a number") from None
        try:
            memory: Optional[int] = int(float(mem))
        except ValueError:
            memory = None          # "[N/A]" on some boards
        cards.append({"index": idx, "name": name, "type": card_type(name), "memory_mib": memory, "uuid": uuid})
    return cards


def _memory_gib() -> Optional[float]:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def inventory(nvidia_smi: Optional[str] = None) -> dict:
    """The machine's cards: ``{"source": "nvidia-smi" | "cpu", "cards": [card dicts],
    "types": {type: count}, "cpu": {"cores": int, "memory_gib": float | None}, "error": str | None}``.
    ``nvidia_smi``: the binary (default: ``nvidia-smi`` on the PATH). A binary that fails is
    reported in ``error`` with no cards, never raised."""
    binary = nvidia_smi or shutil.which("nvidia-smi")
    cards: list[dict] = []
    error = None
    if binary:
        try:
            res = subprocess.run([binary, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=10)
            if res.returncode != 0:
                error = f"nvidia-smi exited {res.returncode}: {(res.stderr or res.stdout).strip()[:200]}"
            else:
                cards = parse_nvidia_smi_csv(res.stdout)
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            error = f"nvidia-smi could not be read: {exc}"
    types: dict[str, int] = {}
    for c in cards:
        types[c["type"]] = types.get(c["type"], 0) + 1
    return {"source": "nvidia-smi" if binary and error is None else "cpu", "cards": cards, "types": types,
            "cpu": {"cores": os.cpu_count() or 1, "memory_gib": _memory_gib()}, "error": error}


def declared_cards(gpu: Any) -> tuple[list[str], int]:
    """``(card types, count)`` a ``gpu=`` value asks for: ``"H100:2"`` -> ``(["H100"], 2)``,
    fallbacks ``["H100", "A100"]`` -> both types, count 1; ``None`` / ``"cpu"`` -> ``([], 0)``."""
    items = [gpu] if isinstance(gpu, str) else list(gpu or [])
    types, count = [], 0
    for item in items:
        if not isinstance(item, str):
            continue
        kind, _, n = item.partition(":")
        if kind.lower() == "cpu":
            continue
        types.append(kind)
        count = max(count, int(n) if n.isdigit() else 1)
    return types, count


def gpu_refusal(gpu: Any, inv: dict) -> Optional[dict]:
    """Why ``gpu=`` cannot be served by the machine ``inv`` (an :func:`inventory`), or None when
    it can: ``{"reason": "gpu_unavailable", "declared", "available": {type: count}, "detail"}``.
    Types compare case-insensitively; the count is checked against the machine's total of that
    type (cards held by other deployments are the quota's business, not this one's)."""
    types, count = declared_cards(gpu)
    if not types:
        return None
    have = {t.upper(): n for t, n in inv["types"].items()}
    if any(have.get(t.upper(), 0) >= count for t in types):
        return None
    if inv["types"]:
        exists = ", ".join(f"{t} x{n}" for t, n in sorted(inv["types"].items()))
    else:
        exists = f"no GPU (a CPU machine: {inv['cpu']['cores']} cores)"
    asked = " or ".join(f"{t}:{count}" if count > 1 else t for t in types)
    detail = (f"gpu={gpu!r} asks for {asked}, which this machine does not have; it has {exists}"
              + (f" (nvidia-smi: {inv['error']})" if inv.get("error") else ""))
    return {"reason": "gpu_unavailable", "declared": gpu, "available": dict(inv["types"]), "detail": detail}


def holdings(workers: list[tuple[str, str, Any]], inv: dict) -> dict:
    """What each deployment holds and what is free. ``workers``: ``(deployment, role, gpu=)`` of
    every running worker. -> ``{"held": {deployment: {"workers": n, "cards": {type: n}}},
    "free": {type: n}}`` (a worker with fallbacks holds its first listed type that exists here)."""
    held: dict[str, dict] = {}
    used: dict[str, int] = {}
    upper = {t.upper(): t for t in inv["types"]}
    for name, _role, gpu in workers:
        entry = held.setdefault(name, {"workers": 0, "cards": {}})
        entry["workers"] += 1
        types, count = declared_cards(gpu)
        kind = next((upper[t.upper()] for t in types if t.upper() in upper), types[0] if types else None)
        if kind is None:
            continue
        entry["cards"][kind] = entry["cards"].get(kind, 0) + count
        used[kind] = used.get(kind, 0) + count
    free = {t: max(0, n - used.get(t, 0)) for t, n in inv["types"].items()}
    return {"held": held, "free": free}
