"""Each tree is materialised once on the host, and each job sees it through a writable overlay
of its own: on a real agent, jobs change, add and remove files of their tree, and neither the
stored checkout nor the next job of the same tree sees any of it. Where the host allows no
overlay, jobs get a copy, as `doctor` says (the copy is what the other job tests exercise on
such a host).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.backends.local.backend import SANDBOX, WORKVIEW, _probe
from tests.conftest import Agent, wait_until

pytestmark = pytest.mark.skipif(
    _probe(sys.executable, SANDBOX) is not None or _probe(sys.executable, WORKVIEW) is not None,
    reason="this host allows no overlay for a job's work dir (jobs get copies)",
)

MEDDLE = r"""
import json, os
seen = {name: open(name).read() for name in ("data.txt", "keep.txt")}
with open("data.txt", "a") as f:
    f.write(" changed by the job")
os.chmod("keep.txt", 0o600)
os.unlink("gone.txt")
with open("new.txt", "w") as f:
    f.write("made by the job")
if os.getuid() == 0:  # an overlay in a user namespace cannot rename a lower directory
    os.rename("bin", "renamed")
    os.rename("renamed", "bin")
print(json.dumps({"seen": seen, "work": sorted(os.listdir("."))}), flush=True)
"""

FILES = {
    "meddle.py": MEDDLE,
    "data.txt": "stored",
    "keep.txt": "kept",
    "gone.txt": "to be removed",
    "bin/run.sh": "#!/bin/sh\necho ran from the checkout\n",
}


def _report(job) -> dict:
    job.wait(timeout=60)
    assert job.refresh().state == JobState.succeeded, job.info.reason
    return json.loads(b"".join(job.logs()).decode().strip().splitlines()[-1])


def _checkout(agent, job_id: str) -> Path:
    raw = (agent.paths.job_dir(job_id) / "tree.json").read_bytes()
    return agent.paths.home / "checkouts" / hashlib.sha256(raw).hexdigest()


def test_jobs_change_their_view_and_never_the_stored_checkout(shared_agent, project):
    root = project(FILES)
    (root / "bin/run.sh").chmod(0o755)
    with shared_agent.client() as client:
        first = client.submit(["meddle.py"], workdir=root)
        report = _report(first)
        checkout = _checkout(shared_agent, first.id)
        second = client.submit(["meddle.py"], workdir=root)
        again = _report(second)
        script = client.submit(["bin/run.sh"], workdir=root)
        script.wait(timeout=60)
        assert script.refresh().state == JobState.succeeded, script.info.reason
        assert b"ran from the checkout" in b"".join(script.logs())

    # Each job saw the stored files, and its own changes only.
    expected = {"seen": {"data.txt": "stored", "keep.txt": "kept"}}
    assert report["seen"] == again["seen"] == expected["seen"]
    assert report["work"] == ["bin", "data.txt", "keep.txt", "meddle.py", "new.txt"]
    # The checkout is the tree as sent, shared by both jobs, untouched by either.
    assert _checkout(shared_agent, second.id) == checkout
    assert (checkout / "data.txt").read_text() == "stored"
    assert (checkout / "gone.txt").read_text() == "to be removed"
    assert not (checkout / "new.txt").exists()
    assert (checkout / "keep.txt").stat().st_mode & 0o777 == 0o644
    assert (checkout / "bin/run.sh").stat().st_mode & 0o777 == 0o755
    # A job's work dir on the host holds what the job changed or made: its overlay's
    # upper layer (a removed file is a whiteout there).
    work = shared_agent.paths.job_dir(first.id) / "work"
    assert (work / "data.txt").read_text() == "stored changed by the job"
    assert (work / "new.txt").read_text() == "made by the job"
    assert not (work / "meddle.py").exists()


def test_a_changed_tree_gets_its_own_checkout_that_reuses_the_unchanged_files(
    shared_agent, project
):
    root = project({"meddle.py": MEDDLE, **{k: v for k, v in FILES.items() if k != "meddle.py"}})
    with shared_agent.client() as client:
        before = client.submit(["true"], workdir=root)
        before.wait(timeout=60)
        (root / "data.txt").write_text("edited after the first job")
        after = client.submit(["cat", "data.txt"], workdir=root)
        after.wait(timeout=60)
        assert after.refresh().state == JobState.succeeded, after.info.reason
        assert b"edited after the first job" in b"".join(after.logs())
    old, new = _checkout(shared_agent, before.id), _checkout(shared_agent, after.id)
    assert old != new
    assert (old / "data.txt").read_text() == "stored"
    assert (new / "data.txt").read_text() == "edited after the first job"
    # The unchanged files are the same files, linked, not copied again.
    assert os.stat(old / "keep.txt").st_ino == os.stat(new / "keep.txt").st_ino
    assert os.stat(old / "data.txt").st_ino != os.stat(new / "data.txt").st_ino


def answering(agent: Agent) -> None:
    """Start the agent and hear its first answer: what it does at its start is done by then,
    whatever `start` waits for."""
    agent.start()
    with agent.client() as client:
        client.info()


def test_checkouts_of_another_boot_are_built_again_and_this_boots_are_kept(make_agent, project):
    """Checkouts are not flushed to disk as they are built: after the host's next boot
    (after a power loss, one may hold empty files) the agent lets them go, and the next job
    of each tree builds its checkout again. A restart in the same boot keeps them."""
    agent = make_agent()
    root = project(FILES)
    with agent.client() as client:
        first = client.submit(["cat", "data.txt"], workdir=root)
        first.wait(timeout=60)
    checkout = _checkout(agent, first.id)
    record = agent.paths.home / "checkouts" / "boot"
    assert record.read_text() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    before = os.stat(checkout / "data.txt").st_ino

    agent.shutdown()
    answering(agent)  # the same boot: kept
    assert os.stat(checkout / "data.txt").st_ino == before
    agent.shutdown()
    record.unlink()  # as an agent from before the record left it: its jobs may still run
    answering(agent)
    assert os.stat(checkout / "data.txt").st_ino == before
    assert record.read_text() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()

    agent.shutdown()
    (checkout / "data.txt").write_text("")  # what a power loss may leave of it
    record.write_text("an-earlier-boot")
    answering(agent)
    assert not checkout.exists()  # out of the way before the agent answers anyone
    assert record.read_text() != "an-earlier-boot"
    with agent.client() as client:
        again = client.submit(["cat", "data.txt"], workdir=root)
        again.wait(timeout=60)
        assert again.refresh().state == JobState.succeeded, again.info.reason
        assert b"".join(again.logs()) == b"stored"
    assert (checkout / "data.txt").read_text() == "stored"  # built again, from the blobs
    tmp = agent.paths.tmp
    wait_until(lambda: not any(p.name.startswith("checkout-gone-") for p in tmp.iterdir()))
