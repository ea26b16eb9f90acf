"""Runs in the agent: /v1/agent (what this agent is and has: its GPUs, a preflight, its
disk use, and garbage collection)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from gpuhop.agent.callers import caller_of
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.services import doctor as doctor_service
from gpuhop.agent.services import gc as gc_service
from gpuhop.agent.services import gpus as gpus_service
from gpuhop.api import AgentInfo, DoctorCheck, ErrorCode, GpuInfo, JobState
from gpuhop.api.agent import ClusterInfo
from gpuhop.api.upkeep import DiskUsage, GcReport
from gpuhop.version import __version__

router = APIRouter(prefix="/v1/agent", tags=["agent"])


def ctx(request: Request) -> AgentContext:
    return request.app.state.ctx


@router.get("")
def info(request: Request) -> AgentInfo:
    c = ctx(request)
    caller = caller_of(request)
    return AgentInfo(
        version=__version__,
        pid=c.pid,
        home=str(c.paths.home),
        gpus=gpus_service.describe(c, caller),
        fake_gpus=c.fake_gpus,
        jobs_running=c.store.count(JobState.running),
        jobs_queued=c.store.count(JobState.queued),
        listener=c.listener,
        backend=c.backend.name,
        ray_address=c.backend.address,
        user=caller.user,
        admin=caller.admin,
    )


@router.get("/gpus")
def gpus(request: Request) -> list[GpuInfo]:
    return gpus_service.describe(ctx(request), caller_of(request))


@router.get("/cluster")
def cluster(request: Request) -> ClusterInfo:
    """A cluster backend's nodes and the user's jobs there, as its scheduler says them."""
    return gpus_service.cluster(ctx(request), caller_of(request))


@router.post("/gpus/{index}/release")
def release_gpu(request: Request, index: int) -> GpuInfo:
    """Put a quarantined GPU back in service (admins only)."""
    c = ctx(request)
    caller = caller_of(request)
    gpus_service.release(c, caller, index)
    return next(g for g in gpus_service.describe(c, caller) if g.index == index)


@router.get("/doctor")
async def doctor(
    request: Request, fresh: bool = Query(default=False), probe: bool = Query(default=True)
) -> list[DoctorCheck]:
    """The preflight. Its TensorFlow probe runs one at a time in a worker thread (callers
    meanwhile wait without holding one) and is reused for a minute; only an admin may ask
    for a `fresh` one. `probe=false`: only the checks that need no probe, at once."""
    if fresh and not caller_of(request).admin:
        raise ApiError(
            403,
            ErrorCode.forbidden,
            f"only an admin may ask for a fresh probe; the last one is at most"
            f" {doctor_service.PROBE_CACHE_SECONDS:.0f}s old",
        )
    return await doctor_service.checks(
        ctx(request), request.app.state.probes, caller_of(request), fresh, probe
    )


@router.get("/usage")
def usage(request: Request) -> DiskUsage:
    return ctx(request).meter.usage()


@router.post("/gc")
def gc(request: Request, dry_run: bool = Query(default=False)) -> GcReport:
    """Garbage collection and retention now (admins only: it removes every user's data)."""
    if not caller_of(request).admin:
        raise ApiError(403, ErrorCode.forbidden, "only an admin may collect garbage")
    c = ctx(request)
    return gc_service.collect(c, c.policy, dry_run=dry_run)
