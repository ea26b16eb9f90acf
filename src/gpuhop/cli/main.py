"""Runs on the user's machine: the `gpuhop` entry point and its command groups.

A command imports only its own module: `gpuhop ps` never loads the code (and the libraries)
of `agent start`, `notebook` or `data push`. `main` reads the command's name from the
arguments and registers the module that defines it; the root's help, `--version` and a name
that is no command register them all, so the listing and click's suggestions stay whole.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import typer

from gpuhop.version import __version__

# Each command (or group) and the module under gpuhop.cli whose `register(app)` adds it, in
# the order they are registered. tests/unit/test_cli_main.py checks it against what the
# modules register.
COMMANDS: dict[str, str] = {
    "run": "jobs",
    "logs": "jobs",
    "cancel": "jobs",
    "show": "show",
    "requeue": "queue",
    "pull": "pull",
    "sweep": "sweep",
    "ps": "ps",
    "top": "ps",
    "forward": "forward",
    "tensorboard": "tensorboard",
    "gpus": "gpus",
    "doctor": "doctor",
    "agent": "agent",
    "remote": "remote",
    "tf-server": "tfserver",
    "data": "data",
    "env": "data",
    "serve": "serve",
    "predict": "serve",
    "gc": "gc",
    "ui": "ui",
    "notebook": "notebook",
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuhop {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    pass


def command_of(args: Sequence[str]) -> str | None:
    """The command named in `args` (the root takes only flags before it), or None."""
    return next((arg for arg in args if not arg.startswith("-")), None)


def build(args: Sequence[str] | None = None) -> typer.Typer:
    """The `gpuhop` app with the command that `args` names registered, or every command
    when they name none of them (None: all)."""
    app = typer.Typer(
        name="gpuhop",
        help=(
            "Use a remote GPU machine for TensorFlow as if it were local.\n\n"
            "With no remote configured, commands talk to an agent on this machine (started on"
            " demand, state in $GPUHOP_HOME), which runs jobs on its GPUs, or on the CPU if it"
            " has none."
        ),
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_root)
    name = command_of(args) if args is not None else None
    modules = [COMMANDS[name]] if name in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in modules:
        importlib.import_module(f"gpuhop.cli.{module}").register(app)
    return app


def main() -> None:
    build(sys.argv[1:])()
