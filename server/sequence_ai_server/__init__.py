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
import sys as _sys

__all__ = ["common", "worker", "launchers", "ops", "gateway"]

# httpx's package imports its command-line client (httpx._main: click, rich, pygments), 40 ms of
# CPU in every gateway and worker start, used by no server. Marked absent before httpx is first
# imported, httpx puts its own stub ``httpx.main`` in its place (its fallback for an install
# without the cli extra); a process that imported httpx already keeps it as it is.
if "httpx" not in _sys.modules:
    _sys.modules.setdefault("httpx._main", None)
