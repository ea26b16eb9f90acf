"""Runs in the agent: /v1/tokens, the bearer tokens of the TCP listener (admins only)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request

from gpuhop.agent.callers import caller_of, owner_login
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.tokens import TokenRecord, TokenStore
from gpuhop.api import ErrorCode, TokenCreated, TokenInfo, TokenRequest

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


def admin_tokens(request: Request) -> TokenStore:
    """The token store, for an admin; 403 for anyone else."""
    if not caller_of(request).admin:
        raise ApiError(403, ErrorCode.forbidden, "only an admin may manage tokens")
    return request.app.state.ctx.tokens


@router.post("", status_code=201)
def create(req: TokenRequest, request: Request) -> TokenCreated:
    tokens = admin_tokens(request)
    if req.user == owner_login() and not req.admin:
        # Its holder would be the agent's owner to every check (the owner's jobs, secrets
        # and datasets) yet not an admin: most likely another person of that name was meant.
        raise ApiError(
            400,
            ErrorCode.bad_request,
            f"{req.user} is the agent's own user (who its socket serves): a token for it"
            " acts as the agent's owner, with the owner's jobs and secrets; give it --admin if"
            " that is meant, or name another user",
        )
    record, token = tokens.create(req.user, req.admin)
    return TokenCreated(**to_info(record).model_dump(), token=token)


@router.get("")
def list_tokens(request: Request) -> list[TokenInfo]:
    return [to_info(r) for r in admin_tokens(request).list()]


@router.delete("/{token_id}")
def revoke(token_id: str, request: Request) -> TokenInfo:
    record = admin_tokens(request).revoke(token_id)
    if record is None:
        raise not_found(f"no token with id {token_id!r}")
    return to_info(record)


def to_info(record: TokenRecord) -> TokenInfo:
    used = record.last_used_at
    return TokenInfo(
        id=record.id,
        user=record.user,
        admin=record.admin,
        created_at=datetime.fromtimestamp(record.created_at, tz=UTC),
        last_used_at=None if used is None else datetime.fromtimestamp(used, tz=UTC),
    )
