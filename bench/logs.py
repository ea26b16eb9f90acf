"""Logs: the throughput of a job that prints many short lines, and the lag of a followed log.

Throughput: `gpuhop run lines.py N` (`for i in range(N): print(i)`) with its output going to
a file, next to `python lines.py N > file`. Lag: a job prints `time.time()` every 50 ms for
3 s; the SDK follows it in-process (`job.logs(follow=True)`) and notes, per line, when it
arrived minus when it was printed; next to reading the same script's stdout from a pipe.
"""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from harness import PYTHON, BenchError, Row, Settings, percentile, private_agent, timed_run

from gpuhop import Client

NAME = "logs"
LINES_SCRIPT = "import sys\n\nfor i in range(int(sys.argv[1])):\n    print(i)\n"
LAG_SCRIPT = """\
import time

end = time.time() + 3.0
while time.time() < end:
    print(repr(time.time()), flush=True)
    time.sleep(0.05)
"""


def lags(chunks: Iterable[bytes], since: float) -> list[float]:
    """Seconds between printing and receiving, for each line printed after `since`."""
    out: list[float] = []
    pending = b""
    for chunk in chunks:
        now = time.time()
        *lines, pending = (pending + chunk).split(b"\n")
        out += [now - printed for printed in map(float, lines) if printed >= since]
    return out


def gpuhop_lags(client: Client, project: Path) -> list[float]:
    job = client.submit(["lag.py"], workdir=project)
    since = time.time()
    out = lags(job.logs(follow=True), since)
    if job.refresh().state.value != "succeeded":
        raise BenchError(f"job {job.id} did not succeed: {job.info.reason}")
    return out


def pipe_lags(project: Path, env: dict[str, str]) -> list[float]:
    with subprocess.Popen([PYTHON, "lag.py"], cwd=project, env=env, stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        since = time.time()
        out = lags(iter(functools.partial(os.read, p.stdout.fileno(), 1 << 16), b""), since)
    if p.returncode != 0:
        raise BenchError(f"lag.py exited with {p.returncode}")
    return out


def time_lines(argv: list[str], project: Path, env: dict[str, str], out: Path, n: int) -> float:
    """Seconds to run a line printer with stdout to `out`; check that no line was lost."""
    with open(out, "wb") as f:
        seconds = timed_run(argv, project, env, stdout=f)
    with open(out, "rb") as f:
        got = sum(1 for _ in f)
    if got != n:
        raise BenchError(f"{' '.join(argv)} printed {n:,} lines; {got:,} reached the file")
    return seconds


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=5, quick=2)
    n = 200_000 if settings.quick else 1_000_000
    commands = {
        "gpuhop": [PYTHON, "-m", "gpuhop", "run", "lines.py", str(n)],
        "python": [PYTHON, "lines.py", str(n)],
    }
    throughput: dict[str, list[float]] = {name: [] for name in commands}
    lag_runs: dict[str, list[list[float]]] = {"gpuhop": [], "pipe": []}
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "lines.py").write_text(LINES_SCRIPT)
        (project / "lag.py").write_text(LAG_SCRIPT)
        with private_agent(root / "agent") as agent, agent.client() as client:
            for _ in range(repeats):
                for name, argv in commands.items():
                    out = root / f"{name}.out"
                    throughput[name].append(time_lines(argv, project, agent.env, out, n))
                lag_runs["gpuhop"].append(gpuhop_lags(client, project))
                lag_runs["pipe"].append(pipe_lags(project, agent.env))

    def lag_ms(name: str, q: float) -> list[float]:
        return [1000 * percentile(lines, q) for lines in lag_runs[name]]

    per_run = statistics.median(len(lines) for lines in lag_runs["gpuhop"])
    follow = "job.logs(follow=True), in-process"
    pipe = "python lag.py | reader"
    return [
        Row(
            NAME,
            f"print {n:,} short lines, output to a file",
            "s",
            throughput["gpuhop"],
            "python lines.py > file",
            throughput["python"],
            "every line checked to arrive",
        ),
        Row(
            NAME,
            "followed log lag, median line",
            "ms",
            lag_ms("gpuhop", 50),
            pipe,
            lag_ms("pipe", 50),
            f"{follow}; a line every 50 ms for 3 s ({per_run:.0f} lines a run)",
        ),
        Row(
            NAME,
            "followed log lag, p99 line",
            "ms",
            lag_ms("gpuhop", 99),
            pipe,
            lag_ms("pipe", 99),
            f"{follow}; p99 of {per_run:.0f} lines is about the worst line",
        ),
    ]
