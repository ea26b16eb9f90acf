"""Datasets on a real agent: pushes send only what changed, jobs read them and cannot
change them, and bad input is refused with nothing stored harmed."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from gpuhop.client.sync import chunkupload
from tests.conftest import wait_until


def make_tree(root: Path, seed: int = 1) -> Path:
    rng = random.Random(seed)
    for i in range(6):
        path = root / f"part{i % 2}" / f"file{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1000, 200_000)))
    (root / "big.bin").write_bytes(rng.randbytes(6 * 1024 * 1024))
    (root / "labels.csv").write_text(
        "id,label\n" + "".join(f"{i},{(i + seed) % 10}\n" for i in range(5000))
    )
    for path in root.rglob("*"):
        age(path)
    return root


def age(path: Path) -> None:
    """Date a file an hour back: files changed in the last two seconds are never cached."""
    past = time.time() - 3600
    os.utime(path, (past, past))


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_second_push_sends_only_the_changed_file(shared_agent, tmp_path):
    tree = make_tree(tmp_path / "ds")
    with shared_agent.client() as client:
        first = client.data.push(tree, "only-changes")
        assert first.info.version == 1 and first.info.new
        assert first.chunks_sent == first.chunks and first.bytes_sent == first.bytes
        assert first.wire_bytes < first.bytes  # labels.csv compresses

        same = client.data.push(tree, "only-changes")
        assert (same.info.version, same.info.new, same.chunks_sent) == (1, False, 0)
        assert same.files_chunked == 0  # nothing was read again: the chunk cache held

        changed = tree / "part1" / "file3.bin"
        changed.write_bytes(b"new content" * 1000)
        age(changed)
        second = client.data.push(tree, "only-changes")
        assert (second.info.version, second.info.new) == (2, True)
        assert (second.chunks_sent, second.bytes_sent) == (1, 11_000)

        # A small change inside the 6 MiB file: only the chunk around it travels.
        big = tree / "big.bin"
        content = bytearray(big.read_bytes())
        content[3_000_000:3_000_004] = b"edit"
        big.write_bytes(content)
        age(big)
        third = client.data.push(tree, "only-changes")
        assert third.info.version == 3
        assert 1 <= third.chunks_sent <= 2 and third.bytes_sent < len(content) / 2

        assert [v.version for v in client.data.versions("only-changes")] == [1, 2, 3]
        stored = shared_agent.home / "datasets" / "only-changes" / "v3"
        assert tree_digest(stored) == tree_digest(tree)
        files = {f["path"]: f for f in client.data.files("only-changes", 1)}
        assert files["part1/file3.bin"]["size"] != 11_000


def test_a_removed_versions_number_is_never_given_to_other_data(shared_agent, tmp_path):
    # After `data rm NAME:2` the next push was v2 again: a job pinned to NAME:2 then read
    # other data under the same name, with no word.
    tree = make_tree(tmp_path / "ds")
    with shared_agent.client() as client:
        assert client.data.push(tree, "renumbered").info.version == 1
        (tree / "labels.csv").write_text("changed once\n")
        age(tree / "labels.csv")
        assert client.data.push(tree, "renumbered").info.version == 2
        assert client.data.remove("renumbered", 2) == [2]
        (tree / "labels.csv").write_text("changed twice\n")
        age(tree / "labels.csv")
        assert client.data.push(tree, "renumbered").info.version == 3
        assert [v.version for v in client.data.versions("renumbered")] == [1, 3]
        # Every version removed: the name is new again.
        assert client.data.remove("renumbered") == [1, 3]
        assert client.data.push(tree, "renumbered").info.version == 1


def test_a_version_of_several_many_chunk_files_is_assembled_whole(shared_agent, tmp_path):
    """Files of several chunks are copied into place together (storage.datasets'
    ASSEMBLERS): each whole, with its mode, beside files linked to their one chunk."""
    rng = random.Random(7)
    tree = tmp_path / "many"
    for i in range(4):
        path = tree / "shards" / f"shard{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(3 * 1024 * 1024 + i))
    tool = tree / "tool.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    (tree / "small.txt").write_text("small")
    for path in tree.rglob("*"):
        age(path)
    with shared_agent.client() as client:
        pushed = client.data.push(tree, "assembled")
    assert pushed.chunks > 6  # each shard is several chunks
    stored = shared_agent.home / "datasets" / "assembled" / "v1"
    assert tree_digest(stored) == tree_digest(tree)
    assert (stored / "tool.sh").stat().st_mode & 0o777 == 0o555
    assert [p.stat().st_mode & 0o777 for p in sorted(stored.glob("shards/*"))] == [0o444] * 4


def test_an_interrupted_push_resumes_without_resending(shared_agent, tmp_path, monkeypatch):
    tree = make_tree(tmp_path / "ds", seed=2)
    monkeypatch.setattr(chunkupload, "UPLOAD_BATCH_BYTES", 1)  # one file per request
    sent = interrupt_after(monkeypatch, 3)
    with shared_agent.client() as client:
        with pytest.raises(Interrupted):
            client.data.push(tree, "resumed")
        with pytest.raises(GpuhopError):
            client.data.versions("resumed")
        monkeypatch.undo()
        result = client.data.push(tree, "resumed")
    assert result.info.version == 1
    assert result.chunks_sent == result.chunks - sum(len(batch) for batch in sent)
    stored = shared_agent.home / "datasets" / "resumed" / "v1"
    assert tree_digest(stored) == tree_digest(tree)


class Interrupted(Exception):
    pass


def interrupt_after(monkeypatch, requests: int) -> list[list]:
    """Make a push stop (raise Interrupted) after `requests` upload requests; returns the
    chunks that those requests sent (whole: the push waits for them before it raises)."""
    sent: list[list] = []
    send = chunkupload.ChunkUpload._send
    lock = threading.Lock()

    def send_some(self, batch):
        with lock:  # requests go from several threads
            if len(sent) == requests:
                raise Interrupted
            sent.append(batch)
        send(self, batch)

    monkeypatch.setattr(chunkupload.ChunkUpload, "_send", send_some)
    return sent


def test_a_file_changed_during_a_push_is_named_and_nothing_of_it_is_kept(
    shared_agent, tmp_path, monkeypatch
):
    tree = make_tree(tmp_path / "ds", seed=4)
    monkeypatch.setattr(chunkupload, "UPLOAD_BATCH_BYTES", 1)  # one chunk per request
    victim = tree / "part1" / "file5.bin"  # sent after part0's files and big.bin

    def rewrite_once(phase: str, done: int, total: int) -> None:
        if phase == "uploading" and not changed:
            changed.append(True)
            victim.write_bytes(os.urandom(victim.stat().st_size))  # same size, new bytes

    changed: list[bool] = []
    with shared_agent.client() as client:
        with pytest.raises(GpuhopError, match=r"part1/file5\.bin changed while it was being"):
            client.data.push(tree, "changed-midway", on_progress=rewrite_once)
        with pytest.raises(GpuhopError):
            client.data.versions("changed-midway")  # no version was made
        again = client.data.push(tree, "changed-midway")  # the new content, as it is now
    assert again.info.version == 1
    stored = shared_agent.home / "datasets" / "changed-midway" / "v1"
    assert tree_digest(stored) == tree_digest(tree)


def test_a_job_reads_a_mounted_dataset_and_cannot_change_it(shared_agent, project, tmp_path):
    tree = make_tree(tmp_path / "ds", seed=3)
    stored = shared_agent.home / "datasets" / "frozen" / "v1"
    script = f"""
