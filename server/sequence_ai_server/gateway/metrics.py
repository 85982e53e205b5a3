"""Prometheus metrics of the gateway, served at ``GET /metrics`` (no key, text format).

    seq_gateway_requests_total{route,status}       requests answered, by route template and HTTP status
    seq_gateway_request_seconds{route}             latency histogram (s), handler time inside the gateway
    seq_gateway_sessions{deployment}               robot sessions open (slots held)
    seq_gateway_slots{deployment}                  slots of its worker (0 when none runs)
    seq_gateway_queue_depth{deployment}            robots waiting for a slot
    seq_gateway_workers_running                    worker processes serving or loading
    seq_gateway_cold_starts_total                  worker processes started since the gateway started

Each gateway app has its own registry (never the process-global one).
"""
from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sequence_ai_server.gateway.slots import slots_of

__all__ = ["GatewayMetrics", "CONTENT_TYPE_LATEST"]

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _StateCollector:
    """Reads sessions, slots, the queue and workers from the services at scrape time."""

    def __init__(self, store: Any, sessions: Any, supervisor: Any):
        self.store, self.sessions, self.supervisor = store, sessions, supervisor

    def collect(self):
        sessions = GaugeMetricFamily("seq_gateway_sessions", "robot sessions open (slots held)", labels=["deployment"])
        slots = GaugeMetricFamily("seq_gateway_slots", "slots of the deployment's worker", labels=["deployment"])
        queue = GaugeMetricFamily("seq_gateway_queue_depth", "robots waiting for a slot", labels=["deployment"])
        rows = self.store.all()
        held = {r.name: len(self.sessions.of(r.name)) for r in rows}
        running = sum(1 for r in rows if r.status in ("starting", "ready"))
        for r in rows:
            sessions.add_metric([r.name], held.get(r.name, 0))
            slots.add_metric([r.name], slots_of(r.spec) if r.status == "ready" else 0)
            queue.add_metric([r.name], self.sessions.queue.depth(r.name))
        yield sessions
        yield slots
        yield queue
        workers = GaugeMetricFamily("seq_gateway_workers_running", "worker processes serving or loading")
        workers.add_metric([], running)
        yield workers
        cold = CounterMetricFamily("seq_gateway_cold_starts", "worker processes started")
        cold.add_metric([], self.supervisor.cold_starts)
        yield cold


class GatewayMetrics:
    """Request counters/latency plus the gateway's state; ``observe()`` from a middleware."""

    def __init__(self, store: Any, sessions: Any, supervisor: Any):
        """Over the deployment ``store``, the ``sessions`` service and the worker ``supervisor``."""
        self.registry = CollectorRegistry()
        self.requests = Counter("seq_gateway_requests", "requests answered", ["route", "status"], registry=self.registry)
        self.latency = Histogram("seq_gateway_request_seconds", "gateway handler time (s)", ["route"],
                                 buckets=_BUCKETS, registry=self.registry)
        self.registry.register(_StateCollector(store, sessions, supervisor))

    def observe(self, route: str, status: int, started: float) -> None:
        """Count one answered request; ``started`` is its time.perf_counter() at arrival."""
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(time.perf_counter() - started)

    def render(self) -> bytes:
        return generate_latest(self.registry)
