"""Runs in the agent: the host's GPUs as clients see them, read live, with the jobs on each,
why a GPU is out of service, and an admin's release of a quarantined one."""

from __future__ import annotations

import contextlib
import logging

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.host.gpuprocs import init_of, per_job
from gpuhop.agent.jobs.store import ACTIVE_STATES, JobNotFound, JobRecord
from gpuhop.api import ErrorCode, GpuInfo
from gpuhop.api.agent import ClusterInfo
from gpuhop.backends.base import Refused

log = logging.getLogger("gpuhop.agent")


def describe(ctx: AgentContext, caller: Caller) -> list[GpuInfo]:
    """Each GPU: its fixed facts, memory used and load now, and what jobs hold of it.

    A user who is not an admin sees how much of each GPU is taken, but only their own jobs'
    ids: other users' jobs do not exist for them.
    """
    usage = ctx.gpu_host.usage()
    visible: set[str] | None = None
    if caller.owner_filter is not None:
        visible = {j.id for j in ctx.store.list(ACTIVE_STATES, owner=caller.owner_filter)}
    memory = {g.index: g.memory_mb for g in ctx.gpus}
    holders: dict[int, list[str]] = {}
    reserved: dict[int, int] = {}
    for held in ctx.store.holdings():
        for index in held.gpu_ids:
            if visible is None or held.job_id in visible:
                holders.setdefault(index, []).append(held.job_id)
            # A whole-GPU job has all of it; a share job its share.
            whole = memory.get(index, 0)
            share = whole if held.gpu_memory_mb is None else held.gpu_memory_mb
            reserved[index] = reserved.get(index, 0) + share
    quarantined = ctx.quarantine.all()
    by_job = _memory_by_job(ctx, holders)
    out = []
    for gpu in ctx.gpus:
        now = usage.get(gpu.index)
        fault = quarantined.get(gpu.index)
        out.append(
            gpu.model_copy(
                update={
                    "memory_used_mb": now.memory_used_mb if now else None,
                    "utilization": now.utilization if now else None,
                    "memory_reserved_mb": reserved.get(gpu.index, 0),
                    "job_ids": holders.get(gpu.index, []),
                    "job_memory_mb": by_job.get(gpu.index),
                    "quarantined": fault.detail if fault else None,
                    "quarantined_since": fault.since if fault else None,
                }
            )
        )
    return out


def holder_names(ctx: AgentContext, gpus: list[GpuInfo]) -> dict[str, str | None]:
    """The name (None for an unnamed one) of each job `gpus` names as a holder: those the
    caller may see already (`describe`), so nobody learns another user's job names here."""
    names: dict[str, str | None] = {}
    for job_id in {j for gpu in gpus for j in gpu.job_ids}:
        with contextlib.suppress(JobNotFound):  # it ended and was removed since
            names[job_id] = ctx.store.get(job_id).spec.name
    return names


def _memory_by_job(ctx: AgentContext, holders: dict[int, list[str]]) -> dict[int, dict[str, int]]:
    """GPU index -> each holder's MB there (0 for one with no process on it), for the GPUs
    whose processes the driver tells."""
    processes = ctx.gpu_host.processes()
    if not processes:
        return {}
    inits = {}
    for job in {j for i in processes for j in holders.get(i, [])}:
        init = init_of(ctx.supervisor.job_paths(job).leader_pid)
        if init is not None:
            inits[job] = init
    used = per_job(processes, inits)
    return {i: {j: used[i].get(j, 0) for j in holders.get(i, [])} for i in processes}


def cluster(ctx: AgentContext, caller: Caller) -> ClusterInfo:
    """What the cluster's scheduler says of its nodes and the agent's user's jobs there.

    Those jobs are all the agent's OS user's, gpuhop's and others; a caller who is not an
    admin sees only their own gpuhop jobs among them. A name that looks like a gpuhop job's
    but names none of the agent's jobs is not taken for one.
    """
    try:
        info = ctx.backend.cluster()
    except Refused as e:
        raise ApiError(503, e.code, e.message) from None
    if info is None:
        raise ApiError(
            409,
            ErrorCode.unsupported,
            f"this agent runs jobs on {ctx.backend.where} (--backend {ctx.backend.name}),"
            " which has no scheduler of its own to ask: gpuhop gpus lists its GPUs",
        )
    jobs = []
    for job in info.jobs:
        record: JobRecord | None = None
        if job.job_id:
            with contextlib.suppress(JobNotFound):
                record = ctx.store.get(job.job_id)
        if record is None:
            if not caller.admin:
                continue
            job = job.model_copy(update={"job_id": None})
        elif caller.owner_filter is not None and record.owner != caller.owner_filter:
            continue
        jobs.append(job)
    return info.model_copy(update={"jobs": jobs})


def release(rt: AgentContext, caller: Caller, index: int) -> None:
    """Put a quarantined GPU back in service (admins only)."""
    if not caller.admin:
        raise ApiError(403, ErrorCode.forbidden, "only an admin may release a quarantined GPU")
    if all(g.index != index for g in rt.gpus):
        raise not_found(f"this host has no GPU {index}")
    held = rt.quarantine.release(index)
    if held is None:
        raise ApiError(409, ErrorCode.conflict, f"GPU {index} is not quarantined")
    log.warning("GPU %d released by %s (it was quarantined: %s)", index, caller.user, held.detail)
    rt.scheduler.wake()
