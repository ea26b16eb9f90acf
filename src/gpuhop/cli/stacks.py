"""Runs on the user's machine: `gpuhop stacks JOB`, where a running job is now: every Python
thread's stack in its processes, dumped by py-spy on the agent's host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuhop.cli import params
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.jobs import find_job
from gpuhop.cli.output import echo, escape, fail, print_json
from gpuhop.client import GpuhopError

if TYPE_CHECKING:
    import typer


def stacks(
    job_ref: str = params.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    worker: int | None = params.Option(
        None, "--worker", min=0, help="Only this worker's processes (multi-worker jobs)."
    ),
    native: bool = params.Option(
        False, "--native", help="Also the C/C++ frames of native extensions (slower)."
    ),
    json_out: bool = params.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """Show every Python thread's stack in a running job's processes, now (py-spy dump):
    where a slow or stuck job is. Each process is paused for the few milliseconds it takes."""
    with client_for(on) as client:
        job = find_job(client, job_ref)
        try:
            data = job.stacks_json(worker, native)
        except GpuhopError as e:
            fail(e.message)
    if json_out:
        print_json(data)
        return
    processes: list[dict[str, Any]] = data["processes"]
    if not processes:
        fail(f"job {data['job']} has no processes left to show (it may be ending)", code=1)
    for i, process in enumerate(processes):
        if i:
            echo("")
        where = "" if process.get("worker") is None else f"worker {process['worker']}, "
        if process.get("stacks") is None:
            echo(
                f"[dim]{where}process {process['pid']}: {escape(process['command'])}:"
                f" {escape(process.get('error') or 'no stacks')}[/dim]"
            )
            continue
        if where:
            echo(f"[bold]{where.rstrip(', ')}[/bold]")
        echo(escape(process["stacks"].rstrip("\n")))


def register(app: typer.Typer) -> None:
    app.command()(stacks)
