"""Runs on the user's machine: a job's place in the queue — `run`'s queue options
(`--priority`, `--after`, `--timeout`, `--retry-on`), `gpuhop requeue`, and what `show` says
about them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuhop.api.queue import format_seconds, parse_duration
from gpuhop.api.states import RetryOn
from gpuhop.cli import params
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import fail, say
from gpuhop.client import GpuhopError

if TYPE_CHECKING:
    import typer

PriorityOption = params.Option(
    0,
    "--priority",
    min=-100,
    max=100,
    help="Higher starts first (-100..100; ties by age). On a team agent only an admin may go"
    " above 0.",
)
AfterOption = params.Option(
    None,
    "--after",
    metavar="JOB[,JOB...]",
    help="Wait in the queue until these jobs end (ids, prefixes or names; repeatable).",
)
AfterAnyOption = params.Option(
    False,
    "--after-any/--after-ok",
    help="--after-ok (default): run only if every --after job succeeded, else be cancelled"
    " saying which did not. --after-any: run however they ended.",
)
TimeoutOption = params.Option(
    None,
    "--timeout",
    metavar="DURATION",
    help="A time limit (6h, 90m, 30s, or seconds): SIGTERM when it passes, SIGKILL 10s later;"
    " the job ends with class timeout and is not retried.",
)
RetryOnOption = params.Option(
    RetryOn.infra.value,
    "--retry-on",
    metavar="infra|any",
    help="Which failures --retries runs again: infra (default: lost, oom-host, killed,"
    " gpu-fault, none of them the code's fault) or any (also app-error and oom-gpu).",
)


def queue_options(
    priority: int, after: list[str] | None, after_any: bool, timeout: str | None, retry_on: str
) -> dict[str, Any]:
    """`run`'s queue options as `Client.submit` takes them; a bad one fails here, named."""
    if retry_on not in set(RetryOn):
        fail(f"--retry-on takes {' or '.join(RetryOn)}, got {retry_on!r}")
    seconds = None
    if timeout is not None:
        try:
            seconds = parse_duration(timeout)
        except ValueError as e:
            fail(f"--timeout: {e}")
    deps = [ref.strip() for refs in after or () for ref in refs.split(",") if ref.strip()]
    if after_any and not deps:
        fail("--after-any says how to wait for --after jobs; give them with --after JOB")
    return {
        "priority": priority,
        "after": deps,
        "after_any": after_any,
        "timeout": seconds,
        "retry_on": retry_on,
    }


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
