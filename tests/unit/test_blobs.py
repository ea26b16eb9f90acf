"""The agent's blob store fed real framed upload streams, split at awkward chunk boundaries."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuhop.agent.storage import settle
from gpuhop.agent.storage.blobs import BlobError, BlobStore
from gpuhop.api.framing import FRAME_HEADER
from gpuhop.client.sync.upload import body_size, frames
from gpuhop.client.sync.workdir import FileEntry
from tests.conftest import wait_until


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def frame(data: bytes, claimed: bytes | None = None) -> bytes:
    """One blob as it travels: header (raw sha256, size), then the content."""
    raw = hashlib.sha256(data if claimed is None else claimed).digest()
    return FRAME_HEADER.pack(raw, len(data)) + data


async def chunked(stream: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(stream), size):
        yield stream[i : i + size]


def receive(store: BlobStore, stream: bytes, chunk_size: int = 65536) -> tuple[int, int]:
    return asyncio.run(store.receive(chunked(stream, chunk_size)))


def files_under(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    (tmp_path / "blobs").mkdir()
    (tmp_path / "tmp").mkdir()
    return BlobStore(tmp_path / "blobs", tmp_path / "tmp")


BLOBS = [b"hello world\n", b"", bytes(range(256)) * 300, b"x"]


@pytest.mark.parametrize("chunk_size", [1, 7, FRAME_HEADER.size - 1, FRAME_HEADER.size + 1, 4096])
def test_several_blobs_in_one_stream_at_any_chunking(store: BlobStore, chunk_size: int):
    stream = b"".join(frame(b) for b in BLOBS)

    stored, total = receive(store, stream, chunk_size)

    assert (stored, total) == (len(BLOBS), sum(len(b) for b in BLOBS))
    for data in BLOBS:
        assert store.has(digest_of(data))
        assert store.path(digest_of(data)).read_bytes() == data
    assert len(files_under(store.root)) == len(BLOBS)
    assert files_under(store.tmp) == []


def test_stored_blobs_are_read_only_and_named_by_digest(store: BlobStore):
    data = b"some content"
    receive(store, frame(data))

    path = store.path(digest_of(data))
    assert path == store.root / digest_of(data)[:2] / digest_of(data)
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_blob_whose_content_does_not_match_its_digest_is_rejected(store: BlobStore):
    good, bad, after = b"first, fine", b"tampered", b"never reached"
    stream = frame(good) + frame(bad, claimed=b"original") + frame(after)

    with pytest.raises(BlobError, match=digest_of(b"original")):
        receive(store, stream, chunk_size=5)

    # What completed before the bad blob stays, so a retry uploads only the rest.
    assert files_under(store.root) == [store.path(digest_of(good))]
    assert not store.has(digest_of(b"original"))
    assert not store.has(digest_of(bad))
    assert files_under(store.tmp) == []


FIRST, SECOND = b"complete", b"0123456789"


@pytest.mark.parametrize(
    "stream",
    [
        frame(FIRST) + frame(SECOND)[:-1],
        frame(FIRST) + frame(SECOND)[: FRAME_HEADER.size],
        frame(FIRST) + frame(SECOND)[: FRAME_HEADER.size - 10],
    ],
    ids=["inside-content", "after-header", "inside-header"],
)
def test_truncated_stream_is_rejected_and_leaves_nothing_half_written(
    store: BlobStore, stream: bytes
):
    with pytest.raises(BlobError, match="upload ended inside"):
        receive(store, stream, chunk_size=3)

    assert files_under(store.root) == [store.path(digest_of(FIRST))]
    assert files_under(store.tmp) == []


def test_blob_over_the_size_limit_is_refused_before_it_is_written(tmp_path: Path):
    for d in ("blobs", "tmp"):
        (tmp_path / d).mkdir()
    store = BlobStore(tmp_path / "blobs", tmp_path / "tmp", max_blob_size=10)

    with pytest.raises(BlobError, match="over the limit"):
        receive(store, frame(b"small") + frame(b"x" * 11))

    assert store.has(digest_of(b"small"))
    assert not store.has(digest_of(b"x" * 11))
    assert files_under(store.tmp) == []


def test_uploading_a_blob_again_keeps_the_stored_one(store: BlobStore):
    data = b"same bytes"
    receive(store, frame(data))
    path = store.path(digest_of(data))
    inode = path.stat().st_ino

    receive(store, frame(data), chunk_size=2)

    assert path.stat().st_ino == inode
    assert path.read_bytes() == data
    assert files_under(store.tmp) == []


def test_upload_that_breaks_off_mid_blob_leaves_no_temp_file(store: BlobStore):
    async def breaks_off() -> AsyncIterator[bytes]:
        yield frame(b"a blob of some length")[: FRAME_HEADER.size + 4]
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        asyncio.run(store.receive(breaks_off()))

    assert files_under(store.tmp) == []


# -- missing() and copy_to() --------------------------------------------------------------------


def test_missing_lists_unknown_digests_once_in_order(store: BlobStore):
    have = b"stored"
    receive(store, frame(have))
    a, b = digest_of(b"a"), digest_of(b"b")

    assert store.missing([b, digest_of(have), a, b, a]) == [b, a]
    assert store.missing([digest_of(have)]) == []
    assert store.missing([]) == []


def test_missing_refuses_something_that_is_not_a_digest(store: BlobStore):
    with pytest.raises(BlobError, match="not a sha256"):
        store.missing(["../../etc/passwd"])


def upload(store: BlobStore, data: bytes) -> str:
    receive(store, frame(data))
    return digest_of(data)


@pytest.mark.parametrize(("executable", "mode"), [(False, 0o644), (True, 0o755)])
def test_copy_to_gives_a_writable_copy_and_leaves_the_blob_alone(
    store: BlobStore, tmp_path: Path, executable: bool, mode: int
):
    data = b"original content"
    digest = upload(store, data)
    dest = tmp_path / "work" / "file.py"
    dest.parent.mkdir()

    store.copy_to(digest, dest, executable=executable)

    assert dest.read_bytes() == data
    assert stat.S_IMODE(dest.stat().st_mode) == mode
    with open(dest, "ab") as f:
        f.write(b" + changed by the job")
    assert dest.read_bytes() == data + b" + changed by the job"
    blob = store.path(digest)
    assert blob.read_bytes() == data
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest
    assert stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert not os.path.samefile(blob, dest)


def test_copy_to_of_an_unknown_blob_fails(store: BlobStore, tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        store.copy_to(digest_of(b"never uploaded"), tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def upload_body(tmp_path: Path, contents: list[bytes]) -> tuple[list[FileEntry], list[bytes]]:
    """Files on disk as the client's scan lists them, and its upload body for them."""
    files = []
    for i, data in enumerate(contents):
        path = tmp_path / f"f{i}"
        path.write_bytes(data)
        files.append(FileEntry(path.name, str(path), len(data), digest_of(data), False))
    return files, list(frames(files))


