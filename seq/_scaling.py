"""How a worker runs infer(): ``@seq.batched`` (several waiting requests in one call) and
``@seq.concurrent`` (how many model copies a worker holds, and how many robots it takes).

Both are pure declarations, validated when the module is imported; the worker
(``sequence_ai_server.worker.host``) reads them from the policy's spec.

    @seq.policy(...)
    @seq.concurrent(replicas_per_gpu=2)
    class P(seq.Policy):
        @seq.batched(max_batch_size=16, eval_wait_ms=20)
        @seq.infer
        def infer(self, obs, *, seed=None): ...   # obs is a list; return one chunk per entry
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ._errors import DeclarationError

__all__ = ["Batching", "Concurrency", "batched", "concurrent", "MAX_SERVE_WAIT_MS", "EVAL_BATCH_DEADLINE_MS"]

MAX_SERVE_WAIT_MS = 10.0          # a serving deployment may wait at most this long for more requests
EVAL_BATCH_DEADLINE_MS = 250.0    # an eval batch runs at the latest this long after its first request
_BATCHED = "__seq_batched__"
_CONCURRENT = "__seq_concurrent__"


def _ms(name: str, value: Any, maximum: Optional[float] = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise DeclarationError(f"@seq.batched({name}=)", f"expected milliseconds >= 0, got {value!r}")
    if maximum is not None and value > maximum:
        raise DeclarationError(f"@seq.batched({name}=)", f"{value} ms is above the {maximum:g} ms a serving deployment may wait",
                               f"use at most {maximum:g}")
    return float(value)


@dataclass(frozen=True)
class Batching:
    """max_batch_size: 2..256 requests per call. eval_wait_ms (default 20): an eval batch runs once
    this long passes with no new request (or when full, or 250 ms after its first request).
    serve_wait_ms (default 0, at most 10): how long a serving deployment waits for more -- only
    allowed with ``@seq.concurrent(max_inputs=...)`` above the worker's slots."""

    max_batch_size: int
    eval_wait_ms: float = 20.0
    serve_wait_ms: float = 0.0

    def to_dict(self) -> dict:
        return {"max_batch_size": self.max_batch_size, "eval_wait_ms": self.eval_wait_ms,
                "serve_wait_ms": self.serve_wait_ms}


def batched(max_batch_size: int, eval_wait_ms: Optional[float] = None, serve_wait_ms: float = 0.0, *,
            wait_ms: Optional[float] = None) -> Callable:
    """Run waiting requests together: infer's observation argument and every inference parameter
    receive a list (one entry per request) and infer returns a list of chunks in the same order.

    Raises DeclarationError for a size outside 2..256 or waits outside their limits.
    ``wait_ms=`` is the old name of ``eval_wait_ms=`` (read, with a DeprecationWarning).
    """
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or not 2 <= max_batch_size <= 256:
        raise DeclarationError("@seq.batched(max_batch_size=)", f"expected an integer from 2 to 256, got {max_batch_size!r}",
                               "write e.g. @seq.batched(max_batch_size=16)")
    if wait_ms is not None:
        warnings.warn("@seq.batched(wait_ms=) is the old name of eval_wait_ms=", DeprecationWarning, stacklevel=2)
        if eval_wait_ms is None:
            eval_wait_ms = wait_ms
    config = Batching(max_batch_size, _ms("eval_wait_ms", 20.0 if eval_wait_ms is None else eval_wait_ms, EVAL_BATCH_DEADLINE_MS),
                      _ms("serve_wait_ms", serve_wait_ms, MAX_SERVE_WAIT_MS))

    def mark(fn: Callable) -> Callable:
        if not callable(fn):
            raise DeclarationError("@seq.batched", f"must decorate the @seq.infer method, got {fn!r}")
        setattr(fn, _BATCHED, config)
        return fn
    return mark


