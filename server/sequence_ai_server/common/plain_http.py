"""The ``verify`` setting of the httpx clients that make the plain-http hops between a gateway and
its workers (the act proxy, health pings, a worker's revocation poll, ``seq doctor``'s ping).

httpx loads certifi's CA bundle into a new TLS context for every client it creates: about 20 ms of
CPU each on a 2-core x86 VM, paid by every worker start (its revocation poller) and twice by every
gateway start, for hops that never use TLS. These clients get a TLS context that loads no CA
certificates instead: it still requires a certificate and checks the host name, so an https URL
such a client ever met would fail verification -- closed, never open. A client given an https URL
gets httpx's default (certifi's CAs).
"""
from __future__ import annotations

import functools
import ssl
from typing import Optional, Union

__all__ = ["tls_verify"]


@functools.lru_cache(maxsize=None)
def _no_ca_context() -> ssl.SSLContext:
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)     # CERT_REQUIRED and check_hostname, no CA loaded


def tls_verify(url: Optional[str] = None) -> Union[bool, ssl.SSLContext]:
    """httpx's ``verify`` for a client of plain-http hops: ``True`` for an ``https://`` ``url``,
    else one shared TLS context with no CA certificates (any TLS peer fails verification)."""
    if url is not None and url.strip().lower().startswith("https://"):
        return True
    return _no_ca_context()
