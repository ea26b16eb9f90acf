"""Runs on the user's machine: `gpuhop ps [--watch]` and `gpuhop top`, the job table.

`--watch` (and `top`, the same thing with the GPU panel on) redraws the table in place
every few seconds, with each running job's GPU use read live from the host.

Jobs and GPUs are the agent's JSON (`Client.jobs_json`, `Client.gpus_json`): the table is
printed without building a model, and written to a pipe without rich (`gpuhop.cli.plain`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuhop.api.sizes import format_mb
from gpuhop.api.states import JobState
from gpuhop.cli import params, plain
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

if TYPE_CHECKING:
    import typer
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

# A job and a GPU as the agent sends them (`JobInfo`'s and `GpuInfo`'s fields).
Info = Mapping[str, Any]

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

# What the table shows of each job: all `ps` asks the agent for (`--json` asks for all).
FIELDS = (
    "id",
    "name",
    "state",
    "priority",
    "gpus",
    "gpu_ids",
    "memory_peak_mb",
    "gpu_memory_mb",
    "created_at",
    "started_at",
    "ended_at",
    "latest_metrics",
    "command",
)


def gpus_column(info: Info) -> str:
    ids = ",".join(map(str, info["gpu_ids"]))
    # The framework's own peak of device memory, where the job reported one.
    peak_mb, share_mb = info.get("memory_peak_mb"), info.get("gpu_memory_mb")
    peak = "" if peak_mb is None else f"peak {format_mb(peak_mb)}"
    if share_mb is not None:
        share = format_mb(share_mb)
        if not ids:
            return f"{share} share"
        return f"{ids} ({share}, {peak})" if peak else f"{ids} ({share})"
    if ids and peak:
        return f"{ids} ({peak})"
    return ids or (str(info["gpus"]) if info["gpus"] else "-")


def gpu_use(info: Info, gpus: Mapping[int, Info]) -> str:
    """A running job's GPUs, read live: utilisation (the busiest of its GPUs) and memory in
    use on them: the job's own where the agent tells each job's apart, else the whole GPU's.
    `*`: a GPU shared with other jobs, whose utilisation is the whole GPU's."""
    held = [gpus[i] for i in info["gpu_ids"] if i in gpus]
    if info["state"] != JobState.running or not held:
        return "-"
    utils = [g["utilization"] for g in held if g.get("utilization") is not None]
    if all(info["id"] in (g.get("job_memory_mb") or {}) for g in held):
        used = [g["job_memory_mb"][info["id"]] for g in held]
    else:
        used = [g["memory_used_mb"] for g in held if g.get("memory_used_mb") is not None]
    util = f"{max(utils)}%" if utils else "?"
    memory = format_mb(sum(used)) if used else "?"
    shared = "*" if any(len(g.get("job_ids", ())) > 1 for g in held) else ""
    return f"{util} {memory}{shared}"


def job_rows(infos: list[Info], gpus: Mapping[int, Info]) -> list[tuple[str, ...]]:
    """The table's cells, each as it is shown: markup already rendered, names as they are."""
    return [
        (
            plain.plain(i["id"]),
            i.get("name") or "-",  # a sweep's run is NAME[lr=0.1]: not markup
            i["state"],
            str(i["priority"]),
            plain.plain(gpus_column(i)),
            plain.plain(gpu_use(i, gpus)),
            plain.plain(ago(i["created_at"])),
            plain.plain(duration(i.get("started_at"), i.get("ended_at"))),
            plain.plain(
                format_metrics(i.get("latest_metrics")) if i.get("latest_metrics") else "-"
            ),
            " ".join(i["command"]),
        )
        for i in infos
    ]


