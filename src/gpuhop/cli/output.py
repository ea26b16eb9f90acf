"""Runs on the user's machine: how the CLI talks to a person (stderr) and to scripts (stdout)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from gpuhop.api import JobInfo, JobState

# No emoji codes: ":cd:" in a certificate fingerprint must stay as it is.
err = Console(stderr=True, highlight=False, emoji=False)

STATE_STYLE = {
    JobState.queued: "yellow",
    JobState.starting: "cyan",
    JobState.running: "cyan",
    JobState.succeeded: "green",
    JobState.failed: "red",
    JobState.cancelled: "magenta",
    JobState.lost: "red",
}


def say(message: str) -> None:
    err.print(f"[dim]gpuhop:[/dim] {message}", soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    # Escaped: an error names paths, URLs and user input, whose brackets are not markup.
    err.print(f"[bold red]gpuhop: error:[/bold red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A plain table on stdout; only the last column wraps."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in columns:
        table.add_column(col, no_wrap=col != columns[-1])
    for row in rows:
        table.add_row(*row)
    Console(highlight=False, emoji=False).print(table)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def ago(ts: datetime | None) -> str:
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


def duration(info: JobInfo) -> str:
    if info.started_at is None:
        return "-"
    end = info.ended_at or datetime.now(UTC)
    seconds = (end - info.started_at).total_seconds()
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def state_text(state: JobState) -> str:
    return f"[{STATE_STYLE[state]}]{state.value}[/]"


def format_metrics(metrics: dict[str, object] | None) -> str:
    if not metrics:
        return "-"
    parts = []
    for key, value in metrics.items():
        if key in ("time", "epochs", "memory_mb", "memory_peak_mb"):
            continue  # memory has its own line in `show`
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def exit_code_for(info: JobInfo) -> int:
    """The exit code `gpuhop run` returns: the job's own, 128+N for a signal, 1 otherwise."""
    if info.state == JobState.succeeded:
        return 0
    if info.exit_code is not None:
        return info.exit_code
    if info.signal is not None:
        return 128 + info.signal
    return 130 if info.state == JobState.cancelled else 1
