"""Jobs outlive their agent: kill the agent hard, start it again, nothing is lost.

The scenarios every backend shares (a running job re-attached after an agent SIGKILL, a
job that ended meanwhile recorded) are in tests/backends/test_contract.py."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from gpuhop.client.embedded import start_background
from gpuhop.home import AgentError, AgentPaths, read_pid
from tests.conftest import AGENT_PYTHON_FLAGS, wait_until

WAITER = """
import os, sys, time
print("waiting", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("released", flush=True)
sys.exit(5)
"""


def kill_agent_hard(agent) -> None:
    os.kill(agent.pid, signal.SIGKILL)
    wait_until(lambda: read_pid(agent.paths) is None, timeout=10)


def test_queued_jobs_start_after_a_restart_and_gpus_stay_single_owner(
    make_agent, project, tmp_path
):
    agent = make_agent(fake_gpus=1)
    root = project({"waiter.py": WAITER})
    release = tmp_path / "release"
    agent.paths.fake_gpus_seam.write_text('{"0": {"energy_mj": 1000}}')  # the GPU's counter
    with agent.client() as client:
        first = client.submit(["waiter.py", str(release)], workdir=root, gpus=1)
        second = client.submit(["waiter.py", str(release)], workdir=root, gpus=1)
        wait_until(lambda: first.refresh().state == JobState.running, timeout=30)
        assert second.refresh().state == JobState.queued
    kill_agent_hard(agent)
    # While no agent watches, the job uses 40 J; the next one counts them from the readings
    # its job's file kept.
    agent.paths.fake_gpus_seam.write_text('{"0": {"energy_mj": 41000}}')
    agent.pid = start_background(agent.paths, fake_gpus=1, python_flags=AGENT_PYTHON_FLAGS)
    with agent.client() as client:
        assert client.job(first.id).state == JobState.running
        assert client.job(second.id).state == JobState.queued
        assert [g.job_ids for g in client.info().gpus] == [[first.id]]
        release.touch()
        a = client.job(first.id).wait(30)
        b = client.job(second.id).wait(30)
    assert a.exit_code == b.exit_code == 5
    assert b.started_at >= a.ended_at
    assert a.energy is not None and b.energy is not None
    assert (a.energy.joules, b.energy.joules) == (40.0, 0.0)


def test_log_follower_resumes_across_an_agent_restart(make_agent, project, tmp_path):
    agent = make_agent()
    release = tmp_path / "release"
    root = project(
        {
            "chatty.py": "import os, sys, time\n"
            "i = 0\n"
            "while not os.path.exists(sys.argv[1]):\n"
            "    print(f'line {i}', flush=True); i += 1; time.sleep(0.002)\n"
            "print('done', flush=True)\n"
        }
    )
    received: list[bytes] = []
    with agent.client() as client:
        job = client.submit(["chatty.py", str(release)], workdir=root)
        follower = threading.Thread(
            target=lambda: received.extend(job.logs(follow=True)), daemon=True
        )
        follower.start()
        wait_until(lambda: len(received) > 5, timeout=30)
        kill_agent_hard(agent)
        agent.pid = start_background(agent.paths, python_flags=AGENT_PYTHON_FLAGS)
        wait_until(lambda: len(received) > 20, timeout=30)
        release.touch()
        follower.join(timeout=60)
        assert not follower.is_alive()
        on_disk = Path(agent.home / "jobs" / job.id / "output.log").read_bytes()
    assert b"".join(received) == on_disk
    assert on_disk.endswith(b"done\n")


def test_a_pull_cut_short_by_the_agent_dying_says_so_and_the_next_one_is_whole(
    make_agent, project, tmp_path
):
    """An agent killed while a pull downloads a 32 MiB artifact: the pull fails with
    gpuhop's own error (it was a TransportError, which the CLI showed as a traceback) and
    leaves no part file; once the agent is back, the next pull brings the file whole."""
    agent = make_agent()
    model = bytes(range(256)) * (128 * 1024)
    root = project(
        {
            "export.py": "import os\n"
            "with open(os.path.join(os.environ['GPUHOP_ARTIFACTS_DIR'], 'model.bin'), 'wb') as f:\n"
            "    f.write(bytes(range(256)) * (128 * 1024))\n"
        }
    )
    dest = tmp_path / "out"

    def die(done: int, total: int) -> None:
        if read_pid(agent.paths) is not None:  # the first bytes came: the rest never will
            kill_agent_hard(agent)

    with agent.client() as client:
        job = client.submit(["export.py"], workdir=root)
        assert job.wait(60).state == JobState.succeeded
        with pytest.raises(GpuhopError, match="closed the connection"):
            job.pull(dest, on_bytes=die)
    assert [p.name for p in dest.rglob("*.gpuhop-part")] == []
    agent.pid = start_background(agent.paths, python_flags=AGENT_PYTHON_FLAGS)
    with agent.client() as client:
        client.job(job.id).pull(dest)
    assert (dest / "model.bin").read_bytes() == model


def _agents_of(home: Path) -> list[int]:
    """The pids of agent processes of the state dir `home` (from their command lines)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # not a process, or gone
        if b"gpuhop.agent" in argv and str(home).encode() in argv:
            pids.append(int(entry.name))
    return pids


def test_an_agent_a_start_gives_up_on_is_stopped_not_left_to_come_up(tmp_path: Path):
    """A start that gives up waiting (here after 10 ms, sooner than any agent answers) says
    so and stops the agent it started: none comes up after the command said it failed, to
    hold the state dir's lock or run queued jobs unasked."""
    paths = AgentPaths(tmp_path / "home")
    try:
        with pytest.raises(AgentError, match=r"did not answer within 0\.01s \(it was stopped\)"):
            start_background(paths, timeout=0.01, python_flags=AGENT_PYTHON_FLAGS)
        wait_until(lambda: not _agents_of(paths.home), timeout=30)
        assert read_pid(paths) is None
    finally:  # where it was left running (the test failed), it goes
        for pid in _agents_of(paths.home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
