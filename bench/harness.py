"""Runs on the benchmarking machine: a private agent, timing helpers, and the results table.

Every benchmark returns `Row`s: one measured quantity, sampled over repeats for gpuhop and
for what a user would do instead on the same machine (or a reason that could not be run).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpuhop import Client, __version__
from gpuhop.home import AgentPaths, JobPaths

REPO = Path(__file__).resolve().parent.parent
# The interpreter of the venv: the agent runs jobs with it, so plain runs use it too.
PYTHON = sys.executable


class BenchError(RuntimeError):
    """A command a benchmark depends on failed; the message says which and how."""


@dataclass(frozen=True)
class Settings:
    repeat: int | None  # None: each benchmark's own default
    quick: bool

    def repeats(self, default: int, quick: int) -> int:
        if self.repeat is not None:
            return self.repeat
        return quick if self.quick else default


@dataclass
class Row:
    """One measured quantity: gpuhop's samples next to the alternative's."""

    bench: str
    what: str
    unit: str
    gpuhop: list[float]
    alternative_name: str
    alternative: list[float] | None = None  # None: skipped, and `note` says why
    note: str = ""

    def ratio(self) -> float | None:
        if not self.alternative or not self.gpuhop:
            return None
        base = statistics.median(self.alternative)
        return statistics.median(self.gpuhop) / base if base else None

    def to_json(self) -> dict[str, object]:
        return {
            "bench": self.bench,
            "what": self.what,
            "unit": self.unit,
            "gpuhop": _summary(self.gpuhop),
            "alternative": {"name": self.alternative_name, **_summary(self.alternative or [])},
            "ratio": self.ratio(),
            "note": self.note,
        }


def _summary(samples: list[float]) -> dict[str, object]:
    if not samples:
        return {"samples": []}
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "samples": samples,
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank: always a value that was seen."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# -- the agent ----------------------------------------------------------------------------------


@dataclass
class PrivateAgent:
    """An agent of the benchmark's own: state dir and hash cache under `root`."""

    root: Path
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHOP_")}
        self.env.update(GPUHOP_HOME=str(self.home), GPUHOP_CACHE_DIR=str(self.cache))
        # Jobs inherit the agent's environment; plain runs get the same quiet TensorFlow.
        self.env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    def cli(self, *args: str) -> None:
        """Run `gpuhop ARGS...` against this agent; raise BenchError if it fails."""
        run_checked([PYTHON, "-m", "gpuhop", *args], env=self.env)

    def client(self) -> Client:
        return Client(self.home, autostart=False, cache_dir=self.cache)

    def cancel_jobs(self) -> None:
        """Cancel every job not ended yet through the agent, queued ones first (so that
        killing a running one starts none of them), and wait for their ends: the agent
        then removes what each attempt had (its cgroup). Nothing if the agent is gone."""
        with contextlib.suppress(Exception), self.client() as client:
            for states in (["queued"], ["starting", "running"]):
                for job in client.jobs(states, limit=10_000):
                    client.job(job.id).cancel(grace=0)
            deadline = time.monotonic() + 30
            while client.jobs(["queued", "starting", "running"]) and time.monotonic() < deadline:
                time.sleep(0.1)

    def kill_jobs(self) -> None:
        """Kill the jobs still running (after an error or Ctrl-C), by process group."""
        for job in (JobPaths(d) for d in AgentPaths(self.home).jobs.glob("*")):
            # A job with an exit status has ended: its pid may belong to someone else by now.
            if job.status.exists():
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads(job.leader_pid.read_text())["pid"]), signal.SIGKILL)


@contextlib.contextmanager
def private_agent(root: Path, *options: str) -> Iterator[PrivateAgent]:
    """Start an agent with `gpuhop agent start [OPTIONS]`; stop it and its leftover jobs at
    the end."""
    agent = PrivateAgent(root)
    try:
        agent.cli("agent", "start", *options)
        yield agent
    finally:
        agent.cancel_jobs()
        agent.kill_jobs()
        agent.cli("agent", "stop")
        agent.kill_jobs()  # one the scheduler started meanwhile (it outlives the agent)


