"""Runs on the user's machine: `gpuhop run | logs | cancel` (`show` is in `show`, `pull` in
`pull`, `ps` in `ps`, `requeue` in `queue`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuhop.api.sizes import parse_mb
from gpuhop.api.states import EndClass, JobState
from gpuhop.cli import params
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import (
    echo,
    escape,
    exit_code_for,
    fail,
    format_metrics,
    human_bytes,
    say,
    state_text,
    wants_live,
)
from gpuhop.cli.queue import (
    AfterAnyOption,
    AfterOption,
    PriorityOption,
    RetryOnOption,
    TimeoutOption,
    queue_options,
)
from gpuhop.client import Client, GpuhopError, Job
from gpuhop.client.notebook import batch_command

if TYPE_CHECKING:
    import typer


class KerasChoice(StrEnum):
    tf_keras = "tf-keras"
    keras3 = "keras3"


def _job(client: Client, ref: str) -> Job:
    try:
        return client.job(ref)
    except GpuhopError as e:
        fail(e.message)


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--env takes KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


NoProgressOption = params.Option(
    False,
    "--no-progress",
    help="Plain log output: no live status line under it (also the case when output is not"
    " a terminal).",
)


def _stream(job: Job, worker: int | None = None) -> None:
    out = sys.stdout.buffer
    for chunk in job.logs(follow=True, worker=worker):
        out.write(chunk)
        out.flush()


def _follow(job: Job, worker: int | None = None, live: bool = False) -> Mapping[str, Any]:
    """Stream a job's log until it ends, with a live status line under it when `live`.
    Returns the ended job's JSON. Ctrl-C detaches; the job goes on."""
    try:
        if live:
            from gpuhop.cli.progress import follow_live

            return follow_live(job, worker)
        _stream(job, worker)
        return job.wait_json()
    except KeyboardInterrupt:
        echo("", stderr=True)
        say(
            f"detached from job {job.id}; it keeps running.\n"
            f"  re-attach: gpuhop logs -f {job.id}\n  stop it:   gpuhop cancel {job.id}"
        )
        raise SystemExit(130) from None


def _summary(info: Mapping[str, Any]) -> str:
    """How a job ended, from its JSON."""
    state, end_class = JobState(info["state"]), info.get("end_class")
    text = f"job {info['id']} {state_text(state)}"
    if info.get("reason"):
        text += f": {info['reason']}"
    if end_class is not None and EndClass(end_class).value != state.value:
        text += f" ({end_class})"  # why it failed, where the state does not say
    if info.get("latest_metrics"):
        text += f"\n  last metrics: {format_metrics(info['latest_metrics'])}"
    return text


