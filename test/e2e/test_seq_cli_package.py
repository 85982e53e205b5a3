"""The ``seq`` command as a package (``seq/cli/``): one module per command group, wired in
``seq/cli/__init__.py``, sharing ``seq/cli/_client.py``. Guards the command tree, the three ways
to start it, the shared defaults (the client library's resolvers) and the 80-line function
limit in ``seq/``."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import typer

from _servers import ROOT, _env

# the command tree as it was before the CLI became a package: a group lost or renamed is a break
TOP = ["serve", "deploy", "account", "validate", "init", "policy", "keys", "volume", "secret", "image", "eval",
       "adapter", "alerts", "gpus"]
POLICY = {"ls", "status", "stop", "start", "rm", "rotate-secret", "params", "doctor", "versions", "rollback",
          "traffic", "logs", "capture", "data", "scale", "usage"}
MAX_FUNCTION_LINES = 80


def test_the_command_tree_has_every_group_and_policy_command():
    from seq.cli import app

    root = typer.main.get_command(app)
    ctx = typer.Context(root)
    assert root.list_commands(ctx) == TOP
    policy = root.get_command(ctx, "policy")
    assert set(policy.list_commands(ctx)) == POLICY
    assert policy.get_command(ctx, "data").list_commands(ctx) == ["export"]
    assert root.get_command(ctx, "keys").list_commands(ctx) == ["create", "ls", "revoke"]
    assert root.get_command(ctx, "volume").list_commands(ctx) == ["put", "ls", "rm"]
    assert root.get_command(ctx, "secret").list_commands(ctx) == ["set", "ls", "rm"]
    assert root.get_command(ctx, "eval").list_commands(ctx) == ["run", "status", "report", "ls", "cancel"]
    assert root.get_command(ctx, "alerts").list_commands(ctx) == ["ls", "add", "rm", "test"]
    assert root.get_command(ctx, "account").list_commands(ctx) == ["limits"]


def test_the_console_script_and_both_module_forms_start_the_same_command():
    for argv in (["-c", "from seq.cli import main; main()"], ["-m", "seq"], ["-m", "seq.cli"]):
        r = subprocess.run([sys.executable, *argv, "policy", "--help"], env=_env(), capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        assert r.returncode == 0, (argv, r.stderr)
        for name in ("rotate-secret", "rollback", "traffic", "capture", "doctor"):
            assert name in r.stdout, (argv, name, r.stdout)


def test_import_seq_loads_no_submodule_and_every_export_resolves_as_its_type_checking_import_says():
    # `python -m seq` imports the package before seq.__main__'s guard: it must need nothing (numpy)
    probe = ("import sys, seq\n"
             "assert not [m for m in sys.modules if m.startswith('seq.') or m == 'numpy'], sorted(sys.modules)\n"
             "seq.policy, seq.Observation\n"
             "from seq import *\n"
             "assert 'numpy' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", probe], env=_env(), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    import seq

    tree = ast.parse((ROOT / "seq" / "__init__.py").read_text())
    checked = {a.name: node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1
               for a in node.names}
    checked.pop("fetch_version")     # adapter_source's own import
    assert checked == seq._EXPORTS                                   # the TYPE_CHECKING block and the lazy map agree
    assert set(seq.__all__) == set(seq._EXPORTS) | {"adapter_source"}
    for name in seq.__all__:
        assert getattr(seq, name).__module__.startswith("seq"), name
    assert set(seq.__all__) <= set(dir(seq))
    try:
        seq.no_such_name
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("seq.no_such_name resolved")


def test_the_cli_takes_its_defaults_from_the_client_resolvers(tmp_path, monkeypatch):
    import sequence_ai_core
    from seq.cli._client import CliError, GatewayClient

    monkeypatch.setenv("SEQUENCES_HOME", str(tmp_path))
    monkeypatch.setenv("SEQUENCES_GATEWAY_URL", "http://127.0.0.1:9/")
    monkeypatch.delenv("SEQUENCES_API_KEY", raising=False)
    try:
        GatewayClient(None, None, None)
    except CliError as exc:          # no key anywhere: the hint names the key file it looked for
        assert exc.code == "unauthorized" and str(tmp_path / "api_key") in exc.hint
    else:
        raise AssertionError("a client with no key was made")
    (tmp_path / "api_key").write_text("sk-from-file\n")
    gw = GatewayClient(None, None, None)
    assert gw.url == sequence_ai_core.resolve_gateway_url() == "http://127.0.0.1:9"
    assert gw.data_dir == sequence_ai_core.data_dir() == tmp_path
    assert gw.api_key == "sk-from-file"
    assert GatewayClient(None, "sk-given", tmp_path / "elsewhere").api_key == "sk-given"


def test_no_function_in_seq_is_longer_than_80_lines():
    long = []
    for path in sorted((Path(ROOT) / "seq").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
