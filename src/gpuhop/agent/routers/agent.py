"""Runs in the agent: /v1/agent (what this agent is and has: its GPUs, and a preflight)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpuhop import __version__
from gpuhop.agent.auth import caller_of
from gpuhop.agent.context import AgentContext
from gpuhop.agent.services import doctor as doctor_service
from gpuhop.agent.services import gpus as gpus_service
from gpuhop.api import AgentInfo, DoctorCheck, GpuInfo, JobState

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
        user=caller.user,
        admin=caller.admin,
    )


@router.get("/gpus")
def gpus(request: Request) -> list[GpuInfo]:
    return gpus_service.describe(ctx(request), caller_of(request))


@router.get("/doctor")
def doctor(request: Request) -> list[DoctorCheck]:
    # A sync route: FastAPI runs it in a worker thread, so the probe's seconds of importing
    # TensorFlow in a subprocess never hold up the other requests.
    return doctor_service.run(ctx(request))
