"""sequence_ai: drive a robot with a deployed action-chunk policy.

    import sequence_ai

    with sequence_ai.connect("my-policy") as policy:
        out = policy.run(observe=robot.observe, act=robot.apply, max_actions=250,
                         validate=robot.is_safe, hold=robot.hold)
    print(out)   # RunOutcome(250 actions over 32 chunks in 16.8s, completed)

``chat()`` / ``decide()`` are the one-shot language-model calls beside the loop (an
OpenAI-compatible endpoint you configure). Everything public is importable from here; the
modules behind it are private. The engine is
``sequence_ai_core`` (asyncio); ``Policy`` is its synchronous face, ``AsyncPolicy`` the engine.
"""
from sequence_ai_core import (
    ActionChunk,
    AsyncPolicy,
    AuthError,
    OutOfCredit,
    ChunkExhausted,
    ConnectOptions,
    ConnectionLost,
    ContractMismatch,
    DelayUnsupported,
    StaleCamera,
    StopToken,
    Operator,
    END_REASONS,
    ImageFrame,
    InvalidRequest,
    ModelInfo,
    Observation,
    PolicyError,
    Prediction,
    Proprioception,
    RunOutcome,
    SequencesError,
    TransportError,
    Unavailable,
    LimitWarning,
)

from sequence_ai_core.protocol import Contract

from ._connect import account, aconnect, connect, models
from ._chat import ChatResult, DecideResult, ToolCall, chat, decide
from ._image import NativeJPEG, RawFrame, encode, encode_jpeg, encode_jpeg_bytes, observation
from ._sync import Policy
from ._prepare import prepare, to_joint_positions
from . import recipes

__version__ = "0.1.0"

__all__ = [
    "Contract",
    "connect",
    "aconnect",
    "models",
    "account",
    "chat",
    "decide",
    "ChatResult",
    "DecideResult",
    "ToolCall",
    "encode_jpeg",
    "encode_jpeg_bytes",
    "NativeJPEG",
    "RawFrame",
    "Policy",
    "AsyncPolicy",
    "StopToken",
    "Operator",
    "END_REASONS",
    "ConnectOptions",
    "Observation",
    "ImageFrame",
    "Proprioception",
    "ActionChunk",
    "Prediction",
    "RunOutcome",
    "ModelInfo",
    "SequencesError",
    "AuthError",
    "OutOfCredit",
    "encode",
    "observation",
    "InvalidRequest",
    "ContractMismatch",
    "DelayUnsupported",
    "StaleCamera",
    "Unavailable",
    "PolicyError",
    "ChunkExhausted",
    "TransportError",
    "ConnectionLost",
    "LimitWarning",
    "prepare",
    "to_joint_positions",
    "recipes",
]


def _publish(names: list) -> None:
    """Give every exported class its public path, as httpx does: a traceback or repr names
    ``sequence_ai.AuthError``, not the private module that defines it. Pickling still works (the
    class is found at its public path) and ``except`` compares classes, not names."""
    for name in names:
        obj = globals().get(name)
        if isinstance(obj, type) and obj.__module__.startswith(("sequence_ai_core", "sequence_ai.")):
            obj.__module__ = __name__


_publish(__all__)
del _publish
