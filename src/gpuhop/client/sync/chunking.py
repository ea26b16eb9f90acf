"""Runs on the user's machine: content-defined chunking of files, for dataset pushes.

Cut points are picked from the content itself, so an edit in the middle of a large file
changes only the chunks around it: the rest keep their digests and are not sent again.
The rolling hash is a polynomial one over a 32-byte window (Rabin-Karp modulo 2**32:
H(i) = sum of byte(i-k) * P**k, k < 32), with FastCDC's normalised chunking (a harder
mask before the normal size, an easier one after, so sizes cluster around 1 MiB). A cut
depends only on the 32 bytes before it and on the previous cut, whatever the block size.

The hash is computed in C (`_cdc.c`, built with the package by hatch_build.py and loaded
with ctypes: about 0.5 CPU-seconds per GB) where that library was built, and with numpy
otherwise (about 1.1 s per GB): both find the same candidates, so the same cut points (the
tests compare them, and pin the cut points of fixed inputs: moving them would send every
dataset again). The numpy way needs no per-byte Python loop:
`H(i) = P**i * (S(i) - S(i-32))` where `S(i) = sum of byte(j) * P**-j` for j <= i.
A file is read into one reused buffer and each chunk hashed where it lies: memory is a
few MiB per file being chunked, whatever the file's size.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

MIN_SIZE = 256 * 1024
NORMAL_SIZE = 1024 * 1024
MAX_SIZE = 4 * 1024 * 1024
BLOCK = 2 * 1024 * 1024  # read at once
SPAN = 256 * 1024  # hashed at once: a few arrays of this many uint32 fit in the cache
WINDOW = 32
# Fixed forever: changing either moves every cut point, and every dataset is sent again.
P = 0x9E3779B1
# Top bits: they depend on every byte of the window. MASK_HARD's bits include MASK_EASY's.
MASK_HARD = np.uint32(((1 << 22) - 1) << 10)
MASK_EASY = np.uint32(((1 << 18) - 1) << 14)
EASY_BELOW = np.uint32(1 << 14)  # h & MASK_EASY == 0  <=>  h < 2**14
HARD_BELOW = np.uint32(1 << 10)  # h & MASK_HARD == 0  <=>  h < 2**10
# Compress a chunk only when a sample of it shrinks by at least this much (zlib on random
# bytes costs about 45 ms per MiB here and saves nothing; a 16 KiB sample costs 0.7 ms).
SAMPLE = 16 * 1024
WORTH_IT = 0.9
RAW, ZLIB = 0, 1


@cache
def _powers() -> tuple[np.ndarray, np.ndarray]:
    """P**i and P**-i modulo 2**32 for every position of the largest span of data."""
    n = BLOCK + MAX_SIZE
    up = np.cumprod(np.full(n, P, dtype=np.uint32), dtype=np.uint32)
    down = np.cumprod(np.full(n, pow(P, -1, 1 << 32), dtype=np.uint32), dtype=np.uint32)
    return np.concatenate(([1], up[:-1])).astype(np.uint32), np.concatenate(
        ([1], down[:-1])
    ).astype(np.uint32)


@dataclass(frozen=True)
class Chunk:
    offset: int
    size: int
    digest: str


def _candidates(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions i >= WINDOW-1 of `data` (the last byte of a would-be chunk) whose hash
    matches the hard mask, and those that match the easy one: in C where it was built."""
    native = _native()
    if native is None:
        return _numpy_candidates(data)
    return _native_candidates(native, data)


# The C function: (data, length, easy_below, hard_below, out) -> how many written to out.
_Native = Callable[[int, int, int, int, int], int]
LIBRARY = "_cdc_native.so"  # next to this file; not an importable module's name


@cache
def _native() -> _Native | None:
    """The C chunker, or None where it was not built (the numpy code does the same)."""
    try:
        lib = ctypes.CDLL(str(Path(__file__).with_name(LIBRARY)))
    except OSError:
        return None
    fn = lib.gpuhop_cdc_candidates
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_uint32]
    fn.argtypes += [ctypes.c_void_p]
    native: _Native = fn
    return native


