"""Runs on the user's machine: the `--on REMOTE` option every command takes, and the client
it selects."""

from __future__ import annotations

from gpuhop.cli import params
from gpuhop.cli.output import fail
from gpuhop.client import Client, GpuhopError

OnOption = params.Option(
    None,
    "--on",
    metavar="REMOTE",
    envvar="GPUHOP_REMOTE",
    show_envvar=False,
    help="The remote GPU host to use (`gpuhop remote ls`; 'local' for this machine)."
    " Default: $GPUHOP_REMOTE, else the default remote, else this machine.",
)


def client_for(on: str | None) -> Client:
    """A client for the remote `on` names (or the default), failing the command cleanly."""
    try:
        return Client(remote=on)
    except GpuhopError as e:
        fail(e.message)
