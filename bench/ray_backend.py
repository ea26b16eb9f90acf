"""Ray backend: jobs on a Ray cluster through gpuhop, next to what a Ray user runs instead.

Starts one local Ray cluster of 2 nodes (2 CPUs each, no GPUs) with token authentication
and Ray's dashboard (the test suite's helper, tests/ray_backend/cluster.py, in a process of
its own), and a private agent on it with `--backend ray`. Then, over repeats:

- hello.py, launch to its line "hello": `gpuhop run hello.py` against `ray job submit
  --working-dir . -- python hello.py`, both CLIs as a user types them; and, in a live
  Python process, gpuhop's SDK (`Client.submit` + `Job.logs(follow=True)`) against Ray's
  `JobSubmissionClient.submit_job` + polling `get_job_logs` every 20 ms;
- a 2-worker job whose workers print a line and exit, launch to exit: `gpuhop run
  --workers 2 worker.py` against the shortest Ray driver that does the same (`RAY_DRIVER`:
  a placement group of 2 SPREAD bundles and one actor per bundle that runs
  `python worker.py`).

Both sides ship the project dir (gpuhop syncs it; Ray's `working_dir` uploads it). The
cluster (by the pids Ray recorded) and the agent are stopped whatever happens.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from harness import (
    PYTHON,
    REPO,
    BenchError,
    Row,
    Settings,
    private_agent,
    time_first_line,
    timed_run,
)

from gpuhop import Client

sys.path.insert(0, str(REPO))
from tests.ray_backend import cluster as ray_cluster  # the test suite's local Ray cluster

NAME = "ray_backend"
NODES = [{"num_cpus": 2, "num_gpus": 0}] * 2
HELLO = 'print("hello", flush=True)\n'
WORKER = 'import os\nprint("worker pid", os.getpid(), flush=True)\n'
POLL = 0.02

# What a Ray user writes to run 2 processes on 2 nodes.
RAY_DRIVER = """
import subprocess, sys
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

@ray.remote(num_cpus=1)
class Worker:
    def run(self, script):
        done = subprocess.run([sys.executable, script], capture_output=True, text=True, check=True)
        return done.stdout

ray.init(address=sys.argv[1], runtime_env={"working_dir": "."})
group = placement_group([{"CPU": 1}] * 2, strategy="SPREAD")
ray.get(group.ready())
workers = [
    Worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote()
    for i in range(2)
]
print("".join(ray.get([w.run.remote("worker.py") for w in workers])), end="")
"""

# A live Python process with Ray's job client: one sample per line on stdin.
RAY_SDK = f"""
import sys, time
from ray.job_submission import JobStatus, JobSubmissionClient

client = JobSubmissionClient(sys.argv[1])
for _ in sys.stdin:
    start = time.perf_counter()
    job = client.submit_job(entrypoint=sys.argv[2], runtime_env={{"working_dir": "."}})
    while "hello\\n" not in client.get_job_logs(job):
        if time.perf_counter() - start > 120:
            sys.exit(f"no output from {{job}}: {{client.get_job_status(job)}}")
        time.sleep({POLL})
    took = time.perf_counter() - start
    while not client.get_job_status(job).is_terminal():
        time.sleep(0.05)
    if client.get_job_status(job) != JobStatus.SUCCEEDED:
        sys.exit(f"{{job}} failed: {{client.get_job_logs(job)}}")
    print(took, flush=True)
"""

CLI_FIRST = "hello.py: launch → first output line"
CLI_EXIT = "hello.py: launch → exit"
SDK_FIRST = "hello.py, from a live Python process: submit → first output line"
GANG = "2 workers spread over 2 nodes, each prints a line: launch → exit"
SUBMIT = "ray job submit"
JOB_CLIENT = "JobSubmissionClient + polling get_job_logs"
DRIVER = "Ray driver: placement group + 2 actors running python worker.py"
# (what, gpuhop's samples, the alternative, its samples, note)
ROWS = (
    (CLI_FIRST, "cli first", SUBMIT, "submit first",
     "both CLIs as typed, until the script's own line (gpuhop prints lines of its own first);"
     " `ray job submit` polls each second for the job's supervisor, then for new lines"),
    (CLI_FIRST, "cli first", JOB_CLIENT, "job client",
     "gpuhop's CLI, Python's start-up included, against Ray's client in a live process"),
    (SDK_FIRST, "sdk", JOB_CLIENT, "job client",
     "like for like: gpuhop's Client.submit + Job.logs(follow=True), in a live process"),
    (CLI_EXIT, "cli exit", SUBMIT, "submit exit", "until the command returns"),
    (GANG, "gpuhop gang", DRIVER, "driver",
     "`gpuhop run --workers 2 worker.py` against `python ray_driver.py` (RAY_DRIVER here, with"
     " ray.init(runtime_env={'working_dir': '.'})): each pays a new Ray driver and 2 actors"),
)  # fmt: skip


def ray_cli() -> str:
    beside = Path(PYTHON).with_name("ray")
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        raise BenchError("Ray's `ray` command is missing (pip install 'ray[default]')")
    return found


@contextlib.contextmanager
def local_cluster(tmp: Path) -> Iterator[ray_cluster.RayCluster]:
    """NODES as a Ray cluster with token authentication and the dashboard; stopped by pid."""
    cluster = ray_cluster.start(tmp, auth=True, nodes=NODES, dashboard=True)
    try:
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def job_client(dashboard: str, project: Path, env: dict[str, str]) -> Iterator[Callable[[], float]]:
    """Ray's JobSubmissionClient in a process of its own (Ray stays out of this one); yields
    a function that takes one sample."""
    entrypoint = f"{shlex.quote(PYTHON)} hello.py"
    argv = [PYTHON, "-c", RAY_SDK, f"http://{dashboard}", entrypoint]
    pipe = subprocess.PIPE
    with (
        tempfile.TemporaryFile() as err,
        subprocess.Popen(argv, cwd=project, env=env, stdin=pipe, stdout=pipe, stderr=err) as proc,
    ):

        def sample() -> float:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            answer = proc.stdout.readline()
            if not answer:
                err.seek(0)
                raise BenchError(f"JobSubmissionClient failed:\n{err.read().decode()[-2000:]}")
            return float(answer)

        try:
            yield sample
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def sdk_first_line(client: Client, project: Path) -> float:
    """gpuhop's SDK: seconds from submitting hello.py to its "hello" arriving."""
    start = time.perf_counter()
    job = client.submit(["hello.py"], workdir=project)
    seen = b""
    with contextlib.closing(job.logs(follow=True)) as chunks:
        for chunk in chunks:
            seen += chunk
            if b"hello\n" in seen:
                break
    took = time.perf_counter() - start
    info = job.wait(timeout=120)
    if b"hello\n" not in seen or info.state != "succeeded":
        raise BenchError(f"job {job.id} ended {info.state} ({info.reason}): {seen[-2000:]!r}")
    return took


