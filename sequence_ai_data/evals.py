"""The eval records: one folder per eval under ``<data_dir>/evals/<id>/``.

    eval.json        the record: layout, parameters, status, progress, gates, the final report
    episodes.jsonl   one line per finished episode (arm, task, seed, metrics, timings, video)
    cancel           present once ``seq eval cancel`` asked the runner to stop
    videos/          GIFs of the episodes, when ``--videos`` was given

Plain JSON written atomically (write + rename), so ``seq eval status`` can read while a run
writes. The eval runner (``sequence_ai_eval.runner``) writes them, ``seq eval`` reads them, and
the gateway's ``GET /v1/account`` counts the running ones; the gateway's database is not touched.
Standard library only.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Iterator, Optional

__all__ = ["EvalStore", "EvalNotFound"]


class EvalNotFound(KeyError):
    """No eval with that id in this data directory."""


class EvalStore:
    """Evals under ``<data_dir>/evals``. Ids look like ``ev-20261130-033128-3f9a``."""

    def __init__(self, data_dir: Path):
        self.root = Path(data_dir).expanduser() / "evals"

    def new_id(self) -> str:
        return f"ev-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"

    def folder(self, eval_id: str) -> Path:
        """``<root>/<eval_id>``; an id that could name anything else (empty, a ``/``, ``\\`` or NUL in
        it, a leading dot, ``..``) is EvalNotFound, so no command reaches outside ``root``."""
        if not eval_id or any(c in eval_id for c in "/\\\x00") or eval_id.startswith("."):
            raise EvalNotFound(eval_id)
        return self.root / eval_id

    def create(self, record: dict) -> dict:
        folder = self.folder(record["id"])
        folder.mkdir(parents=True, exist_ok=False)
        (folder / "episodes.jsonl").touch()
        self._write(folder / "eval.json", record)
        return record

    def load(self, eval_id: str) -> dict:
        path = self.folder(eval_id) / "eval.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise EvalNotFound(eval_id) from None

    def update(self, eval_id: str, **fields: Any) -> dict:
        record = self.load(eval_id)
        record.update(fields)
        self._write(self.folder(eval_id) / "eval.json", record)
        return record

    def add_episode(self, eval_id: str, episode: dict) -> None:
        with open(self.folder(eval_id) / "episodes.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(episode) + "\n")

    def episodes(self, eval_id: str) -> list[dict]:
        path = self.folder(eval_id) / "episodes.jsonl"
        if not path.exists():
            raise EvalNotFound(eval_id)
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def request_cancel(self, eval_id: str) -> None:
        self.load(eval_id)
        (self.folder(eval_id) / "cancel").write_text(str(time.time()))

    def cancel_requested(self, eval_id: str) -> bool:
        return (self.folder(eval_id) / "cancel").exists()

    def all(self, policy: Optional[str] = None) -> Iterator[dict]:
        """Every eval, newest first; only those that ran ``policy`` (any arm) when given."""
        if not self.root.is_dir():
            return
        for folder in sorted(self.root.iterdir(), reverse=True):
            try:
                record = json.loads((folder / "eval.json").read_text())
            except (OSError, ValueError):
                continue
            if policy and policy not in {a["policy"] for a in record.get("arms", [])}:
                continue
            yield record

    @staticmethod
    def _write(path: Path, data: dict) -> None:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, path)
