"""Runs on the user's machine: live progress in the terminal.

- `follow_live`: a job's log streams above a status line (state, elapsed time, epoch and
  step, latest metrics) that a poller thread feeds from the job's metrics file.
- `transfer`: a progress bar with throughput for uploads and pulls.

Both draw only on a terminal; `wants_live()` says whether to use them at all.
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from gpuhop.api import JobInfo, JobState
from gpuhop.cli.output import STATE_STYLE, console, rate, visible, wants_live
from gpuhop.client import GpuhopError, Job

if TYPE_CHECKING:
    from rich.progress import Progress

# The status line reads the job's state and metrics this often, and sooner (but at most
# every MIN_POLL_SECONDS) when the job prints: an epoch's end prints a line and logs metrics.
POLL_SECONDS = 1.0
MIN_POLL_SECONDS = 0.25
# Keys of a metrics record that are not metrics (see gpuhop.runtime.log_metrics).
NOT_METRICS = frozenset(
    {"time", "step", "epoch", "epochs", "source", "progress", "epoch_step", "epoch_steps", "eta"}
)


def elapsed_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 3600:
        return f"{seconds // 60}:{seconds % 60:02d}"
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def metric_text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return visible(str(value))


class JobStatus:
    """What the status line shows, kept up to date by `poll()` (one thread) and drawn by
    rich (another): plain assignments of whole values, so a draw never sees half an update."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.info: JobInfo = job.info
        self.metrics: dict[str, object] = {}
        self.epoch: int | None = None
        self.epochs: int | None = None
        self.step: int | None = None
        self.source: str | None = None  # where the metrics shown came from (fit:MODEL, ...)
        self.within: Within | None = None  # where the running epoch is, as the fit last said
        self.heard = False  # whether the job has written any record yet
        self._offset = 0
        self._spinner = Spinner("dots", style="cyan")

    def poll(self) -> None:
        """Read the job's state and any new metric records. Errors wait for the next poll."""
        try:
            self.info = self.job.refresh()
            records, self._offset = self.job.metrics(self._offset, progress=True)
        except GpuhopError:
            return
        metrics = dict(self.metrics)
        for record in records:
            source = record.get("source")
            if isinstance(source, str) and source != self.source:
                # A new phase (a fit, then a custom loop's tf.summary scalars): its own numbers.
                metrics, self.epoch, self.epochs, self.source = {}, None, None, source
                self.within = None
            self.epoch = _int_or(record.get("epoch"), self.epoch)
            self.epochs = _int_or(record.get("epochs"), self.epochs)
            self.step = _int_or(record.get("step"), self.step)
            if "progress" in record:  # where a fit is within the epoch it runs
                self.within = Within(record)
            elif self.within is not None and self.epoch == self.within.epoch:
                self.within = None  # that epoch's end: its numbers are the metrics now
            metrics.update({k: v for k, v in record.items() if k not in NOT_METRICS})
        self.metrics = metrics
        self.heard = self.heard or bool(records)

    def line(self) -> Text:
        """`running 0:42 · epoch 3/3 · 12/45 · ETA 0:04 · loss … val_loss …`: the epoch
        running, where in it and the time left (where the fit says), then the metrics, the
        most useful first; cut at the screen's edge. A queued job's says why it waits:
        `queued 0:05 · 2nd in line; waits for 1 GPU; held by live2, hog`."""
        info = self.info
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(info.state.value, style=STATE_STYLE[info.state])
        now = datetime.now(UTC)
        if info.started_at is not None:
            end = info.ended_at or now
            text.append(f" {elapsed_text((end - info.started_at).total_seconds())}")
        elif info.state == JobState.queued:
            text.append(f" {elapsed_text((now - info.created_at).total_seconds())}")
        if info.waiting and not info.state.finished:
            # The agent's words: place, need, holders; or "fetching data: 3/9 objects, ..."
            text.append(f" · {info.waiting}", style="dim")
        if info.attempt > 1:
            text.append(f"  attempt {info.attempt}/{info.retries + 1}")
        if info.state in (JobState.starting, JobState.running) and not self.heard:
            text.append(" · starting up (imports, data, model)", style="dim")
        if self.epoch is not None:
            total = f"/{self.epochs}" if self.epochs else ""
            text.append(" · epoch ", style="dim").append(f"{self.epoch}{total}", style="bold")
        within = self.within
        if within is not None and within.steps:
            text.append(f" · {within.step}/{within.steps}")
            if within.eta is not None:
                left = within.eta - (now - within.at).total_seconds()
                text.append(" · ETA ", style="dim").append(elapsed_text(left))
        elif self.step is not None:  # a custom loop's: no step within an epoch
            text.append(" · step ", style="dim").append(f"{self.step:,}", style="bold")
        for key in sorted(self.metrics, key=_usefulness):
            text.append(f" · {visible(key)} ", style="dim")
            text.append(metric_text(self.metrics[key]))
        if self.source is not None:
            text.append(f"  ({visible(self.source)})", style="dim")
        return text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True, overflow="ellipsis")
        grid.add_row(self._spinner, self.line())
        yield grid


