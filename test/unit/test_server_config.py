"""ServerConfig: every SEQ_* setting of the gateway read once, with the defaults the docs give
and an error naming the variable whose value is not usable."""
from pathlib import Path

import pytest

from sequence_ai_server.common.config import ServerConfig


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


def test_a_worker_without_weights_dir_keeps_its_weights_under_the_configured_data_dir(tmp_path):
    """The worker's default weights directory is ``<data_dir>/weights/<name>`` with the data dir
    ServerConfig reads ($SEQUENCES_HOME here), not a fixed ``~/.sequence-ai``."""
    import secrets
    import subprocess
    import sys

    from _servers import ECHO_POLICY, _env, _stop, _wait_file

    home, fake_user_home = tmp_path / "seq-home", tmp_path / "user"
    fake_user_home.mkdir()
    ready, log_path = tmp_path / "w.ready.json", tmp_path / "w.log"
    cmd = [sys.executable, "-m", "sequence_ai_server.worker", "--file", ECHO_POLICY, "--port", "0",
           "--ready-file", str(ready), "--name", "cfg-echo"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env({
            "SEQ_WORKER_SECRET": secrets.token_urlsafe(16), "SEQUENCES_HOME": str(home),
            "HOME": str(fake_user_home)}))
    try:
        _wait_file(ready, proc, 60.0, log_path)
        assert (home / "weights" / "cfg-echo").is_dir(), log_path.read_text()[-2000:]
        assert not (fake_user_home / ".sequence-ai").exists()
    finally:
        _stop(proc)
