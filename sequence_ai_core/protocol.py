"""The wire protocol between a robot client and a sequence-ai server, in one place.

Pure standard library: the client (``sequence_ai_core``) and the server
(``sequence_ai_server``) both import it, so the two sides cannot drift apart. It holds

* the content types of an ``/act`` body (``JSON_CONTENT_TYPE``, ``BINARY_CONTENT_TYPE``) and the
  body limit (``MAX_BODY_BYTES``, 32 MiB);
* the binary ``/act`` framing, both directions: ``encode_act_body`` (client) and
  ``decode_act_body`` / ``frame_bytes`` (server). The framing is a 4-byte big-endian length N,
  N bytes of UTF-8 JSON whose camera images carry ``"blob": [offset, length]`` instead of
  ``"data"``, then the raw JPEG/PNG bytes; offsets count from the first byte after the JSON.
  Depth frames (16-bit PNG, rare) stay base64 in the JSON. A malformed body raises
  ``FramingError`` (a ValueError) with the sentence a 400 answer carries;
* the persistent /act channel's path and request format bytes (``ACT_CHANNEL_PATH``; the
  websocket carries the /act framing unchanged after a 5-byte header), and its binary answer
  (``encode_act_answer`` / ``decode_act_answer``: the answer's JSON with the chunk's rows as raw
  float64 after it, asked for on the upgrade with ``ANSWER_HEADER``);
* the error-code table (``ERROR_CODES``): code -> HTTP status -> retryable -> the client's
  exception class name. The server answers with these statuses; the client picks its class
  from them;
* typed views of the contract a handshake or ``/info`` hands back (``Contract.from_wire``):
  ``ObservationSpec`` (cameras, proprioception widths, history) and ``ActionSpec`` (robot,
  action space, action_dim, control frequency in Hz, bounds, max_delta, on_violation, and the
  delay modes / max_delay_steps);
* the delay fields of an ``/act`` request (``DELAY_FIELDS``).
"""
from __future__ import annotations

import array
import base64
import binascii
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

__all__ = [
    "JSON_CONTENT_TYPE", "BINARY_CONTENT_TYPE", "MAX_BODY_BYTES",
    "FramingError", "BinaryBody", "encode_act_body", "decode_act_body", "frame_bytes",
    "ErrorCode", "ERROR_CODES",
    "CameraSpec", "ObservationSpec", "ActionSpec", "Contract", "DELAY_MODES", "DELAY_FIELDS",
    "ACT_CHANNEL_PATH", "CHANNEL_FORMAT_JSON", "CHANNEL_FORMAT_BINARY", "CHANNEL_FORMAT_SHM", "RAW_ENCODING", "SHM_DIR", "shm_name", "valid_shm_name", "encode_shm_head", "decode_shm_head",
    "DEADLINE_FIELDS", "MAX_DEADLINE_MS",
    "ANSWER_HEADER", "ANSWER_BINARY", "LOCAL_HEADER", "LOCAL_VERSION_HEADER", "LOCAL_VERSION", "BINARY_ANSWER_CONTENT_TYPE", "encode_act_answer", "decode_act_answer",
]

#: The delay modes a policy may declare (``seq.ActionContract(delay_modes=...)``).
DELAY_MODES = ("chunk", "guided", "trained")
#: The delay fields of an /act request body (beside ``observation``): ``prefix`` (rows,
#: absolute, the chunk's action space), ``delay_steps`` (int, control steps), ``obs_time``
#: (capture time, unix s), ``request_id`` (str) and ``generation`` (int); the answer echoes
#: ``request_id`` and ``generation``.
DELAY_FIELDS = ("prefix", "delay_steps", "obs_time", "request_id", "generation")
#: The deadline fields of an /act request body, written first in its JSON (the worker reads
#: them before decoding the rest; a body without them is served first-come first-served):
#: ``deadline_ms`` (the playback the robot has left when it sends, less its network round
#: trip: the time the worker has to answer) and ``period_ms`` (the robot's time between
#: chunks); each a number in (0, MAX_DEADLINE_MS], else 400 naming it. Both are optional.
DEADLINE_FIELDS = ("deadline_ms", "period_ms")
MAX_DEADLINE_MS = 60_000.0

JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/vnd.sequence-ai.act+bin"
# The largest request body a gateway or worker reads (bytes): a 2x224^2 JPEG observation is
# ~30 KB; raw 4K frames still fit.
MAX_BODY_BYTES = 32 * 1024 * 1024
_DESIGN = "see docs/design.md: Binary /act body"
# The persistent /act channel (a websocket on the worker; docs/design.md "The /act channel"):
# its path, and the format byte of a request message (after the u32 sequence number).
ACT_CHANNEL_PATH = "/act/ws"
CHANNEL_FORMAT_JSON = 0
CHANNEL_FORMAT_BINARY = 1
# the binary framing with its blobs in a shared-memory segment of the client's (the same-host
# path, ``sequence_ai_core._shm``: the worker on the client's machine)
CHANNEL_FORMAT_SHM = 2
SHM_DIR = "/dev/shm"
# A frame sent with no codec: ``"encoding": "rgb8"`` and ``"shape": [H, W, 3]``, its bytes the
# H x W x 3 uint8 pixels row after row (any other frame is JPEG or PNG, told by its magic bytes)
RAW_ENCODING = "rgb8"
_SHM_PREFIX, _SHM_HEX = "seq-", 32
# The channel's binary answer: a client sends ``ANSWER_HEADER: ANSWER_BINARY`` on the upgrade; a
# worker that speaks it echoes the header on its accept, and then answers every 200 on that
# channel with ``encode_act_answer``'s bytes (errors stay the JSON error body). A worker that
# does not echo it answers JSON, so old clients and old workers keep working either way.
ANSWER_HEADER = "x-seq-answer"
ANSWER_BINARY = "rows-f64"
BINARY_ANSWER_CONTENT_TYPE = "application/vnd.sequence-ai.answer+bin"
# The same-host door: a client on this machine (a loopback worker URL, or the shm path) sends
# ``LOCAL_HEADER: 1`` on the channel's upgrade (both the blocking and the asyncio channel);
# a worker that has one answers in the same header with "NAME TICKET": NAME its Unix socket in the
# abstract namespace ("@..."), TICKET a one-time ticket that hands the websocket's connection
# place to the door. The client may then carry the channel's messages there instead of the
# websocket. Each message is ``framing.LOCAL_FRAME`` (kind u8: 0 binary, 1 text; length u32) then that many
# bytes; the first one the client sends is "TOKEN\nTICKET" as text (at most 4 KiB), answered by one
# binary answer message (seq 0; status 200, else the error body); the rest are the channel's
# messages as the websocket carries them.
LOCAL_HEADER = "x-seq-local"
# What the worker's door does, named beside it on the accept (absent: 1). 2: a message over its
# limit is answered 413 before it closes (1 closed without a word), so a client whose bodies are
# not on the shared-memory path takes only a door of version 2 or later.
LOCAL_VERSION_HEADER = "x-seq-local-version"
LOCAL_VERSION = 2
# ---------------------------------------------------------------- the /act framing

class FramingError(ValueError):
    """An /act body that cannot be read: ``detail`` says what, ``hint`` what to send instead,
    ``details`` carries structured fields for the error body (or None)."""

    def __init__(self, detail: str, hint: Optional[str] = None, **details: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.hint = hint
        self.details = details or None


def _raw(data: Any) -> bytes:
    if isinstance(data, bytes):         # NativeJPEG / RawFrame too: joined as they are, no copy
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    return base64.b64decode(data)


def _b64(data: Any) -> str:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(data)).decode("ascii")
    return data


