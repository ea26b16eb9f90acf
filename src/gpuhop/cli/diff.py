"""Runs on the user's machine: `gpuhop diff JOB1 JOB2`, what changed between two jobs (the
agent compares them: GET /v1/jobs/JOB1/diff?other=JOB2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuhop.cli import params
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.jobs import find_job
from gpuhop.cli.output import echo, escape, fail, print_json
from gpuhop.cli.show import SECRET_KEY
from gpuhop.client import GpuhopError

if TYPE_CHECKING:
    import typer


def diff(
    first: str = params.Argument(..., metavar="JOB1", help="The earlier job (id, prefix, name)."),
    second: str = params.Argument(..., metavar="JOB2", help="The later job."),
    json_out: bool = params.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """Say what changed from JOB1 to JOB2: their code files (added, removed, changed),
    packages whose versions differ, options, and what they ran on (Python, platform, GPUs,
    driver, gpuhop, and each bucket's listing: its objects changed, or were added or
    removed, between them). Exits 0 whether or not anything changed."""
    with client_for(on) as client:
        job = find_job(client, first)
        try:
            data = job.diff_json(second)
        except GpuhopError as e:
            fail(e.message)
    if json_out:
        print_json(data)
        return
    echo(f"[bold]{data['a']} → {data['b']}[/bold]")
    same = True
    files = [
        *(f"+ {p}" for p in data["files_added"]),
        *(f"- {p}" for p in data["files_removed"]),
        *(f"~ {p}" for p in data["files_changed"]),
    ]
    for title, lines in (
        ("files", files),
        ("packages", [_change(c) for c in data["packages"]]),
        ("options", [_change(c, hide=True) for c in data["options"]]),
        ("ran on", [_change(c) for c in data["ran_on"]]),
    ):
        if lines:
            same = False
            echo(f"[bold]{title}[/bold]")
            for line in lines:
                echo(f"  {escape(line)}")
    if same:
        echo("no difference in files, packages, options or what they ran on")
    for note in data["unknown"]:
        echo(f"[dim]not compared: {escape(note)}[/dim]")


def _change(change: dict[str, Any], hide: bool = False) -> str:
    def shown(value: str | None) -> str:
        if value is None:
            return "(none)"
        return "******" if hide and SECRET_KEY.search(change["what"]) else value

    return f"{change['what']}: {shown(change['a'])} → {shown(change['b'])}"


def register(app: typer.Typer) -> None:
    app.command()(diff)
