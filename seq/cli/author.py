"""Authoring commands of the ``seq`` CLI: they read a policy's declaration, never run it.

    seq validate FILE[:CLASS]          what would be deployed: image steps, weights and where they
                                       mount, code files, contracts, params with ranges
    seq init --list                    the templates
    seq init TEMPLATE DIR              copy a template into DIR (refuses a non-empty DIR)
    seq image dockerfile FILE[:CLASS]  the policy's seq.Image rendered as a Dockerfile

Exit codes: 0 accepted, 1 the declaration is malformed (the DeclarationError is printed),
2 usage (no such file, unknown template, DIR not empty).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from seq.cli._scaffold import TEMPLATES, _Usage, err, init_template, out, render_dockerfile, validate_target

__all__ = ["app", "image_app"]

app = typer.Typer()
image_app = typer.Typer(help="The policy's container image spec.", no_args_is_help=True)


@app.command("validate")
def validate(target: str = typer.Argument(..., help="FILE or FILE:Class"),
             name: Optional[str] = typer.Option(None, "--name", help="deployment name to show")) -> None:
    """Read a policy's declaration (never runs load or infer) and print what would be deployed."""
    validate_target(target, name)


@app.command("init")
def init(template: Optional[str] = typer.Argument(None, help="template name (see --list)"),
         directory: Optional[Path] = typer.Argument(None, help="where to write it (default: ./TEMPLATE)"),
         list_: bool = typer.Option(False, "--list", help="list the templates")) -> None:
    """Scaffold a policy from a template."""
    if list_ or template is None:
        for t in TEMPLATES.values():
            out.print(f"{t.name:<12} {t.description}", markup=False)
        return
    from .deploy import default_name

    target = directory or Path(template)
    name = default_name(target.expanduser().absolute() / "policy.py")   # what `seq deploy` would call it
    try:
        files = init_template(template, target, name)
    except _Usage as exc:
        err.print(f"error[invalid_request]: {exc}", markup=False)
        raise typer.Exit(2)
    out.print(f"wrote {len(files)} file(s) to {target}: {', '.join(f.name for f in files)}", markup=False)
    if any(f.name == "adapter.py" for f in files):
        out.print(f"next: seq adapter check {target / 'adapter.py'}   then: seq deploy {target / 'adapter.py'}",
                  markup=False)
        return
    out.print(f"next: seq validate {target / 'policy.py'}   then: seq deploy {target / 'policy.py'} --name {name}",
              markup=False)


@image_app.command("dockerfile")
def dockerfile(target: str = typer.Argument(..., help="FILE or FILE:Class")) -> None:
    """Print the policy's seq.Image as a Dockerfile (for users who build with Docker)."""
    import seq
    try:
        text = render_dockerfile(target)
    except _Usage as exc:
        err.print(f"error[invalid_request]: {exc}", markup=False)
        raise typer.Exit(2)
    except seq.DeclarationError as exc:
        err.print(f"error[declaration]: {exc}", markup=False)
        raise typer.Exit(1)
    out.print(text, markup=False, end="")
