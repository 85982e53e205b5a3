"""The openpi-compatible endpoint: a deployed policy reachable by openpi's own websocket client.

An unmodified ``openpi_client.websocket_client_policy.WebsocketClientPolicy(host, port,
api_key=...)`` connects to ``ws://host:port/`` (the worker's port, path ``/``). The protocol is
openpi's (``../shared/peers/openpi/websocket_policy_server.py``): the server's first message is
the msgpack metadata dict; then each binary message is one observation dict packed with openpi's
msgpack-numpy convention and is answered with one action dict (``{"actions": float32 (H, D),
"server_timing": {"infer_ms": ...}}``). What differs, on purpose:

* credentials: the ``Authorization`` header (openpi sends ``Api-Key <key>``; ``Bearer`` works
  too) must carry the direct secret -- a lease token from ``POST /v1/connect`` or the worker
  secret -- checked before the websocket is accepted (a refusal is HTTP 401) and again for each
  observation (an expired or ended lease is refused from then on);
* errors: a text message holding the common error body (``{"detail", "code", ...}``, the codes
  of HTTP /act); openpi's client raises it as ``RuntimeError``. The connection stays open;
* limits: a message over the worker's body limit is refused (``payload_too_large``); only bool,
  integer, float and text dtypes are read (object / void: no pickle), arrays whose bytes do not
  match their shape and dicts nested over ``MAX_DEPTH`` are refused;
* one connection is one episode (``@seq.on_episode`` runs when it closes);
* open connections: they share the worker's budget with the /act channel
  (``connections.ConnectionBudget``, ``--max-connections``, default 64); past it the upgrade is
  refused with HTTP 503 ``too_many_connections`` before it is accepted (openpi's client raises
  ``InvalidStatus``), and a closed connection frees its place;
* metering: each observation answered (actions or an error) is counted in the worker's
  ``meter.ActMeter`` like an HTTP /act (status, message bytes in and out, time to answer); an
  answer that could not be sent because the client went away is counted with status 0 (an
  error: nothing delivered) and no bytes out, as on the /act channel.

The observation dict is mapped through the policy's contract (docs/openpi.md): nested dicts are
flattened to ``/``-joined keys; a declared camera view ``v`` takes the key ``v`` or one ending in
``/v`` (``observation/exterior_image_1_left``, ``images/cam_high``), HWC or CHW ``uint8`` (float
images in [0, 1] are scaled); a declared proprioception field ``f`` takes the key ``f`` or ending in
``/f``, else one ``state`` vector is split over the declared fields in their declared order;
``prompt`` is the instruction. Without a declared contract every 3-D array is a view and every
1-D one a proprioception field, named by the key's last part.

The credentials, the size limit, the metering and the rest of the request after decoding are the
act pipeline's (``act.py``), as on HTTP /act and the /act channel.
"""
from __future__ import annotations

import logging
import math
import random
import time
from typing import Any, Optional

import msgpack
import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

import seq
from seq.spec import cast_params

from sequence_ai_server.common.errors import ApiError, new_request_id
from sequence_ai_server.worker.act import ActPipeline, run_prepared
from sequence_ai_server.worker.host import Prepared

__all__ = ["add_openpi_endpoint", "OPENPI_PATH", "packb", "unpackb", "observation_from_openpi"]

log = logging.getLogger("sequence_ai_server.worker")

OPENPI_PATH = "/"
_CONTENT_TYPE = "application/msgpack"     # what a message is, for the pipeline's checks (no JSON in it)
_SCHEMES = ("bearer", "api-key")          # openpi's client sends `Authorization: Api-Key <key>`
_WHERE = "the openpi endpoint"
_HINT = "see docs/openpi.md for how openpi observation keys map onto the policy's contract"


# ---------------------------------------------------------------- openpi's msgpack-numpy convention

