"""Runs in the agent: the host's container images as `gpuhop images` shows them, a user's
pull of one, and their share of garbage collection.

Who sees what: on a team agent an image's reference can be private (a team's registry, the
name of an unreleased model), so a user who is not an admin sees only the images their own
pulls and jobs used, with their own last use; an admin sees every image in the host's store.
A single-user agent shows its user everything.

What gc removes: only images gpuhop pulled (`ImageUses`), by the names it pulled them by,
never one the host's admin put there by hand (one a job ran in included; where a pull
brought an image that also has a name of the admin's, only gpuhop's names go), and never
one a queued or running job names (a queued job's pulled image waits for it). A job's own
pull, and the note of its image's use as it starts, are `gpuhop.agent.jobs.imagewaits`'
and `ImagePulls.job_started`'s. Of the rest, an image no one used for `image_keep_days`
goes; then, while gpuhop's images together pass `image_quota`, the least recently used.
One used within gc's grace period stays (a pull for a job being submitted).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from gpuhop.agent.callers import Caller, owner_login
from gpuhop.agent.config import Policy
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.host import images
from gpuhop.agent.host.images import HostImage, ImageError, PodmanMissing
from gpuhop.agent.jobs.imagepulls import LOCAL, not_built_here
from gpuhop.agent.jobs.store import ACTIVE_STATES
from gpuhop.api import ErrorCode, JobState
from gpuhop.api.images import ImageInfo, ImagePull
from gpuhop.api.spec import check_image
from gpuhop.api.upkeep import Freed

log = logging.getLogger("gpuhop.agent.services.images")

# Podman's words for a reference that names no image anywhere it may look.
_NOT_A_NAME = ("invalid reference format", "did not resolve to an alias", "short-name")


def _host_images(rt: AgentContext) -> list[HostImage]:
    try:
        return images.list_images(rt.podman)
    except PodmanMissing as e:
        raise ApiError(409, ErrorCode.unsupported, str(e)) from None
    except ImageError as e:
        raise ApiError(500, ErrorCode.internal, str(e)) from None


def _host_image_id(rt: AgentContext, reference: str) -> str | None:
    try:
        return images.image_id(rt.podman, reference)
    except PodmanMissing as e:
        raise ApiError(409, ErrorCode.unsupported, str(e)) from None
    except ImageError as e:
        raise ApiError(500, ErrorCode.internal, str(e)) from None


def list_images(rt: AgentContext, caller: Caller) -> list[ImageInfo]:
    """The images `caller` may see (see the module's docstring), newest first."""
    host = _host_images(rt)
    everything = caller.admin or not rt.team()
    last = rt.image_uses.last_used() if everything else rt.image_uses.of(caller.user)
    needs = needed(rt, host)
    out = []
    for image in host:
        if not everything and image.id not in last:
            continue
        users = needs.get(image.id, [])
        jobs = [job_id for job_id, owner in users if everything or owner == caller.user]
        out.append(
            ImageInfo(
                id=image.id,
                references=image.references,
                size=image.size,
                created=_dt(image.created),
                last_used=_dt(last.get(image.id)),
                jobs=jobs,
            )
        )
    return out


def pull(rt: AgentContext, body: ImagePull, caller: Caller) -> ImageInfo:
    """Pull `body.reference` for `caller`, with their secret `body.secret` (user:password)
    where given; the image as `list_images` shows it. 502 in the registry's words where it
    refuses."""
    try:
        reference = check_image(body.reference)
    except ValueError as e:
        raise ApiError(400, ErrorCode.bad_request, str(e)) from None
    if reference.startswith(LOCAL):  # Podman would ask a registry at localhost:443
        if _host_image_id(rt, reference) is not None:
            why = (
                f"{reference} is an image built on this host, which no registry holds: there"
                " is nothing to pull, and jobs may name it as it is"
            )
        else:
            why = not_built_here(reference)
        raise ApiError(400, ErrorCode.bad_request, why)
    credentials = None
    if body.secret is not None:
        values = rt.secrets.values(caller.user, [body.secret])
        if body.secret not in values:
            raise ApiError(
                400,
                ErrorCode.bad_request,
                f"you have no secret named {body.secret}; set it first with `gpuhop secret set"
                f" {body.secret}`, its value the registry's user:password",
            )
        credentials = values[body.secret]
    try:
        image_id = rt.image_pulls.pull(
            caller.user,
            reference,
            lambda: credentials,
            tls_verify=images.tls_verify(rt.policy.insecure_registries, reference),
        )
    except PodmanMissing as e:
        raise ApiError(409, ErrorCode.unsupported, str(e)) from None
    except ImageError as e:
        # A name Podman cannot read or resolve is the caller's to fix (400); what a registry
        # answers, or not reaching it, is the registry's (502), in its words either way.
        local = any(why in str(e) for why in _NOT_A_NAME)
        raise ApiError(400 if local else 502, ErrorCode.registry, str(e)) from None
    for info in list_images(rt, caller):
        if info.id == image_id:
            return info
    raise ApiError(500, ErrorCode.internal, f"{reference} was pulled but is not in the store")


def _names(reference: str) -> set[str]:
    """The names Podman may list `reference` by: as given, and fully qualified."""
    names = {reference}
    if images.registry_of(reference) == "docker.io" and not reference.startswith("docker.io/"):
        names.add(f"docker.io/{reference}")
        if "/" not in reference.split(":")[0]:
            names.add(f"docker.io/library/{reference}")
    if ":" not in reference.rsplit("/", 1)[-1] and "@" not in reference:
        names |= {f"{n}:latest" for n in names}
    return names


def needed(rt: AgentContext, host: list[HostImage]) -> dict[str, list[tuple[str, str]]]:
    """The images that queued or running jobs name: image id -> [(job id, owner)]."""
    by_name = {name: image.id for image in host for name in image.references}
    out: dict[str, list[tuple[str, str]]] = {}
    for job in rt.store.list([JobState.queued, *ACTIVE_STATES], limit=100_000):
        reference = job.spec.image
        if reference is None:
            continue
        owner = job.owner or owner_login()
        ids = {by_name[n] for n in _names(reference) if n in by_name}
        used = rt.image_uses.used_by(owner, reference)
        if used is not None:
            ids.add(used)
        for image_id in ids:
            out.setdefault(image_id, []).append((job.id, owner))
    return out


def collect(rt: AgentContext, policy: Policy, now: float, dry_run: bool, tally: Freed) -> None:
    """gc's part for images (see the module's docstring). A host without Podman has none."""
    try:
        host = images.list_images(rt.podman)
    except ImageError as e:
        if not isinstance(e, PodmanMissing):
            log.warning("images not collected: %s", e)
        return
    known = rt.image_uses.last_used()
    pulled = rt.image_uses.pulled()
    on_host = {image.id for image in host}
    if not dry_run:
        for image_id in known.keys() - on_host:  # removed by hand since: forgotten
            rt.image_uses.forget(image_id)
    ours = [image for image in host if image.id in pulled]
    keep = needed(rt, host)
    candidates = sorted(
        (image for image in ours if image.id not in keep), key=lambda i: known[i.id]
    )
    total = sum(image.size for image in ours)
    for image in candidates:
        if now - known[image.id] < policy.grace_seconds:
            continue  # pulled or used just now: for a job being submitted, say
        old = now - known[image.id] > policy.image_keep_days * 86400
        over = policy.image_quota is not None and total > policy.image_quota
        if not (old or over):
            continue
        # Only the names gpuhop pulled it by: one the admin gave it (the same image built or
        # loaded by hand) keeps it, and its bytes, on the host.
        mine = {n for r in pulled[image.id] for n in _names(r)}
        others = [n for n in image.references if n not in mine]
        if not dry_run:
            try:
                if others:
                    images.untag(rt.podman, image.id, [n for n in image.references if n in mine])
                else:
                    images.remove(rt.podman, image.id)
            except ImageError as e:
                log.warning("image %s not removed: %s", image.id[:12], e)
                continue
            if others:
                rt.image_uses.forget_names(image.id, pulled[image.id])
            else:
                rt.image_uses.forget(image.id)
        if not others:
            total -= image.size
            tally.count += 1
            tally.bytes += image.size


def _dt(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, tz=UTC) if ts is not None else None
