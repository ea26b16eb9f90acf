"""Runs on the user's machine: `gpuhop remote add | ls | rm | default | test | bootstrap |
disconnect`, the GPU hosts this user works with."""

from __future__ import annotations

import os
import stat
import sys
import time

import typer

from gpuhop.cli.output import fail, print_json, print_table, say
from gpuhop.client import Client, GpuhopError
from gpuhop.client.transport import remotes

app = typer.Typer(
    help="The GPU hosts you use: over SSH (the default way in) or a team agent over TLS.",
    no_args_is_help=True,
)

NameArg = typer.Argument(..., metavar="NAME", help="The remote's name.")


def _remote(name: str) -> remotes.Remote:
    try:
        remote = remotes.selected(name)
    except GpuhopError as e:
        fail(e.message)
    if remote is None:
        fail(f"'{remotes.LOCAL}' is this machine's own agent; name a configured remote")
    return remote


@app.command()
def add(
    name: str = NameArg,
    url: str = typer.Argument(
        ..., metavar="URL", help="ssh://[user@]host[:port] or https://host:port"
    ),
    default: bool = typer.Option(False, "--default", help="Make it the default remote."),
    fingerprint: str | None = typer.Option(
        None,
        "--fingerprint",
        metavar="SHA256",
        help="https: the agent certificate's SHA-256 fingerprint, as `gpuhop agent start`"
        " printed it. Without it you are asked to confirm the one the server presents.",
    ),
    token_file: typer.FileText | None = typer.Option(
        None,
        "--token-file",
        metavar="FILE",
        help="https: a file holding your token, readable by you only ('-' for stdin).",
    ),
    python: str | None = typer.Option(
        None, "--python", help="ssh: the Python on the host that bootstrap installs with."
    ),
    replace: bool = typer.Option(False, "--replace", help="Overwrite a remote of that name."),
    yes: bool = typer.Option(
        False, "--yes", "-y", help="https: trust the presented certificate without asking."
    ),
) -> None:
    """Add a remote GPU host.

    ssh://: the agent is reached through your own OpenSSH client (keys, agent, ~/.ssh/config,
    jump hosts); set the host up with `gpuhop remote bootstrap NAME`.
    https://: a team agent started with `gpuhop agent start --listen`; its certificate is
    pinned now, and your token ($GPUHOP_TOKEN, --token-file, or asked for) is stored with
    it (the file is readable by you only). --replace with the same URL keeps the stored
    token unless another is given (a new pin for a replaced certificate, say).
    """
    try:
        remotes.check_name(name)
        url = remotes.check_url(url)
        config = remotes.load()
    except GpuhopError as e:
        fail(e.message)
    if name in config.remotes and not replace:
        fail(f"a remote named {name!r} exists ({config.remotes[name].url}); pass --replace")
    old = config.remotes.get(name)
    remote = remotes.Remote(name=name, url=url, python=python)
    if remote.scheme == "https":
        if python:
            fail("--python is for ssh:// remotes")
        _pin(remote, fingerprint, yes)
        if (
            old is not None
            and old.url == url
            and old.token
            and token_file is None
            and not os.environ.get("GPUHOP_TOKEN")
        ):
            # A new pin for the same agent (its certificate replaced): the token stored with
            # it goes on, as it was shown once. Never to another URL: it is not theirs.
            remote.token = old.token
            say(f"kept the token stored with remote '{name}' (--token-file gives another)")
        else:
            remote.token = _token(token_file)
    elif fingerprint or token_file:
        fail("--fingerprint and --token-file are for https:// remotes; SSH checks host keys")
    config.remotes[name] = remote
    if default or config.default is None:  # the first remote, unless a default was chosen
        config.default = name
    remotes.save(config)
    role = " (the default)" if config.default == name else ""
    say(f"added remote '{name}'{role}: {url}")
    if remote.scheme == "ssh":
        say(f"set the host up with: gpuhop remote bootstrap {name}")


