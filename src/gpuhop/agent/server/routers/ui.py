"""Runs in the agent: /v1/ui, one-time login codes for the dashboard (see `gpuhop.agent.ui`)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request

from gpuhop.agent.callers import caller_of
from gpuhop.agent.ui.sessions import UiSessions
from gpuhop.api.ui import UiLoginCode

router = APIRouter(prefix="/v1/ui", tags=["ui"])


@router.post("/login-codes", status_code=201)
def login_code(request: Request) -> UiLoginCode:
    """A code that logs a browser in as the caller: once, within a minute, and only when it
    comes back through the caller's own credentials."""
    sessions: UiSessions = request.app.state.ui_sessions
    code, expires = sessions.mint_code(caller_of(request))
    return UiLoginCode(code=code, expires_at=datetime.fromtimestamp(expires, tz=UTC))
