"""Datasets: the first push of a directory (2 GB; 200 MB with --quick, or $BENCH_DATASET_MB)
and the re-push after one 1 MB file changed, next to `rsync -a` of the same tree.

Through the SDK in-process (`client.data.push`) into a private agent on this machine, so
the transport is the agent's Unix socket: the numbers are the chunking, hashing, framing
and storing, not a network. The tree is random bytes (incompressible: compression is tried
on a sample and skipped), a few 256 MB files plus many 1 MB ones. Each first push goes to a
fresh agent, which makes the version (each file flushed to the disk) before it answers.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from harness import BenchError, Row, Settings, private_agent, quiet_disk, timed_run

NAME = "datasets"
SEED = 0
BIG = 256 * 1024 * 1024
SMALL = 1024 * 1024


def make_tree(root: Path, megabytes: int) -> int:
    """Random files adding up to about `megabytes` MB: 256 MB ones for most of it, the rest
    (at least 20) 1 MB ones. Dated an hour back. Returns the total size."""
    rng = random.Random(SEED)
    total_bytes = megabytes * 1024 * 1024
    bigs = max(0, (total_bytes - 20 * SMALL) // BIG)
    smalls = max(20, (total_bytes - bigs * BIG) // SMALL)
    (root / "shards").mkdir(parents=True)
    (root / "images").mkdir()
    past = time.time() - 3600
    for i in range(bigs):
        path = root / "shards" / f"shard-{i:03d}.bin"
        with open(path, "wb") as f:
            for _ in range(BIG // (16 * SMALL)):
                f.write(rng.randbytes(16 * SMALL))
        os.utime(path, (past, past))
    for i in range(smalls):
        path = root / "images" / f"img-{i:05d}.bin"
        path.write_bytes(rng.randbytes(SMALL))
        os.utime(path, (past, past))
    return bigs * BIG + smalls * SMALL


def run(settings: Settings) -> list[Row]:
    megabytes = int(os.environ.get("BENCH_DATASET_MB", 200 if settings.quick else 2048))
    first_pushes = settings.repeats(default=2, quick=1)
    repeats = settings.repeats(default=3, quick=2)
    # Without rsync (a bare GPU host) gpuhop's side is still measured, the other skipped.
    has_rsync = shutil.which("rsync") is not None
    uploads, rsyncs, fsyncs, repushes, rersyncs = [], [], [], [], []
    sent: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        tree = root / "tree"
        size = make_tree(tree, megabytes)
        mb = size / 1e6
        mirror = root / "mirror"
        for i in range(first_pushes if has_rsync else 0):
            quiet_disk()  # each copy and push from a disk with nothing left to flush
            rsyncs.append(mb / timed_run(["rsync", "-a", f"{tree}/", f"{mirror}/"]))
            if i < first_pushes - 1:
                shutil.rmtree(mirror)
            synced = root / "synced"  # as gpuhop stores: each file on disk before it is named
            quiet_disk()
            fsyncs.append(mb / timed_run(["rsync", "-a", "--fsync", f"{tree}/", f"{synced}/"]))
            shutil.rmtree(synced)
        rng = random.Random(SEED + 1)
        for i in range(first_pushes):
            home = root / f"agent{i}"
            with private_agent(home) as agent, agent.client() as client:
                quiet_disk()
                start = time.perf_counter()
                first = client.data.push(tree, "bench")
                uploads.append(mb / (time.perf_counter() - start))
                if first.chunks_sent != first.chunks:
                    raise BenchError("a first push to a fresh agent skipped chunks")
                if i == first_pushes - 1:
                    victims = sorted((tree / "images").iterdir())
                    for victim in victims[:repeats]:
                        victim.write_bytes(rng.randbytes(SMALL))
                        start = time.perf_counter()
                        result = client.data.push(tree, "bench")
                        repushes.append(time.perf_counter() - start)
                        sent.append((result.chunks_sent, result.bytes_sent))
                        if has_rsync:
                            rersyncs.append(timed_run(["rsync", "-a", f"{tree}/", f"{mirror}/"]))
            shutil.rmtree(home)
    chunks = ", ".join(f"{c} chunk(s) / {b / 1e6:.1f} MB" for c, b in sent)
    rows = [
        Row(
            NAME,
            f"first push, {mb:,.0f} MB directory",
            "MB/s",
            uploads,
            "rsync -a",
            rsyncs,
            "gpuhop: chunk + hash + send over the socket + check + store + flush (fresh agent"
            " each time); rsync: a local copy, not flushed",
        ),
        Row(
            NAME,
            f"first push, {mb:,.0f} MB directory",
            "MB/s",
            uploads,
            "rsync -a --fsync",
            fsyncs,
            "like for like: every file flushed to disk before the copy ends (gpuhop: each"
            " byte written once, a file of several chunks being its chunks as they arrived)",
        ),
        Row(
            NAME,
            "re-push after one 1 MB file changed",
            "s",
            repushes,
            "rsync -a",
            rersyncs,
            f"gpuhop: stat every file, chunk 1, send the new chunks ({chunks}), assemble the"
            " new version (unchanged files: hard links to the previous one)",
        ),
    ]
    if not has_rsync:
        for row in rows:
            row.alternative, row.note = None, f"skipped: rsync is not installed; {row.note}"
    return rows
