"""Runs in the agent: listing and removing the cached Python environments of jobs."""

from __future__ import annotations

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.services.deps import in_use
from gpuhop.agent.storage.envs import older_than
from gpuhop.api import ErrorCode
from gpuhop.api.data import EnvInfo


def _users(rt: AgentContext) -> dict[str, list[str]]:
    users: dict[str, list[str]] = {}
    for job_id, deps in in_use(rt):
        if deps.get("env"):
            users.setdefault(deps["env"]["id"], []).append(job_id)
    return users


def list_all(rt: AgentContext, caller: Caller) -> list[EnvInfo]:
    """Every cached environment; for a user of a team agent, only their own builds (their
    requirements, and the variables their id covers, are theirs alone)."""
    users = _users(rt)
    ids = rt.envs.ids()
    if not caller.admin and rt.team():
        ids = [i for i in ids if rt.envs.owner(i) == caller.user]
    return [rt.envs.info(env_id, users.get(env_id, [])) for env_id in ids]


def remove(
    rt: AgentContext, ref: str | None, unused: bool, older_than_seconds: float | None
) -> list[str]:
    """Remove one environment (by id or unique prefix), or with `unused` every one that no
    queued or running job uses (and, with `older_than_seconds`, was last used before).
    Holding `rt.uses`: a job submitted meanwhile is either seen using it, or resolves its
    environment once it is gone (see gpuhop.agent.storage.uses)."""
    with rt.uses.exclusive("gpuhop env rm"):
        return _remove(rt, ref, unused, older_than_seconds)


def _remove(
    rt: AgentContext, ref: str | None, unused: bool, older_than_seconds: float | None
) -> list[str]:
    users = _users(rt)
    ids = rt.envs.ids()
    if ref is not None:
        matches = [i for i in ids if i.startswith(ref.lower())] if ref else []
        if not matches:
            raise not_found(f"no environment matches {ref!r} (gpuhop env ls lists them)")
        if len(matches) > 1:
            raise ApiError(409, ErrorCode.ambiguous, f"{ref!r} matches {len(matches)} environments")
        env_id = matches[0]
        if env_id in users:
            raise ApiError(
                409,
                ErrorCode.conflict,
                f"environment {env_id[:12]} is in use by job(s) {', '.join(users[env_id])}",
            )
        if not rt.envs.remove(env_id):
            raise ApiError(409, ErrorCode.conflict, f"environment {env_id[:12]} is being built")
        return [env_id]
    if not unused:
        raise ApiError(400, ErrorCode.bad_request, "name an environment, or ask for unused ones")
    removed = []
    for env_id in ids:
        if env_id in users:
            continue
        if older_than_seconds is not None and not older_than(rt.envs, env_id, older_than_seconds):
            continue
        if rt.envs.remove(env_id):
            removed.append(env_id)
    return removed
