"""Secrets (issue 5): `seq secret set NAME --env VAR...` reads values from stdin (never argv),
`ls` shows names and variable names only, `rm`; values are Fernet-encrypted at rest with a 0600
key file, reach a worker's environment only when its policy declares the secret, and appear in
no log. Real gateway, workers and `seq` CLI."""
from __future__ import annotations

import hashlib
import secrets
import stat
from pathlib import Path

from _servers import ECHO_POLICY, seq_cli


def _policy(tmp_path: Path, name: str, load_check: str, policy_args: str = "") -> str:
    """The echo policy whose load() first runs ``load_check`` (raising if the env is wrong)."""
    src = Path(ECHO_POLICY).read_text()
    marker = "    def load(self, weights_dir):\n"
    assert src.count(marker) == 1 and src.count("@seq.policy(\n") == 1
    src = src.replace(marker, marker + f"        {load_check}\n").replace("@seq.policy(\n", f"@seq.policy({policy_args}\n")
    path = tmp_path / f"{name}.py"
    path.write_text("import hashlib\n" + src)
    return str(path)


def test_secrets_are_encrypted_injected_only_when_declared_and_never_logged(shared_module_gateway, tmp_path):
    gw = shared_module_gateway
    value = "hf_" + secrets.token_hex(16)
    r = seq_cli(gw, "secret", "set", "hf", "--env", "HF_TOKEN", "--env", "HF_USER", input=f"{value}\nrobot-lab\n")
    assert r.returncode == 0, r.stderr
    assert "stored secret hf (HF_TOKEN, HF_USER)" in r.stdout and value not in r.stdout + r.stderr
    r = seq_cli(gw, "secret", "ls")
    assert r.returncode == 0 and "hf" in r.stdout and "HF_TOKEN, HF_USER" in r.stdout and value not in r.stdout
    assert gw.client.get("/v1/secrets").json()["secrets"][0]["env"] == ["HF_TOKEN", "HF_USER"]

    key_file = gw.data_dir / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    for f in gw.data_dir.rglob("*"):             # encrypted at rest: no file holds the plaintext
        if f.is_file():
            assert value.encode() not in f.read_bytes(), f

    digest = hashlib.sha256(value.encode()).hexdigest()
    declared = _policy(tmp_path, "declares", f"assert hashlib.sha256(os.environ.get('HF_TOKEN', '').encode()).hexdigest() "
                       f"== '{digest}' and os.environ['HF_USER'] == 'robot-lab', 'HF_TOKEN was not injected'",
                       'secrets=[seq.Secret.from_name("hf")],')
    d = gw.deploy(declared, "uses-secret")
    assert d["status"] == "ready", d.get("error")
    undeclared = _policy(tmp_path, "undeclared", "assert 'HF_TOKEN' not in os.environ, 'an undeclared secret leaked'")
    d = gw.deploy(undeclared, "no-secret")
    assert d["status"] == "ready", d.get("error")
    assert gw.connect_ready("uses-secret")["version"] == 1

    logs = [gw.log_path, *(gw.data_dir / "logs").rglob("*")]
    assert len([p for p in logs if p.is_file()]) >= 3
    for p in logs:
        if p.is_file():
            assert value not in p.read_text(errors="replace"), p

    r = seq_cli(gw, "secret", "rm", "hf")
    assert r.returncode == 0 and "removed secret hf" in r.stdout
    assert gw.client.get("/v1/secrets").json()["secrets"] == []
    r = seq_cli(gw, "secret", "rm", "hf")
    assert r.returncode == 4 and "error[not_found]" in r.stderr
    d = gw.deploy(declared, "secret-gone")        # a declared secret that is not set fails the start, saying why
    assert d["status"] == "failed" and "'hf', which is not set" in d["error"]


def test_secret_set_refuses_a_bad_variable_name(shared_module_gateway):
    r = seq_cli(shared_module_gateway, "secret", "set", "bad", "--env", "1X", input="v\n")
    assert r.returncode == 5 and "error[invalid_request]" in r.stderr and "'1X'" in r.stderr
