"""Runs in the agent: the pure queue policy that decides which queued jobs start on which GPUs.

No I/O and no clock of its own: the caller passes the queue and the free GPUs, so the policy
is tested without sleeps and without a GPU.

Policy: jobs are considered by priority (high first), then age (old first). A job that needs
no GPU always starts. A GPU job starts when enough GPUs are free; the first GPU job that does
not fit blocks every GPU job behind it, so a large job is never starved by a stream of small
ones. GPUs are handed out lowest index first.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    job_id: str
    gpus: int
    priority: int
    created_at: float


@dataclass(frozen=True)
class Placement:
    job_id: str
    gpu_ids: tuple[int, ...]


def plan(pending: list[Pending], free_gpus: list[int]) -> list[Placement]:
    """Return the jobs to start now and the GPUs each gets."""
    free = sorted(free_gpus)
    placements: list[Placement] = []
    gpu_queue_blocked = False
    for job in sorted(pending, key=lambda j: (-j.priority, j.created_at, j.job_id)):
        if job.gpus == 0:
            placements.append(Placement(job.job_id, ()))
            continue
        if gpu_queue_blocked:
            continue
        if job.gpus <= len(free):
            taken, free = free[: job.gpus], free[job.gpus :]
            placements.append(Placement(job.job_id, tuple(taken)))
        else:
            gpu_queue_blocked = True
    return placements
