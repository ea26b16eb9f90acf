"""No memory cgroup of an attempt outlives it: not one cancelled past its grace period (its
processes SIGKILLed, some still in its cgroup when its end is seen), nor a waiting leader's
once the agent stops or is killed, nor one its end could not remove, once the agent starts
again or stops (a real agent). An OOM-killed attempt's: test_queue.py's oom-host test."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.backends.local.cgroups import agent_cgroup
from tests.conftest import wait_until
from tests.integration.test_leader_server import _servers, _spares

pytestmark = pytest.mark.timeout(120)

# Ignores SIGTERM (so a cancel ends it only by SIGKILL), as does a child of its own.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print("ready", flush=True)
time.sleep(600)
"""


def _cgroup(agent, job_id: str) -> Path:
    made = agent.paths.job_dir(job_id) / "cgroup.json"
    if not made.exists():
        pytest.skip("this host lets the agent make no memory cgroup for a job")
    return Path(json.loads(made.read_text())["path"])


def _ours(parent: Path, job_ids: list[str]) -> list[Path]:
    return [p for j in job_ids for p in parent.glob(f"gpuhop-{j}-*")]


def test_no_cgroup_outlives_a_job_killed_past_its_grace(make_agent, project):
    agent = make_agent()
    root = project({"stubborn.py": STUBBORN})
    ids = []
    with agent.client() as client:
        for _ in range(3):  # the leak was a race: give it more than one chance
            job = client.submit(["stubborn.py"], workdir=root, private_network=True)
            ids.append(job.id)
            wait_until(lambda job=job: b"ready" in b"".join(job.logs()), timeout=60)
            cgroup = _cgroup(agent, job.id)
            assert cgroup.is_dir()
            job.cancel(grace=0)
            job.wait(timeout=60)
            assert job.refresh().state == JobState.cancelled, job.info.reason
            assert not cgroup.exists(), "the attempt's cgroup is left behind"
    assert not _ours(cgroup.parent, ids)


def test_spares_and_left_cgroups_go_with_the_agent(make_agent, project):
    """A waiting leader's cgroup goes when the agent stops or is SIGKILLed; an attempt's cgroup
    that its end could not remove (recorded in its job's dir) goes when the agent starts or
    stops; another's, of the same name but not recorded by this agent, stays."""
    found = agent_cgroup()  # the agent's is this process's
    if found is None:
        pytest.skip("this host lets the agent make no memory cgroup for a job")
    parent = found[0]
    agent = make_agent()
    root = project({"quick.py": "print('done')"})
    with agent.client() as client:
        job = client.submit(["quick.py"], workdir=root)
        job.wait(timeout=60)
        assert job.refresh().state == JobState.succeeded, job.info.reason
    cgroup = parent / f"gpuhop-{job.id}-1"
    assert not cgroup.exists()
    [server] = wait_until(lambda: _servers(agent.pid), timeout=30)
    wait_until(lambda: _spares(parent, server), timeout=30)

    # As an end the kernel refused: the cgroup and its record are left behind.
    cgroup.mkdir()
    (agent.paths.job_dir(job.id) / "cgroup.json").write_text(
        json.dumps({"path": str(cgroup), "counter": "cgroup.procs"})
    )
    other = parent / "gpuhop-0ther000-1"  # not this agent's: no record of it
    other.mkdir()
    try:
        os.kill(agent.pid, signal.SIGKILL)
        wait_until(lambda: not _spares(parent, server), timeout=30)
        assert cgroup.is_dir()
        agent.start()
        wait_until(lambda: not cgroup.exists(), timeout=30)  # swept at start
        assert other.is_dir()
        with agent.client() as client:  # the leader server starts with the first job
            client.submit(["quick.py"], workdir=root).wait(timeout=60)
        [server] = wait_until(lambda: _servers(agent.pid), timeout=30)
        wait_until(lambda: _spares(parent, server), timeout=30)
        cgroup.mkdir()  # again, now swept at stop
        (agent.paths.job_dir(job.id) / "cgroup.json").write_text(
            json.dumps({"path": str(cgroup), "counter": "cgroup.procs"})
        )
        agent.shutdown()
        assert not cgroup.exists()
        wait_until(lambda: not _spares(parent, server), timeout=30)
        assert other.is_dir()
    finally:
        other.rmdir()
        if cgroup.exists():
            cgroup.rmdir()
