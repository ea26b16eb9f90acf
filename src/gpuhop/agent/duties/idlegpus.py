"""Runs in the agent: the idle guard, for jobs that hold whole GPUs and leave them at 0 %.

With `idle_gpu_minutes` set in agent.toml, a running job whose whole GPUs have all read
0 % utilisation in every sample of the GPU history (`gpuhop.agent.host.gpuhistory`) for that
long gets a `gpuhop:` line in its log; with `idle_action = "cancel"` it is then cancelled,
class `idle`, and not retried. Share jobs (`--gpu-memory`) hold no whole GPU and are left
alone, as are notebooks (`gpuhop notebook`), which end by their own idle rule. A GPU whose
load cannot be read (None) never counts as idle.
"""

from __future__ import annotations

import logging
import time

from gpuhop.agent.context import AgentContext
from gpuhop.agent.jobs.records import is_notebook_server
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.api import EndClass, JobState, format_seconds

log = logging.getLogger("gpuhop.agent")

# How long an idle job has to stop after SIGTERM.
IDLE_GRACE = 10.0


class IdleGpus:
    """Warns about (and cancels) jobs that sit on idle GPUs; one `run()` per look."""

    def __init__(self, rt: AgentContext):
        self.rt = rt
        minutes = rt.policy.idle_gpu_minutes
        assert minutes is not None
        self.window = minutes * 60
        self.cancel = rt.policy.idle_action == "cancel"
        self.interval = rt.gpu_history.every
        self._warned: set[tuple[str, int]] = set()  # (job id, attempt)

    def run(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        for job in self.rt.store.list([JobState.running], limit=100_000):
            if not _watched(job) or (job.id, job.attempt) in self._warned:
                continue
            since = self.rt.gpu_history.idle_since(job.gpu_ids, after=job.started_at or now)
            if since is None or now - since < self.window:
                continue
            self._warned.add((job.id, job.attempt))
            self._act(job, now - since)

    def _act(self, job: JobRecord, idle: float) -> None:
        gpus = ",".join(map(str, job.gpu_ids))
        what = (
            f"GPU(s) {gpus} held by this job have been at 0% utilisation for"
            f" {format_seconds(idle)} (the agent's idle_gpu_minutes is"
            f" {self.rt.policy.idle_gpu_minutes:g})"
        )
        then = (
            "; cancelling it (idle_action = cancel)"
            if self.cancel
            else "; others may be waiting for them: end the job if it is done with them"
        )
        try:
            self.rt.supervisor.tell(job.id, f"{what}{then}")
        except OSError as e:
            log.warning("cannot warn idle job %s in its log: %s", job.id, e)
        log.warning("job %s: %s", job.id, what)
        if self.cancel:
            self.rt.supervisor.stop(
                job,
                f"cancelled: its GPU(s) {gpus} sat at 0% for {format_seconds(idle)}"
                " (idle_gpu_minutes in agent.toml)",
                grace=IDLE_GRACE,
                end_class=EndClass.idle,
                state=JobState.cancelled,
            )


def _watched(job: JobRecord) -> bool:
    """Whether the idle guard watches this job: whole GPUs, and not a notebook server."""
    if not job.gpu_ids or job.spec.gpu_memory_mb is not None or job.pid is None:
        return False
    return not is_notebook_server(job.command)
