"""A queued job as placement sees it, in one line: the placement tests' shorthand."""

from __future__ import annotations

from typing import Any

from gpuhop.agent.jobs.placement import Pending
from gpuhop.api.spec import JobSpec


def queued(
    job_id: str,
    gpus: int = 0,
    priority: int = 0,
    created_at: float = 0.0,
    owner: str | None = None,
    **spec: Any,
) -> Pending:
    """`job_id` queued at `created_at` by `owner`, asking for `gpus` (and the rest of its
    spec) at `priority`."""
    return Pending(job_id, created_at, JobSpec(gpus=gpus, priority=priority, **spec), owner)
