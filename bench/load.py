"""Load: the agent answering `ps` while hundreds of jobs wait and dozens of clients follow logs.

A job holds the one (fake) GPU, N jobs queue behind it, C chatty CPU jobs print a line every
20 ms, and F followers (in a separate process, so they do not share this one's GIL) follow
those logs. Meanwhile this process times `ps` as the CLI sends and reads it (GET
/v1/jobs?limit=50&fields=..., the table's columns, its JSON parsed, no models built:
`Client.jobs_json` as `gpuhop ps` calls it): one client in a loop (latency p50/p99,
requests/s), then 4 clients at once (requests/s).
The same is measured on the same agent before any job exists, as the baseline. Every
follower's stream is checked against the log file at the end: nothing lost under load.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from harness import PYTHON, BenchError, Row, Settings, percentile, private_agent

from gpuhop import Client
from gpuhop.cli.ps import FIELDS
from gpuhop.home import AgentPaths, read_pid

NAME = "load"
# Jobs wait for a file named "go" in their artifacts dir (their /tmp is their own).
GO = "import os, time\ngo = os.path.join(os.environ['GPUHOP_ARTIFACTS_DIR'], 'go')\n"
HOLD = GO + "while not os.path.exists(go):\n    time.sleep(0.05)\n"
CHATTY = GO + (
    "i = 0\nwhile not os.path.exists(go):\n"
    "    print(f'line {i}', flush=True); i += 1; time.sleep(0.02)\nprint('done', flush=True)\n"
)
FOLLOWERS = """
import sys, threading
from pathlib import Path
from gpuhop import Client
home, cache, per_job, *jobs = sys.argv[1:]
bad = []
def follow(job_id):
    with Client(Path(home), autostart=False, cache_dir=Path(cache)) as c:
        got = b"".join(c.job(job_id).logs(follow=True))
    if got != (Path(home) / "jobs" / job_id / "output.log").read_bytes():
        bad.append(job_id)
