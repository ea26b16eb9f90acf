"""Issue 39, seeing inside a job: `gpuhop stacks` on a running job, the record of what a job
ran on, and `gpuhop diff` of two jobs. A real agent (the session's) and the CLI as a user
runs it; plain Python jobs, no TensorFlow."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuhop.api import JobState
from gpuhop.version import __version__
from tests.conftest import Agent, wait_until

# A job that says it is up, then waits inside a function whose name only this test uses.
STUCK = """\
import time

def waits_for_a_peer_that_never_comes():
    print("up", flush=True)
    time.sleep(300)

waits_for_a_peer_that_never_comes()
"""


def _started(agent: Agent, root: Path, *args: str) -> str:
    """The id of a job of `root`'s stuck.py started detached with `args`, once it is up."""
    run = agent.cli("run", "-d", *args, "stuck.py", cwd=root)
    assert run.returncode == 0, run.stderr
    job = run.stdout.strip()
    with agent.client() as client:
        handle = client.job(job)
        wait_until(lambda: b"up" in b"".join(handle.logs()), timeout=60)
    return job


def _cancel(agent: Agent, job: str) -> None:
    with agent.client() as client:
        client.job(job).cancel(grace=0)
        client.job(job).wait(timeout=60)  # recorded as ended, not only dead


def test_stacks_shows_where_a_running_job_waits(shared_agent, project):
    root = project({"stuck.py": STUCK})
    job = _started(shared_agent, root)
    try:
        shown = shared_agent.cli("stacks", job)
        assert shown.returncode == 0, shown.stderr
        assert "waits_for_a_peer_that_never_comes (stuck.py:5)" in shown.stdout
        assert "<module> (stuck.py:7)" in shown.stdout
        # Only the job's own processes: not the leader that gpuhop runs it under.
        assert "leader" not in shown.stdout
        with shared_agent.client() as client:
            assert [p.worker for p in client.job(job).stacks().processes] == [None]
        no_worker = shared_agent.cli("stacks", job, "--worker", "1")
        assert no_worker.returncode == 2
        assert f"job {job} has one worker (0); there is no worker 1" in no_worker.stderr
    finally:
        _cancel(shared_agent, job)
    ended = shared_agent.cli("stacks", job)
    assert ended.returncode == 2
    assert f"job {job} has ended: cancelled, so it has no stacks to show" in ended.stderr


def test_stacks_of_one_worker_with_native_frames(shared_agent, project):
    root = project({"stuck.py": STUCK})
    job = _started(shared_agent, root, "--workers", "2")
    try:
        every = shared_agent.cli("stacks", job)
        assert every.returncode == 0, every.stderr
        assert "worker 0" in every.stdout and "worker 1" in every.stdout
        assert every.stdout.count("waits_for_a_peer_that_never_comes") == 2
        one = shared_agent.cli("stacks", job, "--worker", "1", "--native")
        assert one.returncode == 0, one.stderr
        assert "worker 0" not in one.stdout and "worker 1" in one.stdout
        # The C frames under Python's: the sleep's own.
        assert "time_sleep" in one.stdout, one.stdout
        assert "waits_for_a_peer_that_never_comes (stuck.py:5)" in one.stdout
    finally:
        _cancel(shared_agent, job)


# A job whose dump is long: 40 threads, each 800 calls deep, waiting.
DEEP = """\
import threading, time

def descends_further_into_a_very_deep_stack(n, up):
    if n:
        return descends_further_into_a_very_deep_stack(n - 1, up)
    up.release()
    time.sleep(300)

up = threading.Semaphore(0)
for _ in range(40):
    threading.Thread(
        target=descends_further_into_a_very_deep_stack, args=(800, up), daemon=True
    ).start()
for _ in range(40):
    up.acquire()
print("up", flush=True)
time.sleep(300)
"""


def test_a_dump_longer_than_a_mib_is_cut_and_says_so(shared_agent, project):
    """A job decides how long its dump is (here about 1.8 MB): the agent reads its first
    MiB, never the whole into its memory, and the user is told that the rest is cut."""
    root = project({"stuck.py": DEEP})
    job = _started(shared_agent, root)
    try:
        shown = shared_agent.cli("stacks", job)
        assert shown.returncode == 0, shown.stderr
        assert "descends_further_into_a_very_deep_stack (stuck.py:5)" in shown.stdout
        assert shown.stdout.rstrip().endswith("(cut: the dump is longer than 1 MiB)")
        assert 900_000 < len(shown.stdout.encode()) < 1_100_000
    finally:
        _cancel(shared_agent, job)


def _vendored(version: str) -> dict[str, str]:
    """A distribution on the job's PYTHONPATH (`vendor/`), as pip would leave its metadata."""
    return {f"vendor/tinypkg-{version}.dist-info/METADATA": f"Name: tinypkg\nVersion: {version}\n"}


