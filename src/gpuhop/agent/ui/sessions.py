"""Runs in the agent: the dashboard's one-time login codes and browser sessions, in memory.

A code is minted for a caller who holds the agent's ordinary credentials, lives `CODE_TTL`
seconds and is spent by its first use, good or not. Trading it at `/ui/login` gives a
session, named by a random cookie value, that lasts `SESSION_TTL`. Only SHA-256 digests of
codes and cookie values are kept, so a heap dump or a log of this object names none that
works. Both live in memory: restarting the agent logs every browser out, which costs a
`gpuhop ui` and leaves nothing on disk to steal. The clock is a parameter (`now`).

Both tables are bounded per user, the oldest of that user's entries making room for their
newest: however fast one user logs in, no other user's session or pending code is evicted
(users are made by admins, so the whole is bounded too).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

from gpuhop.agent.callers import Caller

CODE_TTL = 60.0
SESSION_TTL = 12 * 3600.0
# Bounds on what one authenticated but careless (or hostile) user can make us hold.
MAX_CODES_PER_USER = 16
MAX_SESSIONS_PER_USER = 64
# 32 random bytes: 256 bits, far beyond guessing through an HTTP endpoint.
SECRET_BYTES = 32


@dataclass(frozen=True)
class Session:
    caller: Caller
    expires_at: float


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


class UiSessions:
    """Login codes and sessions. Safe to use from several threads."""

    def __init__(self, code_ttl: float = CODE_TTL, session_ttl: float = SESSION_TTL):
        self.code_ttl = code_ttl
        self.session_ttl = session_ttl
        self._codes: dict[str, Session] = {}
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def mint_code(self, caller: Caller, now: float | None = None) -> tuple[str, float]:
        """A new login code for `caller`, and when it expires."""
        now = time.time() if now is None else now
        code = secrets.token_urlsafe(SECRET_BYTES)
        expires = now + self.code_ttl
        with self._lock:
            _prune(self._codes, now, caller.user, MAX_CODES_PER_USER - 1)
            self._codes[_digest(code)] = Session(caller, expires)
        return code, expires

    def redeem(self, code: str, caller: Caller, now: float | None = None) -> str | None:
        """Spend `code` and return a new session's cookie value; None if the code is unknown,
        used, expired, or was minted for someone other than `caller` (who presents it)."""
        now = time.time() if now is None else now
        with self._lock:
            minted = self._codes.pop(_digest(code), None)
            if minted is None or minted.expires_at <= now or minted.caller != caller:
                return None
            cookie = secrets.token_urlsafe(SECRET_BYTES)
            _prune(self._sessions, now, caller.user, MAX_SESSIONS_PER_USER - 1)
            self._sessions[_digest(cookie)] = Session(caller, now + self.session_ttl)
        return cookie

    def check(self, cookie: str, now: float | None = None) -> Caller | None:
        """The caller a live session cookie stands for; None for any other value."""
        now = time.time() if now is None else now
        with self._lock:
            session = self._sessions.get(_digest(cookie))
            if session is None:
                return None
            if session.expires_at <= now:
                del self._sessions[_digest(cookie)]
                return None
            return session.caller

    def end(self, cookie: str) -> None:
        """Log a session out."""
        with self._lock:
            self._sessions.pop(_digest(cookie), None)


def _prune(table: dict[str, Session], now: float, user: str, keep: int) -> None:
    """Drop expired entries, then `user`'s oldest ones until at most `keep` of theirs are
    left. Nobody else's entry is touched."""
    for key in [k for k, s in table.items() if s.expires_at <= now]:
        del table[key]
    theirs = sorted((s.expires_at, k) for k, s in table.items() if s.caller.user == user)
    for _, key in theirs[: max(0, len(theirs) - keep)]:
        del table[key]
