"""The ``seq`` command: author policies, run the local gateway, deploy to it and operate it.

    seq serve | deploy | validate | init | image | account [limits] | gpus
    seq policy ls | status | stop | start | rm | rotate-secret | params | doctor
               | versions | rollback | traffic | logs | capture | data export | scale | usage
    seq keys | volume | secret | eval | adapter | alerts

One module per command group, each with its own ``typer.Typer``; this module only wires them.
What they share (the gateway client, ``CliError``, the exit codes, the common options) is in
``seq/cli/_client.py``, whose docstring lists the defaults and the exit codes.
"""
from __future__ import annotations

import typer

from . import (account, adapter, author, capture, deploy, eval, keys, logs, ops, policy, secrets, serve, traffic,
               versions, volumes)

__all__ = ["app", "main"]

app = typer.Typer(help="Author, serve and deploy sequence-ai policies.", no_args_is_help=True, add_completion=False)

# a Typer added without a name lends its commands to the parent group
app.add_typer(serve.app)
app.add_typer(deploy.app)
account.app.add_typer(ops.limits_app)
app.add_typer(account.app, name="account")
app.add_typer(author.app)
policy.app.add_typer(versions.app)
policy.app.add_typer(traffic.app)
policy.app.add_typer(logs.app)
policy.app.add_typer(capture.app)
policy.app.add_typer(ops.scale_app)
app.add_typer(policy.app, name="policy")
app.add_typer(keys.app, name="keys")
app.add_typer(volumes.app, name="volume")
app.add_typer(secrets.app, name="secret")
app.add_typer(author.image_app, name="image")
app.add_typer(eval.app, name="eval")
app.add_typer(adapter.app, name="adapter")
app.add_typer(ops.alerts_app, name="alerts")
app.add_typer(ops.gpus_app)


def main() -> None:
    """The ``seq`` console script (and ``python -m seq`` / ``python -m seq.cli``)."""
    app()
