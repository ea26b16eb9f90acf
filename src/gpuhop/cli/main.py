"""Runs on the user's machine: the `gpuhop` entry point and its command groups.

A command imports only its own module: `gpuhop ps` never loads the code (and the libraries)
of `agent start`, `notebook` or `data push`. `main` reads the command's name from the
arguments and registers the module that defines it; the root's help, `--version` and a name
that is no command register them all, so the listing and click's suggestions stay whole.

The everyday commands (`FAST`) are parsed here without typer when their command line is
plain and valid (see `gpuhop.cli.params`), from the very declarations typer reads for
everything else: `--help`, a mistake, every other command.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuhop.cli import params
from gpuhop.version import __version__

if TYPE_CHECKING:
    import typer

# Each command (or group) and the module under gpuhop.cli whose `register(app)` adds it, in
# the order they are registered. tests/unit/test_cli_main.py checks it against what the
# modules register.
COMMANDS: dict[str, str] = {
    "run": "jobs",
    "logs": "jobs",
    "cancel": "jobs",
    "wait": "jobs",
    "show": "show",
    "stacks": "stacks",
    "profile": "profile",
    "diff": "diff",
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
    "secret": "secret",
    "serve": "serve",
    "predict": "serve",
    "gc": "gc",
    "images": "images",
    "ui": "ui",
    "notebook": "notebook",
}


# The commands `main` parses itself when it can: each is the function of that name in its
# module (COMMANDS).
FAST = frozenset({"run", "ps", "show", "logs", "cancel", "wait"})


def _version(value: bool) -> None:
    if value:
        import typer

        typer.echo(f"gpuhop {__version__}")
        raise typer.Exit()


def _root(
    version: bool = params.Option(
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
    import typer

    app = typer.Typer(
        name="gpuhop",
        help=(
            "Use a remote GPU machine for TensorFlow as if it were local.\n\n"
            "With no remote configured, commands talk to an agent on this machine (started on"
            " demand; its state in $GPUHOP_HOME, else ~/.local/share/gpuhop on Linux), which runs"
            " jobs on its GPUs, or on the CPU if it has none.\n\n"
            "A short option means one thing in every command: -n --name, -p --param (a"
            " sweep's or a notebook's), -w --workers, -e --env, -g --gpus, -d --detach,"
            " -f --follow, -q --quiet; and --timeout is a job's time limit. Other options"
            " (--every, --watch, --dry-run, ports) have their long form only."
        ),
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(params.for_typer(_root))
    name = command_of(args) if args is not None else None
    modules = [COMMANDS[name]] if name in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in modules:
        importlib.import_module(f"gpuhop.cli.{module}").register(app)
    _for_typer(app)
    return app


def _for_typer(app: typer.Typer) -> None:
    """Every command and group callback of `app` as typer reads it (`params.for_typer`)."""
    for command in app.registered_commands:
        if command.callback is not None:
            command.callback = params.for_typer(command.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _for_typer(group.typer_instance)
    if app.registered_callback is not None and app.registered_callback.callback is not None:
        app.registered_callback.callback = params.for_typer(app.registered_callback.callback)


def fast_command(args: Sequence[str]) -> tuple[Callable[..., Any], dict[str, Any]] | None:
    """The command function and its arguments, where `args` name a command of `FAST` with
    a command line `params.parse` takes; else None (typer parses it)."""
    if not args or args[0] not in FAST:
        return None
    module = importlib.import_module(f"gpuhop.cli.{COMMANDS[args[0]]}")
    fn = getattr(module, args[0])
    kwargs = params.parse(fn, args[1:], getattr(module, "CONTEXT", {}).get(args[0]))
    return None if kwargs is None else (fn, kwargs)


def run_fast(fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Run a command as click's standalone mode does: Ctrl-C says "Aborted!", a closed
    pipe (`gpuhop ps | head`) ends it quietly, both with code 1."""
    try:
        fn(**kwargs)
    except KeyboardInterrupt:
        sys.stderr.write("\nAborted!\n")
        sys.exit(1)
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
        # No more writes to the closed pipe, not even Python's flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    except Exception as e:
        typer = sys.modules.get("typer")  # loaded by a part of the command that uses it
        if typer is None or not isinstance(e, typer.Exit):
            raise
        sys.exit(e.exit_code)


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["run"]:
        from gpuhop.cli.jobs import notebook_options_first

        args = ["run", *notebook_options_first(args[1:])]
    fast = fast_command(args)
    if fast is not None:
        run_fast(*fast)
        return
    build(args)(args=args)
