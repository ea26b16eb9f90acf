"""Garbage collection and retention on a real agent: what nothing needs goes, what a queued
or running job, a dataset or an upload in progress needs stays."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from gpuhop.client.submitted import tree_of
from gpuhop.client.sync.upload import send_tree
from gpuhop.client.sync.workdir import scan
from tests.conftest import wait_until
from tests.integration.test_agent_restart import WAITER

# Collect everything that is old enough at once: no grace, no retention.
EAGER = ("--gc-every-hours", "0", "--gc-grace-minutes", "0", "--keep-jobs", "0", "--keep-days", "0")


def upload_only(client, root, cache):
    """Send a project's blobs and tree, as `submit` does, but submit no job."""
    files = scan(root, cache).files
    tree_bytes, digest = tree_of(files)
    client.upload(files)
    send_tree(client.session, tree_bytes, files, None)
    return digest, {f.digest for f in files}


def stored_blobs(agent) -> set[str]:
    return {p.name for p in (agent.home / "blobs").glob("*/*")}


def test_gc_removes_only_what_nothing_needs(make_agent, project, tmp_path):
    agent = make_agent(fake_gpus=1, args=EAGER)
    release = tmp_path / "release"
    with agent.client() as client:
        done = client.submit(["print.py"], workdir=project({"print.py": "print('old job')\n"}))
        done.wait(30)
        holder = client.submit(
            ["waiter.py", str(release)], workdir=project({"waiter.py": WAITER}), gpus=1
        )
        wait_until(lambda: holder.refresh().state == JobState.running, timeout=30)
        queued_root = tmp_path / "queued"
        queued_root.mkdir()
        (queued_root / "q.py").write_text("print(open('data.txt').read())\n")
        (queued_root / "data.txt").write_text("needed by a queued job\n")
        queued = client.submit(["q.py"], workdir=queued_root, gpus=1)
        assert queued.refresh().state == JobState.queued
        data_root = tmp_path / "ds"
        data_root.mkdir()
        (data_root / "d.bin").write_bytes(b"dataset bytes" * 1000)
        client.data.push(data_root, name="ds")
        orphan_root = tmp_path / "orphan"
        orphan_root.mkdir()
        (orphan_root / "unused.bin").write_bytes(b"nobody runs this" * 5000)
        orphan_tree, orphan_blobs = upload_only(client, orphan_root, agent.cache)
        before = stored_blobs(agent)
        assert orphan_blobs <= before
        # Each job's tree is materialised once as a checkout (where the host allows an
        # overlay view of it; otherwise jobs get copies and there are none).
        checkouts = agent.home / "checkouts"
        done_checkout, holder_checkout = (
            checkouts
            / hashlib.sha256((agent.paths.job_dir(j.id) / "tree.json").read_bytes()).hexdigest()
            for j in (done, holder)
        )
        assert done_checkout.is_dir() == holder_checkout.is_dir() == checkouts.is_dir()

        dry = client.gc(dry_run=True)
        assert stored_blobs(agent) == before  # a dry run removes nothing
        report = client.gc()
        assert report.freed == dry.freed
        assert report.pruned_jobs == [done.id]
        after = stored_blobs(agent)
        assert before - after == orphan_blobs
        assert report.freed["blobs"].count == len(orphan_blobs)
        assert report.freed["blobs"].bytes == len(b"nobody runs this" * 5000)
        assert not (agent.home / "trees" / f"{orphan_tree}.json").exists()
        # The pruned job's checkout went with its tree; the running job's stays.
        assert not done_checkout.exists()
        assert holder_checkout.is_dir() == checkouts.is_dir()

        # The old job's record stays; its files are gone, and asking for them says why.
        info = client.job(done.id).refresh()
        assert info.state == JobState.succeeded and info.pruned_at is not None
        with pytest.raises(GpuhopError) as e:
            b"".join(client.job(done.id).logs())
        assert e.value.status == 410 and "retention" in e.value.message

        # What the running, the queued job and the dataset need is all there.
        release.touch()
        assert holder.wait(30).exit_code == 5
        assert queued.wait(30).state == JobState.succeeded
        assert b"".join(queued.logs()) == b"needed by a queued job\n\n"
        again = client.submit(["q.py"], workdir=queued_root)  # the same tree, gone or not
        assert again.wait(30).state == JobState.succeeded
        ds = client.submit(["cat", "d/d.bin"], workdir=project({"x.txt": ""}), data=["ds=d"]).wait(
            30
        )
        assert ds.state == JobState.succeeded, ds.reason
    # Claims follow the blobs they are about: none is left for a removed blob.
    import sqlite3

    db = sqlite3.connect(agent.home / "claims.db")
    claimed = {row[0] for row in db.execute("SELECT digest FROM claims WHERE kind = 'blob'")}
    db.close()
    assert not claimed & orphan_blobs


