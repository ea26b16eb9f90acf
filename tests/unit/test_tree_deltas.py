"""A tree sent as its changes from a stored one, applied by the agent's tree store on real
files: the tree it makes is byte for byte the one the client names (the client's own
`tree_of`), from memory or from the parent's file, and a delta that is wrong in any way is
refused with a message naming what, leaving nothing stored."""

from __future__ import annotations

import hashlib
import json
import marshal
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.treefile import TreeFileError
from gpuhop.agent.storage.trees import MissingBlobs, MissingTree, TreeError, TreeStore
from gpuhop.api.models import TreeDelta
from gpuhop.api.trees import tree_bytes
from gpuhop.client.submitted import tree_of
from gpuhop.client.sync.trees import LastTree
from gpuhop.client.sync.workdir import FileEntry
from tests.unit.test_trees import put, store


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    for d in ("blobs", "tmp", "trees"):
        (tmp_path / d).mkdir()
    return BlobStore(tmp_path / "blobs", tmp_path / "tmp")


@pytest.fixture
def trees(tmp_path: Path, blobs: BlobStore) -> TreeStore:
    return TreeStore(tmp_path / "trees", tmp_path / "tmp", blobs)


FILES = {f"d/{i}.txt": f"file {i}".encode() for i in range(20)} | {"run.sh": b"#!/bin/sh\n"}


def entries_of(blobs, files: dict[str, bytes], executable=("run.sh",)) -> list[FileEntry]:
    return sorted(
        (
            FileEntry(path, "", len(data), put(blobs, data), path in executable)
            for path, data in files.items()
        ),
        key=lambda f: f.path,
    )


def stored_parent(trees, blobs) -> tuple[str, list[FileEntry]]:
    files = entries_of(blobs, FILES)
    raw, digest = tree_of(files)
    assert store(trees, raw)[0] == digest
    return digest, files


def delta(parent: str, files: list[FileEntry], changed=(), removed=()) -> TreeDelta:
    return TreeDelta.model_validate(
        {
            "parent": parent,
            "digest": tree_of(files)[1],
            "changed": [
                {"path": f.path, "digest": f.digest, "size": f.size, "executable": f.executable}
                for f in changed
            ],
            "removed": list(removed),
        }
    )


def test_an_edit_a_rename_a_removal_and_a_mode_change_make_the_clients_tree(trees, blobs):
    parent, _ = stored_parent(trees, blobs)
    new = {**FILES, "d/3.txt": b"edited", "moved/5.txt": FILES["d/5.txt"]}
    del new["d/5.txt"], new["d/9.txt"]
    after = entries_of(blobs, new, executable=("run.sh", "d/1.txt"))
    changed = [f for f in after if f.path in ("d/3.txt", "moved/5.txt", "d/1.txt")]
    digest, summary = trees.store_delta(
        delta(parent, after, changed, ["d/5.txt", "d/9.txt"]), 1 << 20
    )
    raw, expected = tree_of(after)
    assert digest == expected
    assert trees.path(digest).read_bytes() == raw
    assert summary.files == len(after) and summary.bytes == sum(f.size for f in after)
    assert sorted(summary.digests) == sorted({f.digest for f in after})


def test_a_parent_not_in_memory_is_read_from_its_file(trees, blobs, tmp_path):
    parent, _ = stored_parent(trees, blobs)
    fresh = TreeStore(tmp_path / "trees", tmp_path / "tmp", blobs)  # an agent restarted
    after = entries_of(blobs, {**FILES, "d/0.txt": b"new"})
    digest, _ = fresh.store_delta(delta(parent, after, [after[0]]), 1 << 20)
    assert fresh.path(digest).read_bytes() == tree_of(after)[0]


