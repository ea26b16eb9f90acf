"""Runs on the user's machine: `gpuhop sweep` (one job per combination of parameter values,
followed together in one table) and `gpuhop sweep show SWEEP` (every run with its state and
final metrics, sorted by one of them).

Both label each run by the values that differ between the runs (`lr=0.1 batch=32`), read
back from its name. The live table fits the terminal as `ps` does (`tablefit`): RUN, JOB,
STATE and the chosen metric stay whole, the rest is cut or dropped, and it is never taller
than the screen."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpuhop.api import JobInfo, JobState
from gpuhop.api.metrics import higher_is_better
from gpuhop.api.queue import MAX_GRACE
from gpuhop.cli import jobopts, params, plain
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import (
    STATE_STYLE,
    counted,
    duration,
    fail,
    format_metrics,
    print_json,
    print_table,
    say,
)
from gpuhop.cli.tablefit import Column, draw
from gpuhop.client import Client, GpuhopError
from gpuhop.client.sweeps import ARRAY_KEY, parse_param, run_values, unfilled

POLL_SECONDS = 1.0
# Keys of a metrics line that say where the run is, not how well it does.
NOT_METRICS = ("time", "epochs", "step", "epoch", "source")


def sweep(  # noqa: PLR0913 (a command: each parameter is one of its options)
    command: list[str] = typer.Argument(
        ...,
        metavar="SCRIPT.py|COMMAND [ARGS]... | show SWEEP | cancel SWEEP",
        help="The command of every run, with {NAME} where each -p value goes; or `show"
        " SWEEP [--metric NAME] [--desc] [--json]` for a sweep's table of results; or"
        " `cancel SWEEP [--grace S]` to stop every run of it that has not ended.",
        show_default=False,
    ),
    param: list[str] = typer.Option(
        [],
        "--param",
        "-p",
        metavar="NAME=V1,V2,...",
        help="A parameter and its values (repeatable); one run per combination.",
    ),
    array: int | None = typer.Option(
        None,
        "--array",
        min=1,
        max=1000,
        metavar="N",
        help="N runs with GPUHOP_ARRAY_INDEX=0..N-1 (and {index} in the command).",
    ),
    max_parallel: int | None = jobopts.MAX_PARALLEL,
    name: str | None = jobopts.worded(
        jobopts.NAME, "The sweep's name; its runs are NAME[lr=0.1,batch=32]."
    ),
    gpus: int = jobopts.worded(jobopts.GPUS, "Whole GPUs for each run."),
    gpu_memory: str | None = jobopts.worded(
        jobopts.GPU_MEMORY,
        "Instead of whole GPUs: a share of one GPU for each run (6GiB, 6G, 6144M, or MB).",
    ),
    mixed_gpus: bool = jobopts.MIXED_GPUS,
    env: list[str] = jobopts.ENV,
    data: list[str] = jobopts.worded(
        jobopts.DATA, "Mount a dataset in each run's work dir (as for run; repeatable)."
    ),
    secret: list[str] = jobopts.worded(
        jobopts.SECRET, "Give each run your secret NAME as NAME or ENVVAR (as for run)."
    ),
    requirements: Path | None = jobopts.REQUIREMENTS,
    no_requirements: bool = jobopts.NO_REQUIREMENTS,
    python: str | None = jobopts.PYTHON,
    image: str | None = jobopts.IMAGE,
    no_image: bool = jobopts.NO_IMAGE,
    image_secret: str | None = jobopts.IMAGE_SECRET,
    priority: int = jobopts.PRIORITY,
    after: list[str] | None = jobopts.worded(
        jobopts.AFTER,
        "Runs wait in the queue until these jobs end (ids, prefixes or names; repeatable).",
    ),
    after_any: bool = jobopts.AFTER_ANY,
    time_limit: str | None = jobopts.worded(
        jobopts.TIME_LIMIT,
        "A time limit for each run (6h, 90m, 30s, or seconds): SIGTERM when it passes,"
        " SIGKILL 10s later; the run ends with class timeout and is not retried.",
    ),
    retries: int = jobopts.worded(
        jobopts.RETRIES,
        "Run a failed attempt of a run again up to N times (see --retry-on);"
        " $GPUHOP_CHECKPOINT_DIR is kept.",
    ),
    retry_on: str = jobopts.RETRY_ON,
    notify: list[str] = jobopts.worded(
        jobopts.NOTIFY, "A webhook told of each run's start and end.", metavar="URL"
    ),
    workdir: Path = jobopts.worded(jobopts.WORKDIR, "The directory to sync (once, for every run)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Print the sweep id and return."),
    metric: str | None = typer.Option(
        None,
        "--metric",
        "-m",
        help="The metric the live table shows in a column of its own (default: the first"
        " one a run reports).",
    ),
    on: str | None = OnOption,
) -> None:
    """Run a script once per combination of parameter values, and follow the runs together.

    The work dir is synced once; every run gets the same files. A compact table shows each
    run's state and latest metrics until all have ended; Ctrl-C detaches (the runs go on).
    The exit code is 0 if every run succeeded, else 1.

    Example: gpuhop sweep -p lr=0.1,0.01,0.001 -p batch=32,64 --max-parallel 2
    train.py --lr {lr} --batch {batch}

    Then: gpuhop sweep show NAME --metric val_loss; gpuhop sweep cancel NAME stops the runs
    that have not ended.
    """
    if command[0] in _SUBCOMMANDS:
        _dispatch(command[0], [*command[1:], *(["--on", on] if on else [])])
        return
    spec = jobopts.spec_of(locals(), sweep=True)  # before any name is bound: its options
    if jobopts.DESKTOP in notify:
        fail("--notify desktop is gpuhop run's; a sweep's runs tell webhooks (--notify URL)")
    try:
        values = dict(parse_param(p) for p in param)
        if len(values) != len(param):
            fail("a parameter is given twice with -p")
        keys = [*values, *([ARRAY_KEY] if array is not None else [])]
        for key in unfilled(command, keys):
            say(
                f"[yellow]{{{key}}} in the command is no -p parameter's: every run gets it as"
                " written[/yellow]"
            )
        with client_for(on) as client:
            made = client.sweep(command, values, spec, array=array, workdir=workdir)
            if detach:
                print(made.id)
                return
            say(f"sweep {made.id}: {counted(len(made.runs), 'run')} queued (one synced tree)")
            runs = _follow(client, made.id, metric)
    except GpuhopError as e:
        fail(e.message)
    say(f"sweep {made.id}: {_counts(runs)}; results: gpuhop sweep show {made.id}")
    raise typer.Exit(0 if all(r.state == JobState.succeeded for r in runs) else 1)


def _follow(client: Client, sweep_id: str, metric: str | None) -> list[JobInfo]:
    """Poll the sweep's runs until all have ended, drawing the table in place on a
    terminal and printing each run's changes of state otherwise."""
    live = sys.stdout.isatty()
    seen: dict[str, JobState] = {}
    console = Console(highlight=False, emoji=False)
    view = Live(console=console, auto_refresh=False, vertical_overflow="crop") if live else None
    try:
        with view or contextlib.nullcontext():
            while True:
                runs = sorted(client.sweep_runs(sweep_id), key=lambda r: r.created_at)
                if view is not None:
                    width, height = console.size
                    view.update(live_view(runs, metric, width, height), refresh=True)
                else:
                    for run in runs:
                        if seen.get(run.id) != run.state:
                            seen[run.id] = run.state
                            say(f"{escape(run.name or '-')} ({run.id}) {run.state.value}")
                if all(r.state.finished for r in runs):
                    return runs
                time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        say(
            f"detached from sweep {sweep_id}; its runs go on.\n"
            f"  results:  gpuhop sweep show {sweep_id}"
        )
        raise typer.Exit(130) from None


