"""Runs in the agent: the caller's own secrets (set, list, remove), and what a job's secrets
ask of them at submit and at start.

Every caller, an admin too, reaches only their own secrets: nothing here takes another
user's name, and nothing answers with a value.
"""

from __future__ import annotations

from datetime import UTC, datetime

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.storage.secrets import SecretEntry
from gpuhop.api import ErrorCode, SecretInfo
from gpuhop.api.models import check_secret_name
from gpuhop.api.spec import JobSpec


def _name(name: str) -> str:
    try:
        return check_secret_name(name)
    except ValueError as e:
        raise ApiError(400, ErrorCode.bad_request, str(e)) from None


def set_secret(rt: AgentContext, name: str, value: str, caller: Caller) -> SecretInfo:
    return to_info(rt.secrets.set(caller.user, _name(name), value))


def list_secrets(rt: AgentContext, caller: Caller) -> list[SecretInfo]:
    return [to_info(e) for e in rt.secrets.entries(caller.user)]


def remove(rt: AgentContext, name: str, caller: Caller) -> None:
    if not rt.secrets.remove(caller.user, _name(name)):
        raise not_found(f"you have no secret named {name}")


def to_info(entry: SecretEntry) -> SecretInfo:
    return SecretInfo(name=entry.name, set_at=datetime.fromtimestamp(entry.set_at, tz=UTC))


def check_submit(rt: AgentContext, spec: JobSpec, command: list[str], caller: Caller) -> None:
    """Refuse (400) a job that names a secret its user has not set (`--secret`, and its
    image's registry login `--image-secret`), or whose settings spell out one of its user's
    secrets (its command, name or variables: they are stored and shown, and a secret's place
    is `--secret`). The answer names the secret, never says where its value was seen beyond
    which setting."""
    names = [s.name for s in spec.secrets]
    if spec.image_secret is not None:
        names.append(spec.image_secret)
    have = rt.secrets.values(caller.user, names)
    missing = [n for n in dict.fromkeys(names) if n not in have]
    if missing:
        raise ApiError(
            400,
            ErrorCode.bad_request,
            f"you have no secret named {', '.join(missing)}; set it first with"
            f" `gpuhop secret set {missing[0]}` (the value from stdin or --from-file)",
        )
    places = {
        "command": command,
        "name": [spec.name or ""],
        "environment (--env)": list(spec.env.values()),
        "notify URLs": list(spec.notify),
    }
    for value in rt.secrets.all_values(caller.user):
        for where, texts in places.items():
            if any(value in text for text in texts):
                raise ApiError(
                    400,
                    ErrorCode.bad_request,
                    f"the job's {where} holds the value of one of your secrets; give it to the"
                    " job with --secret NAME instead, so that it is neither stored nor shown",
                )
