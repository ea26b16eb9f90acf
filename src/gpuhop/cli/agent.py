"""Runs on the GPU host: `gpuhop agent start | stop | status | token`."""

from __future__ import annotations

import importlib.util
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import typer

from gpuhop.backends import BackendSettings
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
    None,
    "--home",
    envvar="GPUHOP_HOME",
    help="The agent's state dir (default: ~/.local/share/gpuhop on Linux, the user data dir).",
)


def _paths(home: Path | None) -> AgentPaths:
    return AgentPaths(home.absolute() if home else default_home())


@app.command()
def start(  # noqa: PLR0913 (a command: each parameter is one of its options)
    home: Path | None = HomeOption,
    fake_gpus: int | None = typer.Option(
        None,
        "--fake-gpus",
        min=0,
        help="Pretend the host has N GPUs (for tests and demos). Their load and faults are"
        " read from fake-gpus.json in the state dir (see the README's GPU health).",
    ),
    fake_gpu_memory: int | None = typer.Option(
        None,
        "--fake-gpu-memory",
        min=1,
        metavar="MB",
        help="Memory of each fake GPU in MB (default 8192).",
    ),
    fake_gpu_models: str | None = typer.Option(
        None,
        "--fake-gpu-models",
        metavar="MODEL[@GROUP],...",
        help="Each fake GPU's model (and topology group), e.g. A100,A100,V100@1,V100@1.",
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
    backend: str | None = typer.Option(
        None,
        "--backend",
        metavar="local|ray|slurm",
        help="Where jobs run: on this host (local), on a Ray cluster (ray), or as Slurm"
        " jobs of this host's Slurm cluster (slurm)."
        " Default: what this state dir's agent used last, else local.",
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        metavar="HOST:PORT",
        help="The Ray cluster's GCS address, as `ray start --head` prints it (port 6379 by"
        " default). Needed with --backend ray.",
    ),
    ray_token_file: Path | None = typer.Option(
        None,
        "--ray-token-file",
        metavar="FILE",
        help="The cluster's token (`ray get-auth-token` on the head prints it). Default:"
        " Ray's own lookup: $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token.",
    ),
    ray_allow_no_auth: bool = typer.Option(
        False,
        "--ray-allow-no-auth",
        help="Use a Ray cluster that does not enforce token authentication (refused"
        " otherwise: anyone who reaches its ports can run code on its nodes).",
    ),
    partition: str | None = typer.Option(
        None, "--partition", metavar="P", help="The Slurm partition of jobs (--backend slurm)."
    ),
    account: str | None = typer.Option(
        None, "--account", metavar="A", help="The Slurm account jobs are charged to."
    ),
    qos: str | None = typer.Option(None, "--qos", metavar="Q", help="The Slurm QOS of jobs."),
) -> None:
    """Start the agent: on a Unix socket only (no TCP port) unless --listen asks for one.

    With --listen the agent serves HTTPS there with its own self-signed certificate (made
    on first start, kept in the state dir) or --tls-cert/--tls-key, and prints the
    certificate's fingerprint for clients to pin. Every request there needs a token
    (`gpuhop agent token create USER`).

    With --backend ray --ray-address HOST:PORT the agent runs every job on an existing Ray
    cluster (run it on the head node, or any host that reaches the cluster): each worker is
    a Ray actor that starts the job's script on a node Ray picks, and its output streams
    back here. gpuhop and TensorFlow must be installed on every node, in the Python that
    Ray's workers use. The cluster must enforce Ray's token authentication
    (RAY_AUTH_MODE=token), unless --ray-allow-no-auth.

    With --backend slurm (on the cluster's login node, as your own user) every job becomes
    one `sbatch` job of yours, optionally in --partition, --account and --qos (--workers N:
    N tasks started together by srun). The agent's state dir (--home) must be on a
    filesystem the compute nodes see: at start, a tiny `srun` on one node checks that it
    does, and the agent refuses to start where it does not.
    """
    paths = _paths(home)
    if fake_gpu_memory is not None and fake_gpus is None:
        fail("--fake-gpu-memory sets the memory of fake GPUs; give --fake-gpus N too")
    if fake_gpu_models is not None and fake_gpus is None:
        fail("--fake-gpu-models names the models of fake GPUs; give --fake-gpus N too")
    if listen is None and (no_tls or tls_cert or tls_key):
        fail("--no-tls, --tls-cert and --tls-key go with --listen HOST:PORT")
    where = _backend(
        backend, ray_address, ray_token_file, ray_allow_no_auth, (partition, account, qos)
    )
    running = read_pid(paths)
    if running is not None:
        fail(f"an agent already runs for {paths.home} (pid {running}); `gpuhop agent stop` first")
    try:
        spec = None
        if listen is not None:
            from gpuhop.agent.server.listen import parse_listen

            spec = parse_listen(listen, not no_tls, tls_cert, tls_key)
        if foreground:
            from gpuhop.agent.server.daemon import serve

            serve(
                paths,
                fake_gpus=fake_gpus,
                fake_gpu_memory_mb=fake_gpu_memory,
                listen=spec,
                backend=where,
                fake_gpu_models=fake_gpu_models,
            )
            return
        models = ["--fake-gpu-models", fake_gpu_models] if fake_gpu_models else []
        pid = start_background(
            paths,
            fake_gpus=fake_gpus,
            fake_gpu_memory_mb=fake_gpu_memory,
            agent_args=[
                *(spec.args() if spec else ()),
                *(where.args() if where else ()),
                *models,
            ],
        )
    except AgentError as e:
        fail(str(e))
    say(f"agent started (pid {pid}), listening on {paths.socket}")
    if spec is not None:
        _say_listener(paths)


def _backend(
    name: str | None,
    address: str | None,
    token_file: Path | None,
    allow_no_auth: bool,
    slurm: tuple[str | None, str | None, str | None],
) -> BackendSettings | None:
    """The --backend options, checked; None when not given (the agent keeps its last)."""
    if name is None:
        if address or token_file or allow_no_auth:
            fail("--ray-address, --ray-token-file and --ray-allow-no-auth go with --backend ray")
        if any(slurm):
            fail("--partition, --account and --qos go with --backend slurm")
        return None
    settings = BackendSettings(
        name, address, str(token_file.absolute()) if token_file else None, allow_no_auth, *slurm
    )
    try:
        settings.check()
    except AgentError as e:
        fail(str(e))
    if name == "ray" and importlib.util.find_spec("ray") is None:
        fail("the ray backend needs Ray on this host: pip install 'gpuhop[ray]'")
    if name == "slurm" and shutil.which("sbatch") is None:
        fail("the slurm backend needs Slurm's commands (sbatch, squeue, scancel) on this host")
    return settings


def _say_listener(paths: AgentPaths) -> None:
    from gpuhop.agent.server.listen import read_listen_file

    info = read_listen_file(paths)
    if info is None:
        fail(f"the agent did not report its TCP listener; see {paths.logfile}")
    typer.echo(f"listening on {info.url}")
    if info.fingerprint:
        typer.echo(f"certificate fingerprint {info.fingerprint}{_expiry(info.expires)}")


def _expiry(expires: datetime | None) -> str:
    """What follows a certificate's fingerprint: ", expires DATE UTC", and how soon where
    that is within the two weeks `gpuhop doctor` warns of (it and the agent's log then say
    how to renew it)."""
    if expires is None:
        return ""
    left = expires - datetime.now(UTC)
    soon = ""
    if left <= timedelta(0):
        soon = " (expired: clients refuse it; see `gpuhop doctor`)"
    elif left <= timedelta(days=14):
        days = f"{left.days} day(s)" if left.days else "under a day"
        soon = f" (in {days}: renew it; see `gpuhop doctor`)"
    return f", expires {expires.astimezone(UTC):%Y-%m-%d %H:%M} UTC{soon}"


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
    gpus = (
        ", ".join(f"{g.index}: {g.name}{f' on {g.node}' if g.node else ''}" for g in info.gpus)
        or "none (jobs run on the CPU)"
    )
    typer.echo(f"agent {info.version}, pid {info.pid}, state dir {info.home}")
    typer.echo(f"socket {paths.socket} (mode {oct(os.stat(paths.socket).st_mode & 0o777)})")
    if info.listener is not None:
        tls = (
            f"TLS, certificate {info.listener.fingerprint}{_expiry(info.listener.expires)}"
            if info.listener.tls
            else "no TLS"
        )
        typer.echo(f"listening on {info.listener.url} ({tls})")
    if info.backend == "slurm":
        typer.echo("backend: slurm, jobs run as Slurm jobs of the agent's user")
    elif info.backend != "local":
        typer.echo(f"backend: {info.backend}, jobs run on the cluster at {info.ray_address}")
    typer.echo(f"GPUs: {gpus}{' (fake)' if info.fake_gpus else ''}")
    typer.echo(f"jobs: {info.jobs_running} running, {info.jobs_queued} queued")


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="agent")
