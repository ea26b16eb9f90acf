"""Runs on the user's machine: credentials on the agent: bearer tokens for its TCP listener
(made, listed and revoked by admins), and one-time codes that log a browser in to its
dashboard."""

from __future__ import annotations

# The models load on first use (gpuhop.api is lazy): not on the paths of `ps` or `run`.
import gpuhop.api as api
from gpuhop.client.errors import GpuhopError, invalid
from gpuhop.client.session import Session, quote


def create(session: Session, user: str, admin: bool = False) -> api.TokenCreated:
    """A new bearer token for `user`. The token is in the answer and nowhere else."""
    from pydantic import ValidationError

    try:
        body = api.TokenRequest(user=user, admin=admin).model_dump(mode="json")
    except ValidationError as e:  # a user name the agent would refuse: said, no traceback
        raise invalid(f"token for {user!r}", e) from None
    return api.TokenCreated.model_validate(session.request("POST", "/v1/tokens", json=body).json())


def list_tokens(session: Session) -> list[api.TokenInfo]:
    return [api.TokenInfo.model_validate(t) for t in session.request("GET", "/v1/tokens").json()]


def revoke(session: Session, token_id: str) -> api.TokenInfo:
    """Revoke a token by id; requests carrying it are refused from now on."""
    response = session.request("DELETE", f"/v1/tokens/{quote(token_id)}")
    return api.TokenInfo.model_validate(response.json())


def login_code(session: Session) -> api.UiLoginCode:
    """A one-time code that logs a browser in to the agent's dashboard as this session's
    user: once, within a minute, and only through this session's credentials."""
    try:
        response = session.request("POST", "/v1/ui/login-codes")
    except GpuhopError as e:
        if e.status != 404:
            raise
        raise GpuhopError(
            f"{session.endpoint.description} is older than the dashboard; update gpuhop"
            " there (gpuhop remote bootstrap)",
            code="not_found",
            status=404,
        ) from None
    return api.UiLoginCode.model_validate(response.json())
