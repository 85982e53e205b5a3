"""sequence_ai_mcp: the robot as a tool a language model calls, over MCP (the Model Context Protocol).

``sequence-ai mcp`` serves six tools on the official ``mcp`` SDK (stdio, or streamable HTTP on
127.0.0.1 by default; a bearer token is required to bind anywhere else):

* ``act(instruction, max_seconds)`` -- drive the robot with the deployed policy for one
  instruction; returns the RunOutcome as structured content. ``max_seconds`` (s) is required and
  capped by the server (``--max-seconds-cap``). A dropped MCP session or a cancelled tool call
  interrupts the run: the robot holds within one control period and nothing is sent after.
  One driving call at a time: a second ``act`` while one runs gets a typed ``busy`` error.
* ``interrupt()``, ``set_instruction(text)``, ``status()``, ``snapshot(view)`` (image content),
  ``models()`` (the gateway's catalogue).

Every tool carries MCP tool annotations and every argument a bound in its input schema (refused
outside it, with a sentence naming the argument). A host with the MCP Tasks extension
(``io.modelcontextprotocol/tasks``, 2026-07-28) gets ``act`` as a task: ``tasks/get`` polls it,
``tasks/cancel`` stops it (hold within one control period), the result is the run's outcome.

Two backends (``backend.py``): Python mode drives a ``sequence_ai.Policy`` against a robot object
(the simulated cell of ``sim.py`` by default); ``--ros`` mode sends each ``act`` as an ``Act``
goal to the policy driver's ROS 2 action server (``ros.py``, the only module that imports rclpy).

Modules: ``server`` (the tools, the driving lock, the bounds, the HTTP/stdio runners and the
bearer check), ``tasks`` (act as an MCP task),
``backend`` (Python mode), ``sim`` (the simulated cell as a robot), ``ros`` (``--ros`` mode),
``cli`` (``sequence-ai mcp``).

``sim`` needs no ``mcp``: ``from sequence_ai_mcp.sim import SimRobot`` works with the ``sim``
extra alone (the README's Python example), since the names below load on first use (PEP 562).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import PolicyBackend, Robot
    from .server import ActOutcome, McpSettings, build_server

_EXPORTS = {"build_server": "server", "McpSettings": "server", "ActOutcome": "server",
            "PolicyBackend": "backend", "Robot": "backend"}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
