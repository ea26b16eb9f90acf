"""A job's leader started by a fresh interpreter, where the agent's warm leader server could
not start it (LocalBackend.leader; a real leader, a real job): the job gets its variables,
and the leader's interpreter and its cgroup shell have none of them. They run as root on a
team agent, where a user's LD_PRELOAD in their environment ran the user's code as root."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuhop.api.spec import JobSpec
from gpuhop.backends.base import Attempt, GpuHost
from gpuhop.backends.leader import LeaderBackend
from gpuhop.backends.local.backend import LocalBackend
from gpuhop.home import AgentPaths, JobPaths
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)

JOB = """
import os, sys, time
print("job sees", os.environ.get("MY_TEXT"), os.environ.get("LD_PRELOAD"), flush=True)
while not os.path.exists("release"):
    time.sleep(0.05)
"""
VARIABLES = {"MY_TEXT": "a b=c", "LD_PRELOAD": "/nonexistent/gpuhop-test-preload.so"}


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(): v.decode(errors="replace") for k, _, v in pairs}


def test_a_leader_started_afresh_holds_none_of_the_jobs_variables(tmp_path):
    paths = AgentPaths(tmp_path / "home")
    paths.ensure()
    backend = LocalBackend(paths, GpuHost("none"), sys.executable)
    try:
        jp = JobPaths(paths.job_dir("ab12cd34"))
        jp.work.mkdir(parents=True)
        (jp.work / "job.py").write_text(JOB)
        attempt = Attempt("ab12cd34", 1, ["job.py"], [], JobSpec(env=VARIABLES))
        started = LeaderBackend.start(backend, attempt, jp, {})  # not through the server
        wait_until(lambda: b"job sees" in jp.log.read_bytes(), timeout=60)
        leader_env = environ(started.pid)
        (jp.work / "release").touch()
        end = backend.wait(jp, started)
    finally:
        backend.close()
    log = jp.log.read_text()
    assert "job sees a b=c /nonexistent/gpuhop-test-preload.so" in log, log
    assert end.exit_code == 0, (end, log)
    assert not set(leader_env) & set(VARIABLES), leader_env
    assert not (jp.root / "shim-request.json").exists()  # read, and removed, by the leader