def run(
    command: list[str] = params.Argument(
        ...,
        metavar="SCRIPT.py|NOTEBOOK.ipynb|COMMAND [ARGS]...",
        help="A Python script in this directory, or a program on the GPU host, and its"
        " arguments; or a notebook, run top to bottom, and its -p NAME=VALUE parameters.",
        show_default=False,
    ),
    gpus: int = params.Option(0, "--gpus", "-g", min=0, help="Whole GPUs to give the job."),
    gpu_memory: str | None = params.Option(
        None,
        "--gpu-memory",
        metavar="SIZE",
        help="Instead of whole GPUs: a share of one GPU (6GiB, 6G, 6144M, or MB), which the"
        " job may share with other such jobs. TensorFlow, JAX and PyTorch in the job are"
        " capped at it.",
    ),
    name: str | None = params.Option(None, "--name", "-n", help="A name to find the job by."),
    env: list[str] = params.Option(
        [], "--env", "-e", metavar="KEY=VALUE", help="Set an environment variable (repeatable)."
    ),
    workers: int = params.Option(
        1,
        "--workers",
        "-w",
        min=1,
        max=64,
        help="Run N worker processes: tf-keras under MultiWorkerMirroredStrategy (TF_CONFIG"
        " made for you), or Keras 3 on JAX with keras.distribution (-e KERAS_BACKEND=jax).",
    ),
    keras: KerasChoice | None = params.Option(
        None,
        "--keras",
        help="Which Keras the workers of a --workers job use (default: from KERAS_BACKEND and"
        " TF_USE_LEGACY_KERAS, then what the host has). keras3 takes its backend from"
        " KERAS_BACKEND; only jax runs across processes.",
    ),
    gpus_per_worker: int = params.Option(
        0, "--gpus-per-worker", min=0, help="Whole GPUs for each worker of a multi-worker job."
    ),
    worker_timeout: int = params.Option(
        300,
        "--worker-timeout",
        min=5,
        metavar="SECONDS",
        help="How long a worker waits for its peers to join before the job fails.",
    ),
    pack: bool = params.Option(
        False,
        "--pack",
        help="On an agent with the Ray or Slurm backend: put the workers on as few nodes as"
        " possible (default: spread across nodes; on Slurm, one worker per node).",
    ),
    retries: int = params.Option(
        0,
        "--retries",
        min=0,
        max=100,
        help="Run a failed attempt again up to N times (see --retry-on);"
        " $GPUHOP_CHECKPOINT_DIR is kept.",
    ),
    no_auto: bool = params.Option(
        False,
        "--no-auto",
        help="Leave Keras's fit as it is: no metrics callback (and, with --retries, no"
        " BackupAndRestore) added for you. Same as -e GPUHOP_AUTO=0.",
    ),
    retry_on: str = RetryOnOption,
    priority: int = PriorityOption,
    after: list[str] | None = AfterOption,
    after_any: bool = AfterAnyOption,
    timeout: str | None = TimeoutOption,
    detach: bool = params.Option(
        False, "--detach", "-d", help="Print the job id and return at once."
    ),
    pull: Path | None = params.Option(
        None,
        "--pull",
        metavar="DIR",
        help="When the job ends, pull its artifacts into DIR, and the files it created or"
        " changed in its work dir back into the synced directory.",
    ),
    workdir: Path = params.Option(
        Path("."), "--workdir", "-C", help="The directory to sync (default: this one)."
    ),
    quiet: bool = params.Option(False, "--quiet", "-q", help="Print only the job's own output."),
    data: list[str] = params.Option(
        [],
        "--data",
        metavar="NAME[:VERSION]=MOUNT",
        help="Mount a dataset read-only at MOUNT in the work dir (repeatable; latest version"
        " unless pinned, e.g. mnist:2=data).",
    ),
    requirements: Path | None = params.Option(
        None,
        "--requirements",
        "-r",
        metavar="FILE",
        help="Packages for the job's venv, built once per set on the host and reused; the"
        " host's TensorFlow stays visible. Default: requirements.txt here, if any.",
    ),
    no_requirements: bool = params.Option(
        False, "--no-requirements", help="Ignore requirements.txt: run with the host's packages."
    ),
    python: str | None = params.Option(
        None, "--python", metavar="PATH", help="Run with this interpreter on the host."
    ),
    notify: list[str] = params.Option(
        [],
        "--notify",
        metavar="URL|desktop",
        help="POST the job's start and end (JSON) to this webhook; a Slack incoming webhook"
        " works as is (repeatable). 'desktop': a desktop notification here when it ends.",
    ),
    mixed_gpus: bool = params.Option(
        False,
        "--mixed-gpus",
        help="Several GPUs may be of different models (default: the job waits for GPUs of"
        " one model and topology group).",
    ),
    no_progress: bool = NoProgressOption,
    on: str | None = OnOption,
) -> None:
    """Sync this directory to the GPU host, run a script there, and stream its output.

    Files ignored by .gitignore or .gpuhopignore are not sent; unchanged files are never
    sent twice. On a terminal, a status line under the log shows the job's state, epoch,
    step and latest metrics (from its metrics file). The exit code is the job's own.
    Ctrl-C detaches; the job keeps running.

    Example: gpuhop run --gpus 1 train.py --epochs 3
    """
    if workers > 1 and gpus:
        fail("a multi-worker job takes --gpus-per-worker, not --gpus")
    if workers == 1 and gpus_per_worker:
        fail("--gpus-per-worker is for multi-worker jobs (--workers N); use --gpus")
    share_mb = _parse_share(gpu_memory, gpus)
    queue = queue_options(priority, after, after_any, timeout, retry_on)
    desktop = "desktop" in notify
    if desktop and detach:
        fail("--notify desktop tells this terminal when the job ends; it needs a run that waits")
    client = client_for(on)
    try:
        with _uploading(wants_live(no_progress or quiet, sys.stderr)) as on_upload:
            if command[0].endswith(".ipynb"):  # a notebook, run top to bottom with nbclient
                command = batch_command(command, workdir)
            job = client.submit(
                command,
                workdir=workdir,
                gpus=gpus,
                name=name,
                env=_parse_env([*env, *(["GPUHOP_AUTO=0"] if no_auto else [])])
                | ({"GPUHOP_KERAS": keras.value} if keras else {}),
                retries=retries,
                workers=workers,
                gpus_per_worker=gpus_per_worker,
                worker_timeout=worker_timeout,
                pack=pack,
                gpu_memory=share_mb,
                data=data,
                requirements=False if no_requirements else requirements,
                python=python,
                on_upload=on_upload,
                **queue,
                notify=[url for url in notify if url != "desktop"],
                mixed_gpus=mixed_gpus,
            )
    except GpuhopError as e:
        fail(e.message)
    stats = client.last_sync
    if detach:
        print(job.id)
        return
    if not quiet and stats is not None:
        for warning in stats.warnings:
            say(f"[yellow]{escape(warning)}[/yellow]")  # paths are not markup
        sent = (
            f"{stats.files_sent} new, {human_bytes(stats.bytes_sent)}"
            if stats.files_sent
            else "all unchanged"
        )
        say(
            f"synced {stats.files} files ({sent}) in {stats.scan_seconds:.2f}s;"
            f" job {job.id} {job.state.value}"
        )
    info = _follow(job, live=wants_live(no_progress))
    if not quiet:
        say(_summary(info))
    if desktop:
        from gpuhop.cli.notify import desktop_notify

        desktop_notify(f"gpuhop: job {info['id']} {info['state']}", _summary(info))
    if pull is not None:
        from gpuhop.cli.pull import pull_job

        pull_job(job, pull, workdir, live=wants_live(quiet, sys.stderr))
    raise SystemExit(exit_code_for(info))


