"""Runs in the agent: a job's place in the queue — the jobs it runs after (`run --after`),
and its priority changed while it waits (`gpuhop requeue`).
"""

from __future__ import annotations

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.jobs.after import judge
from gpuhop.agent.jobs.store import AmbiguousJob, JobNotFound, JobRecord
from gpuhop.agent.services import admission
from gpuhop.api import ErrorCode, JobState
from gpuhop.api.spec import JobSpec


def resolve_after(rt: AgentContext, spec: JobSpec, caller: Caller) -> list[str]:
    """The full ids of the jobs `spec` runs after, each named by id, unique prefix or name
    among the caller's own jobs. Every name that matches none (or several) is refused in
    one 422 naming them all. They all exist before this job does, so no cycle can form."""
    ids: list[str] = []
    unknown: list[str] = []
    for ref in spec.after:
        try:
            job_id = rt.store.resolve(ref, owner=caller.owner_filter).id
        except (JobNotFound, AmbiguousJob):
            unknown.append(ref)
            continue
        if job_id not in ids:
            ids.append(job_id)
    if unknown:
        raise ApiError(
            422,
            ErrorCode.not_found,
            f"--after names no job (or several) for: {', '.join(unknown)}; give the id (or a"
            " unique prefix, or the name) of a job you submitted",
            {"unknown": unknown},
        )
    return ids


def waiting_for(rt: AgentContext, job: JobRecord) -> list[str]:
    """The jobs a queued job still waits for."""
    if job.state is not JobState.queued or not job.spec.after:
        return []
    return list(
        judge(job.spec.after, job.spec.after_any, rt.store.states(job.spec.after)).waiting_for
    )


def requeue(rt: AgentContext, job: JobRecord, priority: int, caller: Caller) -> JobRecord:
    """Give a queued job a new priority: its owner may lower it or keep it at the default or
    below; raising it above the default is an admin's call on a team agent, as at submit."""
    admission.check_priority_value(priority, caller)
    if not rt.store.transition(job.id, [JobState.queued], JobState.queued, priority=priority):
        state = rt.store.get(job.id).state
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"job {job.id} {state.said}: only a queued job's priority can be changed",
        )
    rt.scheduler.wake()
    return rt.store.get(job.id)
