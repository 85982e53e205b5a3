"""What an install lacks, in one line: the extra that brings a missing module.

``pip install sequence-ai`` is the robot client alone (httpx, sniffio); the server, the ROS 2
nodes, the simulator, the data tools and the rest come with extras (``pip install
'sequence-ai[server]'``). A console script run without its extra answers with one line on stderr
and exit code 1, never a traceback::

    seq serve: needs the server extra (typer is not installed): pip install 'sequence-ai[server]'

:func:`guarded` wraps a console script's main; :func:`missing_line` gives the line for a
``ModuleNotFoundError``; :func:`seq_main` is the ``seq`` console script. Standard library only,
so it works in the smallest install.
"""
from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

__all__ = ["EXTRA_OF", "ROS_MODULES", "OWN_MODULES", "missing_line", "unavailable", "command_name", "guarded",
           "seq_main"]

#: top-level module -> the extra that installs it, for modules only one extra brings. A module
#: several extras bring (numpy, PIL, simplejpeg, websockets) is named by the command's own extra.
EXTRA_OF = {
    **dict.fromkeys(("typer", "rich", "fastapi", "starlette", "uvicorn", "uvloop", "httptools", "msgpack",
                     "pydantic", "pydantic_core", "cryptography", "prometheus_client", "uv"), "server"),
    **dict.fromkeys(("mujoco", "fast_simplification"), "sim"),
    **dict.fromkeys(("rosbags", "pyarrow", "av"), "data"),
    "matplotlib": "demo", "mcp": "mcp", "ray": "ray", "torch": "train", "mkdocs": "docs",
}

#: top-level modules that come with ROS 2 (a ROS install or its set-up script), not with an extra.
ROS_MODULES = frozenset((
    "rclpy", "rcl_interfaces", "builtin_interfaces", "action_msgs", "sensor_msgs", "std_msgs", "std_srvs",
    "trajectory_msgs", "diagnostic_msgs", "sequence_ai_msgs", "ament_index_python", "launch", "launch_ros",
    "rosidl_runtime_py", "rosidl_parser", "rpyutils", "unique_identifier_msgs", "lifecycle_msgs",
))

#: this distribution's own top-level packages: one of them missing is a broken install, which
#: keeps its traceback.
OWN_MODULES = frozenset(("seq", "sequence_ai", "sequence_ai_core", "sequence_ai_server", "sequence_ai_data",
                         "sequence_ai_eval", "sequence_ai_mcp", "sequence_ai_ros", "sequence_ai_sim"))


def missing_line(exc: ImportError, command: str, extra: str) -> Optional[str]:
    """The one line that tells the user of ``command`` what to install for ``exc``.

    Args:
        exc: the ``ModuleNotFoundError`` raised while loading or running ``command``.
        command: what the user ran, as they typed it (``"seq serve"``, ``"policy_driver"``).
        extra: the extra ``command`` needs, named when the missing module is not one only a
            particular extra brings (:data:`EXTRA_OF`).

    Returns:
        ``"<command>: needs the <extra> extra (<module> is not installed): pip install
        'sequence-ai[<extra>]'"``, a ROS 2 set-up line for a ROS module (:data:`ROS_MODULES`), or
        None when ``exc`` is not a missing third-party module (a plain ImportError, or one of this
        distribution's own modules missing: a broken install, whose traceback should show).
    """
    name = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not name:
        return None
    top = name.split(".")[0]
    if top in OWN_MODULES:
        return None
    if top in ROS_MODULES:
        return (f"{command}: needs ROS 2 ({top} is not importable): source the ROS 2 set-up "
                f"(/opt/ros/<distro>/setup.bash, or scripts/env.sh in a checkout) and the workspace's "
                f"install/setup.bash")
    extra = EXTRA_OF.get(top, extra)
    return f"{command}: needs the {extra} extra ({top} is not installed): pip install 'sequence-ai[{extra}]'"


def unavailable(module: str, command: str, extra: str) -> Optional[str]:
    """:func:`missing_line` for ``module`` when it cannot be imported here, else None; found
    without importing it (``importlib.util.find_spec``), so a check before a long step (the demo,
    before it deploys the learned policy: torch) costs nothing when the module is there."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a parent package missing, or a module without a spec
        found = False
    if found:
        return None
    return missing_line(ModuleNotFoundError(f"No module named {module!r}", name=module), command, extra)


def command_name(prog: str, argv: Sequence[str]) -> str:
    """``prog`` and its first argument that is not an option (``"seq serve"``), or ``prog``."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return f"{prog} {first}" if first else prog


def guarded(load: Callable[[], Callable[[], Optional[int]]], command: str, extra: str) -> int:
    """Run a console script's main so that a missing extra is one line, not a traceback.

    Args:
        load: imports the script's module and returns its ``main`` (called with no arguments;
            it reads ``sys.argv``).
        command: the command's name for the line (see :func:`command_name`).
        extra: the extra the command needs (see :func:`missing_line`).

    Returns:
        ``main()``'s exit code (None counts as 0), or 1 after printing :func:`missing_line` to
        stderr when loading or running it raised ``ModuleNotFoundError`` for a third-party module.
        Other exceptions (and a missing module of this distribution) propagate unchanged.
    """
    try:
        main = load()
        rc = main()
    except ModuleNotFoundError as exc:
        line = missing_line(exc, command, extra)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1
    return 0 if rc is None else int(rc)


def seq_main() -> int:
    """The ``seq`` console script (setup.py's entry point; ``python -m seq`` too): ``seq.cli.main``
    with ``sys.argv``, loaded by name only when run, as an entry point is: ``seq.cli`` needs the
    server extra (typer, numpy), while ``import seq`` needs nothing (its exports load on first
    use), so ``python -m seq`` reaches this guard too. Returns its exit code (1: an extra is
    missing, after its one line)."""
    def load():
        import importlib
        return importlib.import_module("seq.cli").main
    return guarded(load, command_name("seq", sys.argv[1:]), "server")
