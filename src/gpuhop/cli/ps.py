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
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuhop.api.sizes import format_mb
from gpuhop.api.states import MAX_JOBS_LISTED, JobState
from gpuhop.cli import params, plain
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import (
    STATE_STYLE,
    WIDE,
    duration,
    fail,
    format_metrics,
    print_json,
    say,
    when,
)
from gpuhop.cli.tablefit import Column, draw
from gpuhop.client import Client, GpuhopError

if TYPE_CHECKING:
    import typer
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

# A job and a GPU as the agent sends them (`JobInfo`'s and `GpuInfo`'s fields).
Info = Mapping[str, Any]


class Size(NamedTuple):
    """A screen's size, in columns and lines."""

    width: int
    height: int


# The table's columns, as `tablefit.fit` keeps them at a terminal's width: ID, NAME, STATE,
# OWNER (where the jobs are more than one user's), GPUS and AGE whole; PRI, DURATION and
# GPU USE go when room is short; WAITING (where a listed job waits: the agent's words, its
# place in line first), METRICS, then COMMAND, take the rest, COMMAND cut first.
COLUMNS = (
    Column("ID"),
    Column("NAME", most=24),
    Column("STATE"),
    Column("OWNER", most=12),
    Column("PRI", "optional", rank=0),
    Column("GPUS"),
    Column("GPU USE", "optional", rank=2),
    Column("AGE"),
    Column("DURATION", "optional", rank=1),
    Column("WAITING", "flex", rank=3, least=16),
    Column("METRICS", "flex", rank=2, least=16),
    Column("COMMAND", "flex", rank=1, least=12),
)
OWNER = 3
STATE = 2
WAITING = 9

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
    "owner",
    "created_at",
    "started_at",
    "ended_at",
    "latest_metrics",
    "waiting",
    "command",
)


def gpus_column(info: Info) -> str:
    """The GPUs a job holds, by index ("0,1"), or how many it asks for while it holds none
    ("2 asked": a bare "1" read as GPU 1)."""
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
    return ids or (f"{info['gpus']} asked" if info["gpus"] else "-")


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


def command_text(command: list[str]) -> str:
    """A job's command on one line, quoted as a shell would need it (`shlex.join`); the line
    breaks of a multi-line `-c` program shown as ⏎."""
    import shlex

    return shlex.join(command).replace("\r\n", "⏎").replace("\n", "⏎").replace("\r", "⏎")