def _pack_array(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in ("V", "O", "c"):
        raise ValueError(f"unsupported dtype {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


# dtype kinds an incoming array or scalar may have: bool, integers, floats, and text (a prompt);
# object and void would mean pickle, complex / datetime / timedelta are no observation
_ARRAY_KINDS = "biufUS"
# how deep an observation's dicts may nest (openpi's own are two levels deep)
MAX_DEPTH = 16


# dtype text -> the accepted np.dtype: a message's three or four arrays look theirs up, not parse them
_DTYPES: dict[str, np.dtype] = {}


def _dtype(text: Any, what: str) -> np.dtype:
    dtype = _DTYPES.get(text) if isinstance(text, str) else None
    if dtype is None:
        dtype = np.dtype(text)
        if dtype.kind not in _ARRAY_KINDS:
            raise ValueError(f"{what} dtype {dtype} is not accepted (numbers only)")
        if isinstance(text, str) and len(_DTYPES) < 64:
            _DTYPES[text] = dtype
    return dtype


def _unpack_array(obj: dict) -> Any:
    try:
        if b"__ndarray__" in obj:
            dtype = _dtype(obj[b"dtype"], "array")
            shape = tuple(map(int, obj[b"shape"]))
            data = obj[b"data"]
            if type(data) is not bytes or any(n < 0 for n in shape) \
                    or math.prod(shape) * dtype.itemsize != len(data):
                raise ValueError(f"array of shape {shape} and dtype {dtype} does not match its "
                                 f"{len(data) if isinstance(data, bytes) else type(data).__name__} data bytes")
            return np.frombuffer(data, dtype=dtype).reshape(shape)
        if b"__npgeneric__" in obj:
            return _dtype(obj[b"dtype"], "scalar").type(obj[b"data"])
    except KeyError as exc:
        raise ValueError(f"an encoded numpy value lacks its {exc.args[0]!r} field") from None
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"an encoded numpy value is malformed ({exc})") from None
    return obj


def packb(obj: Any) -> bytes:
    """msgpack with openpi's ndarray convention (``{__ndarray__, data, dtype, shape}``)."""
    return msgpack.packb(obj, default=_pack_array)


def unpackb(data: bytes) -> Any:
    """The inverse of ``packb``; raises ValueError for a dtype other than bool, integer, float or
    text, a size mismatch, or a malformed ``__ndarray__`` / ``__npgeneric__`` map."""
    return msgpack.unpackb(data, object_hook=_unpack_array)


# ---------------------------------------------------------------- the mapping

def _flatten(obj: dict, prefix: str = "", depth: int = 0) -> dict[str, Any]:
    if depth >= MAX_DEPTH:
        raise ApiError("invalid_request", f"the observation nests dicts more than {MAX_DEPTH} deep (at {prefix!r})",
                       hint=_HINT, details={"max_depth": MAX_DEPTH})
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        key = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/", depth + 1))
        else:
            flat[prefix + key] = value
    return flat


def _find(flat: dict[str, Any], name: str) -> Optional[str]:
    if name in flat:
        return name
    hits = [k for k in flat if k.endswith("/" + name)]
    return hits[0] if len(hits) == 1 else None


def _image(value: Any, key: str, size: Optional[tuple[int, int]]) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
        arr = arr.transpose(1, 2, 0)                       # CHW (openpi's ALOHA) -> HWC
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3):
        raise ApiError("contract_mismatch", f"{key!r}: an image must be HxWx3 or 3xHxW, got shape {list(arr.shape)}",
                       hint=_HINT)
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ApiError("invalid_request", f"{key!r}: a float image holds NaN or inf", hint="send values in [0, 1]")
        arr = (np.clip(arr, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    elif arr.dtype != np.uint8:
        raise ApiError("contract_mismatch", f"{key!r}: image dtype {arr.dtype} is not uint8 (or float in [0, 1])",
                       hint=_HINT)
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    if size is not None and (arr.shape[1], arr.shape[0]) != size:
        raise ApiError("contract_mismatch", f"{key!r}: frame is {arr.shape[1]}x{arr.shape[0]}, this policy reads "
                       f"{size[0]}x{size[1]}", hint="resize it client-side (openpi_client.image_tools.resize_with_pad)",
                       details={"view_size": [arr.shape[1], arr.shape[0]], "expected": list(size)})
    return np.ascontiguousarray(arr)


def _vector(value: Any, key: str) -> np.ndarray:
    arr = np.asarray(value)
    kind = arr.dtype.kind
    if kind not in "biuf":
        raise ApiError("contract_mismatch", f"{key!r}: a proprioception vector must hold numbers, got dtype {arr.dtype}",
                       hint=_HINT)
    if kind == "f" and not np.isfinite(arr).all():     # integers and booleans are always finite
        raise ApiError("invalid_request", f"{key!r} holds NaN or inf", hint="send finite values")
    return arr.astype(np.float32).reshape(-1)


def _layout(flat: dict[str, Any], contract: Any) -> tuple:
    """Where this key set's declared views and proprioception come from -> (views: [(view, key,
    (width, height) or None)], widths: {field: width}, fields: ((field, key), ...) or None,
    state_key: the key of the one ``state`` vector split over the fields, or None). It depends on
    the keys alone, so a connection works it out once per key set. Raises
    ApiError(contract_mismatch) for a view or field no key provides."""
    views = []
    for view, cam in contract.cameras.items():
        key = _find(flat, view)
        if key is None:
            raise ApiError("contract_mismatch", f"no openpi key for camera view {view!r}", hint=_HINT,
                           details={"view": view, "keys": sorted(flat)})
        views.append((view, key, (cam.width, cam.height) if cam.width else None))
    widths = dict(contract.proprio)
    found = {f: _find(flat, f) for f in widths}
    if all(found.values()):
        return views, widths, tuple(found.items()), None
    state_key = _find(flat, "state")
    if state_key is None:
        missing = [f for f, k in found.items() if k is None]
        raise ApiError("contract_mismatch", f"no openpi key for proprioception {missing} and no 'state' vector",
                       hint=_HINT, details={"missing": missing, "keys": sorted(flat)})
    return views, widths, None, state_key


def _proprio(flat: dict[str, Any], widths: dict[str, int], fields: Optional[tuple],
             state_key: Optional[str]) -> dict[str, np.ndarray]:
    if fields is not None:
        out = {f: _vector(flat[k], k) for f, k in fields}
    else:
        state = _vector(flat[state_key], state_key)
        total = sum(widths.values())
        if len(state) != total:
            raise ApiError("contract_mismatch", f"{state_key!r} has {len(state)} values; the policy's proprioception "
                           f"{widths} has {total} in all", hint=_HINT)
        out, at = {}, 0
        for f, w in widths.items():
            out[f], at = state[at:at + w], at + w
    for f, w in widths.items():
        if len(out[f]) != w:
            raise ApiError("contract_mismatch", f"proprioception {f!r} has {len(out[f])} values, the policy reads {w}",
                           hint=_HINT)
    return out


_LAYOUTS_KEPT = 8        # key sets a connection remembers the layout of (a client sends one)


def observation_from_openpi(obs: Any, contract: Any, episode_id: Optional[str] = None,
                            layouts: Optional[dict] = None) -> seq.Observation:
    """An openpi observation dict -> ``seq.Observation`` through ``contract`` (the policy's
    ``ObservationContract`` or None; the rules are in the module docstring). Raises
    ApiError(contract_mismatch / invalid_request) naming the key and what to send.
    ``layouts``: a dict the caller keeps per connection, where the key-to-contract mapping of
    each key set seen is remembered (every value is still checked on every message)."""
    if not isinstance(obs, dict):
        raise ApiError("invalid_request", "an openpi observation is a dict", hint=_HINT)
    flat = _flatten(obs)
    prompt = flat.get("prompt")
    if isinstance(prompt, np.ndarray) and prompt.dtype.kind in "US" and prompt.size == 1:
        prompt = prompt.reshape(-1)[0]
    if isinstance(prompt, bytes):
        prompt = prompt.decode(errors="replace")
    if prompt is not None and not isinstance(prompt, str):
        raise ApiError("invalid_request", f"'prompt' must be a string, got {type(prompt).__name__}", hint=_HINT)
    instruction = str(prompt) if prompt is not None else ""
    images: dict[str, np.ndarray] = {}
    if contract is None:
        for key, value in flat.items():
            name = key.rsplit("/", 1)[-1]
            if isinstance(value, np.ndarray) and value.ndim == 3:
                images[name] = _image(value, key, None)
        proprio = {k.rsplit("/", 1)[-1]: _vector(v, k) for k, v in flat.items()
                   if isinstance(v, np.ndarray) and v.ndim == 1}
        return seq.Observation(images=images, proprio=proprio, instruction=instruction, episode_id=episode_id)
    keys = tuple(flat)
    layout = layouts.get(keys) if layouts is not None else None
    if layout is None:
        layout = _layout(flat, contract)
        if layouts is not None and len(layouts) < _LAYOUTS_KEPT:
            layouts[keys] = layout
    views, widths, fields, state_key = layout
    for view, key, size in views:
        images[view] = _image(flat[key], key, size)
    proprio = _proprio(flat, widths, fields, state_key)
    return seq.Observation(images=images, proprio=proprio, instruction=instruction, episode_id=episode_id)


# ---------------------------------------------------------------- the endpoint

def metadata(state: Any) -> dict:
    """The first message: the policy's name, contract and action layout (openpi's clients read
    it with ``get_server_metadata()``)."""
    host = state.host
    spec = host.spec.to_dict() if host is not None else {}
    contract = spec.get("contract") or {}
    action = contract.get("action") or {}
    return {"server": "sequence-ai", "policy": state.name, "contract": contract,
            "action_dim": action.get("action_dim"), "control_frequency_hz": action.get("control_frequency_hz")}


# request ids for the answers of this endpoint: the common form (``req_`` + 16 hex digits) from a
# generator seeded once from the OS, not a system call per observation (an id is no secret)
_IDS = random.Random()


def _request_id() -> str:
    return f"req_{_IDS.getrandbits(64):016x}"


async def _one(act: ActPipeline, host: Any, token: str, episode_id: str, params: dict, layouts: dict, data: bytes,
               rid: str) -> bytes:
    """One observation message through the act pipeline -> the packed action dict."""
    act.check_token(token)
    act.check_body(data, _CONTENT_TYPE, what="message", hint="send frames at the declared camera size")
    try:
        obs = unpackb(data)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ApiError("invalid_request", f"the message is not an openpi msgpack observation ({exc})",
                       hint=_HINT) from None
    observation = observation_from_openpi(obs, host.spec.observation, episode_id, layouts)
    t0 = time.monotonic()
    chunk, seconds = await run_prepared(host, Prepared(observation, params, [], episode_id), rid)
    actions = chunk["actions"].astype(np.float32)
    return packb({"actions": actions, "server_timing": {"infer_ms": seconds * 1000.0,
                                                        "total_ms": (time.monotonic() - t0) * 1000.0}})


async def _serve(websocket: WebSocket, act: ActPipeline, host: Any, token: str, episode_id: str) -> None:
    """Answer observations until the client goes; each is metered with the status that reached
    the client (0 when the answer could not be sent, with no bytes out)."""
    params = cast_params(host.spec.params, {})     # openpi sends no params: the declared defaults, cast once
    layouts: dict = {}                             # key set -> where the contract's views and fields are
    while True:
        data = await websocket.receive_bytes()
        t0, status, out, delivered = time.perf_counter(), 0, b"", False
        rid = _request_id()
        try:
            status, out = await act.settle(rid, _one(act, host, token, episode_id, params, layouts, data, rid), _WHERE)
            if status == 200:
                await websocket.send_bytes(out)
            else:
                await websocket.send_text(out.decode())
            delivered = True
        finally:
            act.count(t0, status if delivered else 0, len(data), len(out))


def add_openpi_endpoint(app: Any, act: ActPipeline) -> None:
    """Add the openpi-compatible websocket at ``/`` to the worker ``app``; ``act``: the worker's
    ``ActPipeline`` (its connections count against the same budget as the /act channel's)."""

    @app.websocket(OPENPI_PATH)
    async def openpi_endpoint(websocket: WebSocket) -> None:
        """openpi's websocket protocol (module docstring). Api-Key / Bearer: the direct secret."""
        token = await act.admit(websocket, OPENPI_PATH, _SCHEMES, ready=True)
        if token is None:
            return
        host = act.state.host
        episode_id = "openpi_" + new_request_id()[4:]
        try:
            await websocket.accept()
            await websocket.send_bytes(packb(metadata(act.state)))
            await _serve(websocket, act, host, token, episode_id)
        except (WebSocketDisconnect, RuntimeError, KeyError, OSError):
            pass        # the client went (receive_bytes raises KeyError on a text frame: treat as gone)
        finally:
            act.budget.release()
            if episode_id in host.episodes:
                host.end_episode(episode_id)
