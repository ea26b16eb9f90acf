"""The object cache's large objects, named before they are hashed (`ObjectCache`: "Hashed
later"), on a real file system: what the cache counts before and after, and the one copy
that two objects of the same bytes come to, also where a job's view holds them."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.objectcache import Keep, ObjectCache
from gpuhop.agent.storage.objectdownloads import LATER_BYTES, Listed, ObjectId

SIZE = LATER_BYTES + 4096


def _cache(tmp_path: Path) -> ObjectCache:
    for folder in ("tmp", "blobs"):  # as the agent makes them
        (tmp_path / folder).mkdir(exist_ok=True)
    blobs = BlobStore(tmp_path / "blobs", tmp_path / "tmp")
    return ObjectCache(tmp_path / "objects", tmp_path / "objects.db", blobs)


def _fetched(cache: ObjectCache, user: str, key: str, data: bytes) -> ObjectId:
    """`data` downloaded as object `key` (no hash given, as a read in parts gives none)."""
    oid = ObjectId("http://s3", "bucket", key, hashlib.md5(data).hexdigest(), len(data))
    part = cache.downloads.partial(user, oid)
    part.write_bytes(data)
    cache.downloads.commit(user, oid, part)
    return oid


def test_two_objects_of_the_same_bytes_count_twice_until_hashed_then_once(tmp_path: Path):
    data = os.urandom(SIZE)
    cache = _cache(tmp_path)
    try:
        # Hashed only while no download writes: one held open keeps both unhashed here.
        held = ObjectId("http://s3", "bucket", "held", "0" * 32, 1)
        claim = cache.downloads.claim("alice", held)
        assert claim is not None and claim.mine
        one = _fetched(cache, "alice", "one.bin", data)
        two = _fetched(cache, "bob", "two.bin", data)
        cache.downloads.flush()  # named: their files are there for a job
        assert cache.path("alice", one).read_bytes() == data
        assert cache.size() == 2 * SIZE and cache.shas() == set()
        view = cache.make_view("bob", [Listed("d/two.bin", two)], "v")
        assert not cache.hashed_all(0.8)  # (longer than the idle check's wait)
        cache.downloads.release("alice", held)
        assert cache.hashed_all(30)
        sha = hashlib.sha256(data).hexdigest()
        assert cache.shas() == {sha} and cache.size() == SIZE
        # One file: the blob, each user's by-id name, and bob's view of it.
        blob = tmp_path / "blobs" / sha[:2] / sha
        names = [cache.path("alice", one), cache.path("bob", two), view / "d/two.bin"]
        assert all(p.samefile(blob) for p in names) and blob.stat().st_nlink == 4
        assert (view / "d/two.bin").read_bytes() == data
    finally:
        cache.close()
    # Evicted with nothing kept, the bytes go with the last name.
    again = _cache(tmp_path)
    try:
        assert again.hashed_all(5) and again.size() == SIZE
        again.collect(Keep(set(), set()), unused_since=float("inf"), blob_users=set)
        assert again.size() == 0 and not blob.exists()
    finally:
        again.close()