def test_diff_names_the_file_the_package_and_the_option_that_changed(shared_agent, project):
    root = project({"train.py": "print('lr', 0.1)\n", **_vendored("1.0")})
    first = shared_agent.cli("run", "-d", "-e", "PYTHONPATH=vendor", "train.py", cwd=root)
    assert first.returncode == 0, first.stderr
    (root / "train.py").write_text("print('lr', 0.01)\n")
    (root / "vendor" / "tinypkg-1.0.dist-info").rename(root / "vendor" / "tinypkg-2.0.dist-info")
    second = shared_agent.cli(
        "run", "-d", "--retries", "1", "-e", "PYTHONPATH=vendor", "train.py", cwd=root
    )
    assert second.returncode == 0, second.stderr
    a, b = first.stdout.strip(), second.stdout.strip()
    with shared_agent.client() as client:
        for job in (a, b):
            assert client.job(job).wait(timeout=60).state == JobState.succeeded
        changed = client.job(a).diff(b)
        record = client.job(b).provenance_json()
    assert changed.files_changed == ["train.py"]
    assert changed.files_added == ["vendor/tinypkg-2.0.dist-info/METADATA"]
    assert changed.files_removed == ["vendor/tinypkg-1.0.dist-info/METADATA"]
    assert [(c.what, c.a, c.b) for c in changed.packages] == [("tinypkg", "1.0", "2.0")]
    assert [(c.what, c.a, c.b) for c in changed.options] == [("retries", "0", "1")]
    assert changed.ran_on == [] and changed.unknown == []
    shown = shared_agent.cli("diff", a, b)
    assert shown.returncode == 0, shown.stderr
    assert "~ train.py" in shown.stdout and "tinypkg: 1.0 → 2.0" in shown.stdout
    assert "retries: 0 → 1" in shown.stdout
    # What the second job ran on, as its interpreter saw it and as the agent did.
    assert record["recorded"] and record["host_recorded"]
    assert record["python"]["version"] == sys.version.split()[0]
    assert record["packages"]["tinypkg"] == "2.0"
    assert record["gpuhop"] == __version__ and record["gpus"] == []
    summary = shared_agent.cli("show", b)
    assert f"{sys.version.split()[0]} on Linux" in summary.stdout, summary.stdout
    assert f"gpuhop {__version__} on" in summary.stdout


def test_diff_with_a_job_that_has_not_started_says_so(shared_agent, project):
    """A queued job ran on nothing yet: the diff says that, not that it ran no Python, and
    lists no "ran on" line of the other job's against "(none)"."""
    root = project({"train.py": "print('trained')\n", "hold.py": "import time\ntime.sleep(300)\n"})
    ran = shared_agent.cli("run", "-q", "-n", "ran-first", "train.py", cwd=root)
    assert ran.returncode == 0, ran.stderr
    held = shared_agent.cli("run", "-d", "hold.py", cwd=root).stdout.strip()
    waiting = shared_agent.cli("run", "-d", "--after", held, "train.py", cwd=root).stdout.strip()
    try:
        shown = shared_agent.cli("diff", "ran-first", waiting)
    finally:
        shared_agent.cli("cancel", "--grace", "0", held, waiting)
    assert shown.returncode == 0, shown.stderr
    assert f"not compared: job {waiting} has not started (queued)" in shown.stdout, shown.stdout
    assert "\nran on\n" not in shown.stdout and "ran no Python" not in shown.stdout


def test_diff_shows_a_command_as_a_shell_takes_it_and_a_missing_option_as_none(
    shared_agent, project
):
    """`python -c 'import sys' 'a b'` is not `python -c import sys a b`, and a job without a
    name has "(none)" for it, as a missing env variable has, not JSON's null."""
    root = project({"train.py": "pass\n"})
    command = ("python", "-c", "import sys")
    named = shared_agent.cli("run", "-d", "-n", "named", *command, "a b", cwd=root).stdout.strip()
    plain = shared_agent.cli("run", "-d", *command, cwd=root).stdout.strip()
    with shared_agent.client() as client:
        for job in (named, plain):
            assert client.job(job).wait(timeout=60).state == JobState.succeeded
    shown = shared_agent.cli("diff", named, plain)
    assert shown.returncode == 0, shown.stderr
    assert "command: python -c 'import sys' 'a b' → python -c 'import sys'\n" in shown.stdout
    assert "name: named → (none)\n" in shown.stdout


def test_show_names_pytorch_and_jax_beside_tensorflow(shared_agent, project):
    # A PyTorch job's summary said `framework  tensorflow 2.21.0` (the agent's Python has it)
    # and nothing of the PyTorch on its PYTHONPATH.
    root = project(
        {
            "train.py": "print('trained')\n",
            "vendor/torch-2.5.1.dist-info/METADATA": "Name: torch\nVersion: 2.5.1\n",
            "vendor/jax-0.4.35.dist-info/METADATA": "Name: jax\nVersion: 0.4.35\n",
        }
    )
    ran = shared_agent.cli("run", "-d", "-e", "PYTHONPATH=vendor", "train.py", cwd=root)
    assert ran.returncode == 0, ran.stderr
    with shared_agent.client() as client:
        assert client.job(ran.stdout.strip()).wait(timeout=60).state == JobState.succeeded
    summary = shared_agent.cli("show", ran.stdout.strip())
    [line] = [line for line in summary.stdout.splitlines() if "framework" in line]
    assert line.endswith("torch 2.5.1; jax 0.4.35"), line
