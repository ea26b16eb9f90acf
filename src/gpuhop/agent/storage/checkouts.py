"""Runs in the agent: each stored tree materialised once, as a checkout that jobs see through
an overlay (gpuhop.backends.local.workview) instead of each job copying every file.

A checkout is `checkouts/<tree digest>/`, the tree's files with their modes (0644, or 0755
for executables), built in the temp dir and renamed into place whole, so a checkout that
exists is complete. It is not flushed to the disk first (on a tree of 100,000 small files
that took twice as long, 6 -> 13 s, and 230 MB more of the agent's memory): after a power
loss one built just before could come back as files of the right names and no content.
So the host's boot that the checkouts were built in is kept beside them (`boot`), and an
agent started in another boot lets them all go (they move into the temp dir and are
removed there in the background); the next job of each tree builds its checkout again,
from blobs, which are flushed before they are named. Nothing writes into a checkout after
that: a job sees it only as the lower layer of its overlay, which copies a file up before
any change. A new tree reuses the files of the checkout built before it (hard links, for
every path whose digest and mode are unchanged), so one changed file costs one copy and a
link per other file, not a copy of every file (a tree of more than REMEMBER_ENTRIES files
is not remembered for that). A tree is read an entry at a time while its checkout is
built: a big one is never in memory whole.
Checkouts whose tree is gone are removed by garbage collection.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.settle import durable, flush_dir
from gpuhop.agent.storage.trees import REMEMBER_ENTRIES
from gpuhop.api import ManifestEntry
from gpuhop.api.models import SHA256_RE

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
BOOT_FILE = "boot"  # in the checkouts' dir: the host's boot they were built in


def this_boot() -> str:
    """The host's boot id; "" where the kernel gives none (then checkouts are kept)."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


@dataclass
class _Built:
    """The last checkout built: reused by the next one."""

    path: Path
    files: dict[str, tuple[str, bool]]  # path -> (digest, executable)


class CheckoutStore:
    def __init__(self, root: Path, tmp: Path, blobs: BlobStore):
        self.root = root
        self.tmp = tmp
        self.blobs = blobs
        self._lock = threading.Lock()
        self._last: _Built | None = None
        self._forget_other_boots()

    def path(self, digest: str) -> Path:
        if not SHA256_RE.match(digest):
            raise ValueError(f"{digest!r} is not a sha256 hex digest")
        return self.root / digest

    def _forget_other_boots(self) -> None:
        """At the agent's start: let go of checkouts built in another boot of the host. They
        move out of the way at once and are removed in the background; whatever that
        leaves, garbage collection's sweep of the temp dir removes. Without a record (made
        by an agent from before records) they are kept: jobs of this boot, which outlive an
        agent, may still be running on them."""
        boot, record = this_boot(), self.root / BOOT_FILE
        try:
            if record.read_text() == boot:
                return
        except FileNotFoundError:
            self._record(boot)
            return
        old = self.digests()
        if old:
            self.tmp.mkdir(parents=True, exist_ok=True)
            gone = Path(tempfile.mkdtemp(dir=self.tmp, prefix="checkout-gone-"))
            for digest in old:
                os.replace(self.root / digest, gone / digest)
            threading.Thread(
                target=remove, args=(gone,), name="checkouts-gone", daemon=True
            ).start()
        self._record(boot)  # only once the old ones are out of the way

    def _record(self, boot: str) -> None:
        """Record the boot, on the disk before any checkout of it is built: a record lost
        in a crash would keep that boot's checkouts for good."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / BOOT_FILE, "wb") as f:
            f.write(boot.encode())
            durable(f)
        flush_dir(self.root)

    def ensure(self, digest: str, entries: Callable[[], Iterable[ManifestEntry]]) -> Path:
        """The checkout of tree `digest`, built from `entries()` if missing. One at a time:
        two jobs of a new tree build it once."""
        dest = self.path(digest)
        with self._lock:
            if dest.is_dir():
                return dest
            self.root.mkdir(parents=True, exist_ok=True)
            building = Path(tempfile.mkdtemp(dir=self.tmp, prefix="checkout-"))
            try:
                files = self._build(building, entries())
                os.chmod(building, 0o755)
                os.replace(building, dest)
            except BaseException:
                remove(building)
                raise
            self._last = None if files is None else _Built(dest, files)
        return dest

    def _build(
        self, into: Path, entries: Iterable[ManifestEntry]
    ) -> dict[str, tuple[str, bool]] | None:
        """Build the checkout in `into`; what it holds, or None for a tree too big to keep."""
        last = self._last if self._last is not None and self._last.path.is_dir() else None
        files: dict[str, tuple[str, bool]] | None = {}
        for entry, target in placed(into, entries):
            key = (entry.digest, entry.executable)
            if files is not None:
                files[entry.path] = key
                if len(files) > REMEMBER_ENTRIES:
                    files = None
            if last is not None and last.files.get(entry.path) == key:
                try:
                    os.link(last.path / entry.path, target)
                    continue
                except OSError:
                    pass  # removed meanwhile, or too many links: copy it
            self.blobs.copy_to(entry.digest, target, entry.executable)
        return files

    def digests(self) -> list[str]:
        try:
            return [p.name for p in self.root.iterdir() if SHA256_RE.match(p.name)]
        except FileNotFoundError:
            return []

    def remove(self, digest: str) -> None:
        """Remove a checkout (its tree is gone; no job can still be using it)."""
        with self._lock:
            path = self.path(digest)
            if self._last is not None and self._last.path == path:
                self._last = None
            if path.is_dir():
                gone = Path(tempfile.mkdtemp(dir=self.tmp, prefix="checkout-gone-"))
                os.replace(path, gone / digest)
                remove(gone)


def placed(into: Path, entries: Iterable[ManifestEntry]) -> Iterator[tuple[ManifestEntry, Path]]:
    """Each entry with where its file goes under `into`, its parent dir made first. Every
    path is relative with no '..' (ManifestEntry checks it), and `into` holds only what is
    made here: nothing can lead out of it."""
    made: set[str] = set()
    for entry in entries:
        parent = os.path.dirname(entry.path)
        if parent and parent not in made:
            (into / parent).mkdir(parents=True, exist_ok=True)
            made.add(parent)
        yield entry, into / entry.path


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
