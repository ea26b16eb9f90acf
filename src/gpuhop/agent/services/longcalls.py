"""Runs in the agent: a bound on requests that hold one of the server's threads for long.

Most routes answer in milliseconds, but a few wait on the outside world while they hold one
of the worker threads that every synchronous route shares (anyio's pool, 40 of them): an
image pull waits on its registry (Podman gives up on a silent one after some 30 s), a
profile on its capture (up to 5 minutes), a stack dump on py-spy. Without a bound, a user
who asks for a few dozen of them at once (or a registry that hangs) leaves none for anyone
else's `secret ls` or `show`. So a user may have `PER_USER` such calls under way at once,
and all users together `TOTAL`; past either, the call is refused at once with 429 naming
the limit, and the caller tries again once one has ended.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from fastapi import Request

from gpuhop.agent.callers import caller_of
from gpuhop.agent.errors import ApiError
from gpuhop.api import ErrorCode

PER_USER = 4
# Well short of anyio's 40 threads: the rest stay for everyone's quick calls.
TOTAL = 16


class LongCalls:
    """The long calls under way, by user. Thread-safe."""

    def __init__(self, per_user: int = PER_USER, total: int = TOTAL):
        self.per_user = per_user
        self.total = total
        self._lock = threading.Lock()
        self._by_user: dict[str, int] = {}

    @contextmanager
    def held(self, user: str, what: str) -> Iterator[None]:
        """Count a call of `user`'s (`what`: "an image pull") while it runs, or refuse it
        (ApiError 429) where it would pass a limit."""
        with self._lock:
            mine = self._by_user.get(user, 0)
            if mine >= self.per_user:
                raise ApiError(
                    429,
                    ErrorCode.too_many,
                    f"{user} has {mine} long requests under way (image pulls, profiles,"
                    f" stack dumps); this agent takes {self.per_user} per user at once: ask"
                    f" for {what} again once one has ended",
                    {"under_way": mine, "limit": self.per_user},
                )
            everyone = sum(self._by_user.values())
            if everyone >= self.total:
                raise ApiError(
                    429,
                    ErrorCode.too_many,
                    f"the agent has {everyone} long requests under way (image pulls,"
                    f" profiles, stack dumps), its most at once: ask for {what} again in a"
                    " moment",
                    {"under_way": everyone, "limit": self.total},
                )
            self._by_user[user] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._by_user[user] - 1
                if left:
                    self._by_user[user] = left
                else:
                    del self._by_user[user]


def long_call(request: Request, what: str) -> AbstractContextManager[None]:
    """`LongCalls.held` for the caller of `request`, on its app's count."""
    calls: LongCalls = request.app.state.long_calls
    return calls.held(caller_of(request).user, what)