def _pin(remote: remotes.Remote, given: str | None, yes: bool) -> None:
    from gpuhop.client.transport.tls import (
        fetch_certificate,
        normalize_fingerprint,
        validity_problem,
    )

    try:
        wanted = normalize_fingerprint(given) if given else None
    except ValueError as e:
        fail(f"--fingerprint: {e}")
    try:
        pem, presented = fetch_certificate(remote.url)
    except GpuhopError as e:
        fail(e.message)
    if wanted is not None and wanted != presented:
        fail(
            f"the agent at {remote.url} presents a certificate with fingerprint\n  {presented}\n"
            f"not the one you gave\n  {wanted}\nnot adding it: someone may be intercepting"
            " the connection, or the fingerprint is of another agent"
        )
    if problem := validity_problem(pem):
        fail(
            f"the agent at {remote.url} presents a certificate ({presented}) that no"
            f" connection would accept: {problem} (or this machine's clock is wrong); not"
            " adding it: ask the agent's admin to renew it"
        )
    if wanted is None and not yes:
        if not sys.stdin.isatty():
            fail(
                f"the agent at {remote.url} presents fingerprint {presented}; pass it with"
                " --fingerprint (compare it with what `gpuhop agent start` printed on the host)"
                " or --yes to trust it"
            )
        say(f"the agent at {remote.url} presents the certificate fingerprint\n  {presented}")
        if not typer.confirm("Does it match what `gpuhop agent start` printed on the host?"):
            fail("not added")
    remote.certificate = pem
    remote.fingerprint = presented


def _token(token_file: typer.FileText | None) -> str:
    if token_file is not None:
        _check_private(token_file)
        token = token_file.read().strip()
    elif os.environ.get("GPUHOP_TOKEN"):
        token = os.environ["GPUHOP_TOKEN"].strip()
    elif sys.stdin.isatty():
        token = typer.prompt("Token (from `gpuhop agent token create`)", hide_input=True)
    else:
        fail("an https remote needs a token: --token-file FILE or $GPUHOP_TOKEN")
    if not token or any(c.isspace() for c in token):
        fail("that token is empty or has spaces in it")
    return token


def _check_private(token_file: typer.FileText) -> None:
    """Refuse a token file that others may read or change, as ssh refuses such a private
    key: a token is a password, and one on a shared host may already be someone else's."""
    try:
        fd = token_file.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError):
        return  # not a file (a stream a test hands in): nothing to check
    if fd == 0 or not stat.S_ISREG(mode) or not mode & 0o077:
        return  # stdin, a pipe (`--token-file <(pass show gpuhop)`), or private
    name = token_file.name
    fail(
        f"the token file {name} is open to other users (mode {stat.S_IMODE(mode):04o}): a"
        f" token is a password. Run `chmod 600 {name}` and add the remote again; if someone"
        " else may have read it, ask the agent's admin to revoke it and make you a new one"
    )