def _pixels(data: Any) -> Dict[str, Any]:
    """A raw frame's fields (``"encoding": "rgb8"``, ``"shape"``), or none for encoded bytes."""
    shape = getattr(data, "pixel_shape", None)
    return {} if shape is None else {"encoding": RAW_ENCODING, "shape": list(shape)}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


class BinaryBody:
    """A binary /act body kept in its parts (``encode_act_body(..., split=True)``), so that the
    same-host path writes each frame into its segment straight from the frame's own bytes
    (``_shm.ShmSegment.write_parts``) instead of from a joined copy of the whole body.

    ``head``: the 4-byte big-endian JSON length and the JSON; ``blobs``: the frames' bytes in
    the order of their offsets. ``len(body)`` is the body's size (bytes); ``bytes(body)`` the body
    as ``encode_act_body`` joins it (joined on first use, then kept), for any other transport."""

    __slots__ = ("head", "blobs", "size", "_joined")

    def __init__(self, head: bytes, blobs: List[bytes]) -> None:
        self.head, self.blobs = head, tuple(blobs)
        self.size = len(head) + sum(len(b) for b in self.blobs)
        self._joined: Optional[bytes] = None

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        if self._joined is None:
            self._joined = b"".join((self.head, *self.blobs))
        return self._joined


def encode_act_body(body: Dict[str, Any], binary: bool, split: bool = False) -> Tuple[Any, str]:
    """Serialise an /act body; returns ``(bytes, content_type)``.

    ``body["observation"]["images"][i]["data"]`` (and ``["depth"][i]["data"]``) may be raw
    encoded bytes or base64 text; bytes with a ``pixel_shape`` (``sequence_ai.RawFrame``: H x W x 3
    uint8 pixels, no codec) are sent as they are with ``"encoding": "rgb8"`` and ``"shape"``. JSON: every frame becomes base64 text. Binary: every camera
    frame becomes a blob after the JSON header; depth frames stay base64 in the header. A body
    without camera frames is always JSON. ``split``: a binary body comes back as a
    :class:`BinaryBody` (its parts, not joined: the same-host path writes the frames into its
    segment from them); a JSON one is bytes either way. Raises ValueError for NaN/inf in the body.
    """
    obs = body.get("observation")
    images = obs.get("images") if isinstance(obs, dict) else None
    depth = obs.get("depth") if isinstance(obs, dict) else None
    if depth:
        obs = dict(obs, depth=[dict(d, data=_b64(d["data"])) for d in depth])
        body = dict(body, observation=obs)
    if not images:
        return _dumps(body), JSON_CONTENT_TYPE
    if not binary:
        frames = [dict(img, data=_b64(img["data"]), **_pixels(img["data"])) if "data" in img else img for img in images]
        return _dumps(dict(body, observation=dict(obs, images=frames))), JSON_CONTENT_TYPE
    blobs: List[bytes] = []
    frames = []
    offset = 0
    for img in images:
        if "data" not in img:
            frames.append(img)
            continue
        raw = _raw(img["data"])
        frame = {k: v for k, v in img.items() if k != "data"}
        frame["blob"] = [offset, len(raw)]
        frame.update(_pixels(img["data"]))
        offset += len(raw)
        blobs.append(raw)
        frames.append(frame)
    head = _dumps(dict(body, observation=dict(obs, images=frames)))
    if split:
        return BinaryBody(len(head).to_bytes(4, "big") + head, blobs), BINARY_CONTENT_TYPE
    return b"".join([len(head).to_bytes(4, "big"), head, *blobs]), BINARY_CONTENT_TYPE


