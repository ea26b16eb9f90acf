"""Runs on the user's machine: the `gpuhop` entry point and its command groups."""

from __future__ import annotations

import typer

from gpuhop.cli import (
    agent,
    data,
    doctor,
    forward,
    gc,
    gpus,
    jobs,
    notebook,
    ps,
    pull,
    queue,
    remote,
    serve,
    show,
    sweep,
    tensorboard,
    tfserver,
    ui,
)
from gpuhop.version import __version__

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
jobs.register(app)
show.register(app)
queue.register(app)
pull.register(app)
sweep.register(app)
ps.register(app)
forward.register(app)
tensorboard.register(app)
gpus.register(app)
doctor.register(app)
app.add_typer(agent.app, name="agent")
app.add_typer(remote.app, name="remote")
app.add_typer(tfserver.app, name="tf-server")
data.register(app)
serve.register(app)
gc.register(app)
ui.register(app)
notebook.register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuhop {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    pass


def main() -> None:
    app()
