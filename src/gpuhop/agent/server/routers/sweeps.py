"""Runs in the agent: /v1/sweeps, what acts on a sweep's runs together (they are listed
with GET /v1/jobs?sweep=SWEEP)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from gpuhop.agent.callers import caller_of
from gpuhop.agent.services import jobs
from gpuhop.api import JobInfo
from gpuhop.api.queue import MAX_GRACE

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"])


@router.post("/{ref}/cancel")
def cancel(
    ref: str, request: Request, grace: float = Query(default=10.0, ge=0, le=MAX_GRACE)
) -> list[JobInfo]:
    """Cancel every run of the caller's sweep (its id, or its name: the newest of that name)
    that has not ended; every run as it is then."""
    return jobs.cancel_sweep(request.app.state.ctx, ref, grace, caller_of(request))
