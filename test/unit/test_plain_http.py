"""common/plain_http: the gateway-worker hops skip certifi's CA bundle (about 20 ms of CPU per
client) without ever accepting a TLS peer unverified, and take no proxy from the environment."""
from __future__ import annotations

import ssl

from sequence_ai_server.common.plain_http import client_options, tls_verify


def test_plain_http_hops_get_a_context_that_loads_no_ca_and_still_verifies():
    ctx = tls_verify("http://127.0.0.1:8000")
    assert isinstance(ctx, ssl.SSLContext) and ctx is tls_verify()            # one shared context
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname         # fails closed on TLS
    assert ctx.cert_store_stats()["x509_ca"] == 0                              # nothing trusted


def test_an_https_url_keeps_httpx_default_verification():
    assert tls_verify("https://gateway.example:8443") is True
    assert tls_verify(" HTTPS://gateway.example") is True


def test_plain_http_hops_ignore_the_environment_and_an_https_gateway_keeps_it():
    # trust_env=False: no HTTP_PROXY / ALL_PROXY for a hop between a gateway and its workers
    # (test/server/test_proxy_env.py runs them behind one); an https URL gets httpx's defaults,
    # so SSL_CERT_FILE can still name a private CA for it
    assert client_options("http://127.0.0.1:8000") == {"verify": tls_verify(), "trust_env": False}
    assert client_options() == {"verify": tls_verify(), "trust_env": False}
    assert client_options("https://gateway.example:8443") == {}
