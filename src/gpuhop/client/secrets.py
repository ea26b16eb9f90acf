"""Runs on the user's machine: the user's secrets on the agent (set, list, remove). A value
goes to the agent and never comes back: no call here, or route there, returns one."""

from __future__ import annotations

from typing import Any

# The models load on first use (gpuhop.api is lazy): not on the paths of `ps` or `run`.
import gpuhop.api as api
from gpuhop.client.errors import GpuhopError
from gpuhop.client.session import Session, quote


def set_secret(session: Session, name: str, value: str) -> api.SecretInfo:
    """Set (or replace) the secret `name` to `value`: yours alone on the agent."""
    try:
        body = api.SecretValue(value=value).model_dump(mode="json")
    except ValueError as e:  # pydantic's ValidationError: said in one line, without the value
        errors: list[Any] = e.errors() if hasattr(e, "errors") else []
        why = str(errors[0]["msg"]) if errors else "not a valid value"
        raise GpuhopError(
            f"secret {name}: {why.removeprefix('Value error, ')}", code="bad_request"
        ) from None
    response = session.request("PUT", f"/v1/secrets/{quote(name)}", json=body)
    return api.SecretInfo.model_validate(response.json())


def list_secrets(session: Session) -> list[api.SecretInfo]:
    """Your secrets: names and when each was set, never a value."""
    return [api.SecretInfo.model_validate(s) for s in session.request("GET", "/v1/secrets").json()]


def remove(session: Session, name: str) -> None:
    """Remove your secret `name`; queued jobs that name it then fail to start, saying so."""
    session.request("DELETE", f"/v1/secrets/{quote(name)}")
