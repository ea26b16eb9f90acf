"""Disk quotas, the log cap and a full disk, on a real agent: a clear 507 or a clear reason,
and nothing else harmed."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from tests.conftest import wait_until
from tests.integration.test_agent_restart import WAITER

NO_GC = ("--gc-every-hours", "0")


def test_an_upload_over_the_storage_quota_gets_507_with_the_figures(make_agent, project):
    agent = make_agent(args=(*NO_GC, "--storage-quota", "64KiB"))
    with agent.client() as client:
        big = project({"big.py": "x = 1\n", "weights.bin": "w" * 200_000})
        with pytest.raises(GpuhopError) as e:
            client.submit(["big.py"], workdir=big)
        assert e.value.status == 507 and e.value.code == "insufficient_storage"
        assert "storage quota" in e.value.message and "64.0 KiB" in e.value.message
        (big / "weights.bin").unlink()
        assert client.submit(["big.py"], workdir=big).wait(30).state == JobState.succeeded


def test_a_dataset_push_over_the_storage_quota_is_refused(make_agent, tmp_path):
    agent = make_agent(args=(*NO_GC, "--storage-quota", "3MiB"))
    root = tmp_path / "ds"
    root.mkdir()
    (root / "a.bin").write_bytes(os.urandom(4 * 1024 * 1024))
    with agent.client() as client, pytest.raises(GpuhopError) as e:
        client.data.push(root, name="ds")
    assert e.value.status == 507 and "3.0 MiB" in e.value.message
    with agent.client() as client:
        assert client.data.list() == []


def test_a_small_upload_over_the_quota_gets_507_not_500(make_agent, tmp_path):
    # A body that has all arrived when the quota refuses it (small, or on a loaded host)
    # once made the agent answer 500: it tried to read the rest of a body already read.
    agent = make_agent(args=(*NO_GC, "--storage-quota", "1KiB"))
    root = tmp_path / "small"
    root.mkdir()
    (root / "a.bin").write_bytes(os.urandom(8 * 1024))
    for _ in range(3):
        with agent.client() as client, pytest.raises(GpuhopError) as e:
            client.data.push(root, name="small")
        assert e.value.status == 507, e.value.message


def test_a_submission_over_the_jobs_quota_is_refused(make_agent, project):
    agent = make_agent(args=(*NO_GC, "--jobs-quota", "40KiB"))
    with agent.client() as client:
        root = project({"chat.py": "print('x' * 60_000)\n"})
        assert client.submit(["chat.py"], workdir=root).wait(30).state == JobState.succeeded

        def refused() -> GpuhopError | None:
            try:
                client.submit(["chat.py"], workdir=root)
            except GpuhopError as e:
                return e
            return None

        # Usage is measured every few seconds: the refusal comes once the log is counted.
        error = wait_until(refused, timeout=30, interval=0.5)
        assert error.status == 507 and "jobs quota" in error.message


def test_a_job_whose_log_passes_the_cap_fails_saying_so(make_agent, project, tmp_path):
    agent = make_agent(args=(*NO_GC, "--log-cap", "100KiB"))
    release = tmp_path / "release"
    with agent.client() as client:
        quiet = client.submit(["waiter.py", str(release)], workdir=project({"waiter.py": WAITER}))
        chatty = client.submit(
            ["chat.py"],
            workdir=project({"chat.py": "while True:\n    print('y' * 1000)\n"}),
            retries=2,
        )
        info = chatty.wait(60)
        assert info.state == JobState.failed and info.attempt == 1  # not retried
        assert "log passed the agent's cap of 100.0 KiB" in info.reason
        assert quiet.refresh().state == JobState.running
        release.touch()
        assert quiet.wait(30).exit_code == 5


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (needs root and mount); skipped where it cannot be made."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


FILLER = """
import errno
import os
with open(os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "fill.bin"), "wb") as f:
    while True:
        f.write(b"0" * 65536)
        f.flush()
"""


def _fill(path: Path) -> None:
    """Append to `path` until its disk is full."""
    try:
        with open(path, "ab", buffering=0) as f:
            while True:
                f.write(b"0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC, e


def test_a_disk_that_fills_fails_that_job_only(make_agent, project, tmp_path, small_disk):
    agent = make_agent(args=NO_GC)
    # New job dirs land on the small disk; the agent's own files stay where they are.
    subprocess.run(["mount", "--bind", str(small_disk), str(agent.home / "jobs")], check=True)
    try:
        release = tmp_path / "release"
        with agent.client() as client:
            quiet = client.submit(
                ["waiter.py", str(release)], workdir=project({"waiter.py": WAITER})
            )
            wait_until(lambda: b"waiting" in b"".join(quiet.logs()), timeout=30)
            filler = client.submit(["fill.py"], workdir=project({"fill.py": FILLER}))
            info = filler.wait(60)
            assert info.state == JobState.failed
            assert "ran out of space" in info.reason, info.reason
            # The job's end freed its own bookkeeping (a page or so): fill that too.
            _fill(agent.home / "jobs" / filler.id / "artifacts" / "fill.bin")
            # A submission while the disk is full: 507, and no half job dir left behind.
            dirs = set(os.listdir(agent.home / "jobs"))
            with pytest.raises(GpuhopError) as e:
                client.submit(["true"], workdir=project({"x.txt": "x"}))
            assert e.value.status == 507 and "disk is full" in e.value.message
            assert set(os.listdir(agent.home / "jobs")) == dirs
            # The other job was not touched; it ends as it would have.
            assert quiet.refresh().state == JobState.running
            (agent.home / "jobs" / filler.id / "artifacts" / "fill.bin").unlink()
            release.touch()
            assert quiet.wait(30).exit_code == 5
            assert b"".join(quiet.logs()) == b"waiting\nreleased\n"
            assert client.submit(["true"], workdir=tmp_path).wait(30).state == JobState.succeeded
    finally:
        agent.kill_jobs()
        subprocess.run(["umount", "-l", str(agent.home / "jobs")], check=False)
