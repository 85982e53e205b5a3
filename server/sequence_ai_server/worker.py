"""The worker: one process hosting one ``@seq.policy`` class behind ``POST /act``.

Where it sits: the robot client calls ``/act`` here directly (the gateway only hands out this
worker's URL and direct secret). Per request the worker

  1. checks the bearer secret (constant-time),
  2. checks the observation against the ObservationContract *before* any inference (views,
     frame sizes, proprioception widths, instruction) and decodes each JPEG/PNG frame once,
  3. casts ``params`` to the types infer() declares (unknown names refused),
  4. runs infer() on the one policy thread (never on the event loop; one inference at a time),
  5. checks the returned chunk against the ActionContract (T x action_dim, finite), clips it
     into bounds / max_delta with warnings (or refuses it), and fills in action_space, robot and
     control_frequency_hz.

Startup: import the file, call ``load(weights_dir)`` once and ``warmup()`` if declared, then run
one synthetic observation (black frames, zero vectors) through the whole /act path -- a policy
that cannot answer it never serves. Then serve on 127.0.0.1 and write ``--ready-file``
atomically: ``{"port", "pid", "url", "load_s", ...}``. Beside it the worker keeps
``<ready-file>.phase`` (the current phase) and, on failure, ``<ready-file>.error``.

    python -m sequence_ai_server.worker --file policy.py [--class C] --port 0 \\
        --secret S --ready-file /tmp/w.json [--name N] [--weights-dir D] [--parent-pid PID]

The secret may come from ``$SEQ_WORKER_SECRET`` instead of ``--secret`` (keeps it out of ps).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import concurrent.futures
import hmac
import importlib.util
import inspect
import io
import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional, Union

import anyio
import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Header, Request, Response
from PIL import Image as PILImage
from pydantic import BaseModel, ConfigDict, ValidationError

import seq
from seq._params import ParamError, cast_params
from seq._policy import PolicySpec, get_spec, is_policy

from .errors import ApiError, install_error_handlers, new_request_id

__all__ = ["PolicyHost", "load_policy_class", "create_app", "main"]

log = logging.getLogger("sequence_ai_server.worker")

MAX_WARNINGS = 32
SYNTHETIC_INSTRUCTION = "synthetic check: hold still"


# ---------------------------------------------------------------- wire models

class ImageFrameIn(BaseModel):
    view: str
    data: str
    timestamp_ms: Optional[float] = None


class DepthFrameIn(BaseModel):
    """A depth map as a 16-bit PNG of millimetres."""
    view: str
    data: str
    timestamp_ms: Optional[float] = None


class ObservationIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    images: list[ImageFrameIn] = []
    depth: list[DepthFrameIn] = []
    proprioception: dict[str, Union[list[float], float]] = {}
    instruction: Optional[str] = ""


class ActRequest(BaseModel):
    observation: dict[str, Any]
    params: dict[str, Any] = {}
    episode_id: Optional[str] = None


class ActionChunkOut(BaseModel):
    actions: list[list[float]]
    action_space: Optional[str]
    robot: Optional[str]
    control_frequency_hz: Optional[float]
    open_loop_horizon: Optional[int] = None


class ActResponse(BaseModel):
    action_chunk: Optional[ActionChunkOut]
    warnings: list[str] = []
    inference_ms: float
    request_id: str
    outputs: Any = None          # only for a policy with no contract whose infer returns its own format


class PingResponse(BaseModel):
    status: str
    name: Optional[str] = None
    pid: int


# ---------------------------------------------------------------- loading a policy file

def load_policy_class(file: str, class_name: Optional[str] = None) -> type:
    """Import ``file`` (its directory goes on sys.path) and return its @seq.policy class:
    the named one, or the only one defined in that module."""
    path = Path(file).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"policy file not found: {path}")
    directory = str(path.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module_name = path.stem
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    if class_name:
        cls = getattr(module, class_name, None)
        if cls is None:
            raise LookupError(f"{path.name} has no class {class_name!r}")
        if not is_policy(cls):
            raise LookupError(f"{path.name}:{class_name} is not decorated with @seq.policy")
        return cls
    found = [obj for obj in vars(module).values() if is_policy(obj) and obj.__module__ == module.__name__]
    if not found:
        raise LookupError(f"{path.name} defines no @seq.policy class")
    if len(found) > 1:
        names = ", ".join(sorted(c.__name__ for c in found))
        raise LookupError(f"{path.name} defines several @seq.policy classes ({names}); name one with --class")
    return found[0]


# ---------------------------------------------------------------- observation checking + decoding

def _decode_frame(data: str, where: str, expect: Optional[tuple[int, int]], depth: bool = False) -> np.ndarray:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError("invalid_request", f"{where}: data is not valid base64",
                       hint="send each frame as base64 of JPEG or PNG bytes") from None
    try:
        img = PILImage.open(io.BytesIO(raw))
    except Exception:
        raise ApiError("invalid_request", f"{where}: data is not a JPEG or PNG image",
                       hint="encode each frame as JPEG (quality 95) or PNG, then base64") from None
    if img.format not in ("JPEG", "PNG"):
        raise ApiError("invalid_request", f"{where}: image format {img.format} is not accepted",
                       hint="encode each frame as JPEG or PNG")
    if expect is not None and img.size != expect:
        w, h = expect
        raise ApiError("invalid_request", f"{where}: frame is {img.size[0]}x{img.size[1]}, this policy reads {w}x{h}",
                       hint=f"resize the frame to {w}x{h} (width x height) before encoding it",
                       details={"view_size": list(img.size), "expected": [w, h]})
    try:
        if depth:
            arr = np.asarray(img, dtype=np.float32) / 1000.0     # millimetres -> metres
        else:
            arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except Exception as exc:
        raise ApiError("invalid_request", f"{where}: image could not be decoded ({exc})") from None
    return arr


def _proprio_array(values: Union[list[float], float]) -> np.ndarray:
    return np.atleast_1d(np.asarray(values, dtype=np.float64))


def parse_observation(raw: dict[str, Any], spec: PolicySpec, episode_id: Optional[str]) -> tuple[seq.Observation, list[str]]:
    """Check a wire observation against the contract (if declared) and decode it.
    Raises ApiError(invalid_request) naming what is wrong and what to do."""
    try:
        obs_in = ObservationIn.model_validate(raw)
    except ValidationError as exc:
        problems = [f"observation.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ApiError("invalid_request", "observation does not match the wire format: " + "; ".join(problems[:5]),
                       hint="see docs/design.md: images [{view, data}], proprioception {field: [floats]}, instruction",
                       details={"errors": problems}) from None
    contract = spec.observation
    warnings: list[str] = []
    frames: dict[str, list[ImageFrameIn]] = {}
    for frame in obs_in.images:
        frames.setdefault(frame.view, []).append(frame)
    depth_frames = {d.view: d for d in obs_in.depth}
    instruction = (obs_in.instruction or "")
    proprio: dict[str, np.ndarray] = {}
    for name, values in obs_in.proprioception.items():
        proprio[name] = _proprio_array(values)

    if contract is not None:
        declared = ", ".join(f"{v} ({c.width}x{c.height})" for v, c in contract.cameras.items()) or "none"
        missing = [v for v in contract.cameras if v not in frames]
        if missing:
            raise ApiError("invalid_request", f"missing view(s) {missing}; this policy reads: {declared}",
                           hint="send one frame per declared camera view, named exactly as declared",
                           details={"missing_views": missing, "declared_views": list(contract.cameras)})
        for view in list(frames):
            if view not in contract.cameras:
                warnings.append(f"view {view!r} is not declared by this policy and was ignored")
                del frames[view]
        n = contract.history
        for view, fs in frames.items():
            if len(fs) != n:
                raise ApiError("invalid_request", f"view {view!r} has {len(fs)} frame(s); this policy reads {n} per view (history={n})",
                               hint=f"send the last {n} frame(s) of each view, oldest first")
        missing_depth = [v for v, c in contract.cameras.items() if c.depth and v not in depth_frames]
        if missing_depth:
            raise ApiError("invalid_request", f"missing depth frame(s) for view(s) {missing_depth}",
                           hint="send observation.depth: [{view, data: base64 16-bit PNG of millimetres}]")
        for name, width in contract.proprio.items():
            if name not in proprio:
                raise ApiError("invalid_request",
                               f"missing proprioception.{name}; this policy reads {dict(contract.proprio)}",
                               hint=f"send proprioception.{name} as a list of {width} float(s)",
                               details={"missing_field": name})
            got = proprio[name].shape[0]
            if got != width:
                raise ApiError("invalid_request",
                               f"proprioception.{name} has {got} value(s); this policy reads {width}",
                               hint=f"send exactly {width} value(s) for {name}; declared: {dict(contract.proprio)}",
                               details={"field": name, "got": got, "expected": width})
            if not np.all(np.isfinite(proprio[name])):
                raise ApiError("invalid_request", f"proprioception.{name} contains NaN or infinity")
        if not instruction.strip():
            raise ApiError("invalid_request", "instruction is empty; this policy needs a task instruction",
                           hint='send observation.instruction, e.g. "put the red cube on the green pad"')

    images: dict[str, np.ndarray] = {}
    timestamps: dict[str, Optional[float]] = {}
    for view, fs in frames.items():
        cam = contract.cameras.get(view) if contract is not None else None
        expect = (cam.width, cam.height) if cam is not None else None
        arrays = [_decode_frame(f.data, f"view {view!r}", expect) for f in fs]
        images[view] = arrays[0] if (contract is None or contract.history == 1) and len(arrays) == 1 else np.stack(arrays)
        timestamps[view] = fs[-1].timestamp_ms
    depth: dict[str, np.ndarray] = {}
    for view, d in depth_frames.items():
        cam = contract.cameras.get(view) if contract is not None else None
        expect = (cam.width, cam.height) if cam is not None else None
        depth[view] = _decode_frame(d.data, f"depth {view!r}", expect, depth=True)
    obs = seq.Observation(images=images, proprio=proprio, instruction=instruction, episode_id=episode_id,
                          depth=depth, timestamps_ms=timestamps)
    return obs, warnings


# ---------------------------------------------------------------- checking the chunk

def _policy_error(detail: str, reason: str, **details: Any) -> ApiError:
    return ApiError("policy_error", detail, details={"reason": reason, **details},
                    hint="the chunk infer() returned does not fit the declared ActionContract")


def finish_chunk(result: Any, spec: PolicySpec) -> tuple[Optional[ActionChunkOut], list[str], Any]:
    """Validate infer's result against the ActionContract; clip or refuse. -> (chunk, warnings, outputs)."""
    if not isinstance(result, seq.ActionChunk):
        if spec.infer_mode == "raw" and spec.action is None:
            return None, [], result
        if isinstance(result, dict) and "actions" in result:
            result = seq.ActionChunk(result["actions"], result.get("open_loop_horizon"))
        elif isinstance(result, (np.ndarray, list, tuple)):
            result = seq.ActionChunk(result)
        else:
            raise _policy_error(f"infer() returned {type(result).__name__}; return seq.ActionChunk(actions=...)", "type")
    arr = np.array(result.actions, dtype=np.float64)
    action = spec.action
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise _policy_error(f"action chunk has shape {tuple(arr.shape)}; expected T x "
                            f"{action.action_dim if action else 'D'} with T >= 1", "shape", shape=list(arr.shape))
    if action is not None and arr.shape[1] != action.action_dim:
        raise _policy_error(f"action chunk rows have {arr.shape[1]} values; the contract declares action_dim={action.action_dim}",
                            "action_dim", shape=list(arr.shape))
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[:5].tolist()
        raise _policy_error(f"action chunk contains NaN or infinity at (step, dim) {bad}", "non_finite")
    olh = result.open_loop_horizon
    if olh is not None and not (1 <= olh <= arr.shape[0]):
        raise _policy_error(f"open_loop_horizon={olh} is outside 1..{arr.shape[0]} (the chunk's length)", "open_loop_horizon")
    warnings: list[str] = []
    if action is not None:
        violations: list[str] = []
        if action.bounds is not None:
            lo = np.array([b[0] for b in action.bounds])
            hi = np.array([b[1] for b in action.bounds])
            for t, d in np.argwhere((arr < lo) | (arr > hi)).tolist():
                violations.append(f"step {t} dim {d}: {arr[t, d]:.6g} outside [{lo[d]:.6g}, {hi[d]:.6g}]")
            arr = np.clip(arr, lo, hi)
        md = action.max_delta_per_dim()
        if md is not None:
            limit = np.array(md)
            for t in range(1, arr.shape[0]):
                step = arr[t] - arr[t - 1]
                over = np.abs(step) > limit
                if over.any():
                    for d in np.flatnonzero(over).tolist():
                        violations.append(f"step {t} dim {d}: moves {step[d]:.6g} from the previous step, max_delta {limit[d]:.6g}")
                    arr[t] = arr[t - 1] + np.clip(step, -limit, limit)
        if violations:
            if action.on_violation == "refuse":
                raise ApiError("policy_error", f"action chunk violates the declared limits: {violations[0]}"
                               + (f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""),
                               details={"reason": "bounds", "violations": violations[:MAX_WARNINGS]},
                               hint='the contract says on_violation="refuse"; use "clip" to clip instead')
            warnings = [f"clipped {v}" for v in violations[:MAX_WARNINGS]]
            if len(violations) > MAX_WARNINGS:
                warnings.append(f"... and {len(violations) - MAX_WARNINGS} more clipped values")
    chunk = ActionChunkOut(
        actions=arr.tolist(),
        action_space=action.action_space.value if action else None,
        robot=action.robot if action else None,
        control_frequency_hz=action.control_frequency_hz if action else None,
        open_loop_horizon=olh,
    )
    return chunk, warnings, None


