"""Runs on the user's machine: `gpuhop pull`, and the pull at the end of `gpuhop run --pull`:
a job's artifacts and the files it created or changed in its work dir."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import escape, fail, human_bytes, say
from gpuhop.client import GpuhopError, Job
from gpuhop.client.pull import TMP_PART

if TYPE_CHECKING:
    from gpuhop.client.pull import PullPlan

DEFAULT_PULL_DIR = Path("gpuhop-artifacts")
# Over this, the size is said before the pull starts (the progress bar follows on a terminal).
ANNOUNCE_BYTES = 100 << 20
# Each part of a pull as its summary names it, in the order said: (route, what its files are,
# what is said when no part has any).
PARTS = (
    ("artifacts", "artifact file(s)", "nothing in its $GPUHOP_ARTIFACTS_DIR"),
    ("workdir", "file(s) the job wrote in its work dir", "no new or changed file in its work dir"),
    ("tmp", "file(s) the job left in its /tmp", "nothing kept from its /tmp"),
)


class Only(StrEnum):
    artifacts = "artifacts"
    workdir = "workdir"
    tmp = "tmp"


def _where(path: Path) -> str:
    return "." if str(path) in ("", ".") else str(path)


def destinations(
    job: Job, output: Path | None, workdir: Path | None = None, only: Only | None = None
) -> tuple[dict[str, Path], Path]:
    """Where each part of the job's pull goes, and the folder the pull makes its own.

    With `output`, all of it goes there (see `gpuhop.client.pull.layout`); without, the
    artifacts go into gpuhop-artifacts/NAME (see `folder_for`) and the work dir's files
    here, where they would be had the script run here. `workdir` sends those elsewhere;
    `only` keeps one part.
    """
    from gpuhop.client.pull import folder_for, layout

    if output is None:
        home = folder_for(DEFAULT_PULL_DIR, job.id, job.data.get("name"))
        dests = {"artifacts": home, "workdir": Path("."), "tmp": home / TMP_PART}
    else:
        home = output
        dests = layout(output)
    if workdir is not None:
        dests["workdir"] = workdir
    if only is not None:
        dests = {only.value: dests[only.value]}
    return dests, home


def pull_job(
    job: Job,
    dests: dict[str, Path],
    home: Path | None,
    overwrite: bool = False,
    live: bool = False,
) -> None:
    """Pull each part of the job into its place in `dests` (a part not there is left out),
    `home` being the folder the pull makes its own (see `PullPlan.claim`), and say in one
    summary what came back where, and what was left alone."""
    from gpuhop.cli.progress import transfer

    try:
        plan = job.plan_pull(
            dests.get("artifacts"), dests.get("workdir"), overwrite, dests.get("tmp")
        )
        plan.claim(home)
        if plan.size >= ANNOUNCE_BYTES:
            say(f"pulling {len(plan.todo)} file(s), {human_bytes(plan.size)}")
        with transfer(f"pulling job {job.id}'s outputs", live) as on_bytes:
            job.pull(None, on_bytes=on_bytes, plan=plan)
    except GpuhopError as e:
        fail(f"pulling the outputs of job {job.id}: {e.message}")
    except OSError as e:
        fail(f"pulling the outputs of job {job.id}: {e}")
    say(summary(job.id, plan))
    if plan.workdir_note:
        say(f"[yellow]no work-dir files: {escape(plan.workdir_note)}[/yellow]")
    if plan.kept:
        shown = escape(", ".join(str(p) for p in plan.kept[:5]) + " ..." * (len(plan.kept) > 5))
        say(
            f"[yellow]kept {len(plan.kept)} local file(s) that differ from what was synced:"
            f" {shown}; the job's versions: gpuhop pull {job.id} --only workdir -C OTHER_DIR"
            " (or --overwrite)[/yellow]"
        )


def summary(job_id: str, plan: PullPlan) -> str:
    """One line: each part pulled, how much, and where it went; or that there was nothing."""
    pulled, current, empty = [], [], []
    for route, files_are, none in PARTS:
        if route not in plan.roots:
            continue
        fetched = [t for r, _, t in plan.todo if r == route]
        here = len(plan.files(route)) - len(fetched)  # as the job has them: not fetched
        where = escape(_where(plan.roots[route]))
        if fetched:
            size = human_bytes(sum(f.stat().st_size for f in fetched))
            more = f" ({here} more up to date)" if here else ""
            pulled.append(f"{len(fetched)} {files_are}, {size}, into {where}{more}")
        elif here:
            current.append(f"{here} {files_are} in {where}")
        else:
            empty.append(none)
    if pulled:
        text = "pulled " + "; and ".join(pulled)
        return text + (f"; up to date: {'; '.join(current)}" if current else "")
    if current:  # nothing fetched: every file here is the job's already
        return "already up to date: " + "; ".join(current)
    said = " and ".join(filter(None, (", ".join(empty[:-1]), *empty[-1:])))
    return f"job {job_id} left nothing to pull: {said}".rstrip(": ")


def pull(
    job_ref: str = typer.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        metavar="DIR",
        help="Where everything goes: the artifacts at its top, the files the job wrote in its"
        f" work dir in DIR/workdir/ at their paths, what it left in its /tmp in DIR/{TMP_PART}/."
        " Default: the artifacts into"
        " gpuhop-artifacts/NAME/ (NAME-ID/ if another job's pull is there; ID/ for a job"
        " without a name), the work-dir files into this directory. A folder the pull makes"
        " gets a .gpuhopignore, so the next run does not sync it.",
    ),
    workdir: Path | None = typer.Option(
        None,
        "--workdir",
        "-C",
        metavar="DIR",
        help="Where the files the job wrote in its work dir go instead, at their paths in it"
        " (-C . : where they would be had the script run here).",
    ),
    only: Only | None = typer.Option(
        None,
        "--only",
        help="Pull only the artifacts, only the work-dir files, or only what the job left in"
        f" its /tmp (into {TMP_PART}/ in the artifacts' folder).",
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace local work-dir files even where they differ from what was synced.",
    ),
    on: str | None = OnOption,
) -> None:
    """Download what a job wrote: its $GPUHOP_ARTIFACTS_DIR, the files it created or
    changed in its work dir (model.save("my_model.keras") comes back as ./my_model.keras,
    or with -o out as out/workdir/my_model.keras), and what it left in its /tmp
    (tempfile.gettempdir(); into job-tmp/ beside the artifacts).

    Unchanged files are not fetched again. A local file that you changed since the job was
    synced is kept, and named.
    """
    from gpuhop.cli.progress import wants_live

    for flag, folder in (("-o", output), ("-C", workdir)):
        if folder is not None and folder.exists() and not folder.is_dir():
            fail(f"{flag} {folder} is a file, not a folder: name a folder (made if missing)")
    with client_for(on) as client:
        try:
            job = client.job(job_ref)
        except GpuhopError as e:
            fail(e.message)
        dests, home = destinations(job, output, workdir, only)
        pull_job(job, dests, home, overwrite, live=wants_live(False, sys.stderr))


def register(app: typer.Typer) -> None:
    app.command()(pull)