import os, sys
from pathlib import Path
d = Path("data/in")
print("files", sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()))
print("labels", (d / "labels.csv").read_text().splitlines()[1])
attempts = {{
    "write": lambda: open(d / "labels.csv", "a").write("x"),
    "truncate": lambda: open(d / "big.bin", "r+b").truncate(0),
    "chmod": lambda: os.chmod(d / "labels.csv", 0o666),
    "rename": lambda: os.rename(d / "labels.csv", d / "x.csv"),
    "delete": lambda: os.unlink(d / "big.bin"),
    "create": lambda: open(d / "new.txt", "w"),
    "mkdir": lambda: os.mkdir(d / "newdir"),
    "rmdir": lambda: os.rmdir(d / "part0"),
    "unmount": lambda: os.system("umount data/in 2>/dev/null") == 0 or 1 / 0,
    "stored copy": lambda: open("{stored}/labels.csv", "a").write("x"),
    "stored chmod": lambda: os.chmod("{stored}/labels.csv", 0o666),
}}
for what, attempt in attempts.items():
    try:
        attempt()
        print(what, "ALLOWED")
    except (OSError, ZeroDivisionError) as e:
        print(what, "refused")
Path("scratch.txt").write_text("the work dir stays writable")
print("wrote scratch")
"""
    root = project({"job.py": script})
    with shared_agent.client() as client:
        client.data.push(tree, "frozen")
        before = tree_digest(stored)
        job = client.submit(["job.py"], workdir=root, data=["frozen:1=data/in"])
        info = job.wait(timeout=60)
        out = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, out
    assert info.data == ["frozen:v1=data/in"]
    assert "ALLOWED" not in out, out
    assert out.count("refused") == 11
    assert "labels 0,3" in out and "wrote scratch" in out
    assert f"files {sorted(tree_digest(tree))}" in out
    assert tree_digest(stored) == before == tree_digest(tree)
    assert all(not os.access(p, os.W_OK) or os.getuid() == 0 for p in stored.rglob("*"))


def test_a_dataset_in_use_cannot_be_removed(shared_agent, project, tmp_path):
    tree = make_tree(tmp_path / "ds", seed=4)
    root = project(
        {
            "job.py": "import os, time\n"
            "gate = os.path.join(os.environ['GPUHOP_ARTIFACTS_DIR'], 'go')\n"
            "while not os.path.exists(gate):\n"
            "    time.sleep(0.02)\n"
        }
    )
    with shared_agent.client() as client:
        client.data.push(tree, "busy")
        job = client.submit(["job.py"], workdir=root, data=["busy=d"])
        wait_until(lambda: job.refresh().state == JobState.running)
        with pytest.raises(GpuhopError, match=f"dataset busy v1 is in use by job.s. {job.id} "):
            client.data.remove("busy", 1)  # the version the job uses is named
        with pytest.raises(GpuhopError, match="in use by job") as e:
            client.data.remove("busy")
        assert e.value.status == 409
        # In the job's artifacts dir: the host's /tmp is not the job's.
        (shared_agent.paths.jobs / job.id / "artifacts" / "go").touch()
        assert job.wait(timeout=60).state == JobState.succeeded
        assert client.data.remove("busy") == [1]
        assert "busy" not in {d.name for d in client.data.list()}
    assert not (shared_agent.home / "datasets" / "busy").exists()


def test_bad_input_is_refused_and_harms_nothing(shared_agent, project, tmp_path):
    tree = make_tree(tmp_path / "ds", seed=5)
    stored = shared_agent.home / "datasets" / "kept"
    root = project({"job.py": "print('hi')\n", "taken/file.txt": "x"})
    http = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(shared_agent.paths.socket)),
        base_url="http://gpuhop",
    )
    with shared_agent.client() as client, http:
        client.data.push(tree, "kept")
        before = tree_digest(stored)
        chunk = client.data.files("kept")[0]

        def manifest(path: str) -> bytes:
            entry = {"path": path, "size": 1, "chunks": ["a" * 64]}
            return json.dumps({"files": [entry]}).encode()

        for name in ("bad name", ".hidden", "x" * 65):
            r = http.post(f"/v1/datasets/{name}", content=manifest("a"))
            assert r.status_code == 400 and "dataset name" in r.json()["message"]
        for path in ("../escape", "/etc/passwd", "a/../../b", "a//b"):
            r = http.post("/v1/datasets/kept", content=manifest(path))
            assert r.status_code == 422, r.text
            assert path in r.json()["message"] or "path" in r.json()["message"]
        r = http.post("/v1/datasets/kept", content=manifest("fine.txt"))
        assert r.status_code == 409 and r.json()["code"] == "missing_blobs"
        r = http.post("/v1/datasets/kept", content=b"{not json")
        assert r.status_code == 422

        job = client.submit(["job.py"], workdir=root)  # stores the project's tree
        tree = _tree_digest(shared_agent, job.id)
        jobs_before = len(client.jobs())
        bad_mounts = [
            ({"name": "nosuch", "mount": "data"}, 404, "no dataset named 'nosuch'"),
            ({"name": "kept", "version": 9, "mount": "data"}, 404, "has no version 9"),
            ({"name": "kept", "mount": "../outside"}, 422, "inside the work dir"),
            ({"name": "kept", "mount": "/abs"}, 422, "inside the work dir"),
            ({"name": "kept", "mount": "a/../../b"}, 422, "inside the work dir"),
            ({"name": "bad name", "mount": "d"}, 422, "dataset name"),
            ({"name": "kept", "mount": "taken"}, 400, "would hide synced files"),
            ({"name": "kept", "mount": "taken/file.txt"}, 400, "collides with the synced file"),
            ({"name": "kept", "mount": "job.py/x"}, 400, "collides with the synced file"),
        ]
        for mount, status, words in bad_mounts:
            body = {"command": ["job.py"], "tree": tree, "data": [mount]}
            r = http.post("/v1/jobs", json=body)
            assert r.status_code == status, (mount, r.text)
            assert words in r.json()["message"], (mount, r.text)
        two = [{"name": "kept", "mount": "d"}, {"name": "kept", "mount": "d/e"}]
        r = http.post("/v1/jobs", json={"command": ["job.py"], "tree": tree, "data": two})
        assert r.status_code == 400 and "overlap" in r.json()["message"]
        assert len(client.jobs()) == jobs_before
        with pytest.raises(GpuhopError, match="NAME\\[:VERSION\\]=MOUNT"):
            client.submit(["true"], workdir=root, data=["kept"])
        assert [v.version for v in client.data.versions("kept")] == [1]
        assert chunk == client.data.files("kept")[0]
    assert tree_digest(stored) == before


def test_an_unreadable_file_is_named_not_a_traceback(shared_agent, tmp_path):
    tree = make_tree(tmp_path / "ds", seed=7)
    unreadable = tree / "part0" / "secret.bin"
    unreadable.write_bytes(b"not for you")
    unreadable.chmod(0)
    argv = [sys.executable, "-m", "gpuhop", "data", "push", str(tree), "--name", "unreadable"]
    if os.geteuid() == 0:  # root reads a file of mode 000: push without that power
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("as root, a file of mode 000 is readable without setpriv to drop that")
        argv = [setpriv, "--inh-caps=-all", "--bounding-set=-all", *argv]
    try:
        pushed = subprocess.run(
            argv, env=shared_agent.env, capture_output=True, text=True, timeout=120
        )
    finally:
        unreadable.chmod(0o600)

    assert pushed.returncode == 2, pushed.stderr
    assert f"cannot read {unreadable}: Permission denied" in pushed.stderr
    assert "Traceback" not in pushed.stderr
    with shared_agent.client() as client:
        assert "unreadable" not in {d.name for d in client.data.list()}


def test_a_broken_link_is_named_as_one(shared_agent, tmp_path):
    tree = make_tree(tmp_path / "ds", seed=8)
    (tree / "part1" / "latest.bin").symlink_to("gone.bin")
    with shared_agent.client() as client:
        with pytest.raises(GpuhopError) as e:
            client.data.push(tree, "broken-link")
        assert e.value.message == (
            f"{tree / 'part1' / 'latest.bin'} is a link to gone.bin, which does not exist;"
            " remove the link, or push a folder without it"
        )
        assert "broken-link" not in {d.name for d in client.data.list()}


def _tree_digest(agent, job_id: str) -> str:
    raw = (agent.home / "jobs" / job_id / "tree.json").read_bytes()
    return hashlib.sha256(raw).hexdigest()


def test_a_large_file_pushes_in_batches_over_the_json_body_cap(shared_agent, tmp_path):
    """Chunk uploads stream to disk: a batch far over the cap on JSON bodies goes through."""
    tree = tmp_path / "large"
    tree.mkdir()
    (tree / "weights.bin").write_bytes(os.urandom(40 * 1024 * 1024))
    with shared_agent.client() as client:
        pushed = client.data.push(tree, "large-file")
        assert pushed.bytes_sent == 40 * 1024 * 1024
        stored = shared_agent.home / "datasets" / "large-file" / "v1"
        assert tree_digest(stored) == tree_digest(tree)
        client.data.remove("large-file")


def test_a_dataset_chunked_with_numpy_is_not_sent_again_by_the_c_chunker(
    shared_agent, tmp_path, monkeypatch
):
    """Where the C chunker was not built, pushes chunk with numpy; a later push of the same
    files with the C chunker makes the same chunks, so nothing travels again."""
    from gpuhop.client.sync import chunking

    assert chunking._native() is not None, "the C chunker was not built (scripts/setup-venv)"
    tree = make_tree(tmp_path / "ds", seed=5)
    with shared_agent.client() as client, monkeypatch.context() as patch:
        patch.setattr(chunking, "_native", lambda: None)
        before = client.data.push(tree, "either-chunker")
    assert before.chunks > len(list(tree.rglob("*.*")))  # big.bin has several chunks
    moved = tree.rename(tmp_path / "moved")  # another path: its chunk cache is empty
    with shared_agent.client() as client:
        after = client.data.push(moved, "either-chunker")
    assert (after.info.version, after.info.new) == (1, False)
    assert after.files_chunked == before.files and after.chunks_sent == 0
