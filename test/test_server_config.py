"""ServerConfig: every SEQ_* setting of the gateway read once, with the defaults the docs give
and an error naming the variable whose value is not usable."""
from pathlib import Path

import pytest

from sequence_ai_server.config import ServerConfig


def test_defaults_when_nothing_is_set(tmp_path):
    cfg = ServerConfig.from_env(environ={"HOME": str(tmp_path)})
    assert cfg.lease_ttl_s == 300.0 and cfg.max_gpus is None and cfg.health_interval_s == 2.0
    assert cfg.max_body_bytes is None and cfg.backend == "local" and cfg.ray_address == "local"
    assert cfg.ray_gpus_per_node == 8


def test_each_variable_reaches_its_field(tmp_path):
    env = {"SEQUENCES_HOME": str(tmp_path / "home"), "SEQ_LEASE_TTL_S": "2.5", "SEQ_MAX_GPUS": "3",
           "SEQ_HEALTH_INTERVAL_S": "0.5", "SEQ_GATEWAY_MAX_BODY_BYTES": "1024", "SEQ_BACKEND": "Ray",
           "SEQ_RAY_ADDRESS": "10.0.0.1:6379", "SEQ_RAY_GPUS_PER_NODE": "1"}
    cfg = ServerConfig.from_env(environ=env)
    assert cfg.data_dir == tmp_path / "home"
    assert (cfg.lease_ttl_s, cfg.max_gpus, cfg.health_interval_s, cfg.max_body_bytes) == (2.5, 3, 0.5, 1024)
    assert (cfg.backend, cfg.ray_address, cfg.ray_gpus_per_node) == ("ray", "10.0.0.1:6379", 1)
    assert ServerConfig.from_env(Path("/x/y"), environ=env).data_dir == Path("/x/y")   # --data-dir wins


@pytest.mark.parametrize("name, value, words", [
    ("SEQ_MAX_GPUS", "two", "SEQ_MAX_GPUS='two' is not a whole number"),
    ("SEQ_LEASE_TTL_S", "5m", "SEQ_LEASE_TTL_S='5m' is not a number"),
    ("SEQ_BACKEND", "k8s", "unknown worker backend 'k8s'"),
])
def test_an_unusable_value_names_the_variable(name, value, words):
    with pytest.raises(ValueError) as info:
        ServerConfig.from_env(environ={name: value})
    assert words in str(info.value)


def test_cards_per_node_is_checked_only_for_the_ray_backend():
    assert ServerConfig.from_env(environ={"SEQ_RAY_GPUS_PER_NODE": "0"}).ray_gpus_per_node == 8
    with pytest.raises(ValueError, match="SEQ_RAY_GPUS_PER_NODE='0' is not a card count"):
        ServerConfig.from_env(environ={"SEQ_BACKEND": "ray", "SEQ_RAY_GPUS_PER_NODE": "0"})
