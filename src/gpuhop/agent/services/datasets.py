"""Runs in the agent: pushing, listing, showing and removing datasets."""

from __future__ import annotations

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.services.deps import in_use
from gpuhop.agent.storage.datasets import DatasetNotFound
from gpuhop.agent.storage.trees import MissingBlobs, manifest_errors
from gpuhop.api import ErrorCode
from gpuhop.api.data import DatasetInfo, DatasetManifest
from gpuhop.api.models import check_dataset_name


def _name(name: str) -> str:
    try:
        return check_dataset_name(name)
    except ValueError as e:
        raise ApiError(400, ErrorCode.bad_request, str(e)) from None


def push(rt: AgentContext, name: str, raw: bytes, caller: Caller) -> DatasetInfo:
    """A new version of `name`. Datasets are shared for reading among an agent's users, but
    only whoever pushed one (or an admin) adds versions to it or removes it; and a user may
    name only chunks they have sent themselves (see gpuhop.agent.storage.claims)."""
    name = _name(name)
    with manifest_errors():
        if not caller.admin:
            _check_owner(rt, name, None, caller)
            digests = [d for f in DatasetManifest.model_validate_json(raw).files for d in f.chunks]
            unclaimed = rt.claims.unclaimed(caller.user, "blob", digests)
            if unclaimed:
                raise MissingBlobs(unclaimed)
        return rt.datasets.push(name, raw, owner=caller.user)


def list_all(rt: AgentContext) -> list[DatasetInfo]:
    return [rt.datasets.info(n, v) for n in rt.datasets.names() for v in rt.datasets.versions(n)]


def versions(rt: AgentContext, name: str) -> list[DatasetInfo]:
    name = _name(name)  # before any path is made of it: a bad name is a 400, not a 500
    found = [rt.datasets.info(name, v) for v in rt.datasets.versions(name)]
    if not found:
        raise not_found(f"no dataset named {name!r} (gpuhop data ls lists them)")
    return found


def files(rt: AgentContext, name: str, version: int | None) -> list[dict[str, object]]:
    try:
        info = rt.datasets.info(_name(name), version)
    except DatasetNotFound as e:
        raise not_found(str(e)) from None
    return [
        {"path": f["path"], "size": f["size"], "chunks": len(f["chunks"])}
        for f in rt.datasets.manifest(info.name, info.version)
    ]


def _check_owner(rt: AgentContext, name: str, version: int | None, caller: Caller) -> None:
    """Refuse a change to a dataset (all its versions, or one) that another user pushed."""
    if caller.admin:
        return
    for v in [version] if version else rt.datasets.versions(name):
        owner = rt.datasets.info(name, v).owner
        if owner != caller.user:
            raise ApiError(
                403,
                ErrorCode.forbidden,
                f"dataset {name} v{v} was pushed by {owner or 'the agent owner'}: only they or"
                " an admin may change it (push under another name)",
            )


def remove(rt: AgentContext, name: str, version: int | None, caller: Caller) -> list[int]:
    _name(name)
    try:
        targets = [rt.datasets.info(name, version).version] if version else None
    except DatasetNotFound as e:
        raise not_found(str(e)) from None
    _check_owner(rt, name, version, caller)
    users = [
        (job_id, m["version"])
        for job_id, deps in in_use(rt)
        for m in deps.get("data", [])
        if m["name"] == name and (targets is None or m["version"] in targets)
    ]
    if users:
        jobs = ", ".join(sorted({job_id for job_id, _ in users}))
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"dataset {name} is in use by job(s) {jobs} (queued or running); cancel them or"
            " wait until they end",
        )
    try:
        return rt.datasets.remove(name, version)
    except DatasetNotFound as e:
        raise not_found(str(e)) from None
