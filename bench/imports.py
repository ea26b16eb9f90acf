"""Imports: what `run`, `ps`, `logs`, `show` and `cancel` import before their first output.

Each command runs for real against a warm local agent under `python -X importtime`; a row
gives the sum of its top-level imports next to a bare `python -X importtime -c pass` (the
interpreter's own imports), and its note names the packages that took longest (each
module's own time, added up by top-level package: a model class's pydantic build counts
for the gpuhop module that defines it). The full `-X importtime` output of each command is
written to bench/results/importtime-COMMAND.txt.

Each command also runs as a user runs it (no -X importtime), and a row gives the CPU time
(user + system) its process took, next to `python -c pass`'s: on a busy shared machine wall
times and import times swell with the load, CPU times much less.
"""

from __future__ import annotations

import resource
import subprocess
import tempfile
from pathlib import Path

from harness import PYTHON, REPO, BenchError, Row, Settings, private_agent

NAME = "imports"
OUT = REPO / "bench" / "results"


def import_times(text: str) -> dict[str, float]:
    """Time (ms) spent importing each top-level package, from `-X importtime` output (each
    module's own time, added up by the package it belongs to)."""
    times: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        own, _, name = line.removeprefix("import time:").split("|", 2)
        if own.strip().isdigit():
            package = name.strip().split(".")[0]
            times[package] = times.get(package, 0.0) + int(own) / 1000
    return times


def importtime(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [PYTHON, "-X", "importtime", *argv], cwd=cwd, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc.stderr


def cpu_time(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Seconds of CPU (user + system) that `python ARGV` took."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([PYTHON, *argv], cwd=cwd, env=env, capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=5, quick=2)
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "hello.py").write_text('print("hello")\n')
        (project / "wait.py").write_text("import time\ntime.sleep(600)\n")
        with private_agent(root / "agent") as agent, agent.client() as client:
            done = client.submit(["hello.py"], workdir=project)
            done.wait(timeout=120)
            waiting = client.submit(["wait.py"], workdir=project).id
            gpuhop = ["-m", "gpuhop"]
            commands = {
                "run": [*gpuhop, "run", "hello.py"],
                "ps": [*gpuhop, "ps"],
                "logs": [*gpuhop, "logs", done.id],
                "show": [*gpuhop, "show", done.id],
                "cancel": [*gpuhop, "cancel", "--no-wait", waiting],
            }

            def bare() -> float:
                return sum(import_times(importtime(["-c", "pass"], project, agent.env)).values())

            floor = [bare()]
            samples: dict[str, list[float]] = {name: [] for name in commands}
            cpu: dict[str, list[float]] = {name: [] for name in [*commands, "pass"]}
            texts: dict[str, str] = {}
            for _ in range(repeats):
                for name, argv in commands.items():
                    if name == "cancel":  # each try cancels a job of its own
                        argv = [*argv[:-1], client.submit(["wait.py"], workdir=project).id]
                    texts[name] = importtime(argv, project, agent.env)
                    samples[name].append(sum(import_times(texts[name]).values()))
                    if name == "cancel":
                        argv = [*argv[:-1], client.submit(["wait.py"], workdir=project).id]
                    cpu[name].append(1000 * cpu_time(argv, project, agent.env))
                floor.append(bare())
                cpu["pass"].append(1000 * cpu_time(["-c", "pass"], project, agent.env))
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, text in texts.items():
        (OUT / f"importtime-{name}.txt").write_text(text)
        top = sorted(import_times(text).items(), key=lambda kv: -kv[1])[:5]
        note = "heaviest: " + ", ".join(f"{mod} {ms:.0f} ms" for mod, ms in top)
        rows.append(
            Row(NAME, f"gpuhop {name}: imports", "ms", samples[name], "python -c pass", floor, note)
        )
    for name in commands:
        rows.append(
            Row(NAME, f"gpuhop {name}: CPU time", "ms", cpu[name], "python -c pass", cpu["pass"])
        )
    return rows
