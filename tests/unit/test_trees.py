"""The agent's tree store and checkouts on real files: a re-sync checks only what changed
since the last tree, yet refuses a bad entry or a missing blob exactly as a first sync does;
a checkout is built once and reuses the unchanged files of the one before."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from gpuhop.agent.jobs.workdirs import materialise
from gpuhop.agent.storage import checkouts as checkouts_module
from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.checkouts import CheckoutStore
from gpuhop.agent.storage.treefile import TreeFileError
from gpuhop.agent.storage.trees import MissingBlobs, TreeError, TreeStore, TreeSummary
from gpuhop.api import ManifestEntry
from gpuhop.home import JobPaths


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    for d in ("blobs", "tmp", "trees"):
        (tmp_path / d).mkdir()
    return BlobStore(tmp_path / "blobs", tmp_path / "tmp")


@pytest.fixture
def trees(tmp_path: Path, blobs: BlobStore) -> TreeStore:
    return TreeStore(tmp_path / "trees", tmp_path / "tmp", blobs)


def put(blobs: BlobStore, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    blobs.put(digest, data)
    return digest


def tree(blobs: BlobStore, files: dict[str, bytes]) -> list[dict]:
    return [
        {"path": path, "digest": put(blobs, data), "size": len(data), "executable": False}
        for path, data in files.items()
    ]


def raw(entries: list[dict]) -> bytes:
    return json.dumps({"entries": entries}).encode()


def store(trees: TreeStore, body: bytes) -> tuple[str, TreeSummary]:
    """Store a tree as the agent does: arrived in a temp file, checked an entry at a time."""
    upload = trees.receive(len(body) + 1)
    try:
        upload.write(body)
        return trees.store(upload)
    finally:
        upload.close()


def stored_entries(trees: TreeStore, digest: str) -> list[ManifestEntry]:
    return [ManifestEntry.model_validate(e) for e in trees.entries(digest)]


FILES = {f"d/{i}.txt": f"file {i}".encode() for i in range(20)}


def test_a_re_sync_with_one_bad_entry_is_refused_as_a_first_sync_would_be(trees, blobs):
    entries = tree(blobs, FILES)
    store(trees, raw(entries))
    for bad, error in [
        ({**entries[3], "path": "../escape.txt"}, TreeFileError),
        ({**entries[3], "path": "/etc/passwd"}, TreeFileError),
        ({**entries[3], "digest": "not-a-digest"}, TreeFileError),
        ({**entries[3], "size": -1}, TreeFileError),
        ({**entries[3], "extra": 1}, TreeFileError),
        ({**entries[3], "path": "d/4.txt"}, TreeError),  # twice
        ({**entries[3], "path": "d/4.txt/x"}, TreeError),  # a file and a directory
    ]:
        changed = [*entries[:3], bad, *entries[4:]]
        with pytest.raises(error):
            store(trees, raw(changed))
    # Unknown top-level fields, and entries that are not objects, are refused too.
    with pytest.raises(TreeFileError):
        store(trees, json.dumps({"entries": entries, "more": 1}).encode())
    with pytest.raises(TreeFileError):
        store(trees, json.dumps({"entries": [*entries, "d/x.txt"]}).encode())


def test_a_re_sync_names_a_blob_that_is_gone_since_the_last_tree(trees, blobs, tmp_path):
    entries = tree(blobs, FILES)
    store(trees, raw(entries))
    gone = entries[5]["digest"]
    assert blobs.remove(gone, untouched_since=float("inf")) is not None
    with pytest.raises(MissingBlobs) as refused:
        store(trees, raw(entries))
    assert refused.value.missing == [gone]


def test_a_re_sync_with_one_changed_file_stores_the_new_tree(trees, blobs):
    entries = tree(blobs, FILES)
    first, _ = store(trees, raw(entries))
    entries[7] = tree(blobs, {"d/7.txt": b"edited"})[0]
    second, stored = store(trees, raw(entries))
    assert second != first
    assert stored.files == len(FILES)
    assert [e["path"] for e in trees.entries(second)] == list(FILES)
    assert list(trees.entries(second))[7]["digest"] == hashlib.sha256(b"edited").hexdigest()


def test_a_checkout_is_built_once_and_the_next_links_its_unchanged_files(trees, blobs, tmp_path):
    checkouts = CheckoutStore(tmp_path / "checkouts", tmp_path / "tmp", blobs)
    entries = tree(blobs, FILES)
    entries[0]["executable"] = True
    first_digest, _ = store(trees, raw(entries))
    one = checkouts.ensure(first_digest, lambda: stored_entries(trees, first_digest))
    assert checkouts.ensure(first_digest, lambda: stored_entries(trees, first_digest)) == one
    assert (one / "d/0.txt").stat().st_mode & 0o777 == 0o755
    assert (one / "d/1.txt").stat().st_mode & 0o777 == 0o644

    entries[1] = tree(blobs, {"d/1.txt": b"edited"})[0]
    entries[0]["executable"] = False
    second_digest, _ = store(trees, raw(entries))
    two = checkouts.ensure(second_digest, lambda: stored_entries(trees, second_digest))
    assert (two / "d/1.txt").read_bytes() == b"edited"
    assert (one / "d/1.txt").read_bytes() == b"file 1"
    # Changed content or mode: a new file. Unchanged: the same file, linked.
    for name in ("d/0.txt", "d/1.txt"):
        assert os.stat(one / name).st_ino != os.stat(two / name).st_ino
    assert (two / "d/0.txt").stat().st_mode & 0o777 == 0o644
    assert os.stat(one / "d/2.txt").st_ino == os.stat(two / "d/2.txt").st_ino
    # The stored blobs are never part of a checkout.
    assert os.stat(blobs.path(entries[2]["digest"])).st_nlink == 1

    checkouts.remove(first_digest)
    assert not one.exists() and checkouts.digests() == [second_digest]
    assert (two / "d/2.txt").read_bytes() == b"file 2"


def test_a_checkout_reads_its_tree_once_and_remembers_only_small_ones(
    trees, blobs, tmp_path, monkeypatch
):
    """The entries arrive as a stream (read once, never held whole); a tree of more than
    REMEMBER_ENTRIES files is built in full but not kept for the next build's links."""
    monkeypatch.setattr(checkouts_module, "REMEMBER_ENTRIES", 3)
    checkouts = CheckoutStore(tmp_path / "checkouts", tmp_path / "tmp", blobs)
    nested = {f"a/b{i % 2}/c/{i}.txt": b"file %d" % i for i in range(4)}
    big_digest, _ = store(trees, raw(tree(blobs, nested)))
    reads = []

    def once():
        reads.append(1)
        yield from stored_entries(trees, big_digest)

    big = checkouts.ensure(big_digest, once)
    assert reads == [1]
    assert {str(p.relative_to(big)) for p in big.rglob("*.txt")} == set(nested)
    assert (big / "a/b1/c/3.txt").read_bytes() == b"file 3"
    small = dict(list(nested.items())[:2])
    small_digest, _ = store(trees, raw(tree(blobs, small)))
    two = checkouts.ensure(small_digest, lambda: iter(stored_entries(trees, small_digest)))
    name = next(iter(small))
    assert os.stat(big / name).st_ino != os.stat(two / name).st_ino  # big: not remembered
    third = {**small, "new.txt": b"new"}
    third_digest, _ = store(trees, raw(tree(blobs, third)))
    three = checkouts.ensure(third_digest, lambda: iter(stored_entries(trees, third_digest)))
    assert os.stat(two / name).st_ino == os.stat(three / name).st_ino  # small: linked


