"""sequence_ai_server: the self-hosted side of sequence-ai, in five planes (each imports only
its own and earlier ones; test/unit/test_layering.py checks it):

- ``common``: the error shape (its code table is ``sequence_ai_core.protocol.ERROR_CODES``,
  shared with the client), the JSON and body-size guards, credentials, logs, settings, leases.
- ``worker``: one process hosting one ``@seq.policy`` class behind ``/act`` (the direct path):
  ``python -m sequence_ai_server.worker``.
- ``launchers``: how a worker process starts and reports (a local subprocess, or Ray).
- ``ops``: warm floors, quotas, usage, alerts and the card inventory.
- ``gateway``: deployments, keys, ``/v1/connect`` and the supervision of the workers:
  ``python -m sequence_ai_server.gateway``.
"""
__all__ = ["common", "worker", "launchers", "ops", "gateway"]
