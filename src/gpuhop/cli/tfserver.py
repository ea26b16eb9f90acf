"""Runs on the user's machine: `gpuhop tf-server start | stop | ls`, TensorFlow servers on the
GPU host for remote ops (`gpuhop.tf.connect`)."""

from __future__ import annotations

import typer

from gpuhop.api.queue import MAX_GRACE
from gpuhop.cli import jobopts
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import ago, fail, print_table, say, state_text
from gpuhop.cli.ps import gpus_column
from gpuhop.client import GpuhopError

app = typer.Typer(
    help="TensorFlow servers on the GPU host, for running TensorFlow ops there from a local"
    " Python session (gpuhop.tf.connect). Each is a job in a private network namespace,"
    " reachable only through the agent.",
    no_args_is_help=True,
)

NameOption = typer.Option("tf-server", "--name", help="The server job's name.")


@app.command()
def start(
    gpus: int = jobopts.worded(jobopts.GPUS, "Whole GPUs the server holds."),
    gpu_memory: str | None = jobopts.worded(
        jobopts.GPU_MEMORY, "A share of one GPU instead (6GiB, 6144M, ...)."
    ),
    name: str = NameOption,
    wait: bool = typer.Option(
        True, "--wait/--no-wait", help="Return once the server answers (the default)."
    ),
    timeout: float = typer.Option(
        300,
        "--start-timeout",
        min=1,
        help="Seconds to wait for it to answer (--timeout is a job's time limit).",
    ),
    on: str | None = OnOption,
) -> None:
    """Start a TensorFlow server on the GPU host, holding its GPUs until stopped.

    Then, in Python: `with gpuhop.tf.connect(job=NAME):` and ops under
    `tf.device(gpuhop.tf.remote_device())` run there.
    """
    from gpuhop.client import tfservers

    # Its --name is the server's own (a default, no -n) and its --start-timeout a wait's: only the
    # GPU options are the job's.
    spec = jobopts.spec_of({"gpus": gpus, "gpu_memory": gpu_memory})
    with client_for(on) as client:
        try:
            job = tfservers.start(client, spec, name=name, wait=False, timeout=timeout)
            say(f"TensorFlow server job {job.id} ({name}) {state_text(job.state)}")
            if wait:
                tfservers.wait_ready(job, timeout)
                say(f"ready; connect with gpuhop.tf.connect({_remote_arg(on)}job={name!r})")
        except GpuhopError as e:
            fail(e.message)


@app.command()
def stop(
    name: str = typer.Argument("tf-server", help="The server's job name or id."),
    grace: float = typer.Option(
        5.0, "--grace", min=0, max=MAX_GRACE, help="Seconds before SIGKILL."
    ),
    on: str | None = OnOption,
) -> None:
    """Stop a TensorFlow server (cancel its job, which frees its GPUs)."""
    from gpuhop.client import tfservers

    with client_for(on) as client:
        try:
            job = tfservers.find(client, name)
            if job.state.finished:
                fail(f"the TensorFlow server {name!r} (job {job.id}) has already ended")
            job.cancel(grace=grace)
            info = job.wait(timeout=grace + 30)
        except (GpuhopError, TimeoutError) as e:
            fail(str(e))
    say(f"TensorFlow server job {info.id} ({name}) {state_text(info.state)}")


@app.command("ls")
def list_servers(on: str | None = OnOption) -> None:
    """List the TensorFlow servers that are queued, starting or running."""
    from gpuhop.client import tfservers

    with client_for(on) as client:
        try:
            infos = tfservers.list_servers(client)
        except GpuhopError as e:
            fail(e.message)
    if not infos:
        say("no TensorFlow server runs; start one with: gpuhop tf-server start")
        return
    print_table(
        ("ID", "NAME", "STATE", "GPUS", "CREATED"),
        [
            (
                i.id,
                i.name or "-",
                state_text(i.state),
                gpus_column(i.model_dump(mode="json")),
                ago(i.created_at),
            )
            for i in infos
        ],
    )


def _remote_arg(on: str | None) -> str:
    return f"{on!r}, " if on else ""


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="tf-server")