EXPORT = """
import os
model = os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "m")
os.makedirs(model)
open(os.path.join(model, "saved_model.pb"), "w").write("pb")
"""


def test_a_jobs_savedmodel_stays_while_a_model_server_is_to_serve_it(make_agent, project):
    """A model server sees its model in the job that saved it (mounted, not copied): that
    job's files stay while the server is queued or running, and go once it has ended."""
    agent = make_agent(fake_gpus=1, args=EAGER)
    with agent.client() as client:
        source = client.submit(["export.py"], workdir=project({"export.py": EXPORT}))
        assert source.wait(30).state == JobState.succeeded
        holder = client.submit(["sleep", "600"], workdir=project({"x.txt": ""}), gpus=1)
        wait_until(lambda: holder.refresh().state == JobState.running, timeout=30)
        server = client.serve(source, name="m", gpus=1, wait=False)
        try:
            assert server.job.refresh().state == JobState.queued  # behind the holder
            assert source.id not in client.gc().pruned_jobs
            model = agent.paths.job_dir(source.id) / "artifacts" / "m" / "saved_model.pb"
            assert model.read_text() == "pb"
        finally:
            for job in (server.job, holder):
                job.cancel(grace=0)
                job.wait(30)
        assert source.id in client.gc().pruned_jobs
        assert not model.exists()


# An interpreter for `--python` that is replaced while a job is submitted: asked its version
# before the submission takes what it holds (gpuhop.agent.storage.uses), it answers at once
# and changes its modification time, as a reinstalled interpreter would; asked again, once
# the submission holds the lock (the agent asks a changed interpreter again), it says it has
# started and waits for a line on the FIFO beside it: a submission paused half way, holding
# what it holds there. Waits once released no more: the job's later runs of it (its
# environment's build) go straight on, so nothing is left waiting on the FIFO when the test
# fails half way.
PAUSED_PYTHON = """#!/bin/sh
if [ ! -e "{replaced}" ]; then
    : > "{replaced}"
    touch -d @1 "$0"
elif [ ! -e "{released}" ]; then
    : > "{started}"
    read line < "{fifo}"
fi
exec "{python}" "$@"
"""


@pytest.mark.timeout(120)
def test_gc_waits_for_a_submission_under_way_and_a_server_asked_for_meanwhile_is_refused(
    make_agent, project, tmp_path
):
    """Issue 40: gc works out which jobs queued and running jobs use, then prunes; a job
    submitted meanwhile must not lose what it resolved (a model server its source job's
    SavedModel, a job its environment). Made deterministic with a submission paused in the
    middle (its interpreter, replaced after it said its version and so asked again under the
    lock, waits on a FIFO there): gc asked for then
    waits for it (its log says so), and a model server asked for then, whose source job gc
    is to prune, waits behind gc (its log says so) after its first look at the SavedModel.
    Once the submission goes on: gc prunes the source job (nothing queued uses it), and the
    server, which looks again once gc is done, is refused with 410, not queued to mount an
    emptied dir. Without the lock gc never waits; without the second look the server is
    queued on a pruned job."""
    agent = make_agent(fake_gpus=1, args=EAGER)
    started, fifo, released = tmp_path / "started", tmp_path / "release", tmp_path / "released"
    os.mkfifo(fifo)
    python = tmp_path / "python"
    python.write_text(
        PAUSED_PYTHON.format(
            replaced=tmp_path / "replaced",
            started=started,
            fifo=fifo,
            released=released,
            python=sys.executable,
        )
    )
    python.chmod(0o755)
    logged = agent.paths.logfile.stat().st_size

    def said(words: str) -> bool:
        with agent.paths.logfile.open("rb") as f:
            f.seek(logged)
            return words in f.read().decode(errors="replace")

    def release() -> None:
        released.touch()
        with contextlib.suppress(OSError):  # no reader: nothing waits
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"go\n")
            os.close(fd)

    with agent.client() as client, ThreadPoolExecutor(3) as pool:
        source = client.submit(["export.py"], workdir=project({"export.py": EXPORT}))
        assert source.wait(30).state == JobState.succeeded
        holder = client.submit(["sleep", "600"], workdir=project({"x.txt": ""}), gpus=1)
        wait_until(lambda: holder.refresh().state == JobState.running, timeout=30)
        model = agent.paths.job_dir(source.id) / "artifacts" / "m" / "saved_model.pb"

        def in_thread(call):
            def run():
                with agent.client() as own:
                    return call(own)

            return pool.submit(run)

        try:
            paused = in_thread(
                lambda c: c.submit(
                    ["x.py"],
                    workdir=project({"x.py": "", "requirements.txt": "tinypkg==1.0\n"}),
                    gpus=1,
                    python=str(python),
                )
            )
            wait_until(lambda: started.exists() or paused.done(), timeout=30)
            assert started.exists(), paused.result()
            collecting = in_thread(lambda c: c.gc())
            wait_until(lambda: collecting.done() or said("collection waits for 1 job"), 30)
            assert not collecting.done(), "gc did not wait for the submission under way"
            serving = in_thread(lambda c: c.serve(source, name="m", gpus=1, wait=False))
            wait_until(lambda: serving.done() or said("submission waits for garbage"), 30)
            assert not serving.done(), serving.result()
            assert model.read_text() == "pb"  # gc has pruned nothing yet
        finally:
            release()
        queued = paused.result(timeout=60)
        assert source.id in collecting.result(timeout=60).pruned_jobs
        with pytest.raises(GpuhopError) as refused:
            serving.result(timeout=60)
        assert refused.value.status == 410 and "retention" in refused.value.message
        assert not model.exists()
        assert not list(agent.paths.jobs.glob("*/serving.json"))  # no server job was made
        for job in (client.job(queued.id), holder):  # `queued`'s own client is closed
            job.cancel(grace=0)
            job.wait(30)


