"""Runs on the GPU host: `gpuhop agent token create | ls | revoke`, through the local agent.

Tokens let users reach the agent's TCP listener (`gpuhop agent start --listen`). These
commands talk to the agent over its Unix socket, where the caller is its owner, an admin.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import NoReturn

import typer

from gpuhop.cli.output import ago, fail, print_json, print_table, say
from gpuhop.client import Client, GpuhopError
from gpuhop.home import AgentPaths, default_home

app = typer.Typer(
    help="Bearer tokens for the agent's TCP listener: each names a user.", no_args_is_help=True
)

HomeOption = typer.Option(
    None,
    "--home",
    envvar="GPUHOP_HOME",
    help="The agent's state dir (default: ~/.local/share/gpuhop on Linux, the user data dir).",
)


def _paths(home: Path | None) -> AgentPaths:
    return AgentPaths(home.absolute() if home else default_home())


def _client(home: Path | None) -> Client:
    paths = _paths(home)
    try:
        return Client(paths.home, autostart=False)
    except GpuhopError as e:
        _fail(e, home)


def _fail(e: GpuhopError, home: Path | None) -> NoReturn:
    """Say `e`; where no agent answered (these commands start none), how to start it."""
    if e.code != "unreachable":
        fail(e.message)
    start = ["gpuhop", "agent", "start"] + (["--home", str(home)] if home else [])
    fail(f"{e.message}; start the agent first with `{shlex.join(start)}`")


@app.command()
def create(
    user: str = typer.Argument(..., help="Whose jobs the token's holder submits and sees."),
    admin: bool = typer.Option(False, "--admin", help="May see and touch every user's jobs."),
    home: Path | None = HomeOption,
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Make a token for USER and print it. It is shown this once; the agent keeps a hash."""
    with _client(home) as client:
        try:
            created = client.create_token(user, admin=admin)
        except GpuhopError as e:
            _fail(e, home)
    if json_out:
        print_json(created.model_dump(mode="json"))
        return
    typer.echo(created.token)
    say(
        f"token {created.id} for {created.user}{' (admin)' if created.admin else ''};"
        f" it is shown only now. Hand it over; {_how_to_add(_paths(home))}"
    )


def _how_to_add(paths: AgentPaths) -> str:
    """How the token's holder adds this agent as a remote: the command, as they can paste
    it (this host's name, the listener's address and its certificate's fingerprint)."""
    import socket

    from gpuhop.agent.server.listen import read_listen_file
    from gpuhop.client.transport.remotes import NAME_RE

    info = read_listen_file(paths)
    if info is None or not info.tls:
        return (
            "the agent has no TLS listener to reach it by: start it with"
            " `gpuhop agent start --listen HOST:PORT`"
        )
    host = socket.gethostname()
    url = info.url
    scheme, _, address = url.partition("://")
    bound, _, port = address.rpartition(":")
    if bound in ("0.0.0.0", "[::]"):  # every interface: the host by its name
        url = f"{scheme}://{socket.getfqdn()}:{port}"
    name = host.split(".")[0] if NAME_RE.match(host.split(".")[0]) else "team"
    add = ["gpuhop", "remote", "add", name, url, "--fingerprint", info.fingerprint or ""]
    return (
        f"the holder adds this agent with\n  {shlex.join(add)}\n"
        "which asks for the token (or give it with --token-file FILE, or in $GPUHOP_TOKEN)"
    )


@app.command("ls")
def list_tokens(
    home: Path | None = HomeOption,
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """List the tokens (never the tokens themselves): id, user, admin, created, last used."""
    with _client(home) as client:
        try:
            tokens = client.tokens()
        except GpuhopError as e:
            _fail(e, home)
    if json_out:
        print_json([t.model_dump(mode="json") for t in tokens])
        return
    if not tokens:
        say("no tokens yet; make one with: gpuhop agent token create USER")
        return
    print_table(
        ("ID", "USER", "ADMIN", "CREATED", "LAST USED"),
        [
            (
                t.id,
                t.user,
                "yes" if t.admin else "no",
                ago(t.created_at),
                ago(t.last_used_at) if t.last_used_at else "never",
            )
            for t in tokens
        ],
    )


@app.command()
def revoke(
    token_id: str = typer.Argument(..., metavar="ID", help="The token's id (from `ls`)."),
    home: Path | None = HomeOption,
) -> None:
    """Revoke a token: the next request carrying it is refused."""
    with _client(home) as client:
        try:
            record = client.revoke_token(token_id)
        except GpuhopError as e:
            _fail(e, home)
    say(f"token {record.id} of {record.user} revoked")
