"""Runs in the agent: each user's secrets (API keys, tokens), kept by user and name in
`secrets/secrets.db`.

The database is 0600 in a 0700 dir of the state dir, which no job's view of the host shows
(the sandbox covers the state dir, and binds back only the job's own files). A value leaves
this store only for the environment of a job of its own user that names it (`values`); no
route answers with one, so an admin cannot read another user's either. Removed values are
overwritten on disk (`secure_delete`), and the journal is the rollback kind, deleted after
each write, not a WAL that would keep old pages around.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

SCHEMA = """
CREATE TABLE IF NOT EXISTS secrets (
    owner   TEXT NOT NULL,
    name    TEXT NOT NULL,
    value   TEXT NOT NULL,
    set_at  REAL NOT NULL,
    PRIMARY KEY (owner, name)
);
"""


class SecretEntry(NamedTuple):
    """One secret as listed: its name and when it was set; never its value."""

    name: str
    set_at: float


class SecretStore:
    """Thread-safe; one per agent process."""

    def __init__(self, path: Path):
        path.parent.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path.parent, 0o700)
        # Made 0600 before SQLite opens it: never a moment with wider permissions.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        os.chmod(path, 0o600)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=DELETE")
        self._db.execute("PRAGMA secure_delete=ON")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def set(self, owner: str, name: str, value: str) -> SecretEntry:
        """Set (or replace) `owner`'s secret `name`."""
        now = time.time()
        with self._lock:
            self._db.execute(
                "INSERT INTO secrets (owner, name, value, set_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (owner, name) DO UPDATE SET value = excluded.value,"
                " set_at = excluded.set_at",
                (owner, name, value, now),
            )
        return SecretEntry(name, now)

    def entries(self, owner: str) -> list[SecretEntry]:
        """`owner`'s secrets by name: names and when each was set."""
        with self._lock:
            rows = self._db.execute(
                "SELECT name, set_at FROM secrets WHERE owner = ? ORDER BY name", (owner,)
            ).fetchall()
        return [SecretEntry(name, set_at) for name, set_at in rows]

    def remove(self, owner: str, name: str) -> bool:
        """Remove `owner`'s secret `name`; False if there was none."""
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM secrets WHERE owner = ? AND name = ?", (owner, name)
            )
        return cursor.rowcount > 0

    def values(self, owner: str, names: Iterable[str]) -> dict[str, str]:
        """The values of those of `names` that `owner` has set, by name: for the
        environment of `owner`'s own job, and for masking its text. Never for an answer."""
        wanted = set(names)
        with self._lock:
            rows = self._db.execute(
                "SELECT name, value FROM secrets WHERE owner = ?", (owner,)
            ).fetchall()
        return {name: value for name, value in rows if name in wanted}

    def all_values(self, owner: str) -> list[str]:
        """Every value `owner` has set: what a job's settings must not spell out."""
        with self._lock:
            rows = self._db.execute(
                "SELECT value FROM secrets WHERE owner = ?", (owner,)
            ).fetchall()
        return [value for (value,) in rows]
