"""The gateway's request and response bodies (pydantic models), shared by the routers and the
services behind them; docs/design.md gives each route's body."""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, StrictFloat, StrictInt

__all__ = ["DeployRequest", "Deployment", "DeploymentList", "ModelEntry", "ModelList", "ConnectRequest",
           "SecretSet", "WorkerSecretsRequest", "ParamsUpdate", "RollbackRequest", "VolumeUpload",
           "TrafficUpdate", "KeyCreate", "Lease", "ConnectResponse"]


class DeployRequest(BaseModel):
    name: str
    file: str
    class_name: Optional[str] = None


class Deployment(BaseModel):
    name: str
    version: int
    status: str                      # starting | ready | failed | stopped
    phase: Optional[str] = None      # spawning | importing | loading | warmup | checking | ready | failed | stopped
    worker_url: Optional[str] = None
    error: Optional[str] = None
    load_s: Optional[float] = None
    file: str
    class_name: Optional[str] = None
    pid: Optional[int] = None
    started_at: Optional[float] = None
    ready_at: Optional[float] = None
    contract: Optional[dict[str, Any]] = None
    params: list[dict[str, Any]] = []
    spec: Optional[dict[str, Any]] = None
    details: Optional[dict[str, Any]] = None
    build: Optional[dict[str, Any]] = None     # the version building beside the serving one (or the last one that did)
    health: Optional[dict[str, Any]] = None    # a jammed worker seen by the health check: state jammed | replaced
    stopped_at: Optional[float] = None          # `seq policy stop` (unix s): connects refused until `seq policy start`
    sessions: Optional[list[dict[str, Any]]] = None   # GET one deployment: each connected robot and what it runs with
    workers: Optional[list[dict[str, Any]]] = None    # GET one deployment: each serving worker, its cards, slots and robots


class DeploymentList(BaseModel):
    deployments: list[Deployment]


class ModelEntry(BaseModel):
    """One catalogue row; the fields after ``params`` are read off the contract (catalogue.py)."""
    name: str
    version: Optional[int]
    status: str
    contract: Optional[dict[str, Any]]
    params: list[dict[str, Any]]
    short_id: str
    kind: str                                   # model | template
    template_kind: Optional[str] = None         # policy (a template's kind)
    endpoint: Optional[str] = None              # act; None for a template (deploy it first)
    description: Optional[str] = None
    camera_views: Optional[list[str]] = None
    state_dim: Optional[int] = None
    state_layout: Optional[dict[str, int]] = None
    action_dim: Optional[int] = None
    action_space: Optional[str] = None
    action_semantics: Optional[str] = None
    robot: Optional[str] = None
    control_frequency_hz: Optional[float] = None
    client_resize: Optional[dict[str, Any]] = None
    input_aspect_ratio: Optional[float] = None
    input_resize: Optional[str] = None
    history: Optional[int] = None
    pass_raw: bool = True
    delay_modes: Optional[list[str]] = None     # chunk | guided | trained (ActionContract.delay_modes)
    max_delay_steps: Optional[int] = None       # control steps; None: no declared limit


class ModelList(BaseModel):
    models: list[ModelEntry]


class ConnectRequest(BaseModel):
    model: str
    params: dict[str, Any] = {}
    ticket: Optional[str] = None     # a queued robot's place in line (details.ticket of a 503 queued)
    # chunks/s this robot will ask for (admission.py); None: from the contract. Strict: "5" or true
    # is refused naming the field, not read as a number
    request_hz: Optional[Union[StrictInt, StrictFloat]] = None


class SecretSet(BaseModel):
    env: dict[str, str]


class WorkerSecretsRequest(BaseModel):
    names: list[str]


class ParamsUpdate(BaseModel):
    set: dict[str, Any] = {}
    clear: list[str] = []


class RollbackRequest(BaseModel):
    to: Optional[int] = None


class VolumeUpload(BaseModel):
    """``seq volume put``: the manifest of a directory, ``[{"path", "size", "md5"}]`` (volumes.py)."""
    files: list[dict[str, Any]]


class TrafficUpdate(BaseModel):
    """``seq policy traffic``: one of a split (``{"v5": 10, "v4": 90}``), a pin, an unpin or clear."""
    split: Optional[dict[str, Any]] = None   # shares are checked by traffic.parse_split
    pin: Optional[str] = None          # key id or name (a key bound to this deployment)
    version: Optional[str] = None      # the pin's version, "v5" or "5"
    unpin: Optional[str] = None
    clear: bool = False


class KeyCreate(BaseModel):
    name: Optional[str] = None
    deployment: Optional[str] = None


class Lease(BaseModel):
    ttl_s: float
    expires_at: float
    epoch: int


class ConnectResponse(BaseModel):
    session_id: str
    worker_url: str
    direct_secret: str
    lease: Lease
    contract: dict[str, Any]
    params: dict[str, Any]
    version: int
