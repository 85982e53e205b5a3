"""The gateway plane: deployments, keys, sessions and worker supervision behind the ``/v1`` API.
Run it with ``python -m sequence_ai_server.gateway``; it is not on the ``/act`` path."""
