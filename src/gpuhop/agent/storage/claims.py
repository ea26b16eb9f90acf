"""Runs in the agent: which user has shown they hold which blob or tree (`claims.db`).

Blobs and trees are stored once for everybody (content-addressed), but knowing a digest
must not be enough to read someone else's file through a job. So a user who is not an
admin can use a blob only after uploading its bytes once (the agent checks them against
the digest: proof of holding them), and a tree only after storing it. To such a user, a
blob that is on disk but not theirs is "missing": their client uploads it like any other,
and the disk still holds one copy. The agent's owner and admins see every job anyway and
are not tracked.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    user   TEXT NOT NULL,
    kind   TEXT NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (user, kind, digest)
) WITHOUT ROWID;
"""
# SQLite's default limit on host parameters is 32766; stay well under it.
BATCH = 900


class ClaimStore:
    """Thread-safe; one per agent process. `kind` is "blob" or "tree"."""

    def __init__(self, path: Path):
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        path.chmod(0o600)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def claim(self, user: str, kind: str, digests: Iterable[str]) -> None:
        rows = [(user, kind, d) for d in dict.fromkeys(digests)]
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR IGNORE INTO claims VALUES (?, ?, ?)", rows)
            self._db.execute("COMMIT")

    def forget(self, kind: str, digests: list[str]) -> None:
        """Drop every user's claims of `digests` (removed from the store: see agent.gc)."""
        with self._lock:
            for start in range(0, len(digests), BATCH):
                part = digests[start : start + BATCH]
                marks = ",".join("?" * len(part))
                self._db.execute(
                    f"DELETE FROM claims WHERE kind = ? AND digest IN ({marks})", (kind, *part)
                )

    def digests(self, kind: str) -> list[str]:
        """Every digest of `kind` that someone claims."""
        with self._lock:
            rows = self._db.execute("SELECT DISTINCT digest FROM claims WHERE kind = ?", (kind,))
            return [row[0] for row in rows]

    def unclaimed(self, user: str, kind: str, digests: list[str]) -> list[str]:
        """The digests of `digests` that `user` has not claimed, in their order."""
        held: set[str] = set()
        unique = list(dict.fromkeys(digests))
        with self._lock:
            for start in range(0, len(unique), BATCH):
                part = unique[start : start + BATCH]
                marks = ",".join("?" * len(part))
                held.update(
                    row[0]
                    for row in self._db.execute(
                        f"SELECT digest FROM claims WHERE user = ? AND kind = ?"
                        f" AND digest IN ({marks})",
                        (user, kind, *part),
                    )
                )
        return [d for d in digests if d not in held]
