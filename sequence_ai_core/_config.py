"""Where the client's defaults come from: API key, gateway URL, data directory.

Order, first match wins:
  - API key:     ``api_key=`` then ``$SEQUENCES_API_KEY``. (The gateway writes its key to
                 ``$SEQUENCES_HOME/api_key`` or ``~/.sequence-ai/api_key``; the client does not
                 read that file on its own, it only points at it when no key was given.)
  - Gateway URL: ``gateway_url=`` then ``$SEQUENCES_GATEWAY_URL`` then ``http://127.0.0.1:8470``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ._errors import AuthError

__all__ = ["DEFAULT_GATEWAY_URL", "data_dir", "resolve_api_key", "resolve_gateway_url"]

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8470"


def data_dir() -> Path:
    """``$SEQUENCES_HOME`` or ``~/.sequence-ai``."""
    home = os.environ.get("SEQUENCES_HOME")
    return Path(home).expanduser() if home else Path.home() / ".sequence-ai"


def resolve_gateway_url(gateway_url: Optional[str] = None) -> str:
    """``gateway_url`` argument, else ``$SEQUENCES_GATEWAY_URL``, else the local default; no trailing /."""
    url = gateway_url or os.environ.get("SEQUENCES_GATEWAY_URL") or DEFAULT_GATEWAY_URL
    return url.rstrip("/")


def resolve_api_key(api_key: Optional[str] = None) -> str:
    """``api_key`` argument, else ``$SEQUENCES_API_KEY``.

    Raises:
        AuthError: neither is set (``code="no_api_key"``); the hint says where the local gateway
            keeps its key, that the client does not read that file, and that an MCP host needs
            the key in its server env entry.
    """
    key = api_key or os.environ.get("SEQUENCES_API_KEY")
    if key:
        return key.strip()
    key_file = data_dir() / "api_key"
    raise AuthError(
        "no API key: pass api_key= or set SEQUENCES_API_KEY",
        code="no_api_key",
        hint=(f"the local gateway writes its key to {key_file} on first start "
              f"(export SEQUENCES_API_KEY=$(cat {key_file})); the client does not read that file. "
              "An MCP host starting `sequence-ai mcp` over stdio does not pass your shell's "
              "environment: set SEQUENCES_API_KEY (and SEQUENCES_GATEWAY_URL) in the host's server env entry"),
    )