# -- running and timing -------------------------------------------------------------------------


def quiet_disk() -> None:
    """Flush what earlier steps wrote (`sync`), so that the next measurement does not pay
    for their writeback: on this kind of VM a GB still in the page cache halves the next
    write's speed."""
    os.sync()


def run_checked(
    argv: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdout: IO[bytes] | None = None,
) -> None:
    """Run a command to its end; raise BenchError with its stderr if it fails."""
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise BenchError(
            f"{' '.join(argv)} exited with {proc.returncode}:\n{proc.stderr.decode()[-2000:]}"
        )


def timed_run(
    argv: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdout: IO[bytes] | None = None,
) -> float:
    """Seconds from launching a command to its successful exit."""
    start = time.perf_counter()
    run_checked(argv, cwd, env, stdout)
    return time.perf_counter() - start


def time_first_line(
    argv: list[str], cwd: Path, env: dict[str, str], line: bytes | None = None
) -> tuple[float, float]:
    """Seconds from launching a command to its first stdout line (the first that is `line`,
    given one: a tool may print its own lines first), and to its exit."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err) as proc:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            while line is not None and first and first.rstrip(b"\r\n") != line:
                first = proc.stdout.readline()
            first_at = time.perf_counter() - start
            proc.stdout.read()
            code = proc.wait()
            exit_at = time.perf_counter() - start
        if code != 0 or not first:
            err.seek(0)
            missing = "" if first else f" without printing {line!r}" if line else " silently"
            raise BenchError(
                f"{' '.join(argv)} exited with {code}{missing}:\n{err.read().decode()[-2000:]}"
            )
    return first_at, exit_at


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.01) -> None:
    """Poll `predicate` until it is truthy; raise BenchError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


# -- the report ---------------------------------------------------------------------------------


def machine() -> dict[str, object]:
    commit = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpuhop": f"{__version__} ({commit or 'no git'})",
        "gpu": gpu_name(),
        "load_average": os.getloadavg()[0],  # other work on the machine skews every timing
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def gpu_name() -> str:
    """The GPUs nvidia-smi lists here, or "none"."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
        names = [line.split(" (UUID")[0] for line in listed.stdout.splitlines() if line]
        if listed.returncode == 0 and names:
            return "; ".join(names)
    return "none"


def _num(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _spread(samples: list[float] | None) -> str:
    if not samples:
        return "—"
    return " / ".join(_num(v) for v in (min(samples), statistics.median(samples), max(samples)))


COLUMNS = (
    "benchmark",
    "what",
    "unit",
    "gpuhop",
    "alternative",
    "alternative's numbers",
    "ratio",
    "notes",
)


def _table_line(cells: Iterable[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def markdown(rows: list[Row], info: dict[str, object], settings: Settings) -> str:
    head = [
        "# gpuhop benchmarks",
        "",
        f"Machine: {info['nproc']} CPUs ({info['cpus_usable']} usable), Python {info['python']},"
        f" {info['platform']}, GPU: {info['gpu']}, load average {info['load_average']:.2f}"
        " at the start."
        f" gpuhop {info['gpuhop']}, {info['date']}.",
        f"Mode: {'quick' if settings.quick else 'full'}"
        + (f", {settings.repeat} repeats each" if settings.repeat else ", default repeats")
        + ". Columns give min / median / max over repeats; ratio = gpuhop median /"
        " alternative median.",
        "",
        _table_line(COLUMNS),
        _table_line(["---"] * len(COLUMNS)),
    ]
    lines = []
    for row in rows:
        ratio = row.ratio()
        cells = [
            row.bench,
            row.what,
            row.unit,
            _spread(row.gpuhop),
            row.alternative_name,
            _spread(row.alternative),
            f"{ratio:.2f}x" if ratio is not None else "—",
            row.note,
        ]
        lines.append(_table_line(cells))
    return "\n".join(head + lines) + "\n"
