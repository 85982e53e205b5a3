"""sequence_ai_server: the self-hosted side of sequence-ai.

- ``worker``: one process hosting one ``@seq.policy`` class behind ``POST /act`` (direct path);
  its HTTP app is ``worker_app``, the hosting ``_hosting`` (load, replicas, batching, episodes),
  request reading ``observation`` and the chunk check ``chunk``.
- ``gateway``: deployments, API keys and ``/v1/connect``; spawns and supervises the workers.
- ``errors``: the one JSON error shape both of them answer with (its code table is
  ``sequence_ai_core.protocol.ERROR_CODES``, shared with the client).
"""
__all__ = ["errors", "worker", "gateway"]
