"""Shared fixtures: real gateway / worker processes on loopback (see test/_servers.py).

    gateway      a fresh gateway (temp data dir) for one test; .url, .api_key, .deploy(file, name, wait=True)
    echo_policy  path of test/policies/echo_policy.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _servers import ECHO_POLICY, GatewayProcess  # noqa: E402


@pytest.fixture
def gateway(tmp_path):
    gw = GatewayProcess.start(tmp_path)
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture(scope="module")
def module_gateway(tmp_path_factory):
    """One gateway for a whole test module (faster when tests use distinct deployment names)."""
    gw = GatewayProcess.start(tmp_path_factory.mktemp("gateway"))
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture
def echo_policy() -> str:
    return ECHO_POLICY