def labels(runs: list[JobInfo]) -> list[str]:
    """Each run's label: the values that differ between the runs (`lr=0.1 batch=32`), or all
    of them where none differ (a sweep of one run); its name where it carries none."""
    values = [run_values(r.name) for r in runs]
    keys = list(dict.fromkeys(k for v in values for k in v))
    differ = [k for k in keys if len({v.get(k) for v in values}) > 1] or keys
    return [
        " ".join(f"{k}={v[k]}" for k in differ if k in v) or r.name or "-"
        for r, v in zip(runs, values, strict=True)
    ]


# The live table's columns, fitted as `ps`'s are: RUN, JOB, STATE and the chosen metric
# whole; DURATION goes when room is short; WAITING (where a run waits), then METRICS, take
# the rest.
RUN, JOB, STATE, METRIC, DURATION, WAITING, METRICS = range(7)
ACTIVE = (JobState.running, JobState.starting, JobState.queued)


def live_view(runs: list[JobInfo], metric: str | None, width: int, height: int) -> Group:
    """The sweep's table at `width` x `height`: running runs first, then queued, then ended
    ones as room allows (a line says how many more), the counts under it; never taller
    than the screen, with a line free for the cursor and one for the closing line, so
    that the header is still on screen at the end."""
    shown_metric = metric or next(iter(_metric_names(runs, None)), None)
    columns = [
        Column("RUN", most=32),
        Column("JOB"),
        Column("STATE"),
        Column((shown_metric or "").upper()),
        Column("DURATION", "optional", rank=1),
        Column("WAITING", "flex", rank=3, least=12),
        Column("METRICS", "flex", rank=2, least=16),
    ]
    keep = [
        n
        for n in range(len(columns))
        if (n != METRIC or shown_metric) and (n != WAITING or any(r.waiting for r in runs))
    ]
    # The header, the counts, the cursor's line, and the closing line (two on a narrow
    # screen: it names the sweep twice).
    room = max(1, height - 5)
    order = sorted(
        range(len(runs)),
        key=lambda i: ACTIVE.index(runs[i].state) if runs[i].state in ACTIVE else len(ACTIVE),
    )
    if len(order) > room:
        order = order[: max(1, room - 1)]
    named = labels(runs)
    cells = [
        (
            named[i],
            runs[i].id,
            runs[i].state.value,
            _value((runs[i].latest_metrics or {}).get(shown_metric or "")),
            duration(runs[i].started_at, runs[i].ended_at),
            runs[i].waiting or "-",
            _other_metrics(runs[i], shown_metric),
        )
        for i in order
    ]
    rows = [[row[n] for n in keep] for row in cells]
    columns = [columns[n] for n in keep]
    table = draw(columns, rows, width, keep.index(STATE), lambda s: STATE_STYLE[JobState(s)])
    parts: list[Table | Text] = [table]
    if len(order) < len(runs):
        more = f"+{len(runs) - len(order)} more not shown (gpuhop sweep show lists them)"
        parts.append(Text(more, style="dim", no_wrap=True, overflow="ellipsis"))
    parts.append(Text(_counts(runs), style="dim", no_wrap=True, overflow="ellipsis"))
    return Group(*parts)