@contextlib.contextmanager
def _uploading(live: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar for the upload on a terminal (rich, loaded then); else nothing."""
    if not live:
        yield None
        return
    from gpuhop.cli.progress import transfer

    with transfer("uploading", True) as on_upload:
        yield on_upload


def _parse_share(gpu_memory: str | None, gpus: int) -> int | None:
    if gpu_memory is None:
        return None
    try:
        share_mb = parse_mb(gpu_memory)
    except ValueError as e:
        fail(f"--gpu-memory: {e}")
    if gpus > 1:
        fail(
            f"--gpu-memory gives the job a share of one GPU; it cannot be combined with"
            f" --gpus {gpus} (use --gpus {gpus} alone for whole GPUs)"
        )
    return share_mb


def logs(
    job_ref: str = params.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    follow: bool = params.Option(
        False, "--follow", "-f", help="Keep streaming until the job ends."
    ),
    worker: int | None = params.Option(
        None, "--worker", min=0, help="Only this worker's output (multi-worker jobs)."
    ),
    no_progress: bool = NoProgressOption,
    on: str | None = OnOption,
) -> None:
    """Print a job's output (stdout and stderr together; every worker's, prefixed).

    With --follow on a terminal, a status line under the log shows the job's state, epoch,
    step and latest metrics."""
    with client_for(on) as client:
        job = _job(client, job_ref)
        try:
            if follow:
                info = _follow(job, worker, live=wants_live(no_progress))
                say(_summary(info))
            else:
                out = sys.stdout.buffer
                for chunk in job.logs(worker=worker):
                    out.write(chunk)
                out.flush()
        except GpuhopError as e:
            fail(e.message)


def cancel(
    job_ref: str = params.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    grace: float = params.Option(
        10.0, "--grace", min=0, help="Seconds between SIGTERM and SIGKILL."
    ),
    wait: bool = params.Option(True, "--wait/--no-wait", help="Wait until the job has stopped."),
    on: str | None = OnOption,
) -> None:
    """Stop a job: SIGTERM to all its processes, then SIGKILL after the grace period."""
    with client_for(on) as client:
        job = _job(client, job_ref)
        try:
            info = job.cancel_json(grace=grace)
            if wait and not JobState(info["state"]).finished:
                info = job.wait_json(timeout=grace + 30)
        except GpuhopError as e:
            fail(e.message)
        except TimeoutError as e:
            fail(str(e))
        say(_summary(info))


# Commands' context settings (typer's, and `params.parse` honours them): everything after
# `run`'s script is the script's.
CONTEXT = {"run": {"allow_interspersed_args": False, "ignore_unknown_options": True}}


def register(app: typer.Typer) -> None:
    app.command(context_settings=CONTEXT["run"])(run)
    for fn in (logs, cancel):
        app.command()(fn)
