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
from gpuhop.client.sync import chunking
from gpuhop.client.sync.chunking import MAX_SIZE, MIN_SIZE, chunk_file, cut_points, encode


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


def fixed_inputs() -> list[bytes]:
    rng = random.Random(11)
    return [
        *(rng.randbytes(n) for n in (0, 5, 31, 32, 33, 34, 35, 36, 100, 4097, 3_000_007)),
        bytes(100_000),  # every position matches: the hash of zeros is 0
        bytes(rng.choice(b"ab") for _ in range(300_000)),
        b"abc" * 50_000,
    ]


def test_the_c_chunker_finds_what_the_numpy_one_finds():
    native = chunking._native()
    assert native is not None, "the C chunker was not built (scripts/setup-venv builds it)"
    for data in fixed_inputs():
        array = np.frombuffer(data, dtype=np.uint8)
        c_hard, c_easy = chunking._native_candidates(native, array)
        np_hard, np_easy = chunking._numpy_candidates(array)
        assert np.array_equal(c_hard, np_hard), len(data)
        assert np.array_equal(c_easy, np_easy), len(data)


# Cut points of fixed inputs, as the numpy chunker made them before the C one came: a
# dataset pushed then is not sent again. They must never move.
RANDOM_SIZES = [1168813, 1204913, 1084162, 1137934, 1172221, 1096599, 1127904, 888487]
RANDOM_SIZES += [1234672, 1156572, 1048356, 262279]
RANDOM_DIGESTS = "687259ae26067519b8101006938305cf46127bcc2eb847f4f0f2f633dff61526"
LOW_ENTROPY_SIZES = [1120660, 1349491, 675609, *[262144] * 7, 262112]


@pytest.mark.parametrize("implementation", ["c", "numpy"])
def test_cut_points_of_fixed_inputs_never_move(tmp_path, monkeypatch, implementation):
    if implementation == "numpy":
        monkeypatch.setattr(chunking, "_native", lambda: None)
    else:
        assert chunking._native() is not None
    chunks = chunk_file(write(tmp_path / "random", random.Random(17).randbytes(12 << 20)))
    assert [c.size for c in chunks] == RANDOM_SIZES
    joined = "".join(c.digest for c in chunks).encode()
    assert hashlib.sha256(joined).hexdigest() == RANDOM_DIGESTS
    rng = random.Random(3)
    low = bytes(rng.choice(b"ab") for _ in range(3 << 20)) + bytes(2 << 20)
    assert [c.size for c in chunk_file(write(tmp_path / "low", low))] == LOW_ENTROPY_SIZES


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
