"""Runs on the user's machine: `gpuhop ps [--watch]` and `gpuhop top`, the job table.

`--watch` (and `top`, the same thing with the GPU panel on) redraws the table in place
every few seconds, with each running job's GPU use read live from the host.
"""

from __future__ import annotations

import time

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from gpuhop.api import GpuInfo, JobInfo, JobState, format_mb
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import (
    STATE_STYLE,
    ago,
    duration,
    fail,
    format_metrics,
    print_json,
    say,
)
from gpuhop.client import Client, GpuhopError

# The width of a table written to a pipe or a file, where no terminal sets one.
WIDE = 400
COLUMNS = (
    "ID",
    "NAME",
    "STATE",
    "PRI",
    "GPUS",
    "GPU USE",
    "CREATED",
    "DURATION",
    "METRICS",
    "COMMAND",
)


def gpus_column(info: JobInfo) -> str:
    ids = ",".join(map(str, info.gpu_ids))
    # The framework's own peak of device memory, where the job reported one.
    peak = "" if info.memory_peak_mb is None else f"peak {format_mb(info.memory_peak_mb)}"
    if info.gpu_memory_mb is not None:
        share = format_mb(info.gpu_memory_mb)
        if not ids:
            return f"{share} share"
        return f"{ids} ({share}, {peak})" if peak else f"{ids} ({share})"
    if ids and peak:
        return f"{ids} ({peak})"
    return ids or (str(info.gpus) if info.gpus else "-")


def gpu_use(info: JobInfo, gpus: dict[int, GpuInfo]) -> str:
    """A running job's GPUs, read live: utilisation (the busiest of its GPUs) and memory in
    use on them. A shared GPU's figures are the whole GPU's: NVML does not split them."""
    held = [gpus[i] for i in info.gpu_ids if i in gpus]
    if info.state != JobState.running or not held:
        return "-"
    utils = [g.utilization for g in held if g.utilization is not None]
    used = [g.memory_used_mb for g in held if g.memory_used_mb is not None]
    util = f"{max(utils)}%" if utils else "?"
    memory = format_mb(sum(used)) if used else "?"
    shared = "*" if any(len(g.job_ids) > 1 for g in held) else ""
    return f"{util} {memory}{shared}"


