"""Runs on the user's machine: `gpuhop data push | ls | show | share | unshare | rm` and
`gpuhop env ls | rm`."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import (
    ago,
    counted,
    fail,
    human_bytes,
    print_json,
    print_table,
    say,
    wants_live,
)
from gpuhop.client import GpuhopError
from gpuhop.client.data import EVERYONE, PushResult

app = typer.Typer(
    help="Datasets kept on the GPU host: pushed once, re-pushed as changes only, mounted"
    " read-only into jobs with `gpuhop run --data NAME=MOUNT`.",
    no_args_is_help=True,
)
env_app = typer.Typer(
    help="The Python environments the agent built for jobs' requirements (one per set).",
    no_args_is_help=True,
)


def _ref(text: str) -> tuple[str, int | None]:
    name, colon, version = text.partition(":")
    number = version[1:] if version[:1] in ("v", "V") else version
    if colon and not number.isdigit():
        fail(f"{text}: give a dataset as NAME or NAME:VERSION (3 or v3)")
    if colon and int(number) < 1:  # not "no version given": `rm NAME:0` removed them all
        fail(f"{text}: a dataset's versions count from 1; give NAME for all of them")
    return name, int(number) if colon else None


# A push's phase (chunking, uploading) gets a bar from this size, as run's uploads do.
BAR_BYTES = 1 << 20


def _push_with_progress(
    path: Path, name: str, on: str | None, quiet: bool, shared: bool
) -> PushResult:
    from rich.progress import TaskID

    from gpuhop.cli.progress import transfer_bar

    # Drawn only on a terminal, as run's and pull's bars: a pipe or a file gets the one line
    # that says what was pushed (rich would print each bar's last frame there).
    live = not quiet and wants_live(False, sys.stderr)
    with client_for(on) as client, transfer_bar("{task.description:>9}", disable=not live) as bar:
        tasks: dict[str, TaskID | None] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:  # a phase of less than a MiB: no bar (as run's uploads)
                tasks[phase] = bar.add_task(phase, total=total) if total >= BAR_BYTES else None
            task = tasks[phase]
            if task is not None:
                bar.update(task, completed=done, total=total)

        try:
            return client.data.push(path, name, on_progress=progress, shared=shared)
        except GpuhopError as e:
            fail(e.message)


@app.command()
def push(
    path: Path = typer.Argument(..., help="A file or directory to upload."),
    name: str = typer.Option(..., "--name", "-n", help="The dataset's name."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    shared: bool = typer.Option(
        False, "--shared", help="Let every user of a team agent see and mount it."
    ),
    on: str | None = OnOption,
) -> None:
    """Upload a file or directory as a dataset; only chunks the host lacks travel.

    A push under an existing name makes a new version (v1, v2, ...), unless the content
    equals the latest version's: then no version is made. An interrupted push resumes
    where it stopped when run again. On a team agent a dataset is yours alone unless
    pushed `--shared` or shared later (`gpuhop data share NAME USER`); admins see all.
    """
    r = _push_with_progress(path, name, on, quiet, shared)
    what = f"{name} v{r.info.version}" + ("" if r.info.new else " (unchanged: no new version)")
    say(
        f"{what}: {counted(r.files, 'file')}, {human_bytes(r.bytes)} in"
        f" {counted(r.chunks, 'chunk')}; sent {counted(r.chunks_sent, 'chunk')},"
        f" {human_bytes(r.bytes_sent)} ({human_bytes(r.wire_bytes)} on"
        f" the wire) in {r.seconds:.1f}s"
    )


@app.command("ls")
def ls(
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    cached: bool = typer.Option(
        False, "--cached", help="Only the buckets' prefixes cached on the host for your jobs."
    ),
    on: str | None = OnOption,
) -> None:
    """List datasets (each version, its size and age) and, beside them, the buckets'
    prefixes cached on the host for your jobs (`--data s3://...`: objects, size, last use).
    With --json, the datasets, or with --cached the cached prefixes."""
    with client_for(on) as client:
        try:
            infos = [] if cached else client.data.list()
            prefixes = client.data.cached() if cached or not json_out else []
        except GpuhopError as e:
            fail(e.message)
    if json_out:
        print_json([i.model_dump(mode="json") for i in (prefixes if cached else infos)])
        return
    if not cached and not infos:
        say("no datasets yet; upload one with: gpuhop data push DIR --name NAME")
    elif infos:
        print_table(
            ("NAME", "VERSION", "FILES", "SIZE", "CREATED", "OWNER", "SHARED WITH"),
            [
                (
                    i.name,
                    f"v{i.version}",
                    str(i.files),
                    human_bytes(i.bytes),
                    ago(i.created_at),
                    i.owner or "-",
                    _readers(i.shared_with),
                )
                for i in infos
            ],
        )
    if prefixes:
        say("bucket data cached on the host (gpuhop gc removes what no job used for long):")
        print_table(
            ("SOURCE", "OBJECTS", "SIZE", "LAST USED", "IN USE"),
            [
                (
                    p.url + ("" if p.endpoint == "aws" else f" ({p.endpoint})"),
                    str(p.objects),
                    human_bytes(p.bytes),
                    ago(p.last_used),
                    "yes" if p.in_use else "-",
                )
                for p in prefixes
            ],
        )
    elif cached:
        say("no bucket data cached for your jobs (gpuhop run --data s3://BUCKET/PREFIX)")


def _readers(users: list[str]) -> str:
    if EVERYONE in users:
        return "everyone"
    return ",".join(users) or "-"


@app.command()
def show(
    dataset: str = typer.Argument(..., metavar="NAME[:VERSION]"),
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """Show a dataset's versions and the files of one (the latest by default)."""
    name, version = _ref(dataset)
    with client_for(on) as client:
        try:
            versions = client.data.versions(name)
            files = client.data.files(name, version)
        except GpuhopError as e:
            fail(e.message)
    if json_out:
        print_json({"versions": [v.model_dump(mode="json") for v in versions], "files": files})
        return
    for v in versions:
        held = f"{counted(v.files, 'file')}, {human_bytes(v.bytes)}"
        say(f"{name} v{v.version}: {held}, {ago(v.created_at)}")
    print_table(
        ("SIZE", "CHUNKS", "PATH"),
        [(human_bytes(int(str(f["size"]))), str(f["chunks"]), str(f["path"])) for f in files],
    )


