"""Every process a job starts ends with it, and its GPUs are free only once they have: a
child that calls setsid() is no escape, and a cancel's SIGKILL comes even if the agent was
killed and started again within the grace period."""

from __future__ import annotations

import os
import signal

from gpuhop.api import JobState
from gpuhop.client.embedded import start_background
from gpuhop.home import read_pid
from tests.backends.test_contract import STUBBORN, running
from tests.conftest import AGENT_PYTHON_FLAGS, wait_until

# The job starts a child in a session of its own (as a daemonising library would), which
# runs on with the marker in its argv; the parent then waits, or exits at once.
DAEMONISING = """
import os, subprocess, sys, time
marker = sys.argv[1]
sleeper = [sys.executable, "-c", "import time; time.sleep(600)", marker]
subprocess.Popen(sleeper, start_new_session=True)
if os.fork() == 0:  # and a double fork, as a daemon does it
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, sleeper)
    os._exit(0)
print("daemon started", flush=True)
if sys.argv[2] == "wait":
    time.sleep(600)
"""


def test_a_setsid_child_ends_with_its_job_and_holds_no_gpu_after(make_agent, project, tmp_path):
    agent = make_agent(fake_gpus=1)
    root = project({"daemon.py": DAEMONISING})
    marker = f"gpuhop-test-daemon-{tmp_path.name}"
    with agent.client() as client:
        # The parent exits at once: the job succeeds, and its daemons are gone already
        # when it is recorded as ended, before its GPU goes to the next job.
        job = client.submit(["daemon.py", marker, "exit"], workdir=root, gpus=1)
        assert job.wait(60).state == JobState.succeeded
        assert not running(marker)
        # Cancelled while the parent waits: the same.
        job = client.submit(["daemon.py", marker, "wait"], workdir=root, gpus=1)
        wait_until(lambda: b"daemon started" in b"".join(job.logs()), 60)
        assert running(marker)
        job.cancel(grace=2)
        assert job.wait(60).state == JobState.cancelled
        assert not running(marker)


def test_a_cancelled_job_gets_its_sigkill_after_an_agent_restart(make_agent, project, tmp_path):
    agent = make_agent()
    root = project({"stubborn.py": STUBBORN})
    with agent.client() as client:
        job = client.submit(["stubborn.py", str(tmp_path)], workdir=root)
        wait_until(lambda: (tmp_path / "pid").exists(), 60)
        job.cancel(grace=3)
        wait_until(lambda: (tmp_path / "got-term").exists(), 30)
    os.kill(agent.pid, signal.SIGKILL)  # within the grace period
    wait_until(lambda: read_pid(agent.paths) is None, 10)
    agent.pid = start_background(
        agent.paths, agent_args=agent.args, python_flags=AGENT_PYTHON_FLAGS
    )
    with agent.client() as client:
        info = client.job(job.id).wait(60)
    assert info.state == JobState.cancelled
    assert info.reason.endswith("(killed after the grace period)")
    assert not running(str(tmp_path))
