"""Runs in the agent: which container images gpuhop pulled or started jobs in, for whom, and
when last (`images.db` in the state dir).

One row per image, user and reference. It answers three questions: an image's last use
(`gpuhop images`, and gc's "unused for longer than image_keep_days"), which images a user
may see on a team agent (those their own pulls and jobs used: a reference can be private),
and which names gpuhop may remove at all: only those it pulled (`pulled`), never a name
the host's admin put in the store by hand, even where a job ran in it or a pull brought the
same image under another name.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS image_uses (
    image_id   TEXT NOT NULL,
    owner      TEXT NOT NULL,
    reference  TEXT NOT NULL,
    last_used  REAL NOT NULL,
    pulled     INTEGER NOT NULL DEFAULT 0,  -- gpuhop pulled it by this name
    PRIMARY KEY (image_id, owner, reference)
);
"""


class ImageUses:
    """Thread-safe; one per agent process."""

    def __init__(self, path: Path):
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout=5000")
        # A row is written as each image job starts: in a write-ahead log, not waited onto
        # the disk (a rollback journal's commit took two fsyncs, a third of the agent's
        # own part of an image job's start). A power cut may lose the last rows, never the
        # file: an image then looks used a little earlier, or a name gpuhop just pulled is
        # left for the admin to remove (gc removes only names a row says it pulled).
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def note(
        self,
        image_id: str,
        owner: str,
        reference: str,
        now: float | None = None,
        pulled: bool = False,
    ) -> None:
        """`owner` used `image_id` by the name `reference` now: pulled it (`pulled`), or a
        job of theirs started in it. The run path calls this as it starts a job with an
        image."""
        now = time.time() if now is None else now
        with self._lock:
            self._db.execute(
                "INSERT INTO image_uses (image_id, owner, reference, last_used, pulled)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (image_id, owner, reference)"
                " DO UPDATE SET last_used = max(last_used, excluded.last_used),"
                " pulled = max(pulled, excluded.pulled)",
                (image_id, owner, reference, now, int(pulled)),
            )

    def pulled(self) -> dict[str, set[str]]:
        """Each image gpuhop pulled: its id and the names it pulled it by."""
        with self._lock:
            rows = self._db.execute(
                "SELECT image_id, reference FROM image_uses WHERE pulled = 1"
            ).fetchall()
        out: dict[str, set[str]] = {}
        for image_id, reference in rows:
            out.setdefault(image_id, set()).add(reference)
        return out

    def last_used(self) -> dict[str, float]:
        """Every known image's id and its last use by anyone."""
        with self._lock:
            rows = self._db.execute(
                "SELECT image_id, max(last_used) FROM image_uses GROUP BY image_id"
            ).fetchall()
        return {image_id: last for image_id, last in rows}

    def of(self, owner: str) -> dict[str, float]:
        """The images `owner` used, and their last use by `owner`."""
        with self._lock:
            rows = self._db.execute(
                "SELECT image_id, max(last_used) FROM image_uses WHERE owner = ? GROUP BY image_id",
                (owner,),
            ).fetchall()
        return {image_id: last for image_id, last in rows}

    def used_by(self, owner: str, reference: str) -> str | None:
        """The image `owner` last had by the name `reference`, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT image_id FROM image_uses WHERE owner = ? AND reference = ?"
                " ORDER BY last_used DESC LIMIT 1",
                (owner, reference),
            ).fetchone()
        return row[0] if row else None

    def forget_names(self, image_id: str, references: set[str]) -> None:
        """The image no longer has these names (it keeps others)."""
        with self._lock:
            self._db.executemany(
                "DELETE FROM image_uses WHERE image_id = ? AND reference = ?",
                [(image_id, r) for r in references],
            )

    def forget(self, image_id: str) -> None:
        """The image is gone from the host."""
        with self._lock:
            self._db.execute("DELETE FROM image_uses WHERE image_id = ?", (image_id,))
