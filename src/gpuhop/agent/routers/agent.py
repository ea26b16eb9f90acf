"""Runs in the agent: /v1/agent (what this agent is and has)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpuhop import __version__
from gpuhop.api import AgentInfo, JobState

router = APIRouter(prefix="/v1/agent", tags=["agent"])


@router.get("")
def info(request: Request) -> AgentInfo:
    c = request.app.state.ctx
    used = c.store.gpus_in_use()
    return AgentInfo(
        version=__version__,
        pid=c.pid,
        home=str(c.paths.home),
        gpus=[g.model_copy(update={"job_id": used.get(g.index)}) for g in c.gpus],
        fake_gpus=c.fake_gpus,
        jobs_running=c.store.count(JobState.running),
        jobs_queued=c.store.count(JobState.queued),
    )
