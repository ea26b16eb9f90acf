"""Runs on the GPU host: `gpuhop agent start | stop | status | token`."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gpuhop.cli import tokens
from gpuhop.cli.output import fail, print_json, say
from gpuhop.client.embedded import socket_answers, start_background, stop
from gpuhop.home import AgentError, AgentPaths, default_home, read_pid

app = typer.Typer(
    help="Run the agent that stores, schedules and supervises jobs on this host.",
    no_args_is_help=True,
)
app.add_typer(tokens.app, name="token")

HomeOption = typer.Option(
    None, "--home", envvar="GPUHOP_HOME", help="The agent's state dir (default: user data dir)."
)


def _paths(home: Path | None) -> AgentPaths:
    return AgentPaths(home.absolute() if home else default_home())


@app.command()
def start(
    home: Path | None = HomeOption,
    fake_gpus: int | None = typer.Option(
        None, "--fake-gpus", min=0, help="Pretend the host has N GPUs (for tests and demos)."
    ),
    fake_gpu_memory: int | None = typer.Option(
        None,
        "--fake-gpu-memory",
        min=1,
        metavar="MB",
        help="Memory of each fake GPU in MB (default 8192).",
    ),
    foreground: bool = typer.Option(
        False, "--foreground", help="Serve in this process instead of as a daemon."
    ),
    listen: str | None = typer.Option(
        None,
        "--listen",
        metavar="HOST:PORT",
        help="Also serve HTTPS with bearer tokens on this TCP address (port 0: any free port).",
    ),
    no_tls: bool = typer.Option(
        False, "--no-tls", help="Plain HTTP on --listen; accepted for loopback addresses only."
    ),
    tls_cert: Path | None = typer.Option(
        None, "--tls-cert", metavar="FILE", help="Serve this certificate (PEM) on --listen."
    ),
    tls_key: Path | None = typer.Option(
        None, "--tls-key", metavar="FILE", help="The private key (PEM) of --tls-cert."
    ),
) -> None:
    """Start the agent: on a Unix socket only (no TCP port) unless --listen asks for one.

    With --listen the agent serves HTTPS there with its own self-signed certificate (made
    on first start, kept in the state dir) or --tls-cert/--tls-key, and prints the
    certificate's fingerprint for clients to pin. Every request there needs a token
    (`gpuhop agent token create USER`).
    """
    paths = _paths(home)
    if fake_gpu_memory is not None and fake_gpus is None:
        fail("--fake-gpu-memory sets the memory of fake GPUs; give --fake-gpus N too")
    if listen is None and (no_tls or tls_cert or tls_key):
        fail("--no-tls, --tls-cert and --tls-key go with --listen HOST:PORT")
    running = read_pid(paths)
    if running is not None:
        fail(f"an agent already runs for {paths.home} (pid {running}); `gpuhop agent stop` first")
    try:
        spec = None
        if listen is not None:
            from gpuhop.agent.listen import parse_listen

            spec = parse_listen(listen, not no_tls, tls_cert, tls_key)
        if foreground:
            from gpuhop.agent.daemon import serve

            serve(paths, fake_gpus=fake_gpus, fake_gpu_memory_mb=fake_gpu_memory, listen=spec)
            return
        pid = start_background(
            paths,
            fake_gpus=fake_gpus,
            fake_gpu_memory_mb=fake_gpu_memory,
            agent_args=spec.args() if spec else (),
        )
    except AgentError as e:
        fail(str(e))
    say(f"agent started (pid {pid}), listening on {paths.socket}")
    if spec is not None:
        _say_listener(paths)


def _say_listener(paths: AgentPaths) -> None:
    from gpuhop.agent.listen import read_listen_file

    info = read_listen_file(paths)
    if info is None:
        fail(f"the agent did not report its TCP listener; see {paths.logfile}")
    typer.echo(f"listening on {info.url}")
    if info.fingerprint:
        typer.echo(f"certificate fingerprint {info.fingerprint}")


@app.command("stop")
def stop_cmd(home: Path | None = HomeOption) -> None:
    """Stop the agent. Running jobs keep running and are re-attached at the next start."""
    paths = _paths(home)
    pid = stop(paths)
    if pid is None:
        say(f"no agent runs for {paths.home}")
    else:
        say(f"agent {pid} stopped")


@app.command()
def status(
    home: Path | None = HomeOption,
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Say whether the agent runs, and what it has."""
    paths = _paths(home)
    pid = read_pid(paths)
    if pid is None or not socket_answers(paths.socket):
        if json_out:
            print_json({"running": False, "home": str(paths.home)})
        else:
            say(f"no agent runs for {paths.home}")
        raise typer.Exit(1)
    from gpuhop.client import Client, GpuhopError

    try:
        with Client(paths.home, autostart=False) as client:
            info = client.info()
    except GpuhopError as e:
        fail(str(e))
    if json_out:
        print_json({"running": True, **info.model_dump(mode="json")})
        return
    gpus = ", ".join(f"{g.index}: {g.name}" for g in info.gpus) or "none (jobs run on the CPU)"
    typer.echo(f"agent {info.version}, pid {info.pid}, state dir {info.home}")
    typer.echo(f"socket {paths.socket} (mode {oct(os.stat(paths.socket).st_mode & 0o777)})")
    if info.listener is not None:
        tls = f"TLS, certificate {info.listener.fingerprint}" if info.listener.tls else "no TLS"
        typer.echo(f"listening on {info.listener.url} ({tls})")
    typer.echo(f"GPUs: {gpus}{' (fake)' if info.fake_gpus else ''}")
    typer.echo(f"jobs: {info.jobs_running} running, {info.jobs_queued} queued")
