"""Runs on the user's machine: `gpuhop profile JOB`, a few seconds' profile of a running job
(TensorFlow's or JAX's profiler inside it, py-spy's samples for plain Python), waited for
with its progress shown, then where it is and how to view it."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from gpuhop.cli import params
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.jobs import find_job
from gpuhop.cli.output import console, echo, escape, fail, print_json, say, wants_live
from gpuhop.client import GpuhopError

if TYPE_CHECKING:
    import typer

    from gpuhop.client import Job

NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "py-spy": "py-spy"}


def profile(
    job_ref: str = params.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    duration: str = params.Option(
        "5s", "--duration", help="How long to capture: 5s, 30s, 1m (at most 5m)."
    ),
    worker: int | None = params.Option(
        None, "--worker", min=0, help="Only this worker's processes (multi-worker jobs)."
    ),
    json_out: bool = params.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """Profile a running job for a few seconds, without changing its script: TensorFlow's
    (or JAX's) profiler inside it, into its TensorBoard dir (see it in `gpuhop tensorboard
    JOB`'s Profile tab), or for plain Python py-spy's flame graph among its artifacts."""
    from gpuhop.api.profile import MAX_PROFILE_SECONDS
    from gpuhop.api.queue import duration_seconds

    try:
        seconds = duration_seconds(duration)  # not a time limit's: this range is said below
    except ValueError as e:
        fail(f"--duration: {e}")
    if not 0 < seconds <= MAX_PROFILE_SECONDS:
        fail(f"--duration must be more than 0 and at most {MAX_PROFILE_SECONDS:.0f}s")
    with client_for(on) as client:
        job = find_job(client, job_ref)
        try:
            data = _captured(job, seconds, worker, live=not json_out and wants_live(False))
        except GpuhopError as e:
            fail(e.message)
        except KeyboardInterrupt:
            # The agent cannot take a capture back from the job's profiler: it runs its time.
            say(
                f"stopped waiting; the capture goes on in job {job.id} for the rest of its"
                f" {seconds:g}s, and its files are kept among the job's artifacts then;"
                " another capture can start once it has ended"
            )
            raise SystemExit(130) from None
    if json_out:
        print_json(data)
        return
    _report(job.id, data)


def _captured(job: Job, seconds: float, worker: int | None, live: bool) -> dict[str, Any]:
    """The agent's answer, with a countdown on a terminal while it captures."""
    if not live:
        say(f"profiling job {job.id} for {seconds:g}s")
        return job.profile_json(seconds, worker)
    answer: list[Any] = []

    def ask() -> None:
        try:
            answer.append(job.profile_json(seconds, worker))
        except BaseException as e:  # raised in the caller's thread below
            answer.append(e)

    asking = threading.Thread(target=ask, daemon=True)
    started = time.monotonic()
    asking.start()
    with console(stderr=True).status(f"profiling job {job.id}") as status:
        while asking.is_alive():
            spent = time.monotonic() - started
            if spent < seconds:
                status.update(f"profiling job {job.id}: {spent:.0f}s of {seconds:g}s")
            else:
                status.update(f"profiling job {job.id}: writing the trace")
            asking.join(0.2)
    if isinstance(answer[0], BaseException):
        raise answer[0]
    result: dict[str, Any] = answer[0]
    return result


def _report(job: str, data: dict[str, Any]) -> None:
    profiler = NAMES.get(data["profiler"], data["profiler"])
    for process in data.get("processes", []):
        if process.get("error"):
            where = "" if process.get("worker") is None else f"worker {process['worker']}, "
            echo(
                f"[dim]{where}process {process['pid']}: {escape(process['command'])}:"
                f" {escape(process['error'])}[/dim]",
                stderr=True,
            )
    echo(f"{profiler} profile of job {job} ({data['seconds']:g}s), in its artifacts:")
    for path in data["files"]:
        echo(f"  {escape(path)}")
    if data["profiler"] == "py-spy":
        echo(f"View: gpuhop pull {job}, then open the .svg flame graph in a browser.")
    else:
        echo(f"View: gpuhop tensorboard {job} (the Profile tab); gpuhop pull {job} brings it back.")


def register(app: typer.Typer) -> None:
    app.command()(profile)
