"""Fault injection beyond test_agent_restart.py: a crash between allocation and start, a
stopped (SIGSTOP) job and agent, and clients that hang up mid-stream. Each test ends by
checking that nothing was lost or duplicated."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time

import httpx

from gpuhop.api import EndClass, JobState
from gpuhop.client.embedded import start_background
from tests.conftest import AGENT_PYTHON_FLAGS, wait_until
from tests.integration.test_agent_restart import WAITER, kill_agent_hard
from tests.integration.test_queue import SLEEPER

COUNTER = """
import os, sys, time
i = 0
while not os.path.exists(sys.argv[1]):
    print(f"line {i}", flush=True); i += 1; time.sleep(0.005)
print("done", flush=True)
"""


def lines_are_whole_and_in_order(log: bytes) -> None:
    lines = log.decode().splitlines()
    assert lines[-1] == "done"
    assert lines[:-1] == [f"line {i}" for i in range(len(lines) - 1)]


def test_a_crash_between_allocation_and_start_starts_the_job_once(make_agent, project, tmp_path):
    agent = make_agent(fake_gpus=1)
    release = tmp_path / "release"
    with agent.client() as client:
        holder = client.submit(
            ["waiter.py", str(release)], workdir=project({"waiter.py": WAITER}), gpus=1
        )
        once = client.submit(
            ["once.py", str(tmp_path / "runs")],
            workdir=project({"once.py": "import sys\nopen(sys.argv[1], 'a').write('ran\\n')\n"}),
            gpus=1,
        )
        assert once.refresh().state == JobState.queued
        wait_until(lambda: holder.refresh().state == JobState.running, timeout=30)
    kill_agent_hard(agent)
    release.touch()
    # The state a crash leaves right after the scheduler's transaction: `starting`, GPU
    # allocated, no process yet.
    db = sqlite3.connect(agent.paths.db)
    with db:
        db.execute("UPDATE jobs SET state = 'starting', gpu_ids = '[0]' WHERE id = ?", (once.id,))
    db.close()
    agent.pid = start_background(agent.paths, fake_gpus=1, python_flags=AGENT_PYTHON_FLAGS)
    with agent.client() as client:
        info = client.job(once.id).wait(30)
        assert client.job(holder.id).wait(30).exit_code == 5
    assert (info.state, info.attempt) == (JobState.succeeded, 1)
    assert (tmp_path / "runs").read_text() == "ran\n"


def restart_as_if_crashed_mid_start(agent, job_id: str) -> None:
    """Start the (killed) agent again on the state a crash between a job's start and its
    record leaves: `starting`, the leader running (or not), no pid recorded."""
    db = sqlite3.connect(agent.paths.db)
    with db:
        db.execute(
            "UPDATE jobs SET state = 'starting', pid = NULL, pid_start = NULL,"
            " started_at = NULL WHERE id = ?",
            (job_id,),
        )
    db.close()
    agent.pid = start_background(agent.paths, python_flags=AGENT_PYTHON_FLAGS)


def test_a_crash_between_a_start_and_its_record_keeps_the_start_time_and_the_limit(
    make_agent, project
):
    """The agent killed after the job's leader started, before the store recorded it: the
    next agent adopts the job from the leader's pid file, and its start time with it. (It
    had none: a --timeout never stopped such a job, and its duration read 0.0s.)"""
    agent = make_agent()
    with agent.client() as client:
        slow = client.submit(["sleeper.py"], workdir=project({"sleeper.py": SLEEPER}), timeout="3s")
        wait_until(lambda: b"up" in b"".join(slow.logs()), timeout=30)
    killed_at = time.time()
    kill_agent_hard(agent)
    restart_as_if_crashed_mid_start(agent, slow.id)
    with agent.client() as client:
        timed = client.job(slow.id).wait(60)
    assert (timed.state, timed.end_class) == (JobState.failed, EndClass.timeout)
    assert timed.started_at is not None and timed.started_at.timestamp() < killed_at


def test_a_process_that_took_a_dead_leaders_pid_is_not_adopted(make_agent, project):
    """The same crash, and the leader then gone while no agent ran, its pid taken by another
    process: the next agent must not take that process for the job's (it waited on it, and
    a cancel signalled its group). The leader's pid file has its start time for this."""
    agent = make_agent()
    with agent.client() as client:
        slow = client.submit(["sleeper.py"], workdir=project({"sleeper.py": SLEEPER}))
        wait_until(lambda: b"up" in b"".join(slow.logs()), timeout=30)
    kill_agent_hard(agent)
    pid_file = agent.home / "jobs" / slow.id / "shim.pid"
    leader = json.loads(pid_file.read_text())
    os.killpg(int(leader["pid"]), signal.SIGKILL)
    wait_until(lambda: not os.path.exists(f"/proc/{leader['pid']}"), timeout=30)
    # Another process under the leader's pid: pids are not chosen, so the record says so.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        pid_file.write_text(json.dumps({**leader, "pid": stranger.pid}))
        restart_as_if_crashed_mid_start(agent, slow.id)
        with agent.client() as client:
            ended = client.job(slow.id).wait(60)
        assert ended.state == JobState.lost, ended.reason
        assert stranger.poll() is None  # neither waited on nor signalled
    finally:
        stranger.kill()
        stranger.wait()