def decode_act_body(raw: bytes, content_type: str = JSON_CONTENT_TYPE) -> Tuple[dict, Optional[memoryview]]:
    """Split an /act body into its JSON object and, for the binary framing, the blob region.

    ``content_type`` may carry parameters (``; charset=utf-8``); empty means JSON. The blob
    region is a zero-copy view for ``frame_bytes``. Raises FramingError: a short or inconsistent
    length prefix, another content type, JSON that does not parse, a body that is not an object
    or has no ``observation``.
    """
    blobs: Optional[memoryview] = None
    if content_type.startswith(BINARY_CONTENT_TYPE):
        if len(raw) < 4:
            raise FramingError(f"binary /act body is {len(raw)} bytes; it starts with a 4-byte JSON length",
                               hint="see docs/design.md: Binary /act body")
        n = int.from_bytes(bytes(raw[:4]), "big")
        if n > len(raw) - 4:
            raise FramingError(f"binary /act body declares {n} bytes of JSON but carries {len(raw) - 4} after "
                               "the length", hint="the length prefix is big-endian and counts only the JSON")
        text = bytes(memoryview(raw)[4:4 + n])
        blobs = memoryview(raw)[4 + n:]
    elif content_type.startswith(JSON_CONTENT_TYPE) or not content_type:
        text = raw
    else:
        raise FramingError(f"content type {content_type!r} is not accepted",
                           hint=f"send {JSON_CONTENT_TYPE} or {BINARY_CONTENT_TYPE}")
    try:
        body = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: absurd nesting
        raise FramingError(f"/act body is not valid JSON ({str(exc)[:200]})",
                           hint="see docs/design.md for the /act body") from None
    if not isinstance(body, dict):
        raise FramingError("/act body must be a JSON object", hint='send {"observation": {...}, "params": {}}')
    if "observation" not in body:
        raise FramingError("/act body has no observation", hint='send {"observation": {...}, "params": {}}',
                           errors=["observation: Field required"])
    return body, blobs


def frame_bytes(frame: Mapping[str, Any], where: str, blobs: Optional[memoryview]) -> Any:
    """One frame's encoded bytes: a zero-copy view into the binary body's blobs (``"blob"``), or
    its base64 ``"data"`` decoded. ``where`` names the frame in the error. Raises FramingError."""
    if "blob" in frame:
        ref = frame["blob"]
        if blobs is None:
            raise FramingError(f"{where}: blob references need the binary body ({BINARY_CONTENT_TYPE})")
        if (not isinstance(ref, list) or len(ref) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in ref)
                or ref[0] < 0 or ref[1] <= 0 or ref[0] + ref[1] > len(blobs)):
            raise FramingError(f"{where}: blob {ref!r} is not an [offset, length] inside the {len(blobs)} blob bytes",
                               hint="offsets count from the first byte after the JSON")
        return blobs[ref[0]:ref[0] + ref[1]]
    data = frame.get("data")
    if not isinstance(data, str):
        raise FramingError(f"{where}: frame has no data",
                           hint='send "data": base64 of JPEG/PNG bytes (or "blob" in the binary body)')
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise FramingError(f"{where}: data is not valid base64",
                           hint="send each frame as base64 of JPEG or PNG bytes") from None


def encode_act_answer(payload: Mapping[str, Any], rows: Optional[bytes], shape: Optional[Tuple[int, int]]) -> bytes:
    """The binary /act answer: a 4-byte big-endian length N, N bytes of the answer's JSON
    (``payload``, an ``ActResponse`` dict) whose ``action_chunk.actions`` is
    ``{"blob": [0, len(rows)], "shape": [T, D], "dtype": "<f8"}``, then ``rows``: the chunk's T x D
    values as little-endian float64, row after row (the values the JSON answer would carry,
    bit for bit). ``rows`` None: an answer with no chunk (``action_chunk`` null), the JSON alone.
    Raises ValueError when ``rows`` is not 8 x T x D bytes, or for NaN/inf in ``payload``."""
    if rows is not None:
        t, d = shape
        if len(rows) != 8 * t * d:
            raise ValueError(f"{len(rows)} bytes of rows for a {t} x {d} float64 chunk")
        chunk = dict(payload["action_chunk"], actions={"blob": [0, len(rows)], "shape": [t, d], "dtype": "<f8"})
        payload = dict(payload, action_chunk=chunk)
    head = _dumps(payload)
    return b"".join((len(head).to_bytes(4, "big"), head, rows or b""))


