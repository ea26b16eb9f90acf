"""Runs on the user's machine: `gpuhop notebook`, JupyterLab on the GPU host as a job,
forwarded here; and the `.ipynb` side of `gpuhop run` (a notebook as a batch job)."""

from __future__ import annotations

import functools
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpuhop.cli import jobopts
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import counted, fail, human_bytes, say, state_text
from gpuhop.cli.usualport import forward_at, interrupt
from gpuhop.client import Client, GpuhopError

if TYPE_CHECKING:
    from gpuhop.client.notebook import Notebook

DEFAULT_LOCAL_PORT = 8888  # Jupyter's own
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


# Kernels idle this long stop, and then the server (--idle).
DEFAULT_IDLE = "2h"


def parse_idle(text: str) -> int:
    """`2h`, `90m`, `30s`, `3600` (seconds), or `0`/`off` (never) as seconds."""
    if text.strip().lower() in ("0", "off", "never"):
        return 0
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text.lower())
    if match is None:
        fail(f"--idle takes a duration such as 2h, 90m, 600s or 0 (never), not {text!r}")
    return max(1, round(float(match.group(1)) * UNITS[match.group(2)]))


def notebook(  # noqa: PLR0913 (a command: each parameter is one of its options)
    job_ref: str | None = typer.Argument(
        None,
        metavar="JOB",
        help="Re-attach to this notebook job (id, prefix or name). Default: your newest"
        " running one, else a new one.",
    ),
    gpus: int = jobopts.worded(jobopts.GPUS, "Whole GPUs for the notebook."),
    gpu_memory: str | None = jobopts.worded(
        jobopts.GPU_MEMORY,
        "Instead of whole GPUs: a share of one GPU (6GiB, 6G, 6144M, or MB).",
    ),
    name: str | None = jobopts.worded(
        jobopts.NAME, "Name the new notebook job (or re-attach to the one of that name)."
    ),
    idle: str = typer.Option(
        DEFAULT_IDLE,
        "--idle",
        metavar="DURATION",
        help="Stop kernels idle this long, and then the server, freeing its GPUs (2h, 30m,"
        " 600s; 0 for never).",
    ),
    new: bool = typer.Option(False, "--new", help="Start another notebook even if one runs."),
    url_only: bool = typer.Option(
        False,
        "--url",
        help="Print the server's URL with its token (for VS Code or a local JupyterLab:"
        " 'Existing Jupyter Server') instead of opening a browser; keeps forwarding.",
    ),
    local_port: int | None = typer.Option(
        None,
        "--local-port",
        min=0,
        max=65535,
        help=f"The port here (default: {DEFAULT_LOCAL_PORT} if free, else any; 0 for any).",
    ),
    no_browser: bool = typer.Option(False, "--no-browser", help="Print the URL; open nothing."),
    env: list[str] = jobopts.ENV,
    data: list[str] = jobopts.worded(jobopts.DATA, "Mount a dataset (as for run)."),
    secret: list[str] = jobopts.worded(
        jobopts.SECRET, "Give the notebook server your secret NAME (as for run)."
    ),
    workdir: Path = jobopts.WORKDIR,
    requirements: Path | None = jobopts.worded(
        jobopts.REQUIREMENTS,
        "Packages for the job's venv (default: requirements.txt here, if any).",
    ),
    no_requirements: bool = jobopts.worded(
        jobopts.NO_REQUIREMENTS, "Ignore requirements.txt: use the host's packages."
    ),
    python: str | None = jobopts.worded(
        jobopts.PYTHON, "Run Jupyter and its kernels with this Python."
    ),
    image: str | None = jobopts.worded(
        jobopts.IMAGE,
        "Run Jupyter in this container image on the GPU host (Podman; JupyterLab must be"
        " installed in the image; pulled to the host where it lacks it).",
    ),
    no_image: bool = jobopts.worded(
        jobopts.NO_IMAGE,
        "Run Jupyter with the host's Python, not in a container image: also where the agent"
        " runs every job in a default image (agent.toml `image`).",
    ),
    image_secret: str | None = jobopts.IMAGE_SECRET,
    mixed_gpus: bool = jobopts.MIXED_GPUS,
    priority: int = jobopts.PRIORITY,
    time_limit: str | None = jobopts.worded(
        jobopts.TIME_LIMIT,
        "A time limit (6h, 90m, 30s, or seconds): the server gets SIGTERM when it passes,"
        " however busy its kernels (--idle stops an idle one).",
    ),
    on: str | None = OnOption,
) -> None:
    """JupyterLab on the GPU host, as a job, opened here; kernels outlive this command.

    The server runs in this directory's synced copy, with the GPUs it asks for (queued
    like any job: see gpuhop ps, cancel). It is forwarded to 127.0.0.1 here through the
    agent's connection; its token is made here and never written to the job's log.
    Ctrl-C stops forwarding only: the server and its kernels keep running, and
    `gpuhop notebook` again re-attaches. Kernels idle for --idle stop, and then the server,
    so the GPUs come back; `gpuhop pull JOB` brings back what it wrote to
    $GPUHOP_ARTIFACTS_DIR.

    Example: gpuhop notebook --gpus 1
    """
    spec = jobopts.spec_of(locals())  # first: its locals are the command's options
    from gpuhop.client import notebook as nb_client

    idle_s = parse_idle(idle)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    with client_for(on) as client:
        try:
            nb = None if new else nb_client.find(client.session, job_ref or name)
        except GpuhopError as e:
            if job_ref is not None or e.status != 404:
                fail(e.message)
            nb = None
        if nb is not None and nb.job.state.finished:
            if job_ref is not None:
                fail(
                    f"notebook job {nb.job.id} {nb.job.state.said}"
                    f" ({nb.job.info.reason or '-'}); start another: gpuhop notebook"
                )
            nb = None
        if nb is not None:
            say(f"re-attaching to notebook job {nb.job.id} ({state_text(nb.job.state)})")
            # --idle and -C are no spec fields, but ask for a new notebook as much.
            new_only = spec.non_default().keys() - {"name", "requirements"}
            elsewhere = idle_s != parse_idle(DEFAULT_IDLE) or workdir != Path(".")
            if requirements or new_only or elsewhere:
                say(
                    "[yellow]the GPU, Python, env, data, --idle, -C and queue options apply"
                    " to a new notebook; --new starts one[/yellow]"
                )
        else:
            start = functools.partial(
                nb_client.start, client.session, spec, workdir=workdir, idle=idle_s
            )
            nb = _start(client, start)
        _attach(nb, local_port, url_only, no_browser)


