"""Runs on the user's machine: `gpuhop forward`, a job's port made reachable here."""

from __future__ import annotations

import typer

from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.jobs import find_job
from gpuhop.cli.output import fail, say, state_text
from gpuhop.client import Client, GpuhopError, Job

# Where TF Serving's clients look for its REST API: a model server's default port here.
TF_SERVING_REST_PORT = 8501


def forward(
    job_ref: str = typer.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    remote_port: int | None = typer.Argument(
        None,
        metavar="REMOTE_PORT",
        min=1,
        max=65535,
        help="The port the job listens on, on the GPU host's loopback (default for a"
        " model server job from `gpuhop serve`: its server's port).",
    ),
    local_port: int | None = typer.Option(
        None,
        "--local-port",
        min=0,
        max=65535,
        help="The port to listen on here (default: REMOTE_PORT, or 8501 for a model"
        " server, TF Serving's REST port; 0 for any free one).",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="The address to listen on here (keep it local)."
    ),
    unix: str | None = typer.Option(
        None,
        "--unix",
        metavar="PATH",
        help="Listen on a Unix socket of mode 0600 instead of a TCP port, so that other"
        " users of this machine cannot use your forward.",
    ),
    on: str | None = OnOption,
) -> None:
    """Make a port that a job listens on reachable on this machine (TensorBoard, Jupyter).

    Traffic goes through the agent's own connection (the same SSH tunnel or TLS and
    token), so the port needs no opening on the GPU host. Stays until Ctrl-C or until
    the job ends. Like `ssh -L`, a TCP port here serves every user of this machine with
    your credentials; on a shared machine use --unix PATH (only you can connect).

    Example: gpuhop forward train 6006, then open http://127.0.0.1:6006;
    gpuhop forward digits (a model server), then http://127.0.0.1:8501/v1/models/digits
    """
    with client_for(on) as client:
        job = find_job(client, job_ref)
        if remote_port is None:
            try:
                remote_port = client.model(job.id).wait_ready().port
            except GpuhopError as e:
                fail(f"{e.message}; give the port it listens on: gpuhop forward {job_ref} PORT")
            assert remote_port is not None
            if local_port is None:
                local_port = TF_SERVING_REST_PORT
        local = remote_port if local_port is None else local_port
        hold(client, job, remote_port, local, host, unix)


def hold(
    client: Client, job: Job, remote_port: int, local_port: int, host: str, unix: str | None = None
) -> None:
    """Forward `local_port` (or the Unix socket `unix`) here to the job's `remote_port`
    until Ctrl-C or its end."""

    def refused(e: GpuhopError) -> None:
        say(f"[yellow]a connection was refused: {e.message}[/yellow]")

    try:
        fwd = job.forward(remote_port, local_port, host, on_error=refused, unix=unix)
    except GpuhopError as e:
        fail(e.message)
    with fwd:
        say(f"forwarding {fwd.url} -> job {job.id} port {remote_port} (Ctrl-C to stop)")
        try:
            fwd.wait()
        except KeyboardInterrupt:
            say("stopped forwarding")
            return
    if fwd.ended is not None:
        say(f"job {job.id} {state_text(fwd.ended.state)}; stopped forwarding")


def register(app: typer.Typer) -> None:
    app.command()(forward)