def synthetic_observation(spec: PolicySpec) -> dict[str, Any]:
    """Black frames at each declared size, zero vectors of each declared width, an instruction."""
    contract = spec.observation
    images = []
    depth = []
    for view, cam in contract.cameras.items():
        buf = io.BytesIO()
        PILImage.new("RGB", (cam.width, cam.height)).save(buf, format="PNG")
        data = base64.b64encode(buf.getvalue()).decode()
        images.extend({"view": view, "data": data, "timestamp_ms": 0} for _ in range(contract.history))
        if cam.depth:
            buf = io.BytesIO()
            PILImage.fromarray(np.zeros((cam.height, cam.width), dtype=np.uint16)).save(buf, format="PNG")
            depth.append({"view": view, "data": base64.b64encode(buf.getvalue()).decode()})
    return {"images": images, "depth": depth,
            "proprioception": {k: [0.0] * w for k, w in contract.proprio.items()},
            "instruction": SYNTHETIC_INSTRUCTION}


# ---------------------------------------------------------------- the host

class PolicyError(Exception):
    """The policy's own code raised; carries the exception's name and traceback."""

    def __init__(self, exc: BaseException, tb: str, stage: str):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc
        self.exception_type = type(exc).__name__
        self.remote_traceback = tb
        self.stage = stage

    def to_api_error(self) -> ApiError:
        if isinstance(self.exc, seq.PolicyInputError):
            return ApiError("invalid_request", str(self.exc) or "the policy refused this input",
                            details={"exception_type": self.exception_type},
                            hint="the policy refused this observation; its message says why")
        return ApiError("policy_error", f"the policy raised {self.exception_type} in {self.stage}(): {self.exc}",
                        details={"exception_type": self.exception_type, "remote_traceback": self.remote_traceback},
                        hint="this is the policy's own error; fix it in the policy file (traceback in details.remote_traceback)")