threads = [threading.Thread(target=follow, args=(j,)) for j in jobs for _ in range(int(per_job))]
for t in threads: t.start()
print("following", flush=True)
for t in threads: t.join()
print("mismatched" if bad else "all streams match the log files", flush=True)
sys.exit(1 if bad else 0)
"""


def time_ps(client: Client, seconds: float) -> list[float]:
    """Latencies (s) of `ps` requests sent one after another for `seconds`."""
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        client.jobs_json(limit=50, fields=FIELDS)
        out.append(time.perf_counter() - t0)
    return out


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_ps_and_cpu(client: Client, pid: int, seconds: float) -> tuple[list[float], float, float]:
    """`time_ps`, and the agent's CPU time (s) per request: less what it spends meanwhile
    on everything else (followers, jobs), measured for a second before with no request.
    Unlike the latency, this does not depend on what else runs on the machine. Last, that
    second's CPU time per second."""
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    time.sleep(1.0)
    background = (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    latencies = time_ps(client, seconds)
    used = cpu_seconds(pid) - c0 - background * (time.perf_counter() - t0)
    return latencies, max(used, 0.0) / len(latencies), background


def concurrent_rate(agent, seconds: float, clients: int = 4) -> float:
    counts = [0] * clients

    def hammer(i: int) -> None:
        with agent.client() as c:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                c.jobs_json(limit=50, fields=FIELDS)
                counts[i] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def run(settings: Settings) -> list[Row]:
    queued_n, chatty_n, per_job = (100, 4, 5) if settings.quick else (400, 6, 6)
    seconds = 3.0 if settings.quick else 10.0
    repeats = settings.repeats(default=3, quick=1)
    lat: dict[str, list[list[float]]] = {"idle": [], "load": []}
    rate: dict[str, list[float]] = {"idle": [], "load": []}
    cpu: dict[str, list[float]] = {"idle": [], "load": []}
    background: dict[str, list[float]] = {"idle": [], "load": []}
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "hold.py").write_text(HOLD)
        (project / "chatty.py").write_text(CHATTY)
        opts = ("--fake-gpus", "1")
        with private_agent(root / "agent", *opts) as agent, agent.client() as client:
            pid = read_pid(AgentPaths(agent.home))
            if pid is None:
                raise BenchError("the agent wrote no pid file")

            def measure(kind: str) -> None:
                latencies, per_request, busy = time_ps_and_cpu(client, pid, seconds)
                lat[kind].append(latencies)
                cpu[kind].append(per_request)
                background[kind].append(busy)
                rate[kind].append(concurrent_rate(agent, seconds))

            for _ in range(repeats):
                measure("idle")
            client.submit(["hold.py"], workdir=project, gpus=1)
            for _ in range(queued_n):
                client.submit(["hold.py"], workdir=project, gpus=1)
            chatty = [client.submit(["chatty.py"], workdir=project).id for _ in range(chatty_n)]
            followers = subprocess.Popen(
                [PYTHON, "-c", FOLLOWERS, str(agent.home), str(agent.cache), str(per_job), *chatty],
                env=agent.env,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert followers.stdout is not None
                if followers.stdout.readline().strip() != "following":
                    raise BenchError("the followers did not start")
                queued = len(client.jobs(["queued"], limit=10_000))
                if queued != queued_n:
                    raise BenchError(f"{queued} jobs queued, expected {queued_n}")
                for _ in range(repeats):
                    measure("load")
            finally:
                # The queued jobs are cancelled; the running ones end on their go file.
                for job in client.jobs(["queued"], limit=10_000):
                    client.job(job.id).cancel(grace=0)
                for job in client.jobs(["starting", "running"], limit=10_000):
                    go = agent.home / "jobs" / job.id / "artifacts" / "go"
                    if go.parent.is_dir():
                        go.touch()
                verdict = followers.communicate(timeout=300)[0].strip()
            if followers.returncode != 0:
                raise BenchError(f"followers: {verdict}")
            deadline = time.monotonic() + 120
            while client.jobs(["queued", "starting", "running"], limit=10_000):
                if time.monotonic() > deadline:
                    raise BenchError("the jobs did not end in 2 minutes")
                time.sleep(0.5)

    load = (
        f"{queued_n} queued jobs, {chatty_n * per_job} followers of {chatty_n} jobs printing"
        " every 20 ms; followers' streams checked against the log files"
    )

    def ms(kind: str, q: float) -> list[float]:
        return [1000 * percentile(run, q) for run in lat[kind]]

    def sequential_rate(kind: str) -> list[float]:
        return [len(run) / sum(run) for run in lat[kind]]

    return [
        Row(
            NAME,
            "ps (GET /v1/jobs?limit=50, the table's fields) latency, median",
            "ms",
            ms("load", 50),
            "same agent, no jobs",
            ms("idle", 50),
            load,
        ),
        Row(
            NAME,
            "ps latency, p99",
            "ms",
            ms("load", 99),
            "same agent, no jobs",
            ms("idle", 99),
            load,
        ),
        Row(
            NAME,
            "agent CPU time per ps (less its CPU/s without requests)",
            "ms",
            [1000 * c for c in cpu["load"]],
            "same agent, no jobs",
            [1000 * c for c in cpu["idle"]],
            load,
        ),
        Row(
            NAME,
            "agent CPU time per second with no ps (followers' streams, jobs, scheduler)",
            "ms/s",
            [1000 * b for b in background["load"]],
            "same agent, no jobs",
            [1000 * b for b in background["idle"]],
            load,
        ),
        Row(
            NAME,
            "ps requests/s, one client",
            "req/s",
            sequential_rate("load"),
            "same agent, no jobs",
            sequential_rate("idle"),
            load,
        ),
        Row(
            NAME,
            "ps requests/s, 4 clients at once",
            "req/s",
            rate["load"],
            "same agent, no jobs",
            rate["idle"],
            load,
        ),
    ]
