"""Runs on the user's machine: `gpuhop pull`, a job's artifacts brought here."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import fail, human_bytes, say
from gpuhop.client import Client, GpuhopError, Job

DEFAULT_PULL_DIR = Path("gpuhop-artifacts")


def _job(client: Client, ref: str) -> Job:
    try:
        return client.job(ref)
    except GpuhopError as e:
        fail(e.message)


def _pull(job: Job, dest: Path, live: bool = False) -> None:
    from gpuhop.cli.progress import transfer

    try:
        with transfer(f"pulling job {job.id}'s artifacts", live) as on_bytes:
            files = job.pull(dest, on_bytes=on_bytes)
    except GpuhopError as e:
        fail(f"pulling the artifacts of job {job.id}: {e.message}")
    size = sum(f.stat().st_size for f in files)
    if files:
        say(f"pulled {len(files)} artifact file(s), {human_bytes(size)}, into {dest}")
    else:
        say(f"job {job.id} wrote no artifacts (files under $GPUHOP_ARTIFACTS_DIR come back)")


def pull(
    job_ref: str = typer.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        metavar="DIR",
        help="Where to put them (default: gpuhop-artifacts/JOB).",
    ),
    on: str | None = OnOption,
) -> None:
    """Download the files a job wrote to $GPUHOP_ARTIFACTS_DIR."""
    with client_for(on) as client:
        job = _job(client, job_ref)
        from gpuhop.cli.progress import wants_live

        _pull(job, output or DEFAULT_PULL_DIR / job.id, live=wants_live(False, sys.stderr))


def register(app: typer.Typer) -> None:
    app.command()(pull)