def test_a_stopped_job_is_still_running_and_cancel_reaches_it(make_agent, project, tmp_path):
    agent = make_agent()
    release = tmp_path / "release"
    with agent.client() as client:
        job = client.submit(["counter.py", str(release)], workdir=project({"counter.py": COUNTER}))
        wait_until(lambda: b"line 5" in b"".join(job.logs()), timeout=30)
        leader = json.loads((agent.home / "jobs" / job.id / "shim.pid").read_text())
        pgid = int(leader["pid"])  # the leader leads the job's process group
        os.killpg(pgid, signal.SIGSTOP)
        size = len(b"".join(job.logs()))
        assert client.jobs()[0].state == JobState.running  # the agent still answers
        job.cancel(grace=0.5)  # SIGTERM waits on a stopped process; SIGKILL does not
        info = job.wait(30)
        log = b"".join(job.logs())
    assert info.state == JobState.cancelled and "killed after the grace period" in info.reason
    assert len(log) >= size
    # Every line the job wrote is there, in order; the last may have been cut by the kill.
    lines = log.decode().splitlines()
    assert lines[:-1] == [f"line {i}" for i in range(len(lines) - 1)]


def test_a_stopped_agent_loses_nothing_once_it_goes_on(make_agent, project, tmp_path):
    agent = make_agent()
    release = tmp_path / "release"
    received: list[bytes] = []
    with agent.client() as client:
        job = client.submit(["counter.py", str(release)], workdir=project({"counter.py": COUNTER}))
        follower = threading.Thread(
            target=lambda: received.extend(job.logs(follow=True)), daemon=True
        )
        follower.start()
        wait_until(lambda: len(received) > 5, timeout=30)
        on_disk = agent.home / "jobs" / job.id / "output.log"
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            size = on_disk.stat().st_size
            wait_until(lambda: on_disk.stat().st_size > size + 1000, timeout=30)  # job goes on
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        release.touch()
        follower.join(timeout=60)
        assert not follower.is_alive()
        assert job.wait(30).state == JobState.succeeded
    assert b"".join(received) == on_disk.read_bytes()
    lines_are_whole_and_in_order(on_disk.read_bytes())


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_clients_that_hang_up_mid_stream_leave_nothing_open(make_agent, project, tmp_path):
    agent = make_agent()
    release = tmp_path / "release"
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    with agent.client() as client:
        job = client.submit(["counter.py", str(release)], workdir=project({"counter.py": COUNTER}))
        wait_until(lambda: b"line 50" in b"".join(job.logs()), timeout=30)
        baseline = open_fds(agent.pid)
        got = b""
        for _ in range(20):
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(agent.paths.socket))) as http:
                url = f"http://agent/v1/jobs/{job.id}/log"
                params = {"follow": "true", "offset": len(got)}
                with http.stream("GET", url, params=params) as response:
                    for chunk in response.iter_raw():
                        got += chunk
                        break  # hang up after the first chunk, mid-stream
        # Each hang-up closed the agent's side too: no file or socket is left open.
        wait_until(lambda: open_fds(agent.pid) <= baseline, timeout=30)
        release.touch()
        job.wait(30)
        rest = b"".join(job.logs(offset=len(got)))
    transport.close()
    log = (agent.home / "jobs" / job.id / "output.log").read_bytes()
    assert got + rest == log
    lines_are_whole_and_in_order(log)
