"""Where a dataset's bytes are kept, on a real agent: once. A file of several chunks is its
chunks as they arrived (moved into place, not copied), later versions take unchanged chunks
from it, and chunks staged for a push that never came go with an agent of another boot or
with garbage collection."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest

from gpuhop.api.data import CHUNK_HEADER, CONT, PART
from gpuhop.client.sync import chunkupload
from tests.conftest import wait_until
from tests.integration.test_agent_restart import kill_agent_hard
from tests.integration.test_datasets import (
    Interrupted,
    age,
    interrupt_after,
    make_tree,
    tree_digest,
)
from tests.integration.test_full_disk import raw_http
from tests.integration.test_gc import EAGER

MIB = 1024 * 1024


def record(agent, name: str, version: int) -> dict[str, dict]:
    raw = (agent.home / "datasets" / name / f"v{version}.json").read_text()
    return {f["path"]: f for f in json.loads(raw)["files"]}


def stored_bytes(*roots: Path) -> int:
    """Bytes under `roots` on the disk, each file (inode) counted once."""
    seen: dict[tuple[int, int], int] = {}
    for path in (p for root in roots for p in root.rglob("*")):
        st = path.lstat()
        if path.is_file() and not path.is_symlink():
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def staged(agent) -> list[Path]:
    return [p for p in (agent.home / "blobs" / ".staged").rglob("*") if p.is_file()]


def test_a_dataset_is_kept_once_and_its_big_files_are_not_copied(make_agent, tmp_path):
    agent = make_agent()
    tree = make_tree(tmp_path / "ds")
    with agent.client() as client:
        pushed = client.data.push(tree, "once")
    stored = agent.home / "datasets" / "once" / "v1"
    assert tree_digest(stored) == tree_digest(tree)
    big = record(agent, "once", 1)["big.bin"]
    assert len(big["chunks"]) > 1 and sum(big["sizes"]) == big["size"] == 6 * MIB
    # Its chunks are no blobs of their own: the version's file is where they are kept.
    blobs = agent.home / "blobs"
    assert not [d for d in big["chunks"] if (blobs / d[:2] / d).exists()]
    assert (stored / "big.bin").stat().st_nlink == 1
    assert staged(agent) == []
    everything = stored_bytes(blobs, agent.home / "datasets")
    assert pushed.bytes <= everything < pushed.bytes + 100_000  # + the records


def test_new_versions_take_unchanged_chunks_from_the_files_of_earlier_ones(make_agent, tmp_path):
    agent = make_agent()
    tree = make_tree(tmp_path / "ds", seed=5)
    rng = random.Random(5)
    (tree / "second.bin").write_bytes(rng.randbytes(3 * MIB))
    age(tree / "second.bin")
    with agent.client() as client:
        client.data.push(tree, "versions")
        (tree / "labels.csv").write_text("id,label\n0,1\n")
        age(tree / "labels.csv")
        assert client.data.push(tree, "versions").info.version == 2  # big files: linked
        v2 = agent.home / "datasets" / "versions" / "v2"
        assert (v2 / "big.bin").stat().st_nlink == 2
        # The version whose files v2 links to goes; the chunks stay where v2 keeps them.
        assert client.data.remove("versions", 1) == [1]
        for name, at in (("big.bin", 4_000_000), ("second.bin", 100)):
            content = bytearray((tree / name).read_bytes())
            content[at : at + 4] = b"edit"
            (tree / name).write_bytes(content)
            age(tree / name)
        third = client.data.push(tree, "versions")
        assert third.info.version == 3
        assert 2 <= third.chunks_sent <= 4 and third.bytes_sent < 5 * MIB
        v3 = agent.home / "datasets" / "versions" / "v3"
        assert tree_digest(v3) == tree_digest(tree)
        # With v2 gone too, v3's own files keep its chunks: a push of the same tree to a
        # new name sends nothing.
        assert client.data.remove("versions", 2) == [2]
        again = client.data.push(tree, "versions-again")
        assert again.chunks_sent == 0
        assert tree_digest(agent.home / "datasets" / "versions-again" / "v1") == tree_digest(tree)
    assert staged(agent) == []


def test_an_agent_restarted_mid_push_keeps_what_arrived_and_drops_other_boots(
    make_agent, tmp_path, monkeypatch
):
    agent = make_agent()
    tree = make_tree(tmp_path / "ds", seed=6)
    monkeypatch.setattr(chunkupload, "UPLOAD_BATCH_BYTES", 1)  # one file per request
    sent = interrupt_after(monkeypatch, 2)  # big.bin (first, a run) and one more file
    with agent.client() as client, pytest.raises(Interrupted):
        client.data.push(tree, "restarted")
    monkeypatch.undo()
    assert staged(agent)  # big.bin's run and its index
    # What an agent of another boot of the host left: a run that a power loss may have cut.
    other = agent.home / "blobs" / ".staged" / "another-boot"
    other.mkdir()
    (other / "run-0").write_bytes(b"x" * 100)
    agent.shutdown()
    agent.start()
    assert not other.exists()
    with agent.client() as client:
        result = client.data.push(tree, "restarted")
    assert result.chunks_sent == result.chunks - sum(len(batch) for batch in sent)
    assert tree_digest(agent.home / "datasets" / "restarted" / "v1") == tree_digest(tree)
    assert staged(agent) == []


def test_chunks_of_a_push_that_never_came_are_collected(make_agent, tmp_path, monkeypatch):
    agent = make_agent(args=EAGER)
    tree = make_tree(tmp_path / "ds", seed=7)
    monkeypatch.setattr(chunkupload, "UPLOAD_BATCH_BYTES", 1)
    interrupt_after(monkeypatch, 1)  # big.bin's chunks only, staged as one run
    with agent.client() as client:
        with pytest.raises(Interrupted):
            client.data.push(tree, "abandoned")
        monkeypatch.undo()
        runs = staged(agent)
        assert sum(p.stat().st_size for p in runs) >= 6 * MIB
        report = client.gc()
        assert report.freed["temp"].bytes >= 6 * MIB
        wait_until(lambda: staged(agent) == [], timeout=5)
        result = client.data.push(tree, "abandoned")  # all sent again, the version whole
        assert result.chunks_sent == result.chunks
    assert tree_digest(agent.home / "datasets" / "abandoned" / "v1") == tree_digest(tree)
    assert os.listdir(agent.home / "blobs" / ".staged") != []  # this boot's (empty) dir


def test_a_version_a_crash_left_without_its_record_is_made_again_or_collected(make_agent, tmp_path):
    """A push killed between renaming a version's tree into place and writing its record
    (or a removal killed between the two) leaves `vN/` without `vN.json`: no version, which
    the next push of the name makes again (it was refused for good, the number's directory
    being taken), and which garbage collection removes where no push comes."""
    agent = make_agent(args=EAGER)
    tree = make_tree(tmp_path / "ds", seed=8)
    first = tree_digest(tree)
    folder = agent.home / "datasets" / "cut"
    with agent.client() as client:
        client.data.push(tree, "cut")
        (tree / "labels.csv").write_text("id,label\n0,3\n")
        age(tree / "labels.csv")
        assert client.data.push(tree, "cut").info.version == 2
    kill_agent_hard(agent)
    (folder / "v2.json").unlink()  # the state such a crash leaves (its record not written,
    (folder / "last-version").write_text("1")  # nor the number it took, after it)
    agent.start()
    with agent.client() as client:
        assert [v.version for v in client.data.versions("cut")] == [1]
        again = client.data.push(tree, "cut")
        assert (again.info.version, again.info.new) == (2, True)
    assert tree_digest(folder / "v2") == tree_digest(tree)
    kill_agent_hard(agent)
    (folder / "v2.json").unlink()
    agent.start()
    with agent.client() as client:
        assert client.gc().freed["temp"].bytes > 0
        assert [v.version for v in client.data.versions("cut")] == [1]
    assert not (folder / "v2").exists()
    assert tree_digest(folder / "v1") == first


def test_a_run_with_a_bad_chunk_is_refused_and_leaves_nothing(make_agent):
    """Chunks flagged as parts of a file, one of them not what its digest says: the upload
    answers 400 naming it, what came before it in the run is kept (a retry sends only the
    rest), and a run of nothing whole leaves no file."""
    agent = make_agent()
    good, bad = os.urandom(100_000), os.urandom(100_000)
    good_digest = hashlib.sha256(good).hexdigest()
    lie = hashlib.sha256(b"something else").hexdigest()

    def frame(digest: str, data: bytes, flags: int) -> bytes:
        return CHUNK_HEADER.pack(bytes.fromhex(digest), len(data), len(data), flags) + data

    with raw_http(agent) as http:
        r = http.post("/v1/chunks/upload", content=frame(lie, bad, PART))
        assert r.status_code == 400 and r.json()["code"] == "bad_blob", r.text
        assert lie in r.json()["message"]
        assert staged(agent) == []
        body = frame(good_digest, good, PART) + frame(lie, bad, PART | CONT)
        r = http.post("/v1/chunks/upload", content=body)
        assert r.status_code == 400 and lie in r.json()["message"]
        missing = http.post("/v1/chunks/missing", json={"digests": [good_digest, lie]})
        assert missing.json()["missing"] == [lie]
        # CONT without PART (a whole file's chunk, to the blob store): checked the same.
        r = http.post("/v1/chunks/upload", content=frame(lie, bad, CONT))
        assert r.status_code == 400
        assert not [p for p in (agent.home / "blobs").rglob("*") if p.name == lie]