def decode_act_answer(raw: bytes) -> Dict[str, Any]:
    """A binary /act answer (``encode_act_answer``) -> the answer dict the JSON answer would
    parse to (``action_chunk.actions`` as T lists of D floats). Raises FramingError for a
    short or inconsistent length prefix, JSON that does not parse, or a chunk reference that
    is not T x D float64 values inside the bytes after the JSON."""
    if len(raw) < 4:
        raise FramingError(f"binary /act answer is {len(raw)} bytes; it starts with a 4-byte JSON length")
    n = int.from_bytes(bytes(raw[:4]), "big")
    if n > len(raw) - 4:
        raise FramingError(f"binary /act answer declares {n} bytes of JSON but carries {len(raw) - 4}")
    view = memoryview(raw)
    try:
        body = json.loads(bytes(view[4:4 + n]))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise FramingError(f"binary /act answer's JSON does not parse ({str(exc)[:200]})") from None
    chunk = body.get("action_chunk") if isinstance(body, dict) else None
    ref = chunk.get("actions") if isinstance(chunk, dict) else None
    if isinstance(ref, dict):
        chunk["actions"] = _rows(ref, view[4 + n:])
    return body


def _rows(ref: Mapping[str, Any], blobs: memoryview) -> List[List[float]]:
    """The chunk's rows from a binary answer's reference (``encode_act_answer``)."""
    shape, span = ref.get("shape"), ref.get("blob")
    ints = (isinstance(shape, list) and isinstance(span, list) and len(shape) == 2 and len(span) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape + span))
    if not ints or ref.get("dtype") != "<f8" or span[1] != 8 * shape[0] * shape[1] or span[0] + span[1] > len(blobs):
        raise FramingError(f"binary /act answer's chunk reference {dict(ref)!r} is not T x D float64 values "
                           f"inside its {len(blobs)} bytes of rows")
    values = array.array("d")
    values.frombytes(blobs[span[0]:span[0] + span[1]])
    if sys.byteorder != "little":
        values.byteswap()
    t, d = shape
    return [values[i * d:(i + 1) * d].tolist() for i in range(t)]


def shm_name(token_hex: str) -> str:
    """A same-host segment's name from 32 random hex digits: ``seq-`` + them."""
    return _SHM_PREFIX + token_hex


def valid_shm_name(name: str) -> bool:
    """True for a segment name of the same-host path: ``seq-`` and 32 lowercase hex digits."""
    return (len(name) == len(_SHM_PREFIX) + _SHM_HEX and name.startswith(_SHM_PREFIX)
            and all(c in "0123456789abcdef" for c in name[len(_SHM_PREFIX):]))


def encode_shm_head(name: str, used: int) -> bytes:
    """The head of a ``CHANNEL_FORMAT_SHM`` request after the channel's 5 bytes: the segment
    name's length (u8), the name (ASCII), the blob bytes used (u32 big-endian); the binary
    /act body's length-prefixed JSON follows, with no blobs after it."""
    raw = name.encode("ascii")
    return bytes([len(raw)]) + raw + used.to_bytes(4, "big")


def decode_shm_head(message: Any) -> Tuple[str, int, int]:
    """``encode_shm_head``'s inverse on a request's bytes after the channel head -> (name, used,
    where the JSON starts). Raises FramingError for a short head or a name of another form."""
    if len(message) < 1 or len(message) < 1 + message[0] + 4 + 4:
        raise FramingError(f"a same-host request of {len(message)} bytes is shorter than its head",
                           hint="see docs/design.md: The same-host path")
    at = 1 + message[0]
    name = bytes(message[1:at]).decode("ascii", errors="replace")
    if not valid_shm_name(name):
        raise FramingError("the segment name is not seq- and 32 hex digits", hint="see docs/design.md: The same-host path")
    return name, int.from_bytes(bytes(message[at:at + 4]), "big"), at + 4