def _other_metrics(run: JobInfo, shown: str | None) -> str:
    """The run's latest metrics but the one in a column of its own (and where it is: its
    step, epoch and source)."""
    latest = {
        k: v for k, v in (run.latest_metrics or {}).items() if k != shown and k not in NOT_METRICS
    }
    return plain.plain(format_metrics(latest)) if latest else "-"


def _counts(runs: list[JobInfo]) -> str:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.state.value] = counts.get(r.state.value, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in counts.items())


def show(
    sweep_ref: str = typer.Argument(..., metavar="SWEEP", help="A sweep's id, or its name."),
    metric: str | None = typer.Option(
        None,
        "--metric",
        "-m",
        help="Sort by this final metric, best first: highest for a score (accuracy, AUC, F1,"
        " ...), lowest for a loss, an error or a name it does not know (the dashboard's rule).",
    ),
    desc: bool | None = typer.Option(
        None, "--desc/--asc", help="Highest first, or lowest first, whatever the metric."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """Every run of a sweep with its state and final metrics, best first by --metric."""
    try:
        with client_for(on) as client:
            runs = client.sweep_runs(sweep_ref)
    except GpuhopError as e:
        fail(e.message)
    runs = sorted(runs, key=lambda r: r.created_at)
    if metric is not None:
        highest = higher_is_better(metric) if desc is None else desc
        runs = sorted(runs, key=lambda r: _sort_key(r, metric, highest))
    if json_out:
        print_json([r.model_dump(mode="json") for r in runs])
        return
    names = _metric_names(runs, metric)
    print_table(
        ("RUN", "JOB", "STATE", "DURATION", *(n.upper() for n in names)),
        [
            (
                escape(label),
                r.id,
                r.state.value,
                duration(r.started_at, r.ended_at),
                *(_value((r.latest_metrics or {}).get(n)) for n in names),
            )
            for r, label in zip(runs, labels(runs), strict=True)
        ],
    )
    if metric is not None and metric not in names:
        say(f"no run has reported {metric!r} yet")


def _sort_key(run: JobInfo, metric: str, desc: bool) -> tuple[int, float]:
    value = (run.latest_metrics or {}).get(metric)
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return (1, 0.0)  # runs without it last
    return (0, -float(value) if desc else float(value))


def _metric_names(runs: list[JobInfo], first: str | None) -> list[str]:
    names: dict[str, None] = {}
    if first is not None and any(first in (r.latest_metrics or {}) for r in runs):
        names[first] = None
    for r in runs:
        for key, value in (r.latest_metrics or {}).items():
            if key not in NOT_METRICS and isinstance(value, int | float):
                names[key] = None
    return list(names)


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def cancel(
    sweep_ref: str = typer.Argument(..., metavar="SWEEP", help="A sweep's id, or its name."),
    grace: float = params.Option(
        10.0, "--grace", min=0, max=MAX_GRACE, help="Seconds between SIGTERM and SIGKILL."
    ),
    wait: bool = params.Option(True, "--wait/--no-wait", help="Wait until the runs have stopped."),
    on: str | None = OnOption,
) -> None:
    """Cancel every run of a sweep that has not ended (queued or running), as `gpuhop cancel`
    each; the runs that ended keep their results."""
    with client_for(on) as client:
        try:
            before = {r.id: r.state for r in client.sweep_runs(sweep_ref)}
            runs = client.cancel_sweep(sweep_ref, grace)
            stopping = [r for r in runs if not before.get(r.id, r.state).finished]
            if wait:
                runs = [r if r.state.finished else client.job(r.id).wait(grace + 30) for r in runs]
        except GpuhopError as e:
            fail(e.message)
        except TimeoutError as e:
            fail(str(e))
    if not stopping:
        say(f"every run of sweep {sweep_ref} had ended already ({_counts(runs)})")
        return
    say(f"cancelled {len(stopping)} run(s) of sweep {sweep_ref}; now {_counts(runs)}")


_SUBCOMMANDS: dict[str, Callable[..., None]] = {"show": show, "cancel": cancel}


def _dispatch(name: str, args: list[str]) -> None:
    app = typer.Typer(
        add_completion=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},  # as every command's
    )
    app.command()(params.for_typer(_SUBCOMMANDS[name]))  # --on is declared for cli.params
    app(args=args, prog_name=f"gpuhop sweep {name}")


def register(app: typer.Typer) -> None:
    app.command(
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
        cls=jobopts.script_command(),
    )(sweep)