class PolicyHost:
    """Holds one instance of the policy class; every call into policy code runs on one thread."""

    def __init__(self, cls: type, name: Optional[str] = None):
        self.cls = cls
        self.spec: PolicySpec = get_spec(cls)
        self.name = name or cls.__name__
        self.instance: Any = None
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy")
        self.episode_id: Optional[str] = None
        self.timings: dict[str, float] = {}

    def _method(self, stage: str):
        name = self.spec.methods.get(stage)
        return getattr(self.instance, name) if name else None

    def _call(self, stage: str, *args: Any, **kwargs: Any) -> Any:
        """Run on the policy thread (blocking); wraps the policy's exceptions in PolicyError."""
        def run():
            try:
                fn = self._method(stage)
                return fn(*args, **kwargs)
            except Exception as exc:
                raise PolicyError(exc, traceback.format_exc(), stage) from exc
        return self.executor.submit(run).result()

    def start(self, weights_dir: str, phase=lambda p: None) -> None:
        """Construct, load, warm up, and prove the policy on one synthetic observation."""
        t0 = time.monotonic()
        phase("loading")
        def construct():
            self.instance = self.cls()
        self.executor.submit(construct).result()
        self._call("load", weights_dir)
        self.timings["load_s"] = time.monotonic() - t0
        if "warmup" in self.spec.methods:
            phase("warmup")
            t1 = time.monotonic()
            self._call("warmup")
            self.timings["warmup_s"] = time.monotonic() - t1
        if self.spec.observation is not None:
            phase("checking")
            t2 = time.monotonic()
            try:
                self.act_blocking({"observation": synthetic_observation(self.spec)})
            except PolicyError as exc:
                if not isinstance(exc.exc, seq.PolicyInputError):
                    raise
                log.info("synthetic check: the policy refused the synthetic input (%s); accepted", exc)
            except ApiError as exc:
                raise RuntimeError(f"synthetic /act check failed: {exc.detail}") from exc
            self.timings["check_s"] = time.monotonic() - t2
            self.episode_id = None

    def prepare(self, body: ActRequest) -> tuple[Any, dict[str, Any], list[str]]:
        """Check and decode the request (any thread). -> (observation, params, warnings)."""
        try:
            params = cast_params(self.spec.params, body.params)
        except ParamError as exc:
            raise ApiError("invalid_request", str(exc), details={"param": exc.name,
                           "declared": [p.to_dict() for p in self.spec.params]},
                           hint="send only the params infer() declares (seq policy status lists them)") from None
        if self.spec.infer_mode == "raw":
            return body.observation, params, []
        obs, warnings = parse_observation(body.observation, self.spec, body.episode_id)
        return obs, params, warnings

    def infer(self, obs: Any, params: dict[str, Any], episode_id: Optional[str]) -> tuple[Any, float]:
        """On the policy thread: episode boundary, then infer. -> (result, inference seconds)."""
        def run():
            if episode_id is not None and episode_id != self.episode_id:
                if "on_episode" in self.spec.methods:
                    try:
                        self._method("on_episode")(episode_id)
                    except Exception as exc:
                        raise PolicyError(exc, traceback.format_exc(), "on_episode") from exc
                self.episode_id = episode_id
            t0 = time.perf_counter()
            try:
                result = self._method("infer")(obs, **params)
            except Exception as exc:
                raise PolicyError(exc, traceback.format_exc(), "infer") from exc
            return result, time.perf_counter() - t0
        return self.executor.submit(run)

    def act_blocking(self, raw_body: dict[str, Any]) -> ActResponse:
        body = ActRequest.model_validate(raw_body)
        obs, params, warnings = self.prepare(body)
        result, seconds = self.infer(obs, params, body.episode_id).result()
        chunk, more, outputs = finish_chunk(result, self.spec)
        return ActResponse(action_chunk=chunk, warnings=warnings + more, inference_ms=seconds * 1000.0,
                           request_id=new_request_id(), outputs=outputs)

    def stop(self, timeout: float = 10.0) -> None:
        if self.instance is not None and "shutdown" in self.spec.methods:
            try:
                fut = self.executor.submit(self._method("shutdown"))
                fut.result(timeout=timeout)
            except Exception:
                log.exception("@seq.shutdown raised")
        self.executor.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------- the app

