"""A llama.cpp OpenAI-compatible server on loopback serving the tiny GGUF model of _tiny_gguf.py
under two names (the ``llm`` fixture); test_chat_decide.py and test_mcp_server.py use it."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

import _tiny_gguf
from _servers import _env

CHAT_MODEL = "tiny-tools"     # chat_format chatml-function-calling
SCORE_MODEL = "tiny-chatml"   # chat_format chatml (log-probabilities)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    """``http://127.0.0.1:PORT/v1`` of a llama.cpp server with the tiny model under two names."""
    tmp = tmp_path_factory.mktemp("llm")
    model = _tiny_gguf.build(tmp / "tiny.gguf")
    port = free_port()
    common = {"model": str(model), "n_ctx": 8192, "n_threads": 1, "n_batch": 512, "logits_all": True,
              "verbose": False}
    config = {"host": "127.0.0.1", "port": port,
              "models": [dict(common, model_alias=CHAT_MODEL, chat_format="chatml-function-calling"),
                         dict(common, model_alias=SCORE_MODEL, chat_format="chatml")]}
    (tmp / "config.json").write_text(json.dumps(config))
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--config_file", str(tmp / "config.json")],
                            stdout=log, stderr=subprocess.STDOUT, env=_env())
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama.cpp server did not come up in 120 s"
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
