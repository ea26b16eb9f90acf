"""What every backend promises the agent, run against each (tests/backends/conftest.py): a
job starts, its output reaches the log, its exit code and end class are recorded (a signal's
too), a cancel gives it SIGTERM and then SIGKILL after the grace, a time limit ends it, one
failing worker ends the gang, a job outlives an agent killed with SIGKILL and is re-attached,
and a retry finds the failed attempt's checkpoints.

Plain Python jobs only (no TensorFlow): the scenarios test the backend, not the framework
(Keras in an image: tests/tf/test_image_keras.py). The dirs a test shares with its jobs are
passed as arguments: on Ray the work dirs are on the nodes, which all run on this machine
here; in an image, which shows a job nothing of the host but its own dirs, they are dirs of
the job's work dir (`Target.shared_arg`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpuhop.api import EndClass, JobState
from gpuhop.client.embedded import start_background
from gpuhop.home import read_pid
from tests.conftest import wait_until
from tests.integration.test_agent_restart import WAITER

pytestmark = pytest.mark.timeout(300)

CHATTY = """
import os, signal, sys
print("to stdout", flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(sys.argv[1]))
"""

# Says when SIGTERM comes, and ignores it: only SIGKILL after the grace ends it.
STUBBORN = """
import os, signal, sys, time
sync = sys.argv[1]
os.makedirs(sync, exist_ok=True)
signal.signal(signal.SIGTERM, lambda *_: open(f"{sync}/got-term", "w").close())
with open(f"{sync}/pid.tmp", "w") as f:  # whole, then renamed into place
    f.write(str(os.getpid()))
os.replace(f"{sync}/pid.tmp", f"{sync}/pid")
print("up", flush=True)
while True:
    time.sleep(0.05)
"""

# Worker 1 fails once worker 0 says it works (the file in the shared dir), so the scenario
# does not depend on which worker starts first.
GANG = """
import os, sys, time
sync = sys.argv[1]
os.makedirs(sync, exist_ok=True)
if os.environ["GPUHOP_WORKER_INDEX"] == "1":
    while not os.path.exists(f"{sync}/working"):
        time.sleep(0.05)
    print("giving up", flush=True)
    sys.exit(3)
with open(f"{sync}/pid-0.tmp", "w") as f:  # whole, then renamed into place
    f.write(str(os.getpid()))
os.replace(f"{sync}/pid-0.tmp", f"{sync}/pid-0")
print("working", flush=True)
open(f"{sync}/working", "w").close()
time.sleep(300)
"""

RESUMING = """
import os, sys
checkpoints = os.environ["GPUHOP_CHECKPOINT_DIR"]
if os.environ["GPUHOP_ATTEMPT"] == "1":
    os.makedirs(f"{checkpoints}/sub")
    open(f"{checkpoints}/sub/state", "w").write("epoch 3")
    sys.exit(1)