def test_the_clients_upload_body_is_stored_blob_for_blob(store, tmp_path):
    contents = [os.urandom(3 * 1024 * 1024 + 5), b"small", b"", os.urandom(700_000)]
    files, body = upload_body(tmp_path, contents)
    assert sum(map(len, body)) == body_size(files)  # what Content-Length declares
    assert receive(store, b"".join(body)) == (4, sum(map(len, contents)))
    for data in contents:
        assert store.path(digest_of(data)).read_bytes() == data


def test_a_file_that_shrank_since_it_was_hashed_keeps_the_body_length_and_is_refused(
    store, tmp_path
):
    data = os.urandom(2 * 1024 * 1024)
    (tmp_path / "src").mkdir()
    files = [FileEntry("f", str(tmp_path / "src" / "f"), len(data), digest_of(data), False)]
    (tmp_path / "src" / "f").write_bytes(data[:1000])  # cut short after the scan
    body = b"".join(frames(files))
    assert len(body) == body_size(files)
    with pytest.raises(BlobError, match="hashes to"):
        receive(store, body)
    assert files_under(store.root) == []


def test_a_blob_is_named_only_after_its_flush_and_counts_against_the_quota_meanwhile(
    store, monkeypatch
):
    flushed = threading.Event()
    monkeypatch.setattr(settle, "durable", lambda f: flushed.wait(60))  # a slow disk
    asked: list[int] = []
    store.check_quota = asked.append
    first, second = b"a" * 1000, b"b" * 300
    settling = [
        store.put_later(digest_of(first), first),
        store.put_later(digest_of(second), second),
    ]
    # Each is hashed, checked and written on a settling thread: the one asked about second
    # counts the first, not yet named, as stored.
    wait_until(lambda: len(asked) == 2)
    assert asked in ([1000, 300 + 1000], [300, 1000 + 300])
    assert not store.path(digest_of(first)).exists() and not store.has(digest_of(first))
    flushed.set()
    assert [f.result() for f in settling] == [1000, 300]
    assert store.path(digest_of(first)).read_bytes() == first
    store.put(digest_of(b"c"), b"c")
    assert asked[-1] == 1  # nothing settling any more