# ---------------------------------------------------------------- error codes

class ErrorCode(NamedTuple):
    """One row of the error table: the HTTP status it is answered with, whether the same call
    may succeed later unchanged, and the client exception (a name in ``sequence_ai``)."""

    status: int
    retryable: bool
    client_class: str


ERROR_CODES: Dict[str, ErrorCode] = {
    "invalid_request": ErrorCode(400, False, "InvalidRequest"),     # malformed body, unknown param
    "contract_mismatch": ErrorCode(400, False, "ContractMismatch"),  # observation / contract differ
    "unauthorized": ErrorCode(401, False, "AuthError"),             # key or direct secret; ended session
    "lease_expired": ErrorCode(401, False, "AuthError"),            # a lease from an older worker epoch
    "out_of_credit": ErrorCode(402, False, "OutOfCredit"),          # a usage limit set on the gateway
    "quota_exceeded": ErrorCode(402, False, "OutOfCredit"),
    "not_found": ErrorCode(404, False, "InvalidRequest"),           # unknown deployment / model / route
    "payload_too_large": ErrorCode(413, False, "InvalidRequest"),   # a body over MAX_BODY_BYTES
    "policy_error": ErrorCode(500, False, "PolicyError"),           # the policy's own code raised
    "internal": ErrorCode(500, False, "SequencesError"),            # a bug in the server itself
    "warming": ErrorCode(503, True, "Unavailable"),                 # loading; Retry-After says when
    "worker_failed": ErrorCode(503, False, "Unavailable"),          # the worker failed to load or died
    "unavailable": ErrorCode(503, False, "Unavailable"),
    "queued": ErrorCode(503, True, "Unavailable"),                  # every slot taken: waiting in line
    "queue_timeout": ErrorCode(503, False, "Unavailable"),          # waited queue_timeout_s in line
    "deployment_full": ErrorCode(503, False, "Unavailable"),        # every slot taken, on_full="reject"
    "deployment_stopped": ErrorCode(503, False, "Unavailable"),     # `seq policy stop`
    "gpu_limit_reached": ErrorCode(503, False, "Unavailable"),      # no GPU left for another worker
    "too_many_connections": ErrorCode(503, True, "Unavailable"),    # a worker's websocket places all taken
    "request_timeout": ErrorCode(504, True, "Unavailable"),         # one inference ran past its timeout
}


# ---------------------------------------------------------------- contract views

@dataclass(frozen=True)
class CameraSpec:
    """One declared camera view: frame size in pixels (width x height), and whether a 16-bit
    depth PNG (millimetres) is expected beside it."""

    view: str
    width: Optional[int] = None
    height: Optional[int] = None
    depth: bool = False

    @property
    def size(self) -> Optional[Tuple[int, int]]:
        """``(width, height)`` in pixels, or None when the declaration gives no size."""
        return (self.width, self.height) if self.width and self.height else None