def age(value: str | None) -> str:
    """How long ago, in one unit: 45s, 12m, 3h, 5d."""
    ts = when(value)
    if ts is None:
        return "-"
    seconds = max(0, int((datetime.now(UTC) - ts).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def job_rows(infos: list[Info], gpus: Mapping[int, Info]) -> list[tuple[str, ...]]:
    """The table's cells (of every column in COLUMNS), each as it is shown: markup already
    rendered, names as they are."""
    return [
        (
            plain.plain(i["id"]),
            i.get("name") or "-",  # a sweep's run is NAME[lr=0.1]: not markup
            i["state"],
            i.get("owner") or "-",
            str(i["priority"]),
            plain.plain(gpus_column(i)),
            plain.plain(gpu_use(i, gpus)),
            age(i["created_at"]),
            plain.plain(duration(i.get("started_at"), i.get("ended_at"))),
            i.get("waiting") or "-",
            plain.plain(
                format_metrics(i.get("latest_metrics")) if i.get("latest_metrics") else "-"
            ),
            command_text(i["command"]),
        )
        for i in infos
    ]


def _columns(infos: list[Info]) -> list[int]:
    """The columns this listing has: OWNER only where its jobs are more than one user's,
    WAITING only where one of them waits."""
    owners = {i.get("owner") for i in infos}
    waits = any(i.get("waiting") for i in infos)
    return [
        n
        for n in range(len(COLUMNS))
        if (n != OWNER or len(owners) > 1) and (n != WAITING or waits)
    ]


def job_table(infos: list[Info], gpus: Mapping[int, Info], width: int) -> Table:
    """The job table at `width` columns (`tablefit.fit` says which columns, how wide)."""
    keep = _columns(infos)
    rows = [[row[n] for n in keep] for row in job_rows(infos, gpus)]
    return draw([COLUMNS[n] for n in keep], rows, width, keep.index(STATE), _state_style)


def _state_style(state: str) -> str:
    return STATE_STYLE[JobState(state)]


def gpu_panel(gpus: list[Info]) -> Table:
    from rich.table import Table
    from rich.text import Text

    from gpuhop.cli.gpus import holders

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
            else holders(g.get("job_ids", []), g.get("memory_reserved_mb") or 0),
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
    if with_gpus and not states:  # `top`: every active job, however old, and then the newest
        active = client.jobs_json(sorted(ACTIVE), limit=limit, fields=fields)
        listed = {i["id"] for i in infos}
        infos = [*(i for i in active if i["id"] not in listed), *infos]
    running = any(i["state"] == JobState.running and i["gpu_ids"] for i in infos)
    gpus: list[Info] = list(client.gpus_json()) if with_gpus or running else []
    return infos, gpus


ACTIVE = frozenset({JobState.queued, JobState.starting, JobState.running})


def _view(infos: list[Info], gpus: list[Info], panel: bool, every: float, size: Size) -> Group:
    """One screen of `top` (or `ps --watch`) at `size`: a header, the GPU panel, then the
    jobs, active ones first and finished ones as room allows; never taller than the screen
    (a line stays free for the cursor), so the header never scrolls off."""
    from rich.console import Group
    from rich.text import Text

    width, height = size
    by_index = {g["index"]: g for g in gpus}
    counts: dict[str, int] = {}
    for i in infos:
        counts[i["state"]] = counts.get(i["state"], 0) + 1
    summary = "  ".join(f"{n} {state}" for state, n in counts.items()) or "no jobs"
    header = Text.assemble(
        ("gpuhop ", "bold"),
        (f"{summary}  ", ""),
        (f"(every {every:g}s; Ctrl-C to quit)", "dim"),
        no_wrap=True,
        overflow="ellipsis",
    )
    parts: list[object] = [header]
    if panel and gpus:
        shown_gpus = gpus[: max(1, height - 6)]  # a row for the jobs' header, one job, a note
        parts += [gpu_panel(shown_gpus), Text("")]
    room = height - 1 - sum(_height(p) for p in parts) - 1  # the cursor's line, the header
    active = [i for i in infos if i["state"] in ACTIVE]
    finished = [i for i in infos if i["state"] not in ACTIVE]
    rows = (active + finished)[: max(0, room)]
    if len(rows) < len(infos):
        rows = rows[: max(0, room - 1)]
        left = len(infos) - len(rows)
        more = Text(f"+{left} more not shown (gpuhop ps lists them)", style="dim")
    if rows:
        parts.append(job_table(rows, by_index, width))
    if len(rows) < len(infos):
        parts.append(more)
    return Group(*parts)  # type: ignore[arg-type]


def _height(part: object) -> int:
    """The lines a part of `_view` takes: a Text one, a table its header and rows."""
    rows = getattr(part, "row_count", None)
    return 1 if rows is None else rows + 1


def watch(on: str | None, states: list[JobState], limit: int, panel: bool, every: float) -> None:
    """Redraw the job table in place until Ctrl-C."""
    if not plain.styled(sys.stdout):  # rich's Live draws nothing there, until it stops
        what, instead = ("top", "ps and gpuhop gpus") if panel else ("ps --watch", "ps")
        fail(
            f"gpuhop {what} redraws a terminal's screen, and the output here is a pipe or a"
            f" file: run it in a terminal, or use gpuhop {instead} (--json for scripts)"
        )
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console(highlight=False, emoji=False)
    with client_for(on) as client:
        try:
            with Live(
                console=console, screen=False, auto_refresh=False, vertical_overflow="crop"
            ) as live:
                while True:
                    try:
                        infos, gpus = _snapshot(client, states, limit, panel)
                        view = _view(infos, gpus, panel, every, Size(*console.size))
                        live.update(view, refresh=True)
                    except GpuhopError as e:
                        live.update(Text(f"gpuhop: {e.message} (retrying)", style="red"))
                        live.refresh()
                    time.sleep(every)
        except KeyboardInterrupt:
            pass


StateOption = params.Option([], "--state", "-s", help="Only jobs in this state (repeatable).")
EveryOption = params.Option(
    2.0, "--every", min=0.2, metavar="SECONDS", help="Seconds between redraws."
)


def ps(
    state: list[JobState] = StateOption,
    limit: int = params.Option(
        50, "--limit", min=1, max=MAX_JOBS_LISTED, help="At most this many jobs, newest first."
    ),
    watch_: bool = params.Option(
        False, "--watch", help="Redraw the table in place until Ctrl-C (like `top`)."
    ),
    every: float = EveryOption,
    json_out: bool = params.Option(False, "--json", help="Print JSON for scripts."),
    quiet: bool = params.Option(False, "--quiet", "-q", help="Print only the jobs' ids."),
    on: str | None = OnOption,
) -> None:
    """List jobs, newest first, with each running job's GPU use and latest metrics."""
    if watch_ and (json_out or quiet):
        other = "--json" if json_out else "-q"
        fail(f"--watch redraws a table; it cannot be combined with {other}")
    if json_out and quiet:
        fail("-q prints ids and --json prints JSON: choose one")
    if watch_:
        watch(on, state, limit, panel=False, every=every)
        return
    with client_for(on) as client:
        if not quiet:
            _say_remote(on)
        try:
            if quiet:
                ids = client.jobs_json(state or None, limit=limit, fields=("id",))
                sys.stdout.write("".join(f"{i['id']}\n" for i in ids))
                return
            infos, gpus = _snapshot(client, state, limit, with_gpus=False, whole=json_out)
        except GpuhopError as e:
            fail(e.message)
    if json_out:
        print_json(infos)
        return
    if not infos and state:  # none in those states: there may be others
        said = " or ".join(dict.fromkeys(JobState(s).value for s in state))
        say(f"no {said} jobs (gpuhop ps lists them all)")
        return
    if not infos:
        say("no jobs yet; start one with: gpuhop run train.py")
        return
    by_index = {g["index"]: g for g in gpus}
    if not plain.styled(sys.stdout):  # piped into grep or a file: whole values, no colour
        keep = _columns(infos)
        rows = [[row[n] for n in keep] for row in job_rows(infos, by_index)]
        text = plain.table([COLUMNS[n].name for n in keep], rows, WIDE)
        if text is not None:
            sys.stdout.write(text)
            return
    from rich.console import Console

    out = Console(highlight=False, emoji=False)
    if not out.is_terminal:
        out.width = WIDE  # not squeezed to 80 columns
    out.print(job_table(infos, by_index, out.width))


def _say_remote(on: str | None) -> None:
    """One dim line on stderr naming the remote listed, where it is not this machine's agent."""
    from gpuhop.client.transport.remotes import selected

    try:
        remote = selected(on)
    except GpuhopError:
        return  # the client said so already
    if remote is not None:
        say(f"jobs on remote {remote.name!r} ({remote.url})")


def top(
    state: list[JobState] = StateOption,
    limit: int = params.Option(
        30, "--limit", min=1, max=MAX_JOBS_LISTED, help="At most this many jobs, newest first."
    ),
    every: float = EveryOption,
    on: str | None = OnOption,
) -> None:
    """Watch the GPUs and jobs live: utilisation and memory per GPU, which job holds it,
    and each job's state, GPU use and latest metrics. Ctrl-C quits."""
    watch(on, state, limit, panel=True, every=every)


def register(app: typer.Typer) -> None:
    app.command()(ps)
    app.command()(top)
