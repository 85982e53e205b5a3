"""``sequence-ai mcp``: serve the robot's tools over MCP (stdio or streamable HTTP).

    sequence-ai mcp --model pick-place                      # Python mode, the simulated cell, stdio
    sequence-ai mcp --model pick-place --http --port 8471   # streamable HTTP on 127.0.0.1:8471/mcp
    sequence-ai mcp --ros [--action policy_driver/act]      # each act is an Act goal (ROS 2)

Python mode connects to the gateway (``$SEQUENCES_GATEWAY_URL``, ``$SEQUENCES_API_KEY``) and
drives the simulated cell (``--robot sim``, the default) or a robot object of yours
(``--robot package.module:factory``, a callable returning a ``sequence_ai_mcp.Robot``).
``--ros`` imports rclpy and the ``sequence_ai_msgs`` interfaces; Python mode imports neither.

Binding anything but 127.0.0.1 needs a bearer token in ``$SEQUENCES_MCP_TOKEN`` (read from the
environment, never the command line, so it does not show in ``ps``).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any, List, Optional

from .server import DEFAULT_MAX_SECONDS_CAP, McpSettings, build_server, is_loopback, serve_http, serve_stdio

#: Environment variable holding the HTTP bearer token.
TOKEN_ENV = "SEQUENCES_MCP_TOKEN"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sequence-ai mcp", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="deployment to drive (Python mode; required there)")
    p.add_argument("--robot", default="sim", help="'sim' (the simulated cell, default) or module:factory")
    p.add_argument("--seed", type=int, default=0, help="layout seed of the simulated cell (default 0)")
    p.add_argument("--ros", action="store_true", help="send each act as an Act goal to a ROS 2 policy driver")
    p.add_argument("--action", default="policy_driver/act", help="--ros: the Act action name "
                   "(default policy_driver/act)")
    p.add_argument("--camera-topic", action="append", default=None, metavar="VIEW=TOPIC",
                   help="--ros: a sensor_msgs/Image topic snapshot() reads (repeat; default "
                        "exterior_1=camera/exterior_1/image_raw, wrist_left=camera/wrist_left/image_raw)")
    p.add_argument("--stop-condition", action="append", default=None, metavar="NAME",
                   help="--ros: a stop condition act(stop_when=NAME) may name, one of the driver's "
                        "stop_conditions (repeat; default none)")
    p.add_argument("--max-seconds-cap", type=float, default=DEFAULT_MAX_SECONDS_CAP,
                   help=f"the largest max_seconds act accepts (s, default {DEFAULT_MAX_SECONDS_CAP:g})")
    p.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1; others need "
                   f"${TOKEN_ENV})")
    p.add_argument("--port", type=int, default=8471, help="HTTP port (default 8471; 0 picks one)")
    p.add_argument("--gateway", default=None, help="gateway URL (default $SEQUENCES_GATEWAY_URL or local)")
    return p


def _robot(spec: str, seed: int) -> Any:
    if spec == "sim":
        from .sim import SimRobot
        return SimRobot(seed=seed)
    module, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"error: --robot {spec!r}: say 'sim' or module:factory")
    return getattr(importlib.import_module(module), attr)()


def _backend(args: argparse.Namespace):
    if args.ros:
        from .ros import RosBackend
        topics = dict(t.split("=", 1) for t in (args.camera_topic or []))
        return RosBackend(action=args.action, camera_topics=topics or None,
                          stop_conditions=args.stop_condition or ())
    if not args.model:
        raise SystemExit("error: Python mode needs --model NAME (the deployment to drive), or pass --ros")
    import sequence_ai

    from .backend import PolicyBackend
    policy = sequence_ai.connect(args.model, gateway_url=args.gateway)
    try:
        return PolicyBackend(policy, _robot(args.robot, args.seed), gateway_url=args.gateway)
    except BaseException:
        policy.close()
        raise


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``sequence-ai mcp``; returns the exit code (0 ok, 1 a typed error, 2 usage)."""
    import anyio

    import sequence_ai

    args = _parser().parse_args(argv)
    # this package's own lines plain on stderr (stdout is the stdio transport); the SDK logs warnings
    log = logging.getLogger("sequence_ai_mcp")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("sequence-ai mcp: %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    token = os.environ.get(TOKEN_ENV) or None
    if args.http and not is_loopback(args.host) and not token:
        print(f"error: binding {args.host} needs a bearer token: set {TOKEN_ENV} (clients send "
              "Authorization: Bearer <token>), or bind 127.0.0.1", file=sys.stderr)
        return 2
    try:
        backend = _backend(args)
    except sequence_ai.SequencesError as exc:
        print(f"error[{exc.code}]: {exc}", file=sys.stderr)
        return 1
    mcp = build_server(backend, McpSettings(max_seconds_cap=args.max_seconds_cap))
    try:
        if args.http:
            def ready(url: str) -> None:
                print(f"sequence-ai mcp: serving {url} ({backend.description})", file=sys.stderr, flush=True)
            anyio.run(lambda: serve_http(mcp, host=args.host, port=args.port, token=token, on_ready=ready))
        else:
            anyio.run(serve_stdio, mcp)
    except KeyboardInterrupt:
        pass
    except BaseException as exc:  # noqa: BLE001
        if not _client_gone(exc):
            raise
        print("sequence-ai mcp: the client closed stdio; stopped", file=sys.stderr)
    finally:
        mcp.tasks.close()     # a task still driving is stopped, and its hold awaited, first
        backend.close()
    return 0


def _client_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is only the stdio client having gone away (a broken pipe on stdout, possibly
    wrapped in exception groups): the act it drove was already interrupted and held by then."""
    group = getattr(__import__("builtins"), "BaseExceptionGroup", None)
    if group is not None and isinstance(exc, group):
        return all(_client_gone(e) for e in exc.exceptions)
    return isinstance(exc, (BrokenPipeError, ConnectionResetError))


if __name__ == "__main__":
    sys.exit(main())