def _start(client: Client, start: Callable[..., Notebook]) -> Notebook:
    """Sync and queue the notebook job (`start(on_upload=...)`), saying what was sent."""
    from gpuhop.cli.progress import transfer, wants_live

    try:
        with transfer("uploading", wants_live(False, sys.stderr)) as on_upload:
            nb = start(on_upload=on_upload)
    except GpuhopError as e:
        fail(e.message)
    stats = client.last_sync
    synced = (
        f"synced {counted(stats.files, 'file')} ({human_bytes(stats.bytes)}); " if stats else ""
    )
    say(f"{synced}notebook job {nb.job.id} {nb.job.state.value}")
    return nb


def _attach(nb: Notebook, local_port: int | None, url_only: bool, no_browser: bool) -> None:
    job = nb.job

    def queued(info: object) -> None:
        say(f"notebook job {job.id} is queued, waiting for its GPUs (gpuhop ps)")

    def refused(e: GpuhopError) -> None:
        say(f"[yellow]a connection was refused: {e.message}[/yellow]")

    try:
        nb.wait_ready(timeout=180, on_queued=queued)
        fwd = forward_at(nb, DEFAULT_LOCAL_PORT, local_port, refused)
    except GpuhopError as e:
        fail(e.message)
    except KeyboardInterrupt:
        say(f"stopped waiting; notebook job {job.id} goes on (gpuhop cancel {job.id} stops it)")
        raise typer.Exit(130) from None
    with fwd:
        link = nb.url(fwd.url, "" if url_only else "lab")
        say(
            f"JupyterLab of job {job.id} at {fwd.url} (Ctrl-C stops forwarding; the server"
            f" and its kernels keep running)\n  re-attach: gpuhop notebook {job.id}\n"
            f"  stop it:   gpuhop cancel {job.id}"
        )
        sys.stdout.write(link + "\n")
        sys.stdout.flush()
        if not (url_only or no_browser):
            from gpuhop.cli.tensorboard import open_browser

            open_browser(link)
        try:
            fwd.wait()
        except KeyboardInterrupt:
            say(f"stopped forwarding; notebook job {job.id} keeps running")
            return
    ended = fwd.ended
    if ended is not None:
        say(f"notebook job {job.id} {state_text(ended.state)}: {ended.reason or '-'}")


def register(app: typer.Typer) -> None:
    app.command()(notebook)
