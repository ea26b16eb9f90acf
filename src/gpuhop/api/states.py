"""A job's words on the wire that need no schema: its state (`JobState`), why it ended
(`EndClass`) and which failures a retry is for (`RetryOn`).

Runs on both sides. The standard library only: the CLI reads them off the agent's JSON
without loading pydantic (`models` and `queue` build their wire models on them).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["INFRA_CLASSES", "MAX_JOBS_LISTED", "TERMINAL_STATES", "EndClass", "JobState", "RetryOn"]

# The most jobs one listing gives (GET /v1/jobs?limit=): the agent's bound, and ps's --limit.
MAX_JOBS_LISTED = 10_000


class JobState(StrEnum):
    """A job's state. Allowed transitions are listed on each state."""

    # -> starting (scheduler allocated it), cancelled, failed (it can never run here, or its
    # data could not be fetched)
    queued = "queued"
    starting = "starting"  # -> running (process started), failed (could not start), cancelled
    running = "running"  # -> succeeded, failed, cancelled, lost
    succeeded = "succeeded"  # terminal: exit code 0
    failed = "failed"  # terminal: non-zero exit, a signal, or a start error
    cancelled = "cancelled"  # terminal: a user asked for it
    lost = "lost"  # terminal: the process vanished with no exit status while the agent was away

    @property
    def finished(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def said(self) -> str:
        """The state in a sentence about its job: "job 3fa9 is running", "job 3fa9 has
        ended: succeeded" (never "is succeeded")."""
        return f"has ended: {self.value}" if self.finished else f"is {self.value}"


TERMINAL_STATES = frozenset(
    {JobState.succeeded, JobState.failed, JobState.cancelled, JobState.lost}
)


class EndClass(StrEnum):
    """Why a finished job ended, besides its exit code: a bug of the job's, or the machine."""

    succeeded = "succeeded"  # exit code 0
    app_error = "app-error"  # a non-zero exit (or it could not start)
    oom_host = "oom-host"  # the kernel's OOM killer, as the job's cgroup told
    oom_gpu = "oom-gpu"  # the framework's GPU out-of-memory error in the log's tail
    killed = "killed"  # a signal from outside (an unexplained SIGKILL included)
    timeout = "timeout"  # its --timeout passed
    cancelled = "cancelled"  # a user, or a dependency that did not succeed
    lost = "lost"  # its process vanished with no exit status (host or agent gone)
    idle = "idle"  # cancelled by the idle guard: its whole GPUs sat at 0 % too long
    gpu_fault = "gpu-fault"  # a GPU it held had a hardware fault and was quarantined
    data_error = "data-error"  # its data (--data s3://...) could not be fetched; it never ran
    image_error = "image-error"  # its image (--image) could not be pulled; it never ran


# The failures that say nothing about the job's code: worth another attempt by default.
INFRA_CLASSES = frozenset({EndClass.lost, EndClass.oom_host, EndClass.killed, EndClass.gpu_fault})


class RetryOn(StrEnum):
    """Which failed attempts `retries` runs again."""

    infra = "infra"  # lost, oom-host, killed, gpu-fault: the machine's fault, not the code's
    # every failure: also app-error, oom-gpu (never timeout, cancelled, idle, data-error,
    # image-error)
    any = "any"

    def retries(self, end: EndClass) -> bool:
        if self is RetryOn.infra:
            return end in INFRA_CLASSES
        # A data-error or image-error job never ran: its data or image could not be had,
        # which another try of the same job would not change.
        return end not in (
            EndClass.succeeded,
            EndClass.cancelled,
            EndClass.timeout,
            EndClass.idle,
            EndClass.data_error,
            EndClass.image_error,
        )