def test_recent_uploads_are_never_collected(make_agent, tmp_path):
    """An upload whose tree has not arrived yet keeps its blobs (the grace period)."""
    agent = make_agent(args=("--gc-every-hours", "0"))
    root = tmp_path / "p"
    root.mkdir()
    (root / "a.bin").write_bytes(b"in flight" * 1000)
    with agent.client() as client:
        files = scan(root, agent.cache).files
        client.upload(files)  # the blobs arrived; the tree is still to come
        report = client.gc()
        assert report.freed["blobs"].count == 0
        tree_bytes, digest = tree_of(files)
        send_tree(client.session, tree_bytes, files, None)  # would fail if a blob had gone
    assert hashlib.sha256(tree_bytes).hexdigest() == digest


def test_the_agent_collects_on_its_own_and_keeps_the_newest_jobs(make_agent, project):
    args = ("--gc-every-hours", "0.0005", "--gc-grace-minutes", "0")
    agent = make_agent(args=(*args, "--keep-jobs", "1", "--keep-days", "0"))
    with agent.client() as client:
        root = project({"p.py": "print('hi')\n"})
        first = client.submit(["p.py"], workdir=root)
        first.wait(30)
        second = client.submit(["p.py"], workdir=root)
        second.wait(30)
        wait_until(lambda: client.job(first.id).refresh().pruned_at is not None, timeout=30)
        assert client.job(second.id).refresh().pruned_at is None  # the newest one is kept
        assert b"".join(second.logs()) == b"hi\n"
    marker = json.loads((agent.home / "jobs" / first.id / "pruned.json").read_text())
    assert marker["bytes"] > 0
    # The marker comes first (the job reads as pruned at once), then its files go.
    folder = agent.home / "jobs" / first.id
    wait_until(lambda: [p.name for p in folder.iterdir()] == ["pruned.json"], timeout=30)


def test_a_prune_stopped_half_way_is_finished_by_the_next_collection(make_agent, project):
    """A collection that stopped after a job's marker (the agent killed mid-prune) left its
    files: the next one removes them."""
    agent = make_agent(args=("--gc-every-hours", "0", "--keep-jobs", "1", "--keep-days", "0"))
    with agent.client() as client:
        root = project({"p.py": "print('hi')\n"})
        first = client.submit(["p.py"], workdir=root)
        first.wait(30)
        client.submit(["p.py"], workdir=root).wait(30)
    folder = agent.home / "jobs" / first.id
    left = sorted(p.name for p in folder.iterdir())
    assert "output.log" in left
    marker = {"pruned_at": time.time(), "bytes": 3, "why": "a collection stopped half-way"}
    (folder / "pruned.json").write_text(json.dumps(marker))
    gc = agent.cli("gc")
    assert gc.returncode == 0, gc.stderr
    assert [p.name for p in folder.iterdir()] == ["pruned.json"]
    assert json.loads((folder / "pruned.json").read_text()) == marker  # as it was written


def test_only_admins_collect(make_agent):
    agent = make_agent(args=("--listen", "127.0.0.1:0", "--no-tls", "--gc-every-hours", "0"))
    token = agent.cli("agent", "token", "create", "bob").stdout.split()[-1]
    import httpx

    r = httpx.post(
        f"{agent.listener.url}/v1/agent/gc", headers={"authorization": f"Bearer {token}"}
    )
    assert r.status_code == 403 and r.json()["code"] == "forbidden"


def test_gc_on_the_command_line(make_agent):
    agent = make_agent(args=("--gc-every-hours", "0", "--storage-quota", "1GiB"))
    dry = agent.cli("gc", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would free 0 B in all" in dry.stdout + dry.stderr
    assert "of 1.0 GiB" in dry.stdout + dry.stderr
