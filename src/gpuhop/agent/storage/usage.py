"""Runs in the agent: how much disk its stores use, and the quotas on them.

Two figures: *storage* (blobs, trees, datasets and cached bucket objects: what uploads and
fetches add) and *jobs* (job dirs:
work dirs, logs, metrics, artifacts, checkpoints: what jobs add). Each is measured by a
walk (a file with several links counted once) at most every few seconds; between walks,
the bytes the blob store reports stored are added, so a burst of uploads cannot slip past
the quota between two walks; and a refusal walks first where bytes were added since the
last walk (they may be gone again: a refused upload's). An upload, push or submission that
would pass a quota is refused with 507 and the figures; nothing already stored is touched.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

from gpuhop.agent.config import Policy
from gpuhop.agent.storage.blobs import BlobStore, QuotaExceeded
from gpuhop.api.upkeep import DiskUsage
from gpuhop.home import AgentPaths

# A disk with less free than this is "full" when a job fails (see `disk_note`).
FULL_BELOW = 1 << 20


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def tree_bytes(*roots: Path) -> int:
    """Bytes of the files under `roots`, each inode once; vanishing files are skipped."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_size
    return total


class DiskMeter:
    def __init__(self, paths: AgentPaths, blobs: BlobStore, policy: Policy, ttl: float = 5.0):
        self.paths = paths
        self.blobs = blobs
        self.policy = policy
        self.ttl = ttl
        self._lock = threading.Lock()
        self._storage: tuple[float, int] | None = None
        self._walked = -1  # the storage bytes the last walk found
        self._jobs: tuple[float, int] | None = None
        blobs.check_quota = self.check_storage

    def invalidate(self) -> None:
        with self._lock:
            self._storage = self._jobs = None

    def storage(self) -> int:
        with self._lock:
            added = self.blobs.take_added()
            now = time.monotonic()
            if self._storage is None or now - self._storage[0] > self.ttl:
                home = self.paths.home
                roots = (self.paths.blobs, self.paths.trees, home / "datasets", home / "objects")
                self._storage = (now, tree_bytes(*roots))
                self._walked = self._storage[1]
            else:
                self._storage = (self._storage[0], self._storage[1] + added)
            return self._storage[1]

    def jobs(self) -> int:
        with self._lock:
            now = time.monotonic()
            if self._jobs is None or now - self._jobs[0] > self.ttl:
                self._jobs = (now, tree_bytes(self.paths.jobs))
            return self._jobs[1]

    def usage(self) -> DiskUsage:
        return DiskUsage(
            storage_bytes=self.storage(),
            storage_quota=self.policy.storage_quota,
            jobs_bytes=self.jobs(),
            jobs_quota=self.policy.jobs_quota,
            log_cap=self.policy.log_cap,
        )

    def check_storage(self, size: int) -> None:
        """Raise QuotaExceeded if storing `size` more bytes would pass the storage quota:
        measured by a walk before it refuses, where the figure has added bytes since the
        last (what was added since may have gone again: a refused upload's, a push's
        staging, a gc's)."""
        quota = self.policy.storage_quota
        if quota is None or self.storage() + size <= quota:
            return
        with self._lock:
            if self._storage is not None and self._storage[1] != self._walked:
                self._storage = None  # the next look walks
        if self.storage() + size > quota:
            raise QuotaExceeded(
                _message(
                    f"storing {format_bytes(size)} more",
                    "storage",
                    self.storage(),
                    quota,
                    "`gpuhop gc`, `gpuhop data rm`",
                )
            )

    def check_jobs(self, size: int) -> None:
        """Raise QuotaExceeded if a new job dir of `size` bytes would pass the jobs quota."""
        quota = self.policy.jobs_quota
        if quota is not None and self.jobs() + size > quota:
            raise QuotaExceeded(
                _message(
                    f"a job with {format_bytes(size)} of files",
                    "jobs",
                    self.jobs(),
                    quota,
                    "`gpuhop gc` (finished jobs past retention)",
                )
            )


def _message(what: str, name: str, used: int, quota: int, frees: str) -> str:
    kinds = "blobs, trees, datasets and cached bucket objects" if name == "storage" else "job dirs"
    return (
        f"{what} would pass the agent's {name} quota: {format_bytes(used)} of"
        f" {format_bytes(quota)} in use ({kinds}). Free space ({frees}) or raise"
        f" {name}_quota in the agent's agent.toml"
    )


def disk_note(folder: Path, log: Path) -> str:
    """ "; the disk ... is full" when a failed job's disk is (nearly) full or its log says it
    ran out of space; "" otherwise. Appended to the job's reason."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    said = False
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            tail = f.read()
        said = os.strerror(errno.ENOSPC).encode() in tail
    except OSError:
        pass
    if free >= FULL_BELOW and not said:
        return ""
    return (
        f"; the disk holding the job's files ran out of space ({format_bytes(free)} free now"
        f" of {format_bytes(st.f_blocks * st.f_frsize)})"
    )