@dataclass(frozen=True)
class Concurrency:
    """replicas_per_gpu: model copies per card (default 1); gpus_per_replica: cards one copy uses
    (None: every card of the worker); target_inputs / max_inputs: robots a worker takes before
    another starts / at most while that one boots (None: its slots)."""

    replicas_per_gpu: int = 1
    gpus_per_replica: Optional[int] = None
    target_inputs: Optional[int] = None
    max_inputs: Optional[int] = None

    def slots(self, gpus: int = 1) -> int:
        """Model copies in one worker with ``gpus`` cards (self-hosted: one card)."""
        per = self.gpus_per_replica or gpus
        return max(1, gpus // per) * self.replicas_per_gpu

    def to_dict(self) -> dict:
        return {"replicas_per_gpu": self.replicas_per_gpu, "gpus_per_replica": self.gpus_per_replica,
                "target_inputs": self.target_inputs, "max_inputs": self.max_inputs}


def _opt_count(name: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DeclarationError(f"@seq.concurrent({name}=)", f"expected an integer >= 1, got {value!r}")
    return value


def concurrent(replicas_per_gpu: int = 1, gpus_per_replica: Optional[int] = None,
               target_inputs: Optional[int] = None, max_inputs: Optional[int] = None) -> Callable:
    """Declare a worker's slots: ``replicas_per_gpu`` copies of the model per card. Put it under
    ``@seq.policy``. Raises DeclarationError for a count below 1 or max_inputs < target_inputs."""
    config = Concurrency(_opt_count("replicas_per_gpu", replicas_per_gpu) or 1, _opt_count("gpus_per_replica", gpus_per_replica),
                         _opt_count("target_inputs", target_inputs), _opt_count("max_inputs", max_inputs))
    if config.target_inputs and config.max_inputs and config.max_inputs < config.target_inputs:
        raise DeclarationError("@seq.concurrent(max_inputs=)", f"{config.max_inputs} is below target_inputs={config.target_inputs}",
                               "max_inputs is the most a worker takes; make it >= target_inputs")

    def mark(cls: Any) -> Any:
        spec = getattr(cls, "__dict__", {}).get("__seq_spec__")
        if spec is not None:     # written above @seq.policy: update the spec it made
            check_scaling(spec.resources.get("gpu"), config, spec.batching)
            spec.concurrency = config
        setattr(cls, _CONCURRENT, config)
        return cls
    return mark


def batching_of(fn: Callable) -> Optional[Batching]:
    return getattr(fn, _BATCHED, None)


def concurrency_of(cls: type) -> Optional[Concurrency]:
    return cls.__dict__.get(_CONCURRENT)


def gpu_count(gpu: Any) -> int:
    """The number of cards a ``gpu=`` value asks for: ``"H100:4"`` -> 4, ``["L4:2", "A10G:2"]`` ->
    2 (the first choice's count), a bare type or ``None`` -> 1."""
    first = gpu[0] if isinstance(gpu, list) and gpu else gpu
    if isinstance(first, str) and ":" in first:
        return int(first.split(":")[1])
    return 1


def check_scaling(gpu: Any, concurrency: Optional[Concurrency], batching: Optional[Batching]) -> None:
    """Refuse the combinations of ``@seq.concurrent`` and ``@seq.batched`` that cannot be served
    on the cards ``gpu`` (the policy's ``gpu=``) asks for. Raises DeclarationError:
    ``gpus_per_replica`` that does not divide the cards, or ``serve_wait_ms`` without ``max_inputs``
    above the slot count (nothing else could fill a batch)."""
    if concurrency is not None and concurrency.gpus_per_replica:
        cards = gpu_count(gpu)
        if cards % concurrency.gpus_per_replica:
            raise DeclarationError("@seq.concurrent(gpus_per_replica=)",
                                   f"{concurrency.gpus_per_replica} does not divide the {cards} card(s) gpu= asks for",
                                   'ask for a multiple, e.g. gpu="H100:4" with gpus_per_replica=2')
    if batching is not None and batching.serve_wait_ms > 0:
        slots = concurrency.slots(gpu_count(gpu)) if concurrency else 1
        if concurrency is None or not concurrency.max_inputs or concurrency.max_inputs <= slots:
            raise DeclarationError("@seq.batched(serve_wait_ms=)",
                                   "only a deployment that crowds robots onto its copies may wait for more requests",
                                   f"add @seq.concurrent(max_inputs=N) with N above its {slots} slot(s), or drop serve_wait_ms")
