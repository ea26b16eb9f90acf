"""Runs in the agent: the pure queue policy that decides which queued jobs start on which GPUs.

No I/O and no clock of its own: the caller passes the queue, the GPUs with their memory, and
what the running jobs hold, so the policy is tested without sleeps and without a GPU.

Policy:
- Jobs are considered by priority (high first), then age (old first), then id.
- A job that needs no GPU always starts.
- A whole-GPU job (`gpus=N`) takes N GPUs that nobody holds, not even a share: it owns its
  GPUs. They are handed out lowest index first.
- A share job (`gpu_memory_mb=M`) takes one GPU that no whole-GPU job holds and whose shares
  plus M fit in its memory. Of the GPUs it fits on, it goes to the *best fit*: the one that
  would have the least memory left, lowest index on a tie. Shares so pack onto GPUs that are
  already shared and leave empty GPUs (big holes) open for whole-GPU jobs and large shares.
  Three 4 GiB shares on two empty 8 GiB GPUs: the first two share GPU 0, the third takes 1.
- No starvation: the first GPU job (whole or share) that does not fit blocks every GPU job
  behind it, so a large job is never passed over by a stream of small ones. CPU jobs still
  start.
- A job that could never fit on this host (more GPUs than it has, or a share larger than
  every GPU) is passed over instead of blocking the queue for good (`could_ever_fit`).
  Submit refuses such jobs, so this happens only after an agent restart with fewer or
  smaller GPUs; the agent then fails them with a reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    job_id: str
    gpus: int
    priority: int
    created_at: float
    # A share of one GPU in MB; None for whole-GPU and CPU jobs.
    gpu_memory_mb: int | None = None


@dataclass(frozen=True)
class Holding:
    """What a started job holds: its GPUs, and its share of them if it is a share job."""

    job_id: str
    gpu_ids: tuple[int, ...]
    gpu_memory_mb: int | None = None


@dataclass(frozen=True)
class Placement:
    job_id: str
    gpu_ids: tuple[int, ...]


class _Gpus:
    """The GPUs' occupancy while a plan is made: whole-GPU owners and the shares on each."""

    def __init__(self, memory: Mapping[int, int], holdings: Iterable[Holding]):
        self.memory = dict(memory)
        self.whole: set[int] = set()
        self.shared = dict.fromkeys(self.memory, 0)
        for held in holdings:
            for gpu in held.gpu_ids:
                if gpu in self.memory:  # a GPU that vanished across a restart holds nothing
                    self.take(gpu, held.gpu_memory_mb)

    def take(self, gpu: int, share_mb: int | None) -> None:
        if share_mb is None:
            self.whole.add(gpu)
        else:
            self.shared[gpu] += share_mb

    def empty(self) -> list[int]:
        return sorted(g for g in self.memory if g not in self.whole and not self.shared[g])

    def best_fit(self, share_mb: int) -> int | None:
        """The GPU a share goes to: least memory left after it, lowest index on a tie."""
        fits = [
            (self.memory[g] - self.shared[g] - share_mb, g)
            for g in self.memory
            if g not in self.whole and self.shared[g] + share_mb <= self.memory[g]
        ]
        return min(fits)[1] if fits else None


def plan(
    pending: Iterable[Pending], gpus: Mapping[int, int], holdings: Iterable[Holding] = ()
) -> list[Placement]:
    """Return the jobs to start now and the GPUs each gets.

    `gpus` maps each GPU's index to its memory in MB; `holdings` are the started jobs'.
    """
    state = _Gpus(gpus, holdings)
    placements: list[Placement] = []
    gpu_queue_blocked = False
    for job in sorted(pending, key=lambda j: (-j.priority, j.created_at, j.job_id)):
        if job.gpus == 0 and job.gpu_memory_mb is None:
            placements.append(Placement(job.job_id, ()))
            continue
        if gpu_queue_blocked or not could_ever_fit(job, gpus):
            continue
        taken: tuple[int, ...]
        if job.gpu_memory_mb is not None:
            gpu = state.best_fit(job.gpu_memory_mb)
            taken = () if gpu is None else (gpu,)
        else:
            empty = state.empty()
            taken = tuple(empty[: job.gpus]) if job.gpus <= len(empty) else ()
        if not taken:
            gpu_queue_blocked = True
            continue
        for gpu in taken:
            state.take(gpu, job.gpu_memory_mb)
        placements.append(Placement(job.job_id, taken))
    return placements


def could_ever_fit(job: Pending, gpus: Mapping[int, int]) -> bool:
    """Whether the job fits on these GPUs when nothing else runs."""
    if job.gpu_memory_mb is not None:
        return job.gpu_memory_mb <= max(gpus.values(), default=0)
    return job.gpus <= len(gpus)
