"""The machine's card inventory (``seq gpus``, ``GET /v1/gpus``) and the check of a policy's
``gpu=`` declaration against it.

The inventory is read, in this order, from: a fake list (``SEQ_FAKE_GPUS``, for tests and CPU
machines: :func:`fake_cards`), NVML through ``nvidia-ml-py`` (``import pynvml``: per card its
index, name, memory, UUID and the processes on it), ``nvidia-smi`` when NVML cannot be read (one
CSV query, parsed by :func:`parse_nvidia_smi_csv`), else the machine is a CPU box: no cards, its
cores and memory. A card's *index* is NVML's (PCI bus order, as ``nvidia-smi`` numbers them).
A card's *type* is its marketing name without the vendor words (``"NVIDIA H200"`` -> ``H200``,
``"NVIDIA A100-SXM4-80GB"`` -> ``A100``), which is what ``gpu="H200"`` / ``gpu="A100:2"`` name.
``gpu="cpu"`` (or no ``gpu=``) needs no card. Which worker holds which card is the card pool's
(cards.py); :func:`holdings` is the count by declaration, for a launcher that places cards itself.
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
import shutil
import subprocess
from typing import Any, Optional

__all__ = ["NVIDIA_SMI_QUERY", "parse_nvidia_smi_csv", "card_type", "inventory", "declared_cards",
           "gpu_refusal", "holdings", "fake_cards", "nvml_cards", "FAKE_MEMORY_GIB"]

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


FAKE_MEMORY_GIB = {"T4": 16, "L4": 24, "A10G": 24, "A10": 24, "L40S": 48, "A100": 80, "H100": 80, "H200": 141,
                   "B200": 180, "RTX4090": 24, "RTX-PRO-6000": 96}
"""Memory a fake card of a known type reports (GiB) when its ``SEQ_FAKE_GPUS`` entry gives none."""


MAX_FAKE_GIB = 4096          # the most memory a fake card may declare (GiB)


def fake_cards(entries: Any) -> list[dict]:
    """Cards for a fake inventory: one per entry of ``entries`` (``"L4,L4,H100"`` or a list),
    numbered from 0 in order. An entry is a card name (``L4``, ``NVIDIA H100 80GB HBM3``) or
    ``NAME=GIB`` to give its memory (else :data:`FAKE_MEMORY_GIB`'s, or unknown). Raises ValueError
    naming an entry that is empty, is no card name (``cpu``, a ``:`` count, other characters)
    or whose memory is not a finite number of GiB in (0, MAX_FAKE_GIB]."""
    items = entries.split(",") if isinstance(entries, str) else list(entries)
    cards = []
    for i, raw in enumerate(items):
        name, sep, mem = str(raw).partition("=")
        name = name.strip()
        if not name:
            raise ValueError(f"SEQ_FAKE_GPUS entry {i + 1} ({raw!r}) names no card; write card names separated "
                             f"by commas, e.g. SEQ_FAKE_GPUS=L4,L4,H100 (or L4=24 to give a card's memory in GiB)")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}", name) or name.lower() == "cpu":
            raise ValueError(f"SEQ_FAKE_GPUS entry {i + 1} ({raw!r}) is no card name: use letters, digits, spaces, "
                             f"'.', '_' or '-' (up to 64, not 'cpu', no ':' count), e.g. SEQ_FAKE_GPUS=L4,L4,H100")
        kind = card_type(name)
        gib: Optional[float] = FAKE_MEMORY_GIB.get(kind.upper())
        if sep:
            try:
                gib = float(mem)
            except ValueError:
                gib = -1.0
            if not (math.isfinite(gib) and 0 < gib <= MAX_FAKE_GIB):
                raise ValueError(f"SEQ_FAKE_GPUS entry {raw.strip()!r}: the memory after '=' must be a number of "
                                 f"GiB above 0 and at most {MAX_FAKE_GIB} (e.g. {name}=24)")
        cards.append({"index": i, "name": name, "type": kind, "memory_mib": None if gib is None else int(gib * 1024),
                      "uuid": f"GPU-fake-{i:04d}-{kind.lower()}", "processes": []})
    return cards


def nvml_cards(nvml: Any = None) -> list[dict]:
    """The machine's cards from NVML (``pynvml``, the ``nvidia-ml-py`` binding; ``nvml``: a module
    that behaves like it, for a test): index, name, type, memory, UUID and the pids of the compute
    processes on each card. Raises ImportError when the binding is not installed and
    ``pynvml.NVMLError`` when NVML cannot be read (no driver, no library)."""
    if nvml is None:
        import pynvml as nvml
    nvml.nvmlInit()
    try:
        cards = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name, uuid = nvml.nvmlDeviceGetName(h), nvml.nvmlDeviceGetUUID(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            try:
                memory: Optional[int] = int(nvml.nvmlDeviceGetMemoryInfo(h).total // 2**20)
            except nvml.NVMLError:
                memory = None
            try:
                procs = sorted({int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)})
            except nvml.NVMLError:
                procs = []
            cards.append({"index": i, "name": name, "type": card_type(name), "memory_mib": memory, "uuid": uuid,
                          "processes": procs})
        return cards
    finally:
        nvml.nvmlShutdown()


def _nvml_unread(exc: Exception) -> bool:
    """Whether NVML failed only because this machine has no NVIDIA driver or library (a CPU box:
    nothing to report) rather than a driver that answers wrong."""
    name = type(exc).__name__
    return isinstance(exc, ImportError) or name in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded",
                                                   "NVMLError_NotFound") or isinstance(exc, OSError)


def _smi_cards(binary: str) -> tuple[list[dict], Optional[str]]:
    try:
        res = subprocess.run([binary, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=10)
        if res.returncode != 0:
            return [], f"nvidia-smi exited {res.returncode}: {(res.stderr or res.stdout).strip()[:200]}"
        cards = parse_nvidia_smi_csv(res.stdout)
        for c in cards:
            c["processes"] = []
        return cards, None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return [], f"nvidia-smi could not be read: {exc}"


def inventory(nvidia_smi: Optional[str] = None, *, fake: Any = None, nvml: Any = None,
              use_nvml: bool = True) -> dict:
    """The machine's cards: ``{"source": "fake" | "nvml" | "nvidia-smi" | "cpu", "cards": [card
    dicts], "types": {type: count}, "cpu": {"cores": int, "memory_gib": float | None}, "error":
    str | None}``. ``fake``: ``SEQ_FAKE_GPUS``'s entries (:func:`fake_cards`; raises ValueError for
    a bad one); ``nvml``: a stand-in for ``pynvml``; ``use_nvml=False`` skips NVML; ``nvidia_smi``:
    the binary (default: ``nvidia-smi`` on the PATH). A source that fails is reported in ``error``
    (with no cards), never raised; a machine with no NVIDIA driver at all is a CPU box, no error."""
    cards: list[dict] = []
    errors: list[str] = []
    source = "cpu"
    if fake:
        cards, source = fake_cards(fake), "fake"
    else:
        if use_nvml:
            try:
                cards, source = nvml_cards(nvml), "nvml"
            except Exception as exc:  # noqa: BLE001 - NVML raises its own error classes; any is "unread"
                if not _nvml_unread(exc):
                    errors.append(f"NVML could not be read: {type(exc).__name__}: {exc}")
        binary = nvidia_smi or shutil.which("nvidia-smi")
        if source == "cpu" and binary:
            cards, err = _smi_cards(binary)
            if err is None:
                source, errors = "nvidia-smi", []
            else:
                errors.append(err)
    types: dict[str, int] = {}
    for c in cards:
        types[c["type"]] = types.get(c["type"], 0) + 1
    return {"source": source, "cards": cards, "types": types,
            "cpu": {"cores": os.cpu_count() or 1, "memory_gib": _memory_gib()}, "error": "; ".join(errors) or None}


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