def _native_candidates(native: _Native, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    data = np.ascontiguousarray(data, dtype=np.uint8)
    # Room for every position (all of them match in a run of zeros); pages never written
    # are never touched.
    out = np.empty(max(len(data), 1), dtype=np.int64)
    count = native(data.ctypes.data, len(data), int(EASY_BELOW), int(HARD_BELOW), out.ctypes.data)
    found = out[:count]
    easy = found >> 1
    return easy[(found & 1) == 1], easy


def _numpy_candidates(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_candidates` with numpy. Computed a span at a time (each with the WINDOW-1 bytes
    before it), so that the arrays of one step stay in the CPU's cache: twice as fast as
    the whole block at once, with the same result (a window's hash depends on its bytes
    only)."""
    hard, easy = [], []
    for start in range(0, len(data) - WINDOW + 1, SPAN):
        h, e = _span_candidates(data[start : start + SPAN + WINDOW - 1])
        hard.append(h + start)
        easy.append(e + start)
    if not hard:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate(hard), np.concatenate(easy)


def _span_candidates(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(data)
    up, down = _powers()
    s = np.multiply(data, down[:n], dtype=np.uint32)
    np.cumsum(s, out=s)
    # h[k]: the window ending at position k + WINDOW - 1 (S(-1) = 0 for the first one).
    h = np.empty(n - WINDOW + 1, dtype=np.uint32)
    h[0] = s[WINDOW - 1]
    np.subtract(s[WINDOW:], s[:-WINDOW], out=h[1:])
    np.multiply(h, up[WINDOW - 1 : n], out=h)
    # The masks are top bits: a hash has none of them set exactly when it is below their
    # lowest one, so one comparison does the masking and the test in one pass.
    easy = np.flatnonzero(h < EASY_BELOW)
    hard = easy[h[easy] < HARD_BELOW]
    return hard + (WINDOW - 1), easy + (WINDOW - 1)


def cut_points(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, data) for each chunk of a file, in order, reading it block by block."""
    with open(path, "rb", buffering=0) as f:
        for offset, view in _cuts(f):
            yield offset, bytes(view)


def _cuts(f: io.FileIO) -> Iterator[tuple[int, memoryview]]:
    """(offset, bytes) of each chunk of an open file, the bytes a view of the reused read
    buffer: valid until the next step.

    Each byte is hashed once: the candidates of a block are kept (as file offsets) until
    the cuts have passed them. A block is hashed with the WINDOW-1 bytes before it where
    they are still in the buffer; where a cut came first they are not, and the positions
    that would need them lie within WINDOW of that cut, where no next cut can be."""
    no_cuts = np.empty(0, dtype=np.int64)
    buf = bytearray(2 * MAX_SIZE + 2 * BLOCK)
    view = memoryview(buf)
    array = np.frombuffer(buf, dtype=np.uint8)
    lo = hi = 0  # buf[lo:hi]: the bytes after the last cut, not yet yielded
    start = 0  # the file offset of buf[lo]
    hard, easy = no_cuts, no_cuts
    while True:
        if len(buf) - hi < BLOCK:  # move what is left to the front (under MAX_SIZE bytes)
            array[: hi - lo] = array[lo:hi]  # numpy copies overlapping ranges right
            hi -= lo
            lo = 0
        read = f.readinto(view[hi : hi + BLOCK])
        if read:
            first = max(lo, hi - (WINDOW - 1))
            if hi + read - first >= WINDOW:
                h, e = _candidates(array[first : hi + read])
                base = start + first - lo
                hard = np.concatenate((hard, h + base))
                easy = np.concatenate((easy, e + base))
            hi += read
        # A cut needs at most MAX_SIZE bytes after the chunk's start; with fewer, and more
        # to come, it could still move.
        while hi > lo and (hi - lo >= MAX_SIZE or not read):
            end = _next_cut(start, start + hi - lo, hard, easy)
            yield start, view[lo : lo + end - start]
            lo += end - start
            start = end
            hard = hard[np.searchsorted(hard, start) :]
            easy = easy[np.searchsorted(easy, start) :]
        if not read:
            return


def _next_cut(start: int, limit: int, hard: np.ndarray, easy: np.ndarray) -> int:
    """The end (exclusive) of the chunk that starts at `start`."""
    if limit - start <= MIN_SIZE:
        return limit
    normal = min(start + NORMAL_SIZE, limit)
    i = np.searchsorted(hard, start + MIN_SIZE - 1)
    if i < len(hard) and hard[i] < normal - 1:
        return int(hard[i]) + 1
    top = min(start + MAX_SIZE, limit)
    j = np.searchsorted(easy, normal - 1)
    if j < len(easy) and easy[j] < top - 1:
        return int(easy[j]) + 1
    return top


def chunk_file(path: str | os.PathLike[str]) -> list[Chunk]:
    """The chunks of a file with their sha256 digests (the file is read once, in blocks,
    and each chunk hashed in the read buffer, not copied)."""
    with open(path, "rb", buffering=0) as f:
        return [
            Chunk(offset, len(data), hashlib.sha256(data).hexdigest()) for offset, data in _cuts(f)
        ]


def encode(data: bytes) -> tuple[int, bytes]:
    """(encoding, payload) for the wire: zlib where a sample shows it pays, else raw."""
    if len(data) > 4 * SAMPLE:
        sample = data[: SAMPLE // 2] + data[len(data) // 2 : len(data) // 2 + SAMPLE // 2]
        if len(zlib.compress(sample, 1)) > WORTH_IT * len(sample):
            return RAW, data
    packed = zlib.compress(data, 1)
    if len(packed) > WORTH_IT * len(data):
        return RAW, data
    return ZLIB, packed