def test_a_delta_to_a_tree_already_stored_stores_nothing_new(trees, blobs):
    parent, files = stored_parent(trees, blobs)
    after = entries_of(blobs, {**FILES, "d/0.txt": b"new"})
    first, _ = trees.store_delta(delta(parent, after, [after[0]]), 1 << 20)
    again, _ = trees.store_delta(delta(parent, after, [after[0]]), 1 << 20)
    back, _ = trees.store_delta(delta(first, files, [files[0]]), 1 << 20)
    assert first == again and back == parent
    assert sorted(p.name for p in trees.root.iterdir()) == sorted(
        [f"{first}.json", f"{parent}.json"]
    )


@pytest.mark.parametrize(
    "change, error, words",
    [
        ({"removed": ["d/nope.txt"]}, TreeError, "d/nope.txt, which its parent tree does not"),
        ({"removed": ["d/1.txt", "d/1.txt"]}, TreeError, "removes d/1.txt twice"),
        ({"changed": ["d/1.txt", "d/1.txt"]}, TreeError, "lists d/1.txt twice"),
        ({"changed": ["d/1.txt"], "removed": ["d/1.txt"]}, TreeError, "removes and changes"),
        ({"changed": ["d/1.txt/x"]}, TreeError, "d/1.txt as both a file and a directory"),
        ({"changed": ["d"]}, TreeError, "d as both a file and a directory"),
        ({"digest": "0" * 64}, TreeFileError, "not " + "0" * 64),
    ],
)
def test_a_wrong_delta_is_refused_naming_what_and_stores_nothing(
    trees,
    blobs,
    change,
    error,
    words,
):
    parent, files = stored_parent(trees, blobs)
    body = delta(parent, files).model_dump()
    digest = put(blobs, b"some content")
    body["changed"] = [
        {"path": p, "digest": digest, "size": 12, "executable": False}
        for p in change.get("changed", [])
    ]
    body["removed"] = change.get("removed", [])
    body["digest"] = change.get("digest", body["digest"])
    with pytest.raises(error, match=words):
        trees.store_delta(TreeDelta.model_validate(body), 1 << 20)
    assert [p.name for p in trees.root.iterdir()] == [f"{parent}.json"]


def test_a_delta_naming_a_blob_the_agent_lacks_is_refused_naming_it(trees, blobs):
    parent, files = stored_parent(trees, blobs)
    lacking = FileEntry("d/new.txt", "", 3, hashlib.sha256(b"new").hexdigest(), False)
    after = sorted([*files, lacking], key=lambda f: f.path)
    with pytest.raises(MissingBlobs) as refused:
        trees.store_delta(delta(parent, after, [lacking]), 1 << 20)
    assert refused.value.missing == [lacking.digest]
    # A blob of the parent gone since (it was checked when the parent came) is named too.
    after = entries_of(blobs, {**FILES, "d/0.txt": b"new"})
    gone = files[4].digest
    assert blobs.remove(gone, untouched_since=float("inf")) is not None
    with pytest.raises(MissingBlobs) as refused:
        trees.store_delta(delta(parent, after, [after[0]]), 1 << 20)
    assert refused.value.missing == [gone]


def test_a_delta_with_its_files_inside_stores_them_only_with_its_tree(trees, blobs):
    parent, files = stored_parent(trees, blobs)
    data = b"a new file, inside the delta"
    new = FileEntry("d/new.txt", "", len(data), hashlib.sha256(data).hexdigest(), False)
    after = sorted([*files, new], key=lambda f: f.path)
    wrong = delta(parent, after, [new]).model_copy(update={"digest": "f" * 64})
    with pytest.raises(TreeFileError, match="digest: the delta against"):
        trees.store_delta(wrong, 1 << 20, {new.digest: data})
    assert blobs.missing([new.digest]) == [new.digest]
    assert not trees.has("f" * 64)
    digest, summary = trees.store_delta(delta(parent, after, [new]), 1 << 20, {new.digest: data})
    assert (digest, summary.files) == (tree_of(after)[1], len(after))
    assert blobs.path(new.digest).read_bytes() == data


def test_a_delta_against_a_tree_not_stored_is_refused(trees, blobs):
    _, files = stored_parent(trees, blobs)
    with pytest.raises(MissingTree):
        trees.store_delta(delta("a" * 64, files, [files[0]]), 1 << 20)