@dataclass(frozen=True)
class ObservationSpec:
    """What the policy reads: cameras by view name, proprioception field -> width, and
    ``history`` frames per view (oldest first)."""

    cameras: Dict[str, CameraSpec] = field(default_factory=dict)
    proprio: Dict[str, int] = field(default_factory=dict)
    history: int = 1

    @classmethod
    def from_wire(cls, data: Optional[Mapping[str, Any]]) -> Optional["ObservationSpec"]:
        """The view of an ``observation`` contract dict; None for None/empty. Cameras may be a
        ``{view: {width, height, depth}}`` object or a list of names / ``{view|name: ...}``."""
        if not data:
            return None
        raw = data.get("cameras") or {}
        cameras: Dict[str, CameraSpec] = {}
        if isinstance(raw, Mapping):
            for view, cam in raw.items():
                cam = cam if isinstance(cam, Mapping) else {}
                cameras[str(view)] = CameraSpec(str(view), _int(cam.get("width")), _int(cam.get("height")),
                                                bool(cam.get("depth", False)))
        elif isinstance(raw, (list, tuple)):
            for cam in raw:
                view = (cam.get("view") or cam.get("name")) if isinstance(cam, Mapping) else str(cam)
                if view:
                    cameras[str(view)] = CameraSpec(str(view))
        proprio = data.get("proprio")
        widths = {str(k): v for k, v in proprio.items()} if isinstance(proprio, Mapping) else {}
        return cls(cameras, widths, int(data.get("history") or 1))


def _int(value: Any) -> Optional[int]:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class ActionSpec:
    """What every action chunk is: ``robot``, ``action_space`` (e.g. ``"joint_absolute"``),
    ``action_dim`` values per row, ``control_frequency_hz`` (Hz), optional ``bounds`` (one
    ``[low, high]`` per dimension), ``max_delta`` (one number or one per dimension) and
    ``on_violation`` (``"clip"`` or ``"refuse"``). ``raw`` is the wire dict it was read from."""

    robot: Optional[str] = None
    action_space: Optional[str] = None
    action_dim: Optional[int] = None
    control_frequency_hz: Optional[float] = None
    bounds: Optional[List[List[float]]] = None
    max_delta: Any = None
    on_violation: str = "clip"
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_wire(cls, data: Optional[Mapping[str, Any]]) -> Optional["ActionSpec"]:
        """The view of an ``action`` contract dict; None for None/empty."""
        if not data:
            return None
        return cls(data.get("robot"), data.get("action_space"), _int(data.get("action_dim")),
                   data.get("control_frequency_hz"), data.get("bounds"), data.get("max_delta"),
                   data.get("on_violation") or "clip", dict(data))

    def declared(self, key: str) -> Any:
        """The declared value of field ``key`` as it came on the wire (None when absent)."""
        return self.raw.get(key)

    @property
    def delay_modes(self) -> Tuple[str, ...]:
        """What the policy does with the committed prefix: a subset of ``DELAY_MODES``
        (``"chunk"``, ``"guided"``, ``"trained"``); ``("chunk",)`` when the contract predates it."""
        delay = self.raw.get("delay")
        modes = delay.get("modes") if isinstance(delay, Mapping) else None
        return tuple(str(m) for m in modes) if modes else ("chunk",)

    @property
    def max_delay_steps(self) -> Optional[int]:
        """The largest inference delay the policy handles, control steps at
        ``control_frequency_hz``; None: no declared limit."""
        delay = self.raw.get("delay")
        return _int(delay.get("max_delay_steps")) if isinstance(delay, Mapping) else None


@dataclass(frozen=True)
class Contract:
    """A deployment's declared contract: ``observation`` and ``action`` views, each None when
    the policy declares none (it defines its own inputs / outputs)."""

    observation: Optional[ObservationSpec] = None
    action: Optional[ActionSpec] = None

    @classmethod
    def from_wire(cls, data: Any) -> "Contract":
        """The view of a contract dict (``{"observation": ..., "action": ...}``, as the
        handshake, ``/v1/models`` and the worker's ``/info`` hand it back); ``Contract()`` for
        None, an empty dict, or anything that is not a mapping."""
        if not isinstance(data, Mapping):
            return cls()
        obs, act = data.get("observation"), data.get("action")
        return cls(ObservationSpec.from_wire(obs if isinstance(obs, Mapping) else None),
                   ActionSpec.from_wire(act if isinstance(act, Mapping) else None))

    @property
    def declared(self) -> bool:
        """True when the policy declares an observation or an action contract."""
        return self.observation is not None or self.action is not None
