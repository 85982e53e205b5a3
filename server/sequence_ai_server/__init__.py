"""sequence_ai_server: the self-hosted side of sequence-ai.

- ``worker``: one process hosting one ``@seq.policy`` class behind ``POST /act`` (direct path).
- ``gateway``: deployments, API keys and ``/v1/connect``; spawns and supervises the workers.
- ``errors``: the one JSON error shape both of them answer with.
"""
__all__ = ["errors", "worker", "gateway"]
