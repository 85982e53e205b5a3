"""The worker plane: one process hosting one ``@seq.policy`` class behind ``/act`` (HTTP, the
websocket channel and the openpi endpoint). Run it with ``python -m sequence_ai_server.worker``.
It imports only ``common``: never the gateway, ops or the launchers."""