class Within:
    """A fit's progress record (gpuhop.runtime.callbacks.Progress): the epoch it runs, the
    step within it of how many, and the seconds it had left, at `at`."""

    __slots__ = ("at", "epoch", "eta", "step", "steps")

    def __init__(self, record: Mapping[str, object]) -> None:
        self.epoch = _int_or(record.get("epoch"), None)
        self.step = _int_or(record.get("epoch_step"), 0) or 0
        self.steps = _int_or(record.get("epoch_steps"), None)
        eta, at = record.get("eta"), record.get("time")
        self.eta = float(eta) if isinstance(eta, (int, float)) else None
        when = float(at) if isinstance(at, (int, float)) else datetime.now(UTC).timestamp()
        self.at = datetime.fromtimestamp(when, UTC)


# The metrics a person looks at first; the rest follow in the order the job logged them.
FIRST = ("loss", "val_loss", "accuracy", "val_accuracy")


def _usefulness(key: str) -> int:
    return FIRST.index(key) if key in FIRST else len(FIRST)


def _int_or(value: object, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class LineSplitter:
    """Turns a byte stream into whole lines of text, as a terminal would show them: a
    carriage return (a progress bar redrawing itself) keeps only what follows it."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, chunk: bytes) -> str:
        text = self._partial + self._decoder.decode(chunk)
        head, sep, self._partial = text.rpartition("\n")
        return _as_shown(head + sep) if sep else ""

    def rest(self) -> str:
        text, self._partial = self._partial + self._decoder.decode(b"", final=True), ""
        return _as_shown(text)


def _as_shown(text: str) -> str:
    if "\r" not in text:
        return text
    return "".join(line.rpartition("\r")[2] for line in text.splitlines(keepends=True))


__all__ = ["follow_live", "transfer", "transfer_bar", "wants_live"]


def follow_live(job: Job, worker: int | None = None, offset: int = 0) -> Mapping[str, Any]:
    """Stream a job's log (from byte `offset`) to stdout with a status line under it, until
    the job ends."""
    console = Console(highlight=False, emoji=False)
    # The status line polls a handle of its own: a poll sent before the job's end and
    # answered after it must never become the end that `run` reports (its metrics then
    # not yet the last ones, or none).
    status = JobStatus(Job(job.session, job.data))
    stop, output = threading.Event(), threading.Event()

    def poller() -> None:
        while not stop.is_set():
            output.clear()
            status.poll()
            if stop.wait(MIN_POLL_SECONDS):
                return
            output.wait(POLL_SECONDS - MIN_POLL_SECONDS)

    thread = threading.Thread(target=poller, name="gpuhop-status", daemon=True)
    thread.start()
    lines = LineSplitter()
    try:
        with Live(status, console=console, transient=True, refresh_per_second=8):
            for chunk in job.logs(follow=True, worker=worker, offset=offset):
                output.set()
                text = lines.feed(chunk)
                if text:
                    console.print(Text.from_ansi(text, end=""), end="", soft_wrap=True)
            text = lines.rest()
            if text:
                console.print(Text.from_ansi(text), soft_wrap=True)
    finally:
        stop.set()
        output.set()
        thread.join(timeout=5)
    return job.wait_json()


def transfer_bar(label: str, **options: Any) -> Progress:
    """A rich progress display on stderr whose tasks show bytes: a bar, done of total,
    throughput and time left. `label` formats each task's description. Sizes are binary,
    as everywhere in gpuhop, and the rate is the transfer's own: bytes done over the time
    since it began (rich's speed column is decimal, and an estimate of the last seconds)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeRemainingColumn,
    )

    class AverageRate(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(rate(task.completed, task.elapsed or 0), style="progress.data.speed")

    columns = (
        TextColumn(label),
        BarColumn(),
        DownloadColumn(binary_units=True),
        AverageRate(),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=console(stderr=True), **options)


@contextmanager
def transfer(
    what: str, enabled: bool, min_bytes: int = 1 << 20
) -> Iterator[Callable[[int, int], None]]:
    """A progress bar with throughput and time left, on stderr, for `what` (e.g. "upload").

    Yields `update(done, total)`. Nothing is drawn when disabled or for a transfer under
    `min_bytes`, so small syncs stay quiet.
    """
    if not enabled:
        yield lambda done, total: None
        return
    from rich.progress import TaskID

    progress = transfer_bar("[dim]gpuhop:[/dim] {task.description}", transient=True)
    task: list[TaskID] = []

    def update(done: int, total: int) -> None:
        if not task:
            if total < min_bytes:
                return
            progress.start()
            task.append(progress.add_task(what, total=total))
        progress.update(task[0], completed=done, total=total)

    try:
        yield update
    finally:
        if task:
            progress.stop()
