"""Runs in the agent: pushing, listing, showing, sharing and removing datasets. A dataset
is private to its pusher unless shared; admins see every one."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.services.deps import in_use
from gpuhop.agent.storage.datasets import EVERYONE, DatasetNotFound
from gpuhop.agent.storage.trees import MissingBlobs, manifest_errors
from gpuhop.api import ErrorCode
from gpuhop.api.data import CachedData, DatasetInfo, DatasetManifest
from gpuhop.api.models import USER_RE, check_dataset_name


def _name(name: str) -> str:
    try:
        return check_dataset_name(name)
    except ValueError as e:
        raise ApiError(400, ErrorCode.bad_request, str(e)) from None


def push(
    rt: AgentContext, name: str, raw: bytes, caller: Caller, shared: bool = False
) -> DatasetInfo:
    """A new version of `name`, private to its pusher unless `shared` (with every user) or
    shared later (`share`). Only whoever pushed a dataset (or an admin) adds versions to it;
    and a user may name only chunks they have sent themselves (see
    gpuhop.agent.storage.claims)."""
    name = _name(name)
    with manifest_errors():
        if not caller.admin:
            digests = [d for f in DatasetManifest.model_validate_json(raw).files for d in f.chunks]
            unclaimed = rt.claims.unclaimed(caller.user, "blob", digests)
            if unclaimed:
                raise MissingBlobs(unclaimed)
        # The owner check and the push under one lock: of two users pushing a new name at
        # once, one makes v1 and the other is refused, never given v2 of the first's.
        with rt.datasets.locked(name):
            _check_owner(rt, name, None, caller)
            info = rt.datasets.push(name, raw, owner=caller.user)
            if shared:
                rt.datasets.share(name, add=[EVERYONE])
        return _shown(rt, info)


def _shown(rt: AgentContext, info: DatasetInfo) -> DatasetInfo:
    return info.model_copy(update={"shared_with": rt.datasets.sharing(info.name)})


def _readable(rt: AgentContext, name: str, caller: Caller) -> bool:
    return caller.admin or rt.datasets.readable_by(name, caller.user)


def _missing(name: str) -> ApiError:
    # Another user's private dataset answers exactly as one that does not exist.
    return not_found(f"no dataset named {name!r} (gpuhop data ls lists them)")


def list_all(rt: AgentContext, caller: Caller) -> list[DatasetInfo]:
    """Every version of every dataset `caller` may read."""
    return [
        _shown(rt, rt.datasets.info(n, v))
        for n in rt.datasets.names()
        if _readable(rt, n, caller)
        for v in rt.datasets.versions(n)
    ]


def cached(rt: AgentContext, caller: Caller) -> list[CachedData]:
    """The bucket prefixes cached for `caller`'s jobs (their own only, admins too: a user's
    listings and names are theirs), most recently used first."""
    needed = rt.fetches.keep().views
    return [
        CachedData(
            url=p.url,
            endpoint=p.endpoint,
            objects=p.objects,
            bytes=p.bytes,
            last_used=datetime.fromtimestamp(p.last_used, UTC),
            in_use=p.view in needed,
        )
        for p in rt.objects.prefixes(caller.user)
    ]


def versions(rt: AgentContext, name: str, caller: Caller) -> list[DatasetInfo]:
    name = _name(name)  # before any path is made of it: a bad name is a 400, not a 500
    found = [rt.datasets.info(name, v) for v in rt.datasets.versions(name)]
    if not found or not _readable(rt, name, caller):
        raise _missing(name)
    return [_shown(rt, i) for i in found]


def files(
    rt: AgentContext, name: str, version: int | None, caller: Caller
) -> list[dict[str, object]]:
    try:
        info = rt.datasets.info(_name(name), version)
    except DatasetNotFound as e:
        raise not_found(str(e)) from None
    if not _readable(rt, name, caller):
        raise _missing(name)
    return [
        {"path": f["path"], "size": f["size"], "chunks": len(f["chunks"])}
        for f in rt.datasets.manifest(info.name, info.version)
    ]


def share(rt: AgentContext, name: str, user: str, caller: Caller, shared: bool) -> DatasetInfo:
    """Share `name` with `user` ("*": every user), or stop (`shared` False); its owner or an
    admin only. Returns the latest version, with whom it is now shared."""
    name = _name(name)
    if user != EVERYONE and not USER_RE.match(user):
        raise ApiError(400, ErrorCode.bad_request, f"{user!r} is not a user name (or * for all)")
    with rt.datasets.locked(name):
        if not rt.datasets.versions(name) or not _readable(rt, name, caller):
            raise _missing(name)
        _check_owner(rt, name, None, caller)
        if shared:
            rt.datasets.share(name, add=[user])
        else:
            rt.datasets.share(name, drop=[user])
        return _shown(rt, rt.datasets.info(name))


def _check_owner(
    rt: AgentContext, name: str, version: int | None, caller: Caller, removing: bool = False
) -> None:
    """Refuse a change to a dataset (all its versions, or one) that another user pushed
    (`removing`: its removal). A dataset the caller may not even see is named as taken, its
    owner not said."""
    if caller.admin:
        return
    versions = rt.datasets.versions(name)
    if versions and not rt.datasets.readable_by(name, caller.user):
        raise ApiError(
            403,
            ErrorCode.forbidden,
            f"the name {name} is taken by another user's dataset: push under another name",
        )
    for v in [version] if version else versions:
        owner = rt.datasets.info(name, v).owner
        if owner != caller.user:
            raise ApiError(
                403,
                ErrorCode.forbidden,
                f"dataset {name} v{v} was pushed by {owner or 'the agent owner'}: only they or"
                + (
                    " an admin may remove it"
                    if removing
                    else " an admin may change it (push under another name)"
                ),
            )


def remove(rt: AgentContext, name: str, version: int | None, caller: Caller) -> list[int]:
    _name(name)
    # The checks and the removal under the name's lock, as for a push: no one else's version
    # (of a name freed and taken again meanwhile) is removed on the strength of this
    # caller's own. And holding `rt.uses`: a job submitted meanwhile is either seen using
    # it, or resolves its data once it is gone (see gpuhop.agent.storage.uses).
    with rt.uses.exclusive("gpuhop data rm"), rt.datasets.locked(name):
        return _remove(rt, name, version, caller)


def _remove(rt: AgentContext, name: str, version: int | None, caller: Caller) -> list[int]:
    try:
        targets = [rt.datasets.info(name, version).version] if version else None
    except DatasetNotFound as e:
        raise not_found(str(e)) from None
    if not _readable(rt, name, caller):
        raise _missing(name)
    _check_owner(rt, name, version, caller, removing=True)
    users = [
        (job_id, m["version"])
        for job_id, deps in in_use(rt)
        for m in deps.get("data", [])
        if "url" not in m  # a bucket's view, not a dataset
        and m["name"] == name
        and (targets is None or m["version"] in targets)
    ]
    if users:
        jobs = ", ".join(sorted({job_id for job_id, _ in users}))
        used = ", ".join(f"v{v}" for v in sorted({v for _, v in users}))
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"dataset {name} {used} is in use by job(s) {jobs} (queued or running); cancel"
            " them or wait until they end",
        )
    try:
        return rt.datasets.remove(name, version)
    except DatasetNotFound as e:
        raise not_found(str(e)) from None