print("attempt 2 resumes from", open(f"{checkpoints}/sub/state").read())
"""


def running(marker: str) -> bool:
    """Whether any live process on this host has `marker` in its argv. (A job's own pid is
    not the host's: the local backend runs each job in its own PID namespace.)"""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and marker.encode() in argv:
            return True
    return False


def job_lines(log: str) -> list[str]:
    """The job's own lines of a log, without the notes the backend adds (`gpuhop: ...`)."""
    return [line for line in log.splitlines() if not line.startswith("gpuhop: ")]


def kill_agent_hard(agent) -> None:
    os.kill(agent.pid, signal.SIGKILL)
    wait_until(lambda: read_pid(agent.paths) is None, timeout=10)


def restart(agent) -> None:
    agent.pid = start_background(agent.paths, agent_args=agent.args)


def test_output_reaches_the_log_and_the_exit_code_is_recorded(backend, project):
    root = project({"chatty.py": CHATTY})
    with backend.agent.client() as client:
        ok = client.submit(["chatty.py", "0"], workdir=root)
        failing = client.submit(["chatty.py", "3"], workdir=root)
        killing = client.submit(["chatty.py", "kill"], workdir=root)
        done, failed = ok.wait(timeout=120), failing.wait(timeout=120)
        killed = killing.wait(timeout=120)
        log = b"".join(failing.logs()).decode()
    assert (done.state, done.exit_code) == (JobState.succeeded, 0)
    assert done.end_class == EndClass.succeeded
    assert (failed.state, failed.exit_code, failed.signal) == (JobState.failed, 3, None)
    assert failed.reason.startswith("exited with code 3 after ")
    assert failed.end_class == EndClass.app_error
    assert (killed.state, killed.exit_code, killed.signal) == (
        JobState.failed,
        None,
        signal.SIGKILL,
    )
    assert killed.reason.startswith("killed by signal 9 (SIGKILL")
    assert sorted(job_lines(log)) == ["to stderr", "to stdout"]


def test_cancel_sends_sigterm_then_sigkill_after_the_grace(backend, project, tmp_path):
    root = project({"stubborn.py": STUBBORN})
    arg = backend.shared_arg(tmp_path)
    with backend.agent.client() as client:
        job = client.submit(["stubborn.py", arg], workdir=root)
        shared = backend.shared_dir(backend.agent, job.id, tmp_path)
        wait_until(lambda: (shared / "pid").exists(), timeout=120)
        job.cancel(grace=1)
        info = job.wait(timeout=120)
    assert info.state == JobState.cancelled
    assert (shared / "got-term").exists()  # SIGTERM came first, and was ignored
    assert not running(arg)  # then SIGKILL ended it
    backend.settled()


def test_a_time_limit_ends_the_job(backend, project, tmp_path):
    root = project({"waiter.py": WAITER})
    # A release that never comes, named so that no other process's argv holds the name as a
    # word (Podman's own argv holds `--pull never`: it made `running` see the job alive).
    arg = backend.shared_arg(tmp_path / "release-that-never-comes")
    with backend.agent.client() as client:
        job = client.submit(["waiter.py", arg], workdir=root, timeout=2)
        info = job.wait(timeout=120)
        log = b"".join(job.logs()).decode()
    assert (info.state, info.end_class) == (JobState.failed, EndClass.timeout), log
    # Whether it printed first is not asked: the limit counts from the attempt's start, and
    # a cluster's workers may take longer than it to start. No process of it is left.
    assert not running(arg)
    backend.settled()


def test_one_failing_worker_stops_the_gang(backend, project, tmp_path):
    root = project({"gang.py": GANG})
    # On Ray and Slurm, the test clusters' two nodes: a worker on each.
    arg = backend.shared_arg(tmp_path)
    # The minimal image has no Keras: TF_CONFIG for a custom loop's workers, as it asks.
    env = {"TF_USE_LEGACY_KERAS": "0"} if backend.image is not None else {}
    with backend.agent.client() as client:
        job = client.submit(["gang.py", arg], workdir=root, workers=2, env=env)
        info = job.wait(timeout=120)
        worker0 = b"".join(job.logs(worker=0)).decode()
    assert (info.state, info.exit_code) == (JobState.failed, 3), info.reason
    assert info.reason.startswith("worker 1 exited with code 3 first; 1 other worker was stopped")
    assert worker0 == "working\n"
    assert not running(arg)
    backend.settled()


def test_a_running_job_survives_an_agent_sigkill(backend, own_agent, project, tmp_path):
    agent = own_agent()
    root = project({"waiter.py": WAITER})
    release = tmp_path / "release"
    with agent.client() as client:
        job = client.submit(["waiter.py", backend.shared_arg(release)], workdir=root)
        release = backend.shared_dir(agent, job.id, release)
        wait_until(lambda: b"waiting" in b"".join(job.logs()), timeout=120)
    kill_agent_hard(agent)
    restart(agent)
    with agent.client() as client:
        # Re-attached, not lost. (On Slurm the state moves from `starting` to `running` when
        # the agent sees that Slurm runs the job, which a killed agent may not have yet.)
        wait_until(lambda: client.job(job.id).state == JobState.running, timeout=30)
        job = client.job(job.id)
        release.touch()
        info = job.wait(timeout=60)
        log = b"".join(job.logs()).decode()
    assert (info.state, info.exit_code) == (JobState.failed, 5)
    assert job_lines(log) == ["waiting", "released"]


def test_a_job_that_ended_while_the_agent_was_down_is_recorded(
    backend, own_agent, project, tmp_path
):
    agent = own_agent()
    root = project({"waiter.py": WAITER})
    release = tmp_path / "release"
    with agent.client() as client:
        job = client.submit(["waiter.py", backend.shared_arg(release)], workdir=root)
        release = backend.shared_dir(agent, job.id, release)
        wait_until(lambda: b"waiting" in b"".join(job.logs()), timeout=120)
    kill_agent_hard(agent)
    release.touch()
    wait_until((agent.paths.job_dir(job.id) / "status.json").exists, timeout=60)
    restart(agent)
    with agent.client() as client:
        info = client.job(job.id).wait(timeout=60)
    assert (info.state, info.exit_code) == (JobState.failed, 5)


def test_a_retry_resumes_from_the_checkpoints_of_the_failed_attempt(backend, project):
    root = project({"resume.py": RESUMING})
    with backend.agent.client() as client:
        # An exit code is the job's own failure: retried only when asked for.
        job = client.submit(["resume.py"], workdir=root, retries=1, retry_on="any")
        info = job.wait(timeout=120)
        log = b"".join(job.logs()).decode()
    assert (info.state, info.attempt) == (JobState.succeeded, 2)
    assert [(a.attempt, a.state, a.exit_code) for a in info.attempts] == [(1, JobState.failed, 1)]
    assert "gpuhop: attempt 1 failed: exited with code 1" in log
    assert "attempt 2 resumes from epoch 3" in log
