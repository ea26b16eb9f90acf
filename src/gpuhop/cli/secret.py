"""Runs on the user's machine: `gpuhop secret set | ls | rm`, the user's secrets on the agent.

A value is read from stdin (typed unseen on a terminal) or a file, never from the command
line, where the shell's history and `ps` would keep it. It goes to the agent and is never
shown again: `ls` lists names and when each was set.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import ago, fail, print_json, print_table, say
from gpuhop.client import GpuhopError

app = typer.Typer(
    help="Your secrets on the GPU host (API keys, tokens): given to a job only when it names"
    " them (gpuhop run --secret NAME), masked as *** wherever gpuhop shows the job.",
    no_args_is_help=True,
)


def _read_value(name: str, from_file: Path | None) -> str:
    """The value to set: the file's text, else stdin's (unseen where it is a terminal);
    one final newline, which `echo` and editors add, is not part of it."""
    if from_file is not None:
        try:
            raw = from_file.read_bytes()
        except OSError as e:
            fail(f"--from-file {from_file}: {e.strerror or e}")
    elif sys.stdin.isatty():
        import getpass

        raw = getpass.getpass(f"value of {name} (not shown): ").encode(errors="surrogateescape")
    else:
        raw = sys.stdin.buffer.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(
            f"the value of {name} is not UTF-8 text (byte {e.start}); a secret is an environment"
            " variable's value: give binary data encoded, e.g. base64"
        )
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        fail(f"no value for {name}: give it on stdin or with --from-file PATH")
    return text


@app.command("set")
def set_secret(
    name: str = typer.Argument(
        ..., help="The secret's name: an environment variable's (HF_TOKEN, AWS_ACCESS_KEY_ID)."
    ),
    from_file: Path | None = typer.Option(
        None, "--from-file", metavar="PATH", help="Read the value from this file."
    ),
    on: str | None = OnOption,
) -> None:
    """Set (or replace) the secret NAME; its value from stdin or --from-file, never an
    argument. Example: gpuhop secret set HF_TOKEN < token.txt"""
    from gpuhop.api.models import check_secret_name

    try:
        check_secret_name(name)
    except ValueError as e:
        fail(str(e))
    value = _read_value(name, from_file)
    with client_for(on) as client:
        try:
            client.set_secret(name, value)
        except GpuhopError as e:
            fail(e.message)
    say(f"secret {name} set; a job gets it with --secret {name}")


@app.command("ls")
def list_secrets(
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """List your secrets: names and when each was set, never a value."""
    with client_for(on) as client:
        try:
            found = client.secrets()
        except GpuhopError as e:
            fail(e.message)
    if json_out:
        print_json([s.model_dump(mode="json") for s in found])
        return
    if not found:
        say("no secrets yet; set one with: gpuhop secret set NAME < FILE")
        return
    print_table(("NAME", "SET"), [(s.name, ago(s.set_at)) for s in found])


@app.command("rm")
def remove(
    name: str = typer.Argument(..., help="The secret's name."),
    on: str | None = OnOption,
) -> None:
    """Remove the secret NAME. A queued job that names it then fails to start, saying so."""
    with client_for(on) as client:
        try:
            client.remove_secret(name)
        except GpuhopError as e:
            fail(e.message)
    say(f"secret {name} removed")


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="secret")