def create_app(host: PolicyHost, secret: str) -> FastAPI:
    expected = secret.encode()

    def require_secret(authorization: Optional[str] = Header(default=None)) -> None:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token or not hmac.compare_digest(token.strip().encode(), expected):
            raise ApiError("unauthorized", "missing or wrong direct secret",
                           hint="reconnect through the gateway (POST /v1/connect) for fresh worker coordinates")

    router = APIRouter()

    @router.get("/ping", response_model=PingResponse)
    async def ping() -> PingResponse:
        return PingResponse(status="ready", name=host.name, pid=os.getpid())

    @router.get("/info")
    async def info() -> dict:
        d = host.spec.to_dict()
        return {"name": host.name, "class_name": d["class_name"], "contract": d["contract"], "params": d["params"]}

    @router.post("/act", response_model=ActResponse, dependencies=[Depends(require_secret)])
    async def act(body: ActRequest, request: Request, response: Response) -> ActResponse:
        rid = request.state.request_id
        try:
            obs, params, warnings = await anyio.to_thread.run_sync(host.prepare, body)
            result, seconds = await asyncio.wrap_future(host.infer(obs, params, body.episode_id))
        except PolicyError as exc:
            log.warning("%s %s", rid, exc)
            raise exc.to_api_error() from None
        chunk, more, outputs = finish_chunk(result, host.spec)
        if more:
            log.info("%s clipped: %s", rid, more[0])
        response.headers["X-Request-ID"] = rid
        return ActResponse(action_chunk=chunk, warnings=warnings + more, inference_ms=round(seconds * 1000.0, 3),
                           request_id=rid, outputs=outputs)

    app = FastAPI(title=f"sequence-ai worker: {host.name}", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def request_id(request: Request, call_next):
        incoming = request.headers.get("x-request-id", "")
        ok = 0 < len(incoming) <= 64 and all(c.isalnum() or c in "-_." for c in incoming)
        request.state.request_id = incoming if ok else new_request_id()
        return await call_next(request)

    install_error_handlers(app)
    app.include_router(router)
    return app


# ---------------------------------------------------------------- process entry point

def _write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _resolve_weights_dir(spec: PolicySpec, file: str, weights_dir: str) -> Any:
    """A local directory named by weights= is handed to load as is; otherwise the deployment's
    own directory (created, nothing copied). Named parts -> {part: directory}."""
    def one(ref: Any, part: Optional[str]) -> str:
        if isinstance(ref, str):
            local = ref[len("file://"):] if ref.startswith("file://") else ref
            if "://" not in local:
                p = Path(local) if Path(local).is_absolute() else Path(file).resolve().parent / local
                if p.is_dir():
                    return str(p)
                raise FileNotFoundError(f"weights directory not found: {p}")
            log.warning("weights %s are not fetched by a self-hosted worker; load() gets %s", ref, weights_dir)
        d = Path(weights_dir) / part if part else Path(weights_dir)
        d.mkdir(parents=True, exist_ok=True)
        return str(d)
    if isinstance(spec.weights, dict):
        return {part: one(ref, part) for part, ref in spec.weights.items()}
    if spec.weights is None:
        Path(weights_dir).mkdir(parents=True, exist_ok=True)
        return weights_dir
    return one(spec.weights, None)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sequence_ai_server.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--file", required=True, help="the policy file")
    parser.add_argument("--class", dest="class_name", default=None, help="the @seq.policy class (if the file has several)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = an ephemeral port")
    parser.add_argument("--secret", default=None, help="direct secret (or $SEQ_WORKER_SECRET)")
    parser.add_argument("--ready-file", required=True, help="written atomically once serving: {port, pid, ...}")
    parser.add_argument("--name", default=None)
    parser.add_argument("--weights-dir", default=None, help="the deployment's weights directory")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process goes away")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s worker %(levelname)s %(message)s")
    secret = args.secret or os.environ.get("SEQ_WORKER_SECRET")
    if not secret:
        parser.error("a direct secret is required: --secret or $SEQ_WORKER_SECRET")
    ready_file = os.path.abspath(args.ready_file)
    phase_file, error_file = ready_file + ".phase", ready_file + ".error"
    for stale in (ready_file, error_file):
        if os.path.exists(stale):
            os.remove(stale)

    # A SIGTERM while loading ends the process at once: load may hold the policy thread for minutes.
    def stop_now(signum, frame):
        log.info("signal %d while starting; exiting", signum)
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, stop_now)
    signal.signal(signal.SIGINT, stop_now)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    state: dict[str, Any] = {"pid": os.getpid(), "port": port, "name": args.name}

    def phase(name: str, **extra: Any) -> None:
        state.update(phase=name, t=time.time(), **extra)
        log.info("phase=%s", name)
        _write_json_atomic(phase_file, state)

    current = "importing"
    host: Optional[PolicyHost] = None
    try:
        phase("importing")
        cls = load_policy_class(args.file, args.class_name)
        host = PolicyHost(cls, args.name)
        phase("importing", spec=host.spec.to_dict())
        weights_dir = _resolve_weights_dir(host.spec, args.file, args.weights_dir or
                                           os.path.join(os.path.expanduser("~/.sequence-ai"), "weights", args.name or cls.__name__))

        def track(p: str) -> None:
            nonlocal current
            current = p
            phase(p)
        host.start(weights_dir, track)
    except BaseException as exc:  # noqa: BLE001 - report anything that stops the start, then exit
        inner = exc.exc if isinstance(exc, PolicyError) else exc
        tb = exc.remote_traceback if isinstance(exc, PolicyError) else traceback.format_exc()
        detail = f"{type(inner).__name__}: {inner}"
        log.error("failed while %s: %s\n%s", current, detail, tb)
        _write_json_atomic(error_file, {"phase": current, "exception_type": type(inner).__name__,
                                        "detail": detail, "traceback": tb})
        phase("failed")
        sys.stdout.flush()
        os._exit(3)

    app = create_app(host, secret)
    config = uvicorn_config(app)
    import uvicorn
    server = uvicorn.Server(config)
    # After serving, uvicorn re-raises the signal it caught: make that a no-op.
    signal.signal(signal.SIGTERM, lambda s, f: None)
    signal.signal(signal.SIGINT, lambda s, f: None)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        if server.started:
            url = f"http://{args.host}:{port}"
            phase("ready")
            _write_json_atomic(ready_file, {"port": port, "pid": os.getpid(), "url": url, **host.timings,
                                            "spec": host.spec.to_dict()})
            log.info("serving %s on %s", host.name, url)
        if args.parent_pid:
            async def watch_parent() -> None:
                while not server.should_exit:
                    if os.getppid() != args.parent_pid:
                        log.warning("parent %d went away; stopping", args.parent_pid)
                        server.should_exit = True
                    await asyncio.sleep(0.5)
            asyncio.create_task(watch_parent())
        await task

    try:
        asyncio.run(serve())
    finally:
        log.info("stopping: calling @seq.shutdown")
        host.stop()
        log.info("stopped")
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


def uvicorn_config(app: FastAPI):
    import uvicorn
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                          timeout_graceful_shutdown=5)


if __name__ == "__main__":
    sys.exit(main())