def time_gang(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """Seconds a 2-worker run takes; its output must have both workers' lines."""
    with open(log, "wb") as out:
        took = timed_run(argv, cwd, env, stdout=out)
    if len(re.findall(rb"^(?:\[worker \d\] )?worker pid \d+$", log.read_bytes(), re.M)) != 2:
        raise BenchError(f"{' '.join(argv)} did not print 2 workers' lines:\n{log.read_text()}")
    return took


def rows(samples: dict[str, list[float]], why_not: str) -> list[Row]:
    """The table's rows; an alternative with no samples is skipped because of `why_not`."""
    return [
        Row(NAME, what, "s", samples.get(mine, []), alternative, samples.get(theirs),
            note if theirs in samples else f"skipped: {why_not}")
        for what, mine, alternative, theirs, note in ROWS
    ]  # fmt: skip


def run(settings: Settings) -> list[Row]:
    if importlib.util.find_spec("ray") is None:
        return rows({}, "Ray is not installed (pip install 'gpuhop[ray]')")
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        samples = measure(Path(tmp), settings.repeats(default=5, quick=2))
    return rows(samples, "ray.cluster_utils.Cluster started no dashboard (Ray's job API)")


def measure(root: Path, repeats: int) -> dict[str, list[float]]:
    """Every sample, by name (ROWS's); the job API's are missing without a dashboard."""
    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    project = root / "project"
    project.mkdir()
    (project / "hello.py").write_text(HELLO)
    (project / "worker.py").write_text(WORKER)
    (root / "ray_driver.py").write_text(RAY_DRIVER)
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(local_cluster(root))
        assert cluster.token is not None and cluster.token_file is not None
        ray_args = ["--ray-address", cluster.address, "--ray-token-file", str(cluster.token_file)]
        agent = stack.enter_context(private_agent(root / "agent", "--backend", "ray", *ray_args))
        env = {k: v for k, v in agent.env.items() if not k.startswith("RAY_")}
        env["GPUHOP_CONFIG_DIR"] = str(root / "config")  # no remote of the user's applies
        ray_env = {k: v for k, v in env.items() if not k.startswith("GPUHOP_")}
        ray_env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=cluster.token)
        client = stack.enter_context(agent.client())
        gpuhop = [PYTHON, "-m", "gpuhop", "run"]

        def gpuhop_hello() -> None:
            first, end = time_first_line([*gpuhop, "hello.py"], project, env, b"hello")
            add("cli first", first)
            add("cli exit", end)
            add("sdk", sdk_first_line(client, project))

        def gangs() -> None:
            argv = [*gpuhop, "--workers", "2", "worker.py"]
            add("gpuhop gang", time_gang(argv, project, env, root / "gpuhop.log"))
            argv = [PYTHON, str(root / "ray_driver.py"), cluster.address]
            add("driver", time_gang(argv, project, ray_env, root / "driver.log"))

        rounds = [gpuhop_hello, gangs]
        if cluster.dashboard is not None:
            submit = [ray_cli(), "job", "submit", "--address", f"http://{cluster.dashboard}"]
            submit += ["--working-dir", ".", "--", PYTHON, "hello.py"]
            job_client_sample = stack.enter_context(job_client(cluster.dashboard, project, ray_env))

            def ray_hello() -> None:
                first, end = time_first_line(submit, project, ray_env, b"hello")
                add("submit first", first)
                add("submit exit", end)
                add("job client", job_client_sample())

            rounds.append(ray_hello)
        for one in rounds:  # warm up: Ray's worker processes, the package caches
            one()
        samples.clear()
        for _ in range(repeats):
            for one in rounds:
                one()
    return samples
