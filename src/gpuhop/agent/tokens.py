"""Runs in the agent: the bearer tokens of the TCP listener, kept as hashes in `tokens.db`.

A token is shown once, to whoever created it; the agent keeps only its SHA-256. A plain
(fast, unsalted) hash is enough here, unlike for passwords: a token is 256 random bits, so
no dictionary or brute force can invert its hash, and a slow hash would only cost every
request. Lookup is by hash, so comparing secrets byte by byte never happens.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id           TEXT PRIMARY KEY,
    user         TEXT NOT NULL,
    admin        INTEGER NOT NULL DEFAULT 0,
    hash         TEXT NOT NULL UNIQUE,
    created_at   REAL NOT NULL,
    last_used_at REAL
);
"""

PREFIX = "gpuhop_"
# last_used_at is written at most this often per token, not on every request.
TOUCH_INTERVAL = 60.0


@dataclass(frozen=True)
class TokenRecord:
    id: str
    user: str
    admin: bool
    created_at: float
    last_used_at: float | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> TokenRecord:
        return cls(
            id=row["id"],
            user=row["user"],
            admin=bool(row["admin"]),
            created_at=row["created_at"],
            last_used_at=row["last_used_at"],
        )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """Thread-safe; one per agent process."""

    def __init__(self, path: Path):
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        path.chmod(0o600)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def create(self, user: str, admin: bool = False) -> tuple[TokenRecord, str]:
        """A new token for `user`: its record and the token itself (never stored)."""
        token = PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        with self._lock:
            while True:
                token_id = secrets.token_hex(4)
                try:
                    self._db.execute(
                        "INSERT INTO tokens (id, user, admin, hash, created_at)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (token_id, user, int(admin), hash_token(token), now),
                    )
                    break
                except sqlite3.IntegrityError:
                    continue  # id collision: draw again
        return TokenRecord(token_id, user, admin, now, None), token

    def check(self, token: str) -> TokenRecord | None:
        """The record of a valid token, or None for an unknown (or revoked) one."""
        if not token.startswith(PREFIX) or len(token) > 256:
            return None
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM tokens WHERE hash = ?", (hash_token(token),)
            ).fetchone()
            if row is None:
                return None
            now = time.time()
            if row["last_used_at"] is None or now - row["last_used_at"] > TOUCH_INTERVAL:
                self._db.execute(
                    "UPDATE tokens SET last_used_at = ? WHERE id = ?", (now, row["id"])
                )
        return TokenRecord.from_row(row)

    def live(self, token_id: str) -> bool:
        """Whether the token with this id still exists (is not revoked)."""
        with self._lock:
            row = self._db.execute("SELECT 1 FROM tokens WHERE id = ?", (token_id,)).fetchone()
        return row is not None

    def list(self) -> list[TokenRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM tokens ORDER BY created_at, id").fetchall()
        return [TokenRecord.from_row(r) for r in rows]

    def revoke(self, token_id: str) -> TokenRecord | None:
        """Delete a token; it stops working with the next request. None if there was none."""
        with self._lock:
            row = self._db.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
            if row is None:
                return None
            self._db.execute("DELETE FROM tokens WHERE id = ?", (token_id,))
        return TokenRecord.from_row(row)
