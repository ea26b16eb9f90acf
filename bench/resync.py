"""Re-sync: bringing a 5,000-file, 200 MB work dir (1,000 files with --quick) up to date.

Through the SDK in-process (`Client.submit` of the program `true`), for precision: the first
submit to a fresh agent hashes and uploads everything; later submits of the unchanged tree,
and of the tree with one 50 KB file rewritten, are the re-syncs. Side by side with a local
`rsync -a SRC/ DST/` of the same tree and, for the first upload, `cp -r`. Also times each
job until `true` has ended, beside the same job in an empty work dir: the agent materialises
each tree once and each job sees it through an overlay (or copies it, where the host allows
no overlay).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import BenchError, Row, Settings, private_agent, run_checked, timed_run, wait_until

from gpuhop import Client
from gpuhop.client.sync.workdir import RACY_WINDOW_NS

NAME = "resync"
SEED = 0
CHANGED_SIZE = 50_000


def make_tree(root: Path, files: int) -> int:
    """Write `files` files of random bytes (100 B to 80 KB) into 50 directories, dated an hour
    back. Returns the total size in bytes."""
    rng = random.Random(SEED)
    subdirs = ("", "sub0", "sub1", "sub2", "sub3")
    dirs = [root / f"d{i:02d}" / sub for i in range(10) for sub in subdirs]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    past = time.time() - 3600
    total = 0
    for i in range(files):
        path = rng.choice(dirs) / f"f{i:05d}.bin"
        data = rng.randbytes(rng.randint(100, 80_000))
        path.write_bytes(data)
        os.utime(path, (past, past))
        total += len(data)
    return total


# One gpuhop sync: seconds until `submit` returned, seconds until the job ended, files hashed.
Sync = tuple[float, float, int]


@dataclass
class Resyncs:
    """The samples of one kind of re-sync; `rsync` stays empty where rsync is not installed."""

    gpuhop: list[Sync] = field(default_factory=list)
    rsync: list[float] = field(default_factory=list)


def submit_true(client: Client, tree: Path) -> Sync:
    """Submit the program `true` with `tree` as its work dir and wait until it has ended."""
    start = time.perf_counter()
    job = client.submit(["true"], workdir=tree)
    synced = time.perf_counter() - start
    # Following the log waits inside the agent; polling the job would compete with it for CPU.
    for _ in job.logs(follow=True):
        pass
    ended = time.perf_counter() - start
    if job.refresh().state.value != "succeeded":
        raise BenchError(f"job {job.id} did not succeed: {job.info.reason}")
    assert client.last_sync is not None
    return synced, ended, client.last_sync.hashed


def resync(client: Client, tree: Path, mirror: Path | None, into: Resyncs) -> None:
    """Bring the agent, and then the rsync mirror (if any), up to date with `tree`."""
    into.gpuhop.append(submit_true(client, tree))
    if mirror is not None:
        into.rsync.append(timed_run(["rsync", "-a", f"{tree}/", f"{mirror}/"]))


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=5, quick=3)
    # Each first upload needs a fresh agent and takes seconds: fewer of them.
    first_uploads = settings.repeats(default=3, quick=2)
    files = 1_000 if settings.quick else 5_000
    copies, uploads, empty_runs = [], [], []
    unchanged, changed = Resyncs(), Resyncs()
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        tree, copy, empty = root / "tree", root / "copy", root / "empty"
        empty.mkdir()
        mirror = root / "mirror" if shutil.which("rsync") else None
        megabytes = make_tree(tree, files) / 1e6
        # A file changed within the racy window before a scan is hashed again by every scan.
        racy_clean_at = time.time() + RACY_WINDOW_NS / 1e9
        if mirror is not None:
            run_checked(["rsync", "-a", f"{tree}/", f"{mirror}/"])
        for _ in range(first_uploads):
            copies.append(megabytes / timed_run(["cp", "-r", str(tree), str(copy)]))
            shutil.rmtree(copy)
        wait_until(lambda: time.time() > racy_clean_at, timeout=10)
        for i in range(first_uploads):
            home = root / f"agent{i}"
            with private_agent(home) as agent, agent.client() as client:
                uploads.append(megabytes / submit_true(client, tree)[0])
                if i == first_uploads - 1:  # the last agent keeps its blobs and hash cache
                    for _ in range(repeats):
                        resync(client, tree, mirror, unchanged)
                        empty_runs.append(submit_true(client, empty)[1])
                    rng = random.Random(SEED + 1)
                    for victim in sorted(tree.rglob("*.bin"))[:repeats]:
                        victim.write_bytes(rng.randbytes(CHANGED_SIZE))
                        resync(client, tree, mirror, changed)
            shutil.rmtree(home)
    if any(hashed for _, _, hashed in unchanged.gpuhop):
        raise BenchError("an unchanged re-sync hashed files again: the hash cache did not hold")

    size = f"{files:,} files, {megabytes:.0f} MB"
    skipped = "" if unchanged.rsync else "skipped: rsync not installed. "
    return [
        Row(
            NAME,
            f"first upload, {size}",
            "MB/s",
            uploads,
            "cp -r",
            copies,
            "gpuhop: hash everything + send over the agent's socket (fresh agent each time)",
        ),
        Row(
            NAME,
            "re-sync, unchanged tree",
            "s",
            [synced for synced, _, _ in unchanged.gpuhop],
            "rsync -a SRC/ DST/",
            unchanged.rsync or None,
            f"{skipped}gpuhop: a scan with a warm hash cache, then submit",
        ),
        Row(
            NAME,
            f"re-sync, one {CHANGED_SIZE // 1000} KB file rewritten",
            "s",
            [synced for synced, _, _ in changed.gpuhop],
            "rsync -a SRC/ DST/",
            changed.rsync or None,
            f"{skipped}gpuhop: hash 1 file; 1 request: the job, its tree inside as a delta from"
            " the last one (the file inside)",
        ),
        Row(
            NAME,
            "unchanged tree: submit → job `true` ended",
            "s",
            [ended for _, ended, _ in unchanged.gpuhop],
            "rsync -a SRC/ DST/",
            unchanged.rsync or None,
            f"{skipped}each job sees the tree's one checkout through an overlay (a copy of all"
            f" {megabytes:.0f} MB where the host allows none; alternative: the unchanged rsync"
            " above; `true` after it adds ~1 ms)",
        ),
        Row(
            NAME,
            f"job in the {files:,}-file tree vs in an empty work dir: submit → `true` ended",
            "s",
            [ended for _, ended, _ in unchanged.gpuhop],
            "the same job, empty work dir",
            empty_runs,
            "target: within 0.05 s of the empty work dir",
        ),
    ]
