"""Runs on the user's machine: `gpuhop pull`, and the pull at the end of `gpuhop run --pull`:
a job's artifacts and the files it created or changed in its work dir."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path

import typer

from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import escape, fail, human_bytes, say
from gpuhop.client import GpuhopError, Job

DEFAULT_PULL_DIR = Path("gpuhop-artifacts")
# Over this, the size is said before the pull starts (the progress bar follows on a terminal).
ANNOUNCE_BYTES = 100 << 20


class Only(StrEnum):
    artifacts = "artifacts"
    workdir = "workdir"


def _where(path: Path) -> str:
    return "." if str(path) in ("", ".") else str(path)


def pull_job(
    job: Job,
    artifacts: Path | None,
    workdir: Path | None,
    overwrite: bool = False,
    live: bool = False,
) -> None:
    """Pull the job's artifacts into `artifacts` and its work-dir outputs into `workdir`
    (None: not that part), saying what came back and what was left alone."""
    from gpuhop.cli.progress import transfer

    try:
        plan = job.plan_pull(artifacts, workdir, overwrite)
        if plan.workdir_note:
            say(f"[yellow]no work-dir files: {escape(plan.workdir_note)}[/yellow]")
        if plan.size >= ANNOUNCE_BYTES:
            say(f"pulling {len(plan.todo)} file(s), {human_bytes(plan.size)}")
        with transfer(f"pulling job {job.id}'s outputs", live) as on_bytes:
            job.pull(None, on_bytes=on_bytes, plan=plan)
    except GpuhopError as e:
        fail(f"pulling the outputs of job {job.id}: {e.message}")
    except OSError as e:
        fail(f"pulling the outputs of job {job.id}: {e}")
    for kind, where in (("artifacts", artifacts), ("workdir", workdir)):
        if where is None:
            continue
        files = plan.files(kind)
        size = sum(f.stat().st_size for f in files)
        if kind == "artifacts":
            if files:
                say(
                    f"pulled {len(files)} artifact file(s), {human_bytes(size)},"
                    f" into {escape(str(where))}"
                )
            else:
                say(
                    f"job {job.id} wrote no artifacts (files under $GPUHOP_ARTIFACTS_DIR come back)"
                )
        elif files:
            say(
                f"pulled {len(files)} file(s) the job wrote in its work dir,"
                f" {human_bytes(size)}, into {escape(_where(where))}"
            )
    if plan.kept:
        shown = escape(", ".join(str(p) for p in plan.kept[:5]) + " ..." * (len(plan.kept) > 5))
        say(
            f"[yellow]kept {len(plan.kept)} local file(s) that differ from what was synced:"
            f" {shown}; the job's versions: gpuhop pull {job.id} --only workdir -C OTHER_DIR"
            " (or --overwrite)[/yellow]"
        )


def pull(
    job_ref: str = typer.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        metavar="DIR",
        help="Where the artifacts go (default: gpuhop-artifacts/JOB).",
    ),
    workdir: Path = typer.Option(
        Path("."),
        "--workdir",
        "-C",
        metavar="DIR",
        help="Where the files the job wrote in its work dir go, at their paths in it"
        " (default: this directory, where they would be had the script run here).",
    ),
    only: Only | None = typer.Option(
        None, "--only", help="Pull only the artifacts, or only the work-dir files."
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace local work-dir files even where they differ from what was synced.",
    ),
    on: str | None = OnOption,
) -> None:
    """Download what a job wrote: its $GPUHOP_ARTIFACTS_DIR, and the files it created or
    changed in its work dir (model.save("my_model.keras") comes back as ./my_model.keras).

    Unchanged files are not fetched again. A local file that you changed since the job was
    synced is kept, and named.
    """
    from gpuhop.cli.progress import wants_live

    with client_for(on) as client:
        try:
            job = client.job(job_ref)
        except GpuhopError as e:
            fail(e.message)
        pull_job(
            job,
            None if only == Only.workdir else output or DEFAULT_PULL_DIR / job.id,
            None if only == Only.artifacts else workdir,
            overwrite,
            live=wants_live(False, sys.stderr),
        )


def register(app: typer.Typer) -> None:
    app.command()(pull)