def test_a_checkout_that_fails_half_way_leaves_nothing(trees, blobs, tmp_path):
    checkouts = CheckoutStore(tmp_path / "checkouts", tmp_path / "tmp", blobs)
    entries = [ManifestEntry(path="a.txt", digest="0" * 64, size=1)]  # never uploaded
    with pytest.raises(FileNotFoundError):
        checkouts.ensure("1" * 64, lambda: entries)
    assert checkouts.digests() == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_job_finds_its_checkout_by_the_digest_recorded_at_submit_or_by_its_copy(
    trees, blobs, tmp_path
):
    checkouts = CheckoutStore(tmp_path / "checkouts", tmp_path / "tmp", blobs)
    digest, _ = store(trees, raw(tree(blobs, FILES)))
    recorded, older = (JobPaths(tmp_path / "jobs" / name) for name in ("recorded", "older"))
    for jp in (recorded, older):
        jp.root.mkdir(parents=True)
        jp.tree.write_bytes(trees.path(digest).read_bytes())

    # A job stored by this agent names its tree; one from an older agent (no digest in its
    # row) gets the same checkout by hashing its copy of the tree.
    view = materialise(recorded, blobs, checkouts, None, digest)
    assert view == checkouts.path(digest)
    assert (view / "d/3.txt").read_bytes() == b"file 3"
    assert materialise(older, blobs, checkouts, None, None) == view
    assert checkouts.digests() == [digest]
    # Where the backend has no overlay, the job gets a copy of its files and no view.
    copied = JobPaths(tmp_path / "jobs" / "copied")
    copied.root.mkdir()
    copied.tree.write_bytes(trees.path(digest).read_bytes())
    assert materialise(copied, blobs, checkouts, "no overlay here", digest) is None
    assert (copied.work / "d/3.txt").read_bytes() == b"file 3"


def test_a_retry_finds_the_copy_of_its_files_as_the_earlier_attempt_left_it(trees, blobs, tmp_path):
    checkouts = CheckoutStore(tmp_path / "checkouts", tmp_path / "tmp", blobs)
    digest, _ = store(trees, raw(tree(blobs, FILES)))
    jp = JobPaths(tmp_path / "jobs" / "retried")
    jp.root.mkdir(parents=True)
    jp.tree.write_bytes(trees.path(digest).read_bytes())
    assert materialise(jp, blobs, checkouts, "no overlay here", digest) is None
    made = jp.materialised.stat().st_mtime_ns
    # The first attempt changes a file of its tree, removes one and writes its own.
    (jp.work / "d/3.txt").write_bytes(b"changed")
    removed = next(p for p in jp.work.rglob("*.txt") if p.name != "3.txt")
    removed.unlink()
    (jp.work / "training.csv").write_text("epoch,loss\n0,1.0\n")

    assert materialise(jp, blobs, checkouts, "no overlay here", digest) is None
    assert (jp.work / "d/3.txt").read_bytes() == b"changed"
    assert not removed.exists()
    assert (jp.work / "training.csv").read_text() == "epoch,loss\n0,1.0\n"
    # Made once: what the first attempt wrote is still newer than the making.
    assert jp.materialised.stat().st_mtime_ns == made
