"""Runs on the user's machine: `gpuhop gc`, garbage collection and retention on an agent."""

from __future__ import annotations

import typer

from gpuhop.api.upkeep import DiskUsage
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import fail, human_bytes, print_json, print_table, say
from gpuhop.client import GpuhopError

WHAT = {
    "jobs": "finished jobs' files (past retention)",
    "trees": "work-dir trees no job holds",
    "blobs": "files no tree or dataset names",
    "temp": "leftovers of interrupted uploads",
    "envs": "environments unused for long",
    "objects": "cached bucket prefixes unused for long",
    "images": "container images unused for long or over quota",
}


def gc(
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Say what would be removed; remove nothing."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """Remove what nothing needs any more: blobs and trees no job or dataset uses, finished
    jobs' files past the retention policy (their records stay), leftovers of interrupted
    uploads, and environments, cached bucket prefixes and container images unused for long
    (or, for images, past agent.toml's image_quota). Never anything a
    queued or running job needs, nor anything uploaded in the last hour. Admins only; the
    agent also does this on its own (at start and every few hours: see agent.toml)."""
    try:
        with client_for(on) as client:
            report = client.gc(dry_run=dry_run)
    except GpuhopError as e:
        fail(e.message)
    if json_out:
        print_json(report.model_dump(mode="json"))
        return
    rows: list[tuple[str, ...]] = [
        (WHAT[kind], str(f.count), human_bytes(f.bytes))
        for kind, f in report.freed.items()
        if f.count
    ]
    verb = "would free" if dry_run else "freed"
    if rows:
        print_table(("WHAT", "COUNT", "BYTES"), rows)
    say(f"{verb} {human_bytes(report.total_bytes)} in all")
    say(usage_line(report.usage))


def usage_line(usage: DiskUsage) -> str:
    def part(name: str, used: int, quota: int | None) -> str:
        return f"{name} {human_bytes(used)}" + (f" of {human_bytes(quota)}" if quota else "")

    return "in use: " + ", ".join(
        (
            part("storage", usage.storage_bytes, usage.storage_quota),
            part("job dirs", usage.jobs_bytes, usage.jobs_quota),
        )
    )


def register(app: typer.Typer) -> None:
    app.command()(gc)
