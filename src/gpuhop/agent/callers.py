"""Runs in the agent: who a request comes from, as the listener's auth middleware (`auth`)
or the dashboard's session gate (`gpuhop.agent.ui.gate`) put it into the request's scope.

Both sides import this module and it imports neither, so the agent's auth and the UI's
gate share one notion of a caller without importing each other back.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass

from starlette.requests import HTTPConnection

SCOPE_KEY = "gpuhop.caller"


@dataclass(frozen=True)
class Caller:
    """Who a request comes from. An admin sees and touches every job; a user only their own."""

    user: str
    admin: bool

    @property
    def owner_filter(self) -> str | None:
        """The owner to restrict job queries to; None for an admin (every job)."""
        return None if self.admin else self.user


def owner_login() -> str:
    """The OS login name of the agent's user: who the Unix socket's callers are."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "owner"


def caller_of(conn: HTTPConnection) -> Caller:
    """The caller of a request or WebSocket (a `Request` and a `WebSocket` are both)."""
    caller = conn.scope.get(SCOPE_KEY)
    if not isinstance(caller, Caller):
        # Fail closed: an app served without an auth middleware is a bug, never an admin.
        raise RuntimeError(
            "no caller in the request scope: the app must run behind OwnerAuth/TokenAuth"
        )
    return caller
