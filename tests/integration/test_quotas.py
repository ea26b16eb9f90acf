"""Disk quotas, the log cap and a full disk, on a real agent: a clear 507 or a clear reason,
and nothing else harmed."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.api.data import CHUNK_HEADER, CONT, PART
from gpuhop.api.framing import FRAME_HEADER
from gpuhop.client import GpuhopError
from tests.conftest import wait_until
from tests.integration.test_agent_restart import WAITER
from tests.integration.test_full_disk import raw_http

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


MIB = 1 << 20


def blob_frames(blobs: list[bytes]) -> bytes:
    return b"".join(FRAME_HEADER.pack(hashlib.sha256(b).digest(), len(b)) + b for b in blobs)


def chunk_frames(whole: bytes, parts: list[bytes]) -> bytes:
    """A dataset upload: one file of one chunk (a blob), then a file of several (a run)."""
    flags = [0] + [PART] + [PART | CONT] * (len(parts) - 1)
    return b"".join(
        CHUNK_HEADER.pack(hashlib.sha256(data).digest(), len(data), len(data), flag) + data
        for data, flag in zip([whole, *parts], flags, strict=True)
    )


@pytest.mark.parametrize("route", ["/v1/blobs/upload", "/v1/chunks/upload"])
def test_gc_after_an_upload_refused_over_the_quota_frees_what_it_stored_at_once(make_agent, route):
    # The 507 tells the user to run `gpuhop gc`; it once freed nothing of the refused
    # upload (its blobs and runs were "recent") until the grace period had passed.
    agent = make_agent(args=(*NO_GC, "--storage-quota", "3MiB"))

    def body(mib: int) -> bytes:  # `mib` MiB of new content
        new = [os.urandom(MIB) for _ in range(mib)]
        return blob_frames(new) if route == "/v1/blobs/upload" else chunk_frames(*new[:1], new[1:])

    with raw_http(agent) as http, agent.client() as client:
        refused = http.post(route, content=body(4))  # the 4th MiB passes the quota
        assert refused.status_code == 507, refused.text
        assert "storage quota" in refused.json()["message"]
        report = client.gc()
        assert [p for p in agent.paths.blobs.rglob("*") if p.is_file()] == []
        assert report.usage.storage_bytes == 0
        # And the advice works: 3 MiB of other content fits now.
        again = http.post(route, content=body(3))
        assert again.status_code == 200, again.text


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
