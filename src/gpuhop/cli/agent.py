"""Runs on the GPU host: `gpuhop agent start | stop | status`."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gpuhop.cli.output import fail, print_json, say
from gpuhop.client.embedded import socket_answers, start_background, stop
from gpuhop.home import AgentError, AgentPaths, default_home, read_pid

app = typer.Typer(
    help="Run the agent that stores, schedules and supervises jobs on this host.",
    no_args_is_help=True,
)

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
) -> None:
    """Start the agent (listening on a Unix socket only; no TCP port)."""
    paths = _paths(home)
    if fake_gpu_memory is not None and fake_gpus is None:
        fail("--fake-gpu-memory sets the memory of fake GPUs; give --fake-gpus N too")
    running = read_pid(paths)
    if running is not None:
        fail(f"an agent already runs for {paths.home} (pid {running}); `gpuhop agent stop` first")
    try:
        if foreground:
            from gpuhop.agent.daemon import serve

            serve(paths, fake_gpus=fake_gpus, fake_gpu_memory_mb=fake_gpu_memory)
            return
        pid = start_background(paths, fake_gpus=fake_gpus, fake_gpu_memory_mb=fake_gpu_memory)
    except AgentError as e:
        fail(str(e))
    say(f"agent started (pid {pid}), listening on {paths.socket}")


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
    typer.echo(f"GPUs: {gpus}{' (fake)' if info.fake_gpus else ''}")
    typer.echo(f"jobs: {info.jobs_running} running, {info.jobs_queued} queued")
