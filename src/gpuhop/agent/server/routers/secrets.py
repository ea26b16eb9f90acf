"""Runs in the agent: /v1/secrets, the caller's own secrets. No route answers with a value."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gpuhop.agent.callers import caller_of
from gpuhop.agent.services import secrets
from gpuhop.api import SecretInfo, SecretValue

router = APIRouter(prefix="/v1/secrets", tags=["secrets"])


@router.put("/{name}")
def set_secret(name: str, body: SecretValue, request: Request) -> SecretInfo:
    return secrets.set_secret(request.app.state.ctx, name, body.value, caller_of(request))


@router.get("")
def list_secrets(request: Request) -> list[SecretInfo]:
    return secrets.list_secrets(request.app.state.ctx, caller_of(request))


@router.delete("/{name}", status_code=204)
def remove(name: str, request: Request) -> Response:
    secrets.remove(request.app.state.ctx, name, caller_of(request))
    return Response(status_code=204)
