"""The settings of the httpx clients that make the plain-http hops between a gateway and its
workers (the act proxy, health pings, revocation pushes and a worker's revocation poll, a worker's
secrets fetch, a Ray node's proxy to its worker, ``seq doctor``'s ping): ``client_options()``.

No proxy from the environment. httpx reads ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` by
default and sends even a request for 127.0.0.1 through that proxy unless ``NO_PROXY`` names it. On
a robot or workstation behind a site proxy that would send these hops, and the worker secrets and
lease tokens they carry, to the proxy: the act proxy and a worker's secrets fetch would fail, and
a revoked session would be refused at its worker only once its lease ran out (both the push and
the poll lost). These hops are between processes of one deployment, so they never use one (an
https gateway URL, which none of ours is, keeps httpx's defaults and the environment).

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

__all__ = ["client_options", "tls_verify"]


@functools.lru_cache(maxsize=None)
def _no_ca_context() -> ssl.SSLContext:
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)     # CERT_REQUIRED and check_hostname, no CA loaded


def _https(url: Optional[str]) -> bool:
    return url is not None and url.strip().lower().startswith("https://")


def tls_verify(url: Optional[str] = None) -> Union[bool, ssl.SSLContext]:
    """httpx's ``verify`` for a client of plain-http hops: ``True`` for an ``https://`` ``url``,
    else one shared TLS context with no CA certificates (any TLS peer fails verification)."""
    return True if _https(url) else _no_ca_context()


def client_options(url: Optional[str] = None) -> dict:
    """Keyword arguments for an ``httpx.Client`` / ``AsyncClient`` (or ``httpx.get`` / ``post``)
    making a plain-http hop to ``url``: the no-CA ``verify`` of :func:`tls_verify` and
    ``trust_env=False`` (no proxy from the environment; module docstring). An ``https://`` URL
    (a gateway behind TLS, never a worker) gets httpx's defaults instead, so ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` still name a private CA for it."""
    return {} if _https(url) else {"verify": _no_ca_context(), "trust_env": False}