def job_table(infos: list[JobInfo], gpus: dict[int, GpuInfo]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in COLUMNS:
        table.add_column(col, no_wrap=col != COLUMNS[-1], overflow="ellipsis")
    for i in infos:
        table.add_row(
            i.id,
            Text(i.name or "-"),  # a sweep's run is NAME[lr=0.1]: not markup
            Text(i.state.value, style=STATE_STYLE[i.state]),
            str(i.priority),
            gpus_column(i),
            gpu_use(i, gpus),
            ago(i.created_at),
            duration(i),
            format_metrics(i.latest_metrics) if i.latest_metrics else "-",
            Text(" ".join(i.command)),
        )
    return table


def gpu_panel(gpus: list[GpuInfo]) -> Table:
    cluster = any(g.node for g in gpus)  # an agent on a Ray cluster: say which node
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("GPU", *(("NODE",) if cluster else ()), "NAME", "UTIL", "MEMORY", "JOBS"):
        table.add_column(col, no_wrap=True)
    for g in gpus:
        used = "?" if g.memory_used_mb is None else format_mb(g.memory_used_mb)
        table.add_row(
            str(g.index),
            *((g.node or "-",) if cluster else ()),
            g.name,
            _bar(g.utilization),
            f"{used} / {format_mb(g.memory_mb)}",
            Text(f"QUARANTINED: {g.quarantined}", style="bold red")
            if g.quarantined
            else ", ".join(g.job_ids) or "-",
        )
    return table


def _bar(percent: int | None, width: int = 10) -> Text:
    if percent is None:
        return Text("?")
    filled = round(width * max(0, min(percent, 100)) / 100)
    style = "green" if percent < 50 else "yellow" if percent < 90 else "red"
    return (
        Text("█" * filled, style=style)
        + Text("░" * (width - filled), style="dim")
        + Text(f" {percent:3d}%")
    )


def _snapshot(
    client: Client, states: list[JobState], limit: int, with_gpus: bool
) -> tuple[list[JobInfo], list[GpuInfo]]:
    infos = client.jobs(states or None, limit=limit)
    running = any(i.state == JobState.running and i.gpu_ids for i in infos)
    gpus = client.gpus() if with_gpus or running else []
    return infos, gpus


def _view(infos: list[JobInfo], gpus: list[GpuInfo], panel: bool, every: float) -> Group:
    by_index = {g.index: g for g in gpus}
    counts: dict[str, int] = {}
    for i in infos:
        counts[i.state.value] = counts.get(i.state.value, 0) + 1
    summary = "  ".join(f"{n} {state}" for state, n in counts.items()) or "no jobs"
    header = Text.assemble(
        ("gpuhop ", "bold"),
        (f"{summary}  ", ""),
        (f"(every {every:g}s; Ctrl-C to quit)", "dim"),
    )
    parts: list[object] = [header]
    if panel and gpus:
        parts += [gpu_panel(gpus), Text("")]
    parts.append(job_table(infos, by_index))
    return Group(*parts)  # type: ignore[arg-type]


def watch(on: str | None, states: list[JobState], limit: int, panel: bool, every: float) -> None:
    """Redraw the job table in place until Ctrl-C."""
    from rich.live import Live

    console = Console(highlight=False, emoji=False)
    with client_for(on) as client:
        try:
            with Live(console=console, screen=False, auto_refresh=False) as live:
                while True:
                    try:
                        infos, gpus = _snapshot(client, states, limit, panel)
                        live.update(_view(infos, gpus, panel, every), refresh=True)
                    except GpuhopError as e:
                        live.update(Text(f"gpuhop: {e.message} (retrying)", style="red"))
                        live.refresh()
                    time.sleep(every)
        except KeyboardInterrupt:
            pass


StateOption = typer.Option([], "--state", "-s", help="Only jobs in this state (repeatable).")
EveryOption = typer.Option(
    2.0, "--every", "-n", min=0.2, metavar="SECONDS", help="Seconds between redraws."
)


def ps(
    state: list[JobState] = StateOption,
    limit: int = typer.Option(50, "--limit", min=1, help="At most this many jobs, newest first."),
    watch_: bool = typer.Option(
        False, "--watch", "-w", help="Redraw the table in place until Ctrl-C (like `top`)."
    ),
    every: float = EveryOption,
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """List jobs, newest first, with each running job's GPU use and latest metrics."""
    if watch_:
        if json_out:
            fail("--watch redraws a table; it cannot be combined with --json")
        watch(on, state, limit, panel=False, every=every)
        return
    with client_for(on) as client:
        try:
            infos, gpus = _snapshot(client, state, limit, with_gpus=False)
        except GpuhopError as e:
            fail(e.message)
    if json_out:
        print_json([i.model_dump(mode="json") for i in infos])
        return
    if not infos:
        say("no jobs yet; start one with: gpuhop run train.py")
        return
    out = Console(highlight=False, emoji=False)
    if not out.is_terminal:
        out.width = WIDE  # piped into grep or a file: whole values, not a squeezed table
    out.print(job_table(infos, {g.index: g for g in gpus}))


def top(
    state: list[JobState] = StateOption,
    limit: int = typer.Option(30, "--limit", min=1, help="At most this many jobs, newest first."),
    every: float = EveryOption,
    on: str | None = OnOption,
) -> None:
    """Watch the GPUs and jobs live: utilisation and memory per GPU, which job holds it,
    and each job's state, GPU use and latest metrics. Ctrl-C quits."""
    watch(on, state, limit, panel=True, every=every)


def register(app: typer.Typer) -> None:
    app.command()(ps)
    app.command()(top)
