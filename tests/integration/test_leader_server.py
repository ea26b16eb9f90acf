"""The local backend starts each job's leader by a fork of its warm leader server: the leader is
what one started by the agent would be (its own session, its log as output, the job's
environment), a server that dies is replaced at the next job while the jobs it started are
still watched to their end, and the server ends with the agent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhop.api import JobState
from tests.conftest import wait_until

WAITING = """
import os, time
print("job", os.environ["GPUHOP_JOB_ID"], flush=True)
go = os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "go")
while not os.path.exists(go):
    time.sleep(0.02)
print("went", flush=True)
"""


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (state is [0], ppid [1])."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _servers(agent_pid: int) -> list[int]:
    """The leader servers the agent started: its children running leaderserver.py."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = _stat(int(pid))
        except (OSError, IndexError):
            continue
        if int(stat[1]) == agent_pid and b"leaderserver.py" in argv and stat[0] != "Z":
            found.append(int(pid))
    return found


def _leader_pid(agent, job_id: str) -> int:
    path = agent.paths.job_dir(job_id) / "shim.pid"
    wait_until(path.exists, timeout=30)
    return int(json.loads(path.read_text())["pid"])


def test_a_jobs_leader_is_forked_by_the_server_and_outlives_it(make_agent, project):
    agent = make_agent()
    root = project({"wait.py": WAITING})
    with agent.client() as client:
        job = client.submit(["wait.py"], workdir=root)
        leader = _leader_pid(agent, job.id)
        [server] = wait_until(lambda: _servers(agent.pid), timeout=30)
        # The leader leads a session of its own, as one the agent started would.
        assert int(_stat(leader)[1]) == server
        assert os.getsid(leader) == leader
        # Its request (the job's environment) went through a file the leader read and removed.
        assert not (agent.paths.job_dir(job.id) / "shim-request.json").exists()
        wait_until(lambda: b"job" in b"".join(job.logs()), timeout=30)

        os.kill(server, signal.SIGKILL)  # the running job is watched on without it
        wait_until(lambda: not _servers(agent.pid) or _servers(agent.pid) != [server])
        (agent.paths.job_dir(job.id) / "artifacts" / "go").touch()
        job.wait(timeout=60)
        assert job.refresh().state == JobState.succeeded, job.info.reason
        assert b"".join(job.logs()).decode().splitlines() == [f"job {job.id}", "went"]

        # The next job gets a new server.
        again = client.submit(["python", "-c", "print('again')"], workdir=root)
        again.wait(timeout=60)
        assert again.refresh().state == JobState.succeeded, again.info.reason
        assert b"".join(again.logs()) == b"again\n"
        [new_server] = _servers(agent.pid)
        assert new_server != server

    agent.shutdown()
    wait_until(lambda: not Path(f"/proc/{new_server}").exists() or _stat(new_server)[0] == "Z")


def _spares(parent: Path, server: int) -> list[Path]:
    return sorted(parent.glob(f"gpuhop-spare-{server}-*"))


def test_a_waiting_leader_takes_the_job_into_the_attempts_cgroup(make_agent, project):
    """The server forks each leader before its job comes, in a cgroup of its own: the job's
    request renames that cgroup to the attempt's (or the leader joins the attempt's), so every
    process of the job is in it. A waiting leader that dies is replaced; none, nor its cgroup,
    outlives the agent."""
    agent = make_agent()
    root = project({"wait.py": WAITING})
    with agent.client() as client:
        job = client.submit(["wait.py"], workdir=root)
        leader = _leader_pid(agent, job.id)
        wait_until(lambda: b"job" in b"".join(job.logs()), timeout=30)
        made = agent.paths.job_dir(job.id) / "cgroup.json"
        if not made.exists():
            (agent.paths.job_dir(job.id) / "artifacts" / "go").touch()
            job.wait(timeout=60)
            pytest.skip("this host lets the agent make no memory cgroup for a job")
        cgroup = Path(json.loads(made.read_text())["path"])
        # The leader, the sandbox's first process and the job's own: all in the attempt's.
        procs = {int(p) for p in (cgroup / "cgroup.procs").read_text().split()}
        assert leader in procs and len(procs) >= 2, procs
        [server] = _servers(agent.pid)
        # The server makes the spare's cgroup, then forks the spare, which joins it.
        [spare_cgroup] = wait_until(lambda: _spares(cgroup.parent, server), timeout=30)
        [spare] = wait_until(
            lambda: [int(p) for p in (spare_cgroup / "cgroup.procs").read_text().split()],
            timeout=30,
        )
        assert int(_stat(spare)[1]) == server and os.getsid(spare) == spare
        (agent.paths.job_dir(job.id) / "artifacts" / "go").touch()
        job.wait(timeout=60)
        assert job.refresh().state == JobState.succeeded, job.info.reason
        assert not cgroup.exists()  # removed with the attempt

        os.kill(spare, signal.SIGKILL)  # the next job is forked by the server itself
        wait_until(lambda: not spare_cgroup.exists(), timeout=30)
        again = client.submit(["python", "-c", "print('again')"], workdir=root)
        again.wait(timeout=60)
        assert again.refresh().state == JobState.succeeded, again.info.reason
        assert b"".join(again.logs()) == b"again\n"
        assert wait_until(lambda: _spares(cgroup.parent, server), timeout=30)

    agent.shutdown()
    wait_until(lambda: not _spares(cgroup.parent, server), timeout=30)


def test_each_leader_leads_its_session_by_the_time_its_pid_is_answered(tmp_path):
    """The agent signals a job's process group (a cancel) as soon as it has the leader's pid:
    the server answers only once that group exists, for leaders asked for faster than it
    forks spares too (a pid answered before the child's `setsid` once let a cancel with no
    grace reach nothing, and the job ran on)."""
    from gpuhop.backends.local.forkserver import SERVER

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = subprocess.Popen(
        [sys.executable, "-I", "-S", SERVER, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        start_new_session=True,
    )
    theirs.close()
    leaders: list[int] = []
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for n in range(6):  # back to back: the first takes the spare, the rest are forked
            request = tmp_path / f"request-{n}"
            os.mkfifo(request)  # the leader blocks opening it, in its own session by then
            message = json.dumps({"request": str(request), "cgroup": None}).encode()
            socket.send_fds(ours, [message], [log])
            answer = json.loads(ours.recv(1 << 16))
            leaders.append(answer["pid"])
            assert os.getpgid(answer["pid"]) == answer["pid"], n
            assert os.getsid(answer["pid"]) == answer["pid"], n
    finally:
        os.close(log)
        for pid in leaders:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        ours.close()  # the server ends when the agent's end closes
        server.wait(timeout=30)
