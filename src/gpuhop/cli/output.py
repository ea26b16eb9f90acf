"""Runs on the user's machine: how the CLI talks to a person (stderr) and to scripts (stdout).

Messages are written in rich's markup. On a terminal rich draws them; written to a pipe or a
file they come out as rich would write them there (`gpuhop.cli.plain`), without loading rich:
the commands' plain output paths start without it. A job is the agent's JSON (a dict with
`JobInfo`'s fields), as `Job.data` and the SDK's `*_json` calls give it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, NoReturn

from gpuhop.api.states import JobState
from gpuhop.cli.plain import escape, plain, styled

if TYPE_CHECKING:
    from rich.console import Console


@functools.cache
def console(stderr: bool = False) -> Console:
    """rich's console on stdout or stderr, made on first use (drawing only)."""
    from rich.console import Console

    # No emoji codes: ":cd:" in a certificate fingerprint must stay as it is.
    return Console(stderr=stderr, highlight=False, emoji=False)


class _JobOutput:
    """Whether the job output this command copied to stdout stopped mid-line."""

    open_line = False


def job_output(chunk: bytes) -> None:
    """Copy a piece of a job's output to stdout, as it came, noting whether it stopped
    mid-line (see `_own_line`)."""
    out = sys.stdout.buffer
    out.write(chunk)
    out.flush()
    if chunk:
        _JobOutput.open_line = not chunk.endswith(b"\n")


def _own_line(stream: IO[str]) -> None:
    """Start gpuhop's next line on a line of its own: where the job's output it copied
    stopped mid-line (a progress bar, a killed job) and `stream` goes where that output
    went (one terminal, or `2>&1`), a newline first."""
    if not _JobOutput.open_line:
        return
    _JobOutput.open_line = False
    try:
        shared = os.path.samestat(os.fstat(sys.stdout.fileno()), os.fstat(stream.fileno()))
    except (OSError, ValueError, AttributeError):
        shared = True  # cannot tell (a captured stream): a blank line costs less than a glued one
    if shared:
        stream.write("\n")
        stream.flush()


def echo(markup: str, stderr: bool = False) -> None:
    """One line of markup: drawn by rich on a terminal, written plain elsewhere."""
    stream: IO[str] = sys.stderr if stderr else sys.stdout
    _own_line(stream)
    if styled(stream):
        console(stderr).print(markup, soft_wrap=True)
    else:
        stream.write(plain(markup) + "\n")
        stream.flush()


STATE_STYLE = {
    JobState.queued: "yellow",
    JobState.starting: "cyan",
    JobState.running: "cyan",
    JobState.succeeded: "green",
    JobState.failed: "red",
    JobState.cancelled: "magenta",
    JobState.lost: "red",
}


def wants_live(no_progress: bool, stream: object = None) -> bool:
    """A live display only on a terminal that can redraw, and never when asked not to."""
    target = sys.stdout if stream is None else stream
    if no_progress or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(target, "isatty", None)
    return bool(isatty and isatty())


def say(message: str) -> None:
    echo(f"[dim]gpuhop:[/dim] {message}", stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    # Escaped: an error names paths, URLs and user input, whose brackets are not markup.
    echo(f"[bold red]gpuhop: error:[/bold red] {escape(message)}", stderr=True)
    # SystemExit, not typer.Exit: a command that `main` parsed itself runs without typer.
    raise SystemExit(code)


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


# The width of a table written to a pipe or a file, where no terminal sets one.
WIDE = 400


def print_table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A plain table on stdout; only the last column wraps, at a terminal's width (to a
    pipe or a file, rows are whole: not squeezed to 80 columns)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in columns:
        table.add_column(col, no_wrap=col != columns[-1])
    for row in rows:
        table.add_row(*row)
    out = Console(highlight=False, emoji=False)
    if not out.is_terminal:
        out.width = WIDE
    out.print(table)


def human_bytes(n: float) -> str:
    """A size in binary units, as every size gpuhop shows is (GPU memory too): "3.0 MiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def rate(n: float, seconds: float) -> str:
    """How fast `n` bytes went in `seconds`, all of them: "12.3 MiB/s"."""
    return f"{human_bytes(n / seconds if seconds > 0 else 0)}/s"


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """ "1 file", "3 files"."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def when(value: datetime | str | None) -> datetime | None:
    """A time as the wire writes it (ISO 8601), or as a model holds it."""
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def ago(value: datetime | str | None) -> str:
    ts = when(value)
    if ts is None:
        return "-"
    seconds = (datetime.now(UTC) - ts).total_seconds()
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 86400:
        return f"{seconds / 3600:.0f}h ago"
    return ts.astimezone().strftime("%Y-%m-%d %H:%M")


def duration(started_at: datetime | str | None, ended_at: datetime | str | None) -> str:
    start = when(started_at)
    if start is None:
        return "-"
    end = when(ended_at) or datetime.now(UTC)
    seconds = (end - start).total_seconds()
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def state_text(state: JobState) -> str:
    return f"[{STATE_STYLE[state]}]{state.value}[/]"


# Keys of a metrics record that `format_metrics` shows as values (memory has its own line in
# `show`; the source is said after them).
NOT_SHOWN = frozenset(
    {"time", "epochs", "memory_mb", "memory_peak_mb", "source", "progress", "epoch_step"}
    | {"epoch_steps", "eta"}
)


# The control characters (C0, DEL, C1) of text a job wrote, which a terminal would act on.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """Text a job wrote (a metric's name or value), with its control characters shown as
    `\\xNN`: on a team agent an admin's `ps` shows every user's metrics, and a job must not
    clear that terminal, retitle it or write its clipboard (OSC 52) with an escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def format_metrics(metrics: dict[str, object] | None) -> str:
    """A metrics record as markup: "epoch=3 loss=0.2 (from fit:MODEL)" where it names its
    source. The job wrote it: its brackets are text, not markup, and its control characters
    are shown, not sent (`visible`)."""
    if not metrics:
        return "-"
    parts = []
    for key, value in metrics.items():
        if key in NOT_SHOWN:
            continue
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        else:
            parts.append(f"{key}={value}")
    source = metrics.get("source")
    if isinstance(source, str):
        parts.append(f"(from {source})")
    return escape(visible(" ".join(parts)))


def exit_code_for(info: Mapping[str, Any]) -> int:
    """The exit code `gpuhop run` returns: the job's own, 128+N for a signal, 1 otherwise."""
    state = JobState(info["state"])
    if state == JobState.succeeded:
        return 0
    if info.get("exit_code") is not None:
        return int(info["exit_code"])
    if info.get("signal") is not None:
        return 128 + int(info["signal"])
    return 130 if state == JobState.cancelled else 1
