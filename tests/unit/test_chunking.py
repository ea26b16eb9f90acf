"""Content-defined chunking on real files: cuts follow the content, not the offsets."""

from __future__ import annotations

import hashlib
import random
import zlib
from pathlib import Path

import numpy as np
import pytest

from gpuhop.agent.storage.blobs import BlobError
from gpuhop.agent.storage.chunks import decode
from gpuhop.client import chunking
from gpuhop.client.chunking import MAX_SIZE, MIN_SIZE, chunk_file, cut_points, encode


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def blob() -> bytes:
    return random.Random(7).randbytes(24 * 1024 * 1024)


def test_chunks_cover_the_file_within_the_size_bounds(tmp_path, blob):
    path = write(tmp_path / "f", blob)
    pieces = list(cut_points(path))
    assert b"".join(data for _, data in pieces) == blob
    assert [offset for offset, _ in pieces] == list(
        np.cumsum([0] + [len(d) for _, d in pieces[:-1]])
    )
    assert all(MIN_SIZE <= len(d) <= MAX_SIZE for _, d in pieces[:-1])
    assert 8 <= len(pieces) <= 48  # about 1 MiB each
    chunks = chunk_file(path)
    assert [c.digest for c in chunks] == [hashlib.sha256(d).hexdigest() for _, d in pieces]


def test_an_edit_or_an_insertion_changes_only_nearby_chunks(tmp_path, blob):
    before = {c.digest for c in chunk_file(write(tmp_path / "a", blob))}
    edited = bytearray(blob)
    edited[12_000_000:12_000_100] = b"x" * 100
    inserted = blob[:5_000_000] + b"a few new bytes" + blob[5_000_000:]
    for variant in (bytes(edited), inserted):
        after = chunk_file(write(tmp_path / "b", variant))
        assert 1 <= sum(c.digest not in before for c in after) <= 2


def test_cuts_do_not_depend_on_the_read_block_size(tmp_path, blob, monkeypatch):
    path = write(tmp_path / "f", blob)
    expected = chunk_file(path)
    monkeypatch.setattr(chunking, "BLOCK", 300_001)
    assert chunk_file(path) == expected


def test_small_and_empty_files(tmp_path):
    assert chunk_file(write(tmp_path / "empty", b"")) == []
    (only,) = chunk_file(write(tmp_path / "small", b"hello"))
    assert (only.offset, only.size) == (0, 5)


def test_compression_only_where_it_pays(blob):
    noise = blob[: 1 << 20]
    assert encode(noise) == (chunking.RAW, noise)
    text = b"epoch,loss,accuracy\n" * 50_000
    encoding, payload = encode(text)
    assert encoding == chunking.ZLIB and len(payload) < len(text) // 10
    assert decode(encoding, payload, len(text), "d") == text


def test_decoding_refuses_lies_and_bombs():
    bomb = zlib.compress(b"\0" * (64 << 20))
    with pytest.raises(BlobError, match="does not end"):
        decode(chunking.ZLIB, bomb, 1 << 20, "d")
    with pytest.raises(BlobError, match="bad zlib"):
        decode(chunking.ZLIB, b"not zlib", 10, "d")
    with pytest.raises(BlobError, match="header says"):
        decode(chunking.RAW, b"abc", 4, "d")
