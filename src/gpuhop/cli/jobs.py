"""Runs on the user's machine: `gpuhop run | logs | cancel | wait` (`show` is in `show`, `pull` in
`pull`, `ps` in `ps`, `requeue` in `queue`)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuhop.api.queue import MAX_GRACE
from gpuhop.api.states import EndClass, JobState
from gpuhop.cli import jobopts, params
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.jobopts import KerasChoice
from gpuhop.cli.output import (
    counted,
    echo,
    escape,
    exit_code_for,
    fail,
    format_metrics,
    human_bytes,
    job_output,
    rate,
    say,
    state_text,
    wants_live,
)
from gpuhop.cli.plain import plain
from gpuhop.client import Client, GpuhopError, Job
from gpuhop.client.notebook import batch_command

if TYPE_CHECKING:
    import typer

    from gpuhop.client.submitted import SyncStats


def find_job(client: Client, ref: str) -> Job:
    """The job `ref` names, or fail saying why none is (`show` and `forward` too)."""
    try:
        return client.job(ref)
    except GpuhopError as e:
        fail(e.message)


NoProgressOption = params.Option(
    False,
    "--no-progress",
    help="Plain log output: no live status line under it (also the case when output is not"
    " a terminal).",
)


def _stream(job: Job, worker: int | None = None, raw: bool = True, offset: int = 0) -> None:
    for chunk in _as_written(job.logs(follow=True, worker=worker, offset=offset), raw):
        job_output(chunk)


def _as_written(chunks: Iterable[bytes], raw: bool) -> Iterator[bytes]:
    """A job's log as `logs` writes it: its own bytes on a terminal (which draws them) or
    with `raw`; to a pipe or a file, the text a terminal would show (`gpuhop.cli.termtext`:
    a progress bar's last frame, no escape codes)."""
    if raw or sys.stdout.isatty():
        yield from chunks
        return
    from gpuhop.cli.termtext import TerminalText

    text = TerminalText()
    for chunk in chunks:
        yield text.feed(chunk).encode()
    yield text.close().encode()


def _follow(
    job: Job,
    worker: int | None = None,
    live: bool = False,
    raw: bool = True,
    offset: int = 0,
    on: str | None = None,
) -> Mapping[str, Any]:
    """Stream a job's log (from byte `offset`) until it ends, with a live status line under
    it when `live` (else as `_as_written` with `raw`). Returns the ended job's JSON. Ctrl-C
    detaches; the job goes on, and the commands it names reach it on remote `on`."""
    try:
        if live:
            from gpuhop.cli.progress import follow_live

            return follow_live(job, worker, offset)
        _stream(job, worker, raw, offset)
        return job.wait_json()
    except KeyboardInterrupt:
        echo("", stderr=True)
        where = f" --on {on}" if on else ""  # not the default remote, perhaps
        say(
            f"detached from job {job.id}; it keeps running.\n"
            f"  re-attach: gpuhop logs -f{where} {job.id}\n"
            f"  stop it:   gpuhop cancel{where} {job.id}"
        )
        raise SystemExit(130) from None


def _summary(info: Mapping[str, Any]) -> str:
    """How a job ended, from its JSON."""
    state, end_class = JobState(info["state"]), info.get("end_class")
    text = f"job {info['id']} {state_text(state)}"
    if info.get("reason"):
        text += f": {info['reason']}"
    if end_class is not None and EndClass(end_class).value != state.value:
        text += f" ({end_class})"  # why it failed, where the state does not say
    if info.get("latest_metrics"):
        text += f"\n  last metrics: {format_metrics(info['latest_metrics'])}"
    return text


# Below this many bytes sent, a sync says no rate: it would measure the round trips.
RATE_FROM = 1 << 20
# A sync that sends this much is likely data that goes with the code: `run` says so.
BIG_SYNC = 1 << 30


def run(  # noqa: PLR0913 (a command: each parameter is one of its options)
    command: list[str] = params.Argument(
        ...,
        metavar="SCRIPT.py|NOTEBOOK.ipynb|COMMAND [ARGS]...",
        help="A Python script in this directory, or a program on the GPU host, and its"
        " arguments; or a notebook, run top to bottom, and its -p NAME=VALUE parameters.",
        show_default=False,
    ),
    gpus: int = jobopts.GPUS,
    gpu_memory: str | None = jobopts.GPU_MEMORY,
    name: str | None = jobopts.NAME,
    env: list[str] = jobopts.ENV,
    workers: int = jobopts.WORKERS,
    keras: KerasChoice | None = jobopts.KERAS,
    gpus_per_worker: int = jobopts.GPUS_PER_WORKER,
    worker_timeout: int = jobopts.WORKER_TIMEOUT,
    pack: bool = jobopts.PACK,
    retries: int = jobopts.RETRIES,
    no_auto: bool = jobopts.NO_AUTO,
    retry_on: str = jobopts.RETRY_ON,
    priority: int = jobopts.PRIORITY,
    after: list[str] | None = jobopts.AFTER,
    after_any: bool = jobopts.AFTER_ANY,
    time_limit: str | None = jobopts.TIME_LIMIT,
    detach: bool = params.Option(
        False, "--detach", "-d", help="Print the job id and return at once."
    ),
    pull: Path | None = params.Option(
        None,
        "--pull",
        metavar="DIR",
        help="When the job ends, pull what it wrote into DIR: its artifacts at the top, the"
        " files it created or changed in its work dir in DIR/workdir/ (as gpuhop pull -o"
        " DIR). The next run does not sync DIR.",
    ),
    workdir: Path = jobopts.WORKDIR,
    quiet: bool = params.Option(False, "--quiet", "-q", help="Print only the job's own output."),
    data: list[str] = jobopts.DATA,
    secret: list[str] = jobopts.SECRET,
    requirements: Path | None = jobopts.REQUIREMENTS,
    no_requirements: bool = jobopts.NO_REQUIREMENTS,
    python: str | None = jobopts.PYTHON,
    image: str | None = jobopts.IMAGE,
    no_image: bool = jobopts.NO_IMAGE,
    image_secret: str | None = jobopts.IMAGE_SECRET,
    notify: list[str] = jobopts.NOTIFY,
    mixed_gpus: bool = jobopts.MIXED_GPUS,
    no_progress: bool = NoProgressOption,
    on: str | None = OnOption,
) -> None:
    """Sync this directory to the GPU host, run a script there, and stream its output.

    Files ignored by .gitignore or .gpuhopignore are not sent; unchanged files are never
    sent twice. On a terminal, a status line under the log shows the job's state, epoch,
    step and latest metrics (from its metrics file). The exit code is the job's own.
    Ctrl-C detaches; the job keeps running.

    Example: gpuhop run --gpus 1 train.py --epochs 3
    """
    spec = jobopts.spec_of(locals())  # first: its locals are the command's options
    if command[0].startswith("-") and command[0] != "-":
        # Only `run -- -x` comes here (typer's path refuses it first, `RunCommand`): a
        # program's name never starts with a dash.
        fail(f"No such option: {command[0]}")
    desktop = jobopts.DESKTOP in notify
    if desktop and detach:
        fail("--notify desktop tells this terminal when the job ends; it needs a run that waits")
    client = client_for(on)
    started = time.monotonic()
    try:
        with _uploading(wants_live(no_progress or quiet, sys.stderr)) as on_upload:
            if command[0].endswith(".ipynb"):  # a notebook, run top to bottom with nbclient
                command = batch_command(command, workdir)
            job = client.submit(command, spec, workdir=workdir, on_upload=on_upload)
    except GpuhopError as e:
        fail(e.message)
    seconds = time.monotonic() - started
    stats = client.last_sync
    if not quiet and stats is not None:
        for warning in stats.warnings:  # with --detach too: they are the sync's
            say(f"[yellow]{escape(warning)}[/yellow]")  # paths are not markup
        if stats.bytes_sent >= BIG_SYNC:
            say(f"[yellow]{escape(big_sync_hint(stats))}[/yellow]")
    if detach:
        print(job.id)
        return
    if not quiet and stats is not None:
        sent = (
            f"{stats.files_sent} new, {human_bytes(stats.bytes_sent)}"
            + (f" at {rate(stats.bytes_sent, seconds)}" if stats.bytes_sent >= RATE_FROM else "")
            if stats.files_sent
            else "all unchanged"
        )
        say(
            f"synced {counted(stats.files, 'file')} ({sent}) in {seconds:.2f}s;"
            f" job {job.id} {job.state.value}"
        )
    info = _follow(job, live=wants_live(no_progress), on=on)
    if not quiet:
        say(_summary(info))
    if desktop:
        from gpuhop.cli.notify import desktop_notify

        # The summary is markup for the terminal; a notification shows its text.
        desktop_notify(f"gpuhop: job {info['id']} {info['state']}", plain(_summary(info)))
    if pull is not None:
        from gpuhop.cli.pull import destinations, pull_job

        dests, home = destinations(job, pull)
        pull_job(job, dests, home, live=wants_live(quiet, sys.stderr))
    raise SystemExit(exit_code_for(info))


@contextlib.contextmanager
def _uploading(live: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar for the upload on a terminal (rich, loaded then); else nothing."""
    if not live:
        yield None
        return
    from gpuhop.cli.progress import transfer

    with transfer("uploading", True) as on_upload:
        yield on_upload


def logs(
    job_ref: str = params.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    follow: bool = params.Option(
        False,
        "--follow",
        "-f",
        help="Keep streaming until the job ends, then exit with its code (as run does).",
    ),
    tail: int | None = params.Option(
        None, "--tail", min=0, metavar="N", help="Only the last N lines (then, with -f, on)."
    ),
    worker: int | None = params.Option(
        None, "--worker", min=0, help="Only this worker's output (multi-worker jobs)."
    ),
    no_progress: bool = NoProgressOption,
    raw: bool = params.Option(
        False,
        "--raw",
        help="The job's bytes as it wrote them, progress-bar frames and colour codes too. By"
        " default a pipe or a file gets the text a terminal shows (a terminal gets the bytes"
        " and draws them).",
    ),
    on: str | None = OnOption,
) -> None:
    """Print a job's output (stdout and stderr together; every worker's, prefixed).

    With --follow on a terminal, a status line under the log shows the job's state, epoch,
    step and latest metrics."""
    with client_for(on) as client:
        job = find_job(client, job_ref)
        try:
            offset = 0 if tail is None else _tail(job, tail, worker, raw, follow)
            if follow:
                live = wants_live(no_progress)
                info = _follow(job, worker, live=live, raw=raw, offset=offset, on=on)
                say(_summary(info))
                raise SystemExit(exit_code_for(info))
            if tail is None:
                for chunk in _as_written(job.logs(worker=worker), raw):
                    job_output(chunk)
        except GpuhopError as e:
            fail(e.message)


# How much of a log's end `logs --tail` reads first; four times more until it has its lines.
TAIL_WINDOW = 64 * 1024


def _tail(job: Job, lines: int, worker: int | None, raw: bool, follow: bool = False) -> int:
    """Print the last `lines` lines of the job's log; return the offset after them. The
    job's log is read from near its end (its size is known); a worker's own log whole.
    With `follow`, a last line without its newline yet (a progress bar's frames) is one of
    the `lines` but left to the follow, which gets it whole: printed here, the rest of it
    would be drawn after it as a line of its own."""
    size = None if worker is not None else int(job.data.get("log_size") or 0)
    window = TAIL_WINDOW
    while True:
        start = 0 if size is None else max(0, size - window)
        data = b"".join(job.logs(offset=start, worker=worker))
        kept = _lines(data)
        unended = b""
        if follow and lines and kept and not kept[-1].endswith(b"\n"):
            unended = kept.pop()
        shown = lines - 1 if unended else lines
        if start == 0 or len(kept) > shown:  # more than asked: the first may be cut
            break
        window *= 4
    for chunk in _as_written([b"".join(kept[max(0, len(kept) - shown) :] if shown else [])], raw):
        job_output(chunk)
    return start + len(data) - len(unended)


def _lines(data: bytes) -> list[bytes]:
    """`data`'s lines, each with its newline (the last may have none). Not
    `bytes.splitlines`: the carriage returns of a progress bar's frames end no line."""
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


JobsArgument = params.Argument(
    ..., metavar="JOB...", help="Job ids, unique id prefixes, or names.", show_default=False
)


def cancel(
    job_refs: list[str] = JobsArgument,
    grace: float = params.Option(
        10.0, "--grace", min=0, max=MAX_GRACE, help="Seconds between SIGTERM and SIGKILL."
    ),
    wait: bool = params.Option(True, "--wait/--no-wait", help="Wait until the jobs have stopped."),
    on: str | None = OnOption,
) -> None:
    """Stop jobs: SIGTERM to all their processes, then SIGKILL after the grace period.

    Each job is told at once; one that cannot be cancelled (unknown, or ended already) is
    named, the others are still cancelled, and the exit code is then 2."""
    with client_for(on) as client:
        problems = cancel_jobs(client, job_refs, grace, wait)
    if problems:
        fail("; ".join(problems))


def cancel_jobs(client: Client, job_refs: list[str], grace: float, wait: bool) -> list[str]:
    """Tell each job to stop at once, then (with `wait`) say how each ended; the problems
    met (a job unknown, or ended already), one each, the others cancelled all the same."""
    problems = []
    cancelled = []
    for ref in job_refs:
        try:
            job = client.job(ref)
            cancelled.append((job, job.cancel_json(grace=grace)))
        except GpuhopError as e:
            problems.append(e.message)
    for job, info in cancelled:
        try:
            if wait and not JobState(info["state"]).finished:
                info = job.wait_json(timeout=grace + 30)
        except GpuhopError as e:
            problems.append(e.message)
            continue
        except TimeoutError as e:
            problems.append(str(e))
            continue
        say(_summary(info))
    return problems


def wait(
    job_refs: list[str] = JobsArgument,
    on: str | None = OnOption,
) -> None:
    """Wait until jobs have ended, say how each ended, and exit with the job's code (as
    `run` does: 128+N for a signal). With several, the first non-zero code of them, in the
    order given, naming its job.

    Example: gpuhop wait train-a train-b && gpuhop pull train-b"""
    with client_for(on) as client:
        try:
            jobs = [client.job(ref) for ref in job_refs]
            ended = [job.wait_json() for job in jobs]
        except GpuhopError as e:
            fail(e.message)
        except KeyboardInterrupt:
            echo("", stderr=True)
            say("stopped waiting; the jobs go on")
            raise SystemExit(130) from None
    for info in ended:
        say(_summary(info))
    failed = [info for info in ended if exit_code_for(info)]
    if failed and len(ended) > 1:
        say(f"exit code {exit_code_for(failed[0])}, from job {failed[0]['id']}")
    raise SystemExit(exit_code_for(failed[0]) if failed else 0)


# Commands' context settings (typer's, and `params.parse` honours them): everything after
# `run`'s script is the script's.
CONTEXT = {"run": {"allow_interspersed_args": False, "ignore_unknown_options": True}}
# A notebook's own arguments: its papermill-style parameters.
NOTEBOOK_PARAMETER = ("-p", "--parameter")


def notebook_options_first(args: list[str]) -> list[str]:
    """`run`'s arguments with gpuhop's options given after a notebook moved before it
    (`run nb.ipynb -p lr=0.01 --pull out/` is `run --pull out/ nb.ipynb -p lr=0.01`): a
    notebook takes only -p NAME=VALUE parameters. After a script or a program, everything
    stays the script's; what is neither an option of `run` nor a parameter stays after the
    notebook, where `batch_command` says what is wrong with it."""
    takes_value = params.option_values(run)
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "--"):
        flag = args[i]
        if flag.startswith("--"):
            valued = takes_value.get(flag.partition("=")[0]) and "=" not in flag
        else:
            valued = takes_value.get(flag[:2]) and len(flag) == 2  # not -g2
        i += 2 if valued else 1
    if i >= len(args) or not args[i].endswith(".ipynb"):
        return args
    options: list[str] = []
    rest: list[str] = []
    tail = iter(args[i + 1 :])
    for arg in tail:
        name = arg.partition("=")[0]
        if arg in NOTEBOOK_PARAMETER:
            rest += [arg, *([value] if (value := next(tail, None)) is not None else [])]
        elif name in takes_value and name not in NOTEBOOK_PARAMETER:
            options.append(arg)
            if takes_value[name] and "=" not in arg:
                options += [value] if (value := next(tail, None)) is not None else []
        else:
            rest.append(arg)
    return [*args[:i], *options, args[i], *rest]


def big_sync_hint(stats: SyncStats) -> str:
    """What to do about a work dir that sent BIG_SYNC bytes or more: data goes once, as a
    dataset, or stays out of the work dir."""
    files = ", ".join(f"{path} ({human_bytes(size)})" for path, size in stats.largest())
    return (
        f"{human_bytes(stats.bytes_sent)} of this work dir went with the job"
        + (f" (largest: {files})" if files else "")
        + ": data that big is better pushed once (gpuhop data push DIR --name NAME, then"
        " run --data NAME) and left out of the work dir (.gpuhopignore)"
    )


def register(app: typer.Typer) -> None:
    app.command(context_settings=CONTEXT["run"], cls=jobopts.script_command())(run)
    for fn in (logs, cancel, wait):
        app.command()(fn)