def test_a_delta_whose_tree_passes_the_size_cap_is_refused(trees, blobs):
    from gpuhop.agent.storage.trees import TreeTooLarge

    parent, _ = stored_parent(trees, blobs)
    after = entries_of(blobs, {**FILES, "d/0.txt": b"new"})
    with pytest.raises(TreeTooLarge, match="leave generated or bulky files out"):
        trees.store_delta(delta(parent, after, [after[0]]), 1000)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("parent", "../x", "not a sha256 hex digest"),
        ("changed", [{"path": "../x", "digest": "0" * 64, "size": 1}], "'..'"),
        ("changed", [{"path": "/etc/passwd", "digest": "0" * 64, "size": 1}], "absolute"),
        ("changed", [{"path": "a", "digest": "0" * 64, "size": -1}], "greater than or equal"),
        ("removed", ["\ud800"], "lone surrogate"),
        ("more", 1, "Extra inputs are not permitted"),
    ],
)
def test_a_malformed_delta_is_refused_as_it_is_parsed(field, value, words):
    body = {"parent": "0" * 64, "digest": "1" * 64, field: value}
    with pytest.raises(ValidationError, match=words):
        TreeDelta.model_validate(body)


def test_a_delta_against_a_tree_too_large_to_hold_is_refused(trees, blobs, tmp_path, monkeypatch):
    """Its entries would all be held in memory: the client is asked for the whole tree."""
    parent, files = stored_parent(trees, blobs)
    monkeypatch.setattr("gpuhop.agent.storage.trees.MAX_DELTA_PARENT_FILES", 5)
    fresh = TreeStore(tmp_path / "trees", tmp_path / "tmp", blobs)
    with pytest.raises(MissingTree, match="too large to take a delta against; send the whole"):
        fresh.store_delta(delta(parent, files, [files[0]]), 1 << 20)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"gpuhop-tree-2\n" + b"a" * 10,
        b"gpuhop-tree-0\n" + b"a" * 64,
        b"gpuhop-tree-2\n" + b"A" * 64,
        b"gpuhop-tree-2\n" + b"a" * 64 + b"more",
        b"gpuhop-tree-1\n" + b"a" * 64,
    ],
)
def test_a_record_of_the_last_tree_that_is_not_one_is_no_record(tmp_path, payload):
    """The client's record is a cache: anything but what it wrote means "send it whole"."""
    record = LastTree.path_for(tmp_path, tmp_path)
    record.parent.mkdir(parents=True)
    record.write_bytes(payload)
    assert LastTree.digest_of(tmp_path, tmp_path) is None
    LastTree.save(tmp_path, tmp_path, "b" * 64)
    assert LastTree.digest_of(tmp_path, tmp_path) == "b" * 64


def test_a_record_of_the_first_format_still_names_its_tree(tmp_path):
    """A record from before (the digest, then the tree's entries) keeps deltas going."""
    record = LastTree.path_for(tmp_path, tmp_path)
    record.parent.mkdir(parents=True)
    record.write_bytes(b"gpuhop-tree-1\n" + b"c" * 64 + marshal.dumps([("p", "d" * 64, 1, True)]))
    assert LastTree.digest_of(tmp_path, tmp_path) == "c" * 64


def test_a_trees_bytes_are_its_json():
    """Both sides write a tree without json.dumps, and name it by the bytes: they must be
    json.dumps's, byte for byte, whatever the paths hold."""
    digest = hashlib.sha256(b"x").hexdigest()
    entries = [
        ("a b/ü ñ.txt", digest, 0, False),
        ('q"uote/tab\there', digest, 12, True),
        ("emoji/\U0001f600\u2028", digest, 10**12, False),
    ]
    expected = json.dumps(
        {
            "entries": [
                {"path": p, "digest": d, "size": s, "executable": x} for p, d, s, x in entries
            ]
        },
        separators=(",", ":"),
    ).encode()
    assert tree_bytes(entries) == expected
