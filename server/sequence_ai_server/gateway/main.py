"""The gateway process: :func:`serve` (bind, build the app, run uvicorn until SIGINT/SIGTERM) and
:func:`main` (its command line). ``python -m sequence_ai_server.gateway`` runs ``main``; ``seq serve``
calls ``serve``."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Optional

from sequence_ai_server.common.config import ServerConfig
from sequence_ai_server.gateway.app import create_app

__all__ = ["serve", "main", "DEFAULT_HOST", "DEFAULT_PORT"]

log = logging.getLogger("sequence_ai_server.gateway")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8470


class BadSetting(ValueError):
    """A ``SEQ_*`` setting the gateway cannot start with; the message names the variable, its
    value and the form it takes."""


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, data_dir: Optional[Path] = None,
          ready_file: Optional[str] = None, on_ready: Any = None) -> None:
    """Run the gateway in the foreground until SIGINT/SIGTERM; stops every worker on the way out.
    Port 0 binds an ephemeral port; ``ready_file`` then receives ``{"url", "port", "pid"}``.
    Every setting is read once, here (``ServerConfig.from_env(data_dir)``); ``data_dir``
    overrides ``$SEQUENCES_HOME``. Raises BadSetting for a setting that is not valid, DataDirInUse when another gateway holds the data dir,
    and OSError when the address cannot be bound: both before the data dir gets a key, a store or
    a log (a data dir this call created is removed again when the bind fails)."""
    import uvicorn

    # one INFO line per health ping (httpx's request log) buried the shell of `seq serve &` and
    # `python -m sequence_ai_server.gateway &` alike: both come through here
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = ServerConfig.from_env(data_dir)
        if config.fake_gpus:            # the fake cards are read in full before anything is made
            from sequence_ai_server.ops.gpus import fake_cards
            fake_cards(config.fake_gpus)
    except ValueError as exc:           # a SEQ_* variable that is not valid: named in the message
        raise BadSetting(str(exc)) from None
    from sequence_ai_server.gateway.datadir_lock import hold_data_dir   # one gateway per data dir: the lock is held until exit
    created = not config.data_dir.expanduser().exists()
    dir_lock = hold_data_dir(config.data_dir)  # raises DataDirInUse naming the holder
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol is
    # IPPROTO_TCP; with 0 every response waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))                # before create_app: a busy port creates no API key
    except OSError:
        sock.close()
        dir_lock.release()
        if created:                            # leave no half-made data dir behind
            dir_lock.path.unlink(missing_ok=True)
            try:
                config.data_dir.expanduser().rmdir()
            except OSError:
                pass
        raise
    bound = sock.getsockname()[1]
    app = create_app(config=config)
    from sequence_ai_server.common.header_timeout import timed_http_protocol   # slowloris: 408 past the deadline
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                                           http=timed_http_protocol(config.header_timeout_s)))

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            url = f"http://{host}:{bound}"
            dir_lock.note(port=bound)   # a second gateway's refusal names this port
            app.state.gateway.url = url
            info = {"url": url, "port": bound, "pid": os.getpid(),
                    "api_key_file": str(app.state.gateway.api_key_file), "data_dir": str(app.state.gateway.data_dir)}
            if ready_file:
                tmp = f"{ready_file}.tmp"
                Path(tmp).write_text(json.dumps(info))
                os.replace(tmp, ready_file)
            if on_ready:
                on_ready(info)
        await task

    # uvicorn re-raises the signal it handled once it has shut down; by then we are done.
    signal.signal(signal.SIGTERM, lambda s, f: None)
    signal.signal(signal.SIGINT, lambda s, f: None)
    asyncio.run(run())


def main(argv: Optional[list[str]] = None) -> int:
    """Parse ``argv`` (default: the process's), then :func:`serve`; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m sequence_ai_server.gateway", description="sequence-ai gateway")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gateway %(levelname)s %(message)s")
    try:
        serve(args.host, args.port, Path(args.data_dir) if args.data_dir else None, args.ready_file,
              on_ready=lambda info: log.info("serving on %s (API key in %s)", info["url"], info["api_key_file"]))
    except BadSetting as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    return 0
