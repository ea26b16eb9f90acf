"""An agent whose state dir is full (issue 19): a small tmpfs of its own as the state dir.
Requests answer 507 with a clear message, never 500; a job that ends meanwhile is recorded
as ended once space returns; an upload that fills the disk leaves none of its blobs."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuhop.api import JobState
from gpuhop.api.framing import FRAME_HEADER
from gpuhop.backends.leader import read_json
from gpuhop.backends.procs import alive
from gpuhop.client import GpuhopError
from tests.conftest import Agent, wait_until
from tests.integration.test_agent_restart import WAITER

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_agent(tmp_path: Path) -> Iterator[Agent]:
    """An agent whose state dir is an 8 MiB tmpfs, unmounted at the end."""
    state = tmp_path / "state"
    state.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(state)],
        capture_output=True,
    )
    if made.returncode != 0 or not state.is_mount():
        # Unmounted, the agent's state dir is on the real disk: the tests would fill it.
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    agent = Agent(state / "home", tmp_path / "cache", None)
    try:
        yield agent.start()
    finally:
        agent.shutdown()
        # A job whose leader had not yet written its pid file: found by its working dir.
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError):
                if Path(os.readlink(proc / "cwd")).is_relative_to(state):
                    os.kill(int(proc.name), signal.SIGKILL)
        wait_until(lambda: subprocess.run(["umount", str(state)]).returncode == 0, timeout=10)


def fill(where: Path, leave: int = 0) -> Path:
    """Fill the filesystem of `where` up to `leave` bytes free; return the filler file."""
    filler = where / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        while True:
            st = os.statvfs(where)
            room = st.f_bavail * st.f_frsize - leave
            if room <= 0:
                break
            f.write(b"\0" * min(room, 1 << 16))
            f.flush()
    return filler


def raw_http(agent: Agent) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    return httpx.Client(transport=transport, base_url="http://agent", timeout=30)


def test_a_full_disk_answers_507_and_a_job_that_ends_is_recorded(small_agent, project, tmp_path):
    agent = small_agent
    release = tmp_path / "release"
    with agent.client() as client, raw_http(agent) as http:
        job = client.submit(["waiter.py", str(release)], workdir=project({"waiter.py": WAITER}))
        wait_until(lambda: job.refresh().state == JobState.running, timeout=30)
        leader = wait_until(lambda: read_json(agent.paths.job_dir(job.id) / "shim.pid"))
        filler = fill(agent.home)
        r = http.post("/v1/jobs", json={"command": ["sleep", "1"], "env": {"A": "x" * 4096}})
        assert r.status_code == 507, r.text
        assert "disk is full" in r.json()["message"]
        release.touch()  # the job ends while nothing can be recorded
        wait_until(lambda: not alive(int(leader["pid"]), None), timeout=30)
        assert job.refresh().state == JobState.running  # not recorded yet: no room
        filler.unlink()
        info = job.wait(60)
    assert info.state.finished


def test_an_upload_that_fills_the_disk_leaves_none_of_its_blobs(small_agent):
    agent = small_agent
    with agent.client() as client:
        assert client.info().version
    blobs = [os.urandom(1 << 20) for _ in range(6)]
    body = b"".join(FRAME_HEADER.pack(hashlib.sha256(b).digest(), len(b)) + b for b in blobs)
    fill(agent.home, leave=3 << 20)
    with raw_http(agent) as http:
        r = http.post("/v1/blobs/upload", content=body)
        assert r.status_code == 507, r.text
        assert "disk is full" in r.json()["message"]
    assert [p for p in agent.paths.blobs.rglob("*") if p.is_file()] == []


def test_a_dataset_push_that_fills_the_disk_is_refused_whole_and_goes_once_room_returns(
    small_agent, tmp_path
):
    agent = small_agent
    tree = tmp_path / "ds"
    tree.mkdir()
    (tree / "big.bin").write_bytes(os.urandom(5 << 20))  # a file of several chunks: a run
    (tree / "small.txt").write_text("small")
    with agent.client() as client:
        assert client.info().version
        filler = fill(agent.home, leave=3 << 20)
        with pytest.raises(GpuhopError, match="disk is full"):
            client.data.push(tree, "too-big")
        # Nothing of it stays: no version, and the run's chunks are gone with the room.
        staged = agent.home / "blobs" / ".staged"
        assert [p for p in staged.rglob("*") if p.is_file()] == []
        with pytest.raises(GpuhopError, match="no dataset"):
            client.data.versions("too-big")
        filler.unlink()
        pushed = client.data.push(tree, "too-big")
    assert pushed.info.version == 1
    stored = agent.home / "datasets" / "too-big" / "v1"
    assert (stored / "big.bin").read_bytes() == (tree / "big.bin").read_bytes()
