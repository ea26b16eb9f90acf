"""Runs on the user's machine: a job's place in the queue — `gpuhop requeue`, and what `show`
says about it (the options that set it, `--priority`, `--after`, `--time-limit`,
`--retry-on`, are every job command's: `gpuhop.cli.jobopts`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuhop.api.queue import format_seconds
from gpuhop.api.states import RetryOn
from gpuhop.cli import params
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import fail, say
from gpuhop.client import GpuhopError

if TYPE_CHECKING:
    import typer


def queue_rows(info: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`show`'s lines about the queue: priority, dependencies, time limit, end class (from
    the job's JSON)."""
    rows = [("priority", str(info["priority"]))]
    if info.get("after"):
        how = "however they end" if info.get("after_any") else "if all succeed"
        rows.append(("after", f"{', '.join(info['after'])} ({how})"))
    if info.get("waiting_for"):
        rows.append(("waits for", ", ".join(info["waiting_for"])))
    if info.get("timeout") is not None:
        rows.append(("timeout", format_seconds(info["timeout"])))
    if info.get("retries"):
        rows.append(("retry on", info.get("retry_on", RetryOn.infra)))
    if info.get("end_class") is not None:
        rows.append(("class", info["end_class"]))
    return rows


def requeue(
    job_ref: str = params.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    priority: int = params.Option(
        ...,
        "--priority",
        min=-100,
        max=100,
        help="The job's new priority (higher starts first; above 0 is an admin's call on a"
        " team agent).",
    ),
    on: str | None = OnOption,
) -> None:
    """Change a queued job's priority: it moves to its new place in the queue."""
    with client_for(on) as client:
        try:
            info = client.job(job_ref).requeue(priority)
        except GpuhopError as e:
            fail(e.message)
    say(f"job {info.id} queued with priority {info.priority}")


def register(app: typer.Typer) -> None:
    app.command()(requeue)