@app.command("ls")
def ls(json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """List the remotes (tokens are never printed)."""
    try:
        config = remotes.load()
    except GpuhopError as e:
        fail(e.message)
    listed = sorted(config.remotes.values(), key=lambda r: r.name)
    rows = [
        {
            "name": r.name,
            "url": r.url,
            "default": config.default == r.name,
            "fingerprint": r.fingerprint,
            "token": bool(r.token),
        }
        for r in listed
    ]
    if json_out:
        print_json(rows)
        return
    if not rows:
        say("no remotes yet; add one with: gpuhop remote add lab ssh://me@gpu-box")
        return
    print_table(
        ("NAME", "URL", "DEFAULT", "CERTIFICATE"),
        [
            (r.name, r.url, "*" if config.default == r.name else "", r.fingerprint or "-")
            for r in listed
        ],
    )


@app.command("rm")
def rm(name: str = NameArg) -> None:
    """Forget a remote (its host and jobs are not touched)."""
    config = remotes.load()
    removed = config.remotes.pop(name, None)
    if removed is None:
        fail(f"no remote named {name!r}")
    if config.default == name:
        config.default = None
    remotes.save(config)
    if removed.scheme == "ssh":
        _disconnect(removed)
    say(f"removed remote '{name}'")


@app.command("default")
def default_cmd(
    name: str = typer.Argument(..., metavar="NAME", help=f"A remote, or '{remotes.LOCAL}'."),
) -> None:
    """Set the remote that commands use without --on ('local': this machine)."""
    config = remotes.load()
    if name != remotes.LOCAL and name not in config.remotes:
        fail(f"no remote named {name!r}")
    # 'local' is stored as chosen, so that a later `remote add` leaves it the default.
    config.default = name
    remotes.save(config)
    say(f"commands now use {'this machine' if name == remotes.LOCAL else repr(name)} by default")


@app.command()
def test(name: str = NameArg) -> None:
    """Connect to a remote's agent and say what it has, and how long a request takes."""
    remote = _remote(name)
    started = time.perf_counter()
    try:
        with Client(remote=remote.name) as client:
            connected = time.perf_counter()
            info = client.info()
            answered = time.perf_counter()
            client.info()
            again = time.perf_counter() - answered
    except GpuhopError as e:
        fail(e.message)
    gpus = ", ".join(f"{g.index}: {g.name}" for g in info.gpus) or "none (jobs run on the CPU)"
    who = f", you are {info.user}{' (admin)' if info.admin else ''}" if info.user else ""
    say(f"remote '{name}' answers: gpuhop {info.version}, agent pid {info.pid}{who}")
    say(f"GPUs: {gpus}; jobs: {info.jobs_running} running, {info.jobs_queued} queued")
    say(
        f"connect {1000 * (connected - started):.0f} ms, first request"
        f" {1000 * (answered - connected):.0f} ms, next {1000 * again:.1f} ms"
    )


@app.command()
def bootstrap(
    name: str = NameArg,
    python: str | None = typer.Option(
        None,
        "--python",
        help="The Python on the host to install with (default: the one given to `remote add`,"
        " else python3). Its packages, TensorFlow included, stay visible to jobs.",
    ),
) -> None:
    """Install this gpuhop on an ssh:// remote and start its agent (no root needed).

    Running it again changes nothing unless this gpuhop or the chosen Python differs.
    """
    from gpuhop.client.bootstrap import bootstrap as run_bootstrap

    remote = _remote(name)
    if remote.scheme != "ssh":
        fail("bootstrap sets up ssh:// remotes; a team agent is started on its host")
    try:
        report = run_bootstrap(remote, python, say=say)
    except GpuhopError as e:
        fail(e.message)
    what = "installed" if report.installed else "already up to date"
    say(f"gpuhop {what} on '{name}' ({report.home}), Python {report.python_version}")
    say(f"agent {report.agent}")
    say(f"TensorFlow: {report.tensorflow or 'not installed'}")
    for note in report.notes:
        say(f"[yellow]{note}[/yellow]")
    try:
        with Client(remote=remote.name) as client:
            info = client.info()
    except GpuhopError as e:
        fail(e.message)
    gpus = ", ".join(f"{g.index}: {g.name}" for g in info.gpus) or "none (jobs run on the CPU)"
    say(f"GPUs: {gpus}")
    say(f"ready in {report.seconds:.1f}s; try: gpuhop run --on {name} train.py")


@app.command()
def disconnect(name: str = NameArg) -> None:
    """Close the kept-alive SSH connection to a remote (the next command opens a new one)."""
    remote = _remote(name)
    if remote.scheme != "ssh":
        fail("only ssh:// remotes keep a connection open")
    say("disconnected" if _disconnect(remote) else "no connection was open")


def _disconnect(remote: remotes.Remote) -> bool:
    from gpuhop.client.transport.ssh import SshConnection

    try:
        return SshConnection(remote).disconnect()
    except GpuhopError:
        return False


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="remote")
