"""The capture routes: a deployment's capture settings, what its workers kept, the export of it,
and episode labels (capture.py keeps the files, capture_export.py writes the exports).

* ``GET  /v1/deployments/{name}/capture``         (any key; a robot key its own deployment)
  settings and what is kept (retention is enforced first)
* ``PUT  /v1/deployments/{name}/capture``         (account key) ``{"rate", "images",
  "retention_days"}`` or ``{"off": true}``
* ``POST /v1/deployments/{name}/capture/export``  (account key) ``{"format", "out", "version",
  "mode", "fps"}``: writes on the gateway's machine (self-hosted: the CLI's machine); ``out``
  follows :func:`~sequence_ai_server.gateway.capture_export.check_export_target`
* ``POST /v1/episodes/{episode_id}/label``        (any key; a robot key its own deployment)
  ``{"model", "success", "notes"}``
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from sequence_ai_server.worker.capture import DEFAULT_RETENTION_DAYS, CaptureConfig, CaptureError, capture_dir, prune, summary, write_label
from sequence_ai_server.gateway.capture_export import DEFAULT_LEROBOT_VERSION, ExportRefused, export_jsonl, export_lerobot
from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.keys import require_scope
from sequence_ai_server.gateway.routes import Auth

if TYPE_CHECKING:
    from sequence_ai_server.gateway.deployments import DeploymentService

__all__ = ["router", "CaptureSet", "ExportReq", "LabelReq"]


class CaptureSet(BaseModel):
    """PUT /v1/deployments/{name}/capture: rate 0<r<=1, images, retention_days (d), or off."""
    rate: Optional[float] = None
    images: bool = False
    retention_days: float = DEFAULT_RETENTION_DAYS
    off: bool = False


class ExportReq(BaseModel):
    """POST .../capture/export: format lerobot|jsonl, out (absolute dir), version 2.1 (default)|3.0, mode new|append|overwrite, fps (Hz)."""
    format: str = "lerobot"
    out: str
    version: str = DEFAULT_LEROBOT_VERSION
    mode: str = "new"
    fps: Optional[float] = None


class LabelReq(BaseModel):
    """POST /v1/episodes/{episode_id}/label: the deployment, success, notes."""
    model: str
    success: bool
    notes: str = ""


def _new_config(body: CaptureSet, old: CaptureConfig) -> CaptureConfig:
    """The settings ``body`` asks for (``off`` keeps the old rate, images and retention).
    Raises ApiError invalid_request for a rate outside (0, 1] or a retention <= 0 days."""
    if body.off:
        return CaptureConfig(False, old.rate, old.images, old.retention_days, time.time())
    if body.rate is None or not 0.0 < body.rate <= 1.0:
        raise ApiError("invalid_request", f"--rate must be in (0, 1], got {body.rate}",
                       hint="e.g. --rate 0.1 keeps one episode in ten; --off stops capture")
    if not body.retention_days > 0:
        raise ApiError("invalid_request", f"--retention-days must be > 0, got {body.retention_days}",
                       hint="the default is 30 days")
    return CaptureConfig(True, body.rate, body.images, body.retention_days, time.time())


def _export(d: Path, body: ExportReq, data_dir: Path) -> dict:
    """Run one export of the kept files in ``d`` (pruned first). Raises CaptureError for an
    unknown format, and what export_jsonl / export_lerobot raise."""
    prune(d, CaptureConfig.load(d).retention_days)
    if body.format == "jsonl":
        return export_jsonl(d, body.out, body.mode, data_dir=data_dir)
    if body.format == "lerobot":
        return export_lerobot(d, body.out, version=body.version, mode=body.mode, fps=body.fps, data_dir=data_dir)
    raise CaptureError(f"--format must be lerobot or jsonl, got {body.format!r}")


async def _export_answer(run: Callable[[], dict], out: str) -> dict:
    """``run()`` in a thread; every refusal is ApiError invalid_request naming ``out`` (a bad
    target, no kept episodes, a non-empty folder, a file system that refused the write)."""
    from sequence_ai_data.episode import ExportError
    try:
        return await asyncio.to_thread(run)
    except ExportRefused as exc:
        raise ApiError("invalid_request", str(exc), hint="nothing was written or deleted",
                       details={"reason": "export_target", "out": out}) from None
    except (ExportError, CaptureError) as exc:
        raise ApiError("invalid_request", str(exc),
                       hint="--overwrite replaces an earlier export" if "not empty" in str(exc) else None) from None
    except OSError as exc:   # the target's file system refused (permissions, space, ...)
        raise ApiError("invalid_request", f"could not write the export to {out}: {type(exc).__name__}: {exc}",
                       hint="an earlier export there is left as it was; check the folder's permissions and free space",
                       details={"reason": "export_write", "out": out}) from None


def router(deployments: "DeploymentService", auth: Auth) -> APIRouter:
    """The capture routes over ``deployments``' capture folders (see the module docstring)."""
    capture_router = APIRouter(tags=["capture"])
    export_lock = threading.Lock()   # one export at a time: two into one folder would race the swap

    def where(name: str) -> Path:
        deployments.require(name)
        return capture_dir(deployments.data_dir, name)

    def show(name: str) -> dict:
        d = where(name)
        prune(d, CaptureConfig.load(d).retention_days)
        return {"name": name, **summary(d)}

    @capture_router.get("/v1/deployments/{name}/capture")
    async def get_capture(name: str, key: Any = Depends(auth.require_key)) -> dict:
        require_scope(key, name)
        return await asyncio.to_thread(show, name)

    @capture_router.put("/v1/deployments/{name}/capture")
    async def set_capture(name: str, body: CaptureSet, key: Any = Depends(auth.account_key)) -> dict:
        d = where(name)
        await asyncio.to_thread(_new_config(body, CaptureConfig.load(d)).save, d)
        return await asyncio.to_thread(show, name)

    @capture_router.post("/v1/deployments/{name}/capture/export")
    async def export(name: str, body: ExportReq, key: Any = Depends(auth.account_key)) -> dict:
        d = where(name)

        def run() -> dict:
            with export_lock:
                return _export(d, body, deployments.data_dir)
        return {"name": name, **await _export_answer(run, body.out)}

    @capture_router.post("/v1/episodes/{episode_id}/label")
    async def label(episode_id: str, body: LabelReq, key: Any = Depends(auth.require_key)) -> dict:
        require_scope(key, body.model)
        if not 0 < len(episode_id) <= 128:
            raise ApiError("invalid_request", "episode_id must be 1 to 128 characters")
        d = where(body.model)
        try:
            kept = await asyncio.to_thread(write_label, d, episode_id, body.success, body.notes)
        except CaptureError as exc:
            raise ApiError("invalid_request", str(exc), details={"reason": "label_limit"}) from None
        return {"episode_id": episode_id, "model": body.model, "success": body.success, "kept": kept}

    return capture_router