def job_table(infos: list[Info], gpus: Mapping[int, Info]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in COLUMNS:
        table.add_column(col, no_wrap=col != COLUMNS[-1], overflow="ellipsis")
    for row in job_rows(infos, gpus):
        cells = [Text(cell) for cell in row]
        cells[2].stylize(STATE_STYLE[JobState(row[2])])
        table.add_row(*cells)
    return table


def gpu_panel(gpus: list[Info]) -> Table:
    from rich.table import Table
    from rich.text import Text

    cluster = any(g.get("node") for g in gpus)  # an agent on a Ray cluster: say which node
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("GPU", *(("NODE",) if cluster else ()), "NAME", "UTIL", "MEMORY", "JOBS"):
        table.add_column(col, no_wrap=True)
    for g in gpus:
        used = "?" if g.get("memory_used_mb") is None else format_mb(g["memory_used_mb"])
        table.add_row(
            str(g["index"]),
            *((g.get("node") or "-",) if cluster else ()),
            g["name"],
            _bar(g.get("utilization")),
            f"{used} / {format_mb(g['memory_mb'])}",
            Text(f"QUARANTINED: {g['quarantined']}", style="bold red")
            if g.get("quarantined")
            else ", ".join(g.get("job_ids", ())) or "-",
        )
    return table


def _bar(percent: int | None, width: int = 10) -> Text:
    from rich.text import Text

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
    client: Client, states: list[JobState], limit: int, with_gpus: bool, whole: bool = False
) -> tuple[list[Info], list[Info]]:
    """The jobs (the table's fields of each; every field with `whole`) and, where one of
    them runs on a GPU or `with_gpus`, the GPUs."""
    fields = None if whole else FIELDS
    infos: list[Info] = list(client.jobs_json(states or None, limit=limit, fields=fields))
    running = any(i["state"] == JobState.running and i["gpu_ids"] for i in infos)
    gpus: list[Info] = list(client.gpus_json()) if with_gpus or running else []
    return infos, gpus


def _view(infos: list[Info], gpus: list[Info], panel: bool, every: float) -> Group:
    from rich.console import Group
    from rich.text import Text

    by_index = {g["index"]: g for g in gpus}
    counts: dict[str, int] = {}
    for i in infos:
        counts[i["state"]] = counts.get(i["state"], 0) + 1
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
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

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


StateOption = params.Option([], "--state", "-s", help="Only jobs in this state (repeatable).")
EveryOption = params.Option(
    2.0, "--every", "-n", min=0.2, metavar="SECONDS", help="Seconds between redraws."
)


def ps(
    state: list[JobState] = StateOption,
    limit: int = params.Option(50, "--limit", min=1, help="At most this many jobs, newest first."),
    watch_: bool = params.Option(
        False, "--watch", "-w", help="Redraw the table in place until Ctrl-C (like `top`)."
    ),
    every: float = EveryOption,
    json_out: bool = params.Option(False, "--json", help="Print JSON for scripts."),
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
            infos, gpus = _snapshot(client, state, limit, with_gpus=False, whole=json_out)
        except GpuhopError as e:
            fail(e.message)
    if json_out:
        print_json(infos)
        return
    if not infos:
        say("no jobs yet; start one with: gpuhop run train.py")
        return
    by_index = {g["index"]: g for g in gpus}
    if not plain.styled(sys.stdout):  # piped into grep or a file: whole values, no colour
        text = plain.table(COLUMNS, job_rows(infos, by_index), WIDE)
        if text is not None:
            sys.stdout.write(text)
            return
    from rich.console import Console

    out = Console(highlight=False, emoji=False)
    if not out.is_terminal:
        out.width = WIDE  # not squeezed to 80 columns
    out.print(job_table(infos, by_index))


def top(
    state: list[JobState] = StateOption,
    limit: int = params.Option(30, "--limit", min=1, help="At most this many jobs, newest first."),
    every: float = EveryOption,
    on: str | None = OnOption,
) -> None:
    """Watch the GPUs and jobs live: utilisation and memory per GPU, which job holds it,
    and each job's state, GPU use and latest metrics. Ctrl-C quits."""
    watch(on, state, limit, panel=True, every=every)


def register(app: typer.Typer) -> None:
    app.command()(ps)
    app.command()(top)