def _share(name: str, user: str | None, everyone: bool, on: str | None, shared: bool) -> None:
    if (user is None) == (not everyone):
        fail("give a USER, or --everyone")
    who = EVERYONE if everyone or user is None else user
    with client_for(on) as client:
        try:
            info = (client.data.share if shared else client.data.unshare)(name, who)
        except GpuhopError as e:
            fail(e.message)
    say(f"{name} is shared with: {_readers(info.shared_with).replace('-', 'nobody')}")


@app.command()
def share(
    name: str = typer.Argument(...),
    user: str | None = typer.Argument(None, help="The user to share it with."),
    everyone: bool = typer.Option(False, "--everyone", help="Share it with every user."),
    on: str | None = OnOption,
) -> None:
    """Let another user of a team agent see and mount a dataset of yours (every version)."""
    _share(name, user, everyone, on, shared=True)


@app.command()
def unshare(
    name: str = typer.Argument(...),
    user: str | None = typer.Argument(None, help="The user to stop sharing it with."),
    everyone: bool = typer.Option(False, "--everyone", help="Undo a share with every user."),
    on: str | None = OnOption,
) -> None:
    """Stop sharing a dataset (jobs already running keep their mount)."""
    _share(name, user, everyone, on, shared=False)


@app.command()
def rm(
    dataset: str = typer.Argument(..., metavar="NAME[:VERSION]"),
    on: str | None = OnOption,
) -> None:
    """Remove a dataset version, or all versions of a dataset.

    Its files on the host go with it; `gpuhop gc` then removes the chunks that no version
    holds any more, so a later push of the same files sends what went.
    """
    name, version = _ref(dataset)
    with client_for(on) as client:
        try:
            removed = client.data.remove(name, version)
        except GpuhopError as e:
            fail(e.message)
    say(f"removed {name} " + ", ".join(f"v{v}" for v in removed))


@env_app.command("ls")
def env_ls(
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """List the environments: requirements, size, last use, jobs using them."""
    with client_for(on) as client:
        try:
            envs = client.envs.list()
        except GpuhopError as e:
            fail(e.message)
    if json_out:
        print_json([e.model_dump(mode="json") for e in envs])
        return
    if not envs:
        say("no environments yet; a job with a requirements.txt makes one")
        return
    print_table(
        ("ID", "SIZE", "BUILT", "LAST USED", "JOBS", "PYTHON", "REQUIREMENTS"),
        [
            (
                e.id[:12],
                human_bytes(e.size) if e.ready else "building",
                ago(e.created_at),
                ago(e.last_used),
                ",".join(e.jobs) or "-",
                e.python,
                " ".join(line for line in e.requirements.splitlines() if line.strip()),
            )
            for e in envs
        ],
    )


@env_app.command("rm")
def env_rm(
    env_id: str | None = typer.Argument(None, metavar="ID", help="An id or unique prefix."),
    unused: bool = typer.Option(
        False, "--unused", help="Remove every environment no queued or running job uses."
    ),
    older_than: float | None = typer.Option(
        None,
        "--older-than",
        metavar="DAYS",
        min=0,
        help="With --unused: only those idle this long.",
    ),
    on: str | None = OnOption,
) -> None:
    """Remove an environment, or the unused ones; a job that needs one again rebuilds it."""
    if (env_id is None) == (not unused):
        fail("give an environment ID, or --unused")
    if older_than is not None and not unused:
        fail(f"--older-than goes with --unused: gpuhop env rm --unused --older-than {older_than:g}")
    with client_for(on) as client:
        try:
            removed = client.envs.remove(
                env_id, unused, None if older_than is None else older_than * 86400
            )
        except GpuhopError as e:
            fail(e.message)
    say(f"removed {len(removed)} environment(s)" + "".join(f"\n  {r[:12]}" for r in removed))


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="data")
    main.add_typer(env_app, name="env")
