"""Runs in the agent: what a queued job needs brought to the host before it may start (its
buckets' data, its container image), got while the job waits, and how the scheduler holds
the job until it is here.

One `Preparations` per kind of need. It starts a job's preparation at submit (or at the
scheduler's first look at the job, after an agent restart), in a thread of its own, and
meanwhile says how far it is (`note`: the job's `waiting`, as `ps`, `show` and `run`'s
status line show it). A preparation that cannot be done ends the job, never started, as
`failed` with the kind's end class and the source's own words; one whose job left the queue
(a cancel) or whose agent stops ends quietly (`Stopped`). The kinds say what is needed,
whether it is here, and how to get it.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, Generic, Protocol, TypeVar

from gpuhop.agent.jobs.store import JobRecord, JobStore
from gpuhop.api import EndClass, JobState

log = logging.getLogger("gpuhop.agent")


class Progress(Protocol):
    def note(self) -> str:
        """One line for the job's `waiting`."""
        ...


P = TypeVar("P", bound=Progress)


class Unmet(Exception):
    """What a job needs cannot be had; the message says why, in the source's words."""


class Stopped(Exception):
    """The job left the queue (or the agent stops): its preparation ends, failing nothing."""


class Preparations(ABC, Generic[P]):
    """The agent's preparations of one kind, one per queued job that needs one. Thread-safe."""

    # The job's end class where its preparation fails, and the reason's first words.
    end_class: ClassVar[EndClass]
    failure: ClassVar[str]
    # The note of a job whose preparation cannot start (the agent stops).
    idle_note: ClassVar[str]

    def __init__(
        self, store: JobStore, on_done: Callable[[str, JobState], None], name: str
    ) -> None:
        """`on_done`: a preparation finished (the job may start) or failed it (its final
        state, for its notifications)."""
        self.store = store
        self.on_done = on_done
        self._lock = threading.Lock()
        self._under_way: dict[str, P] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=name)
        self._closed = False
        self._stopping = threading.Event()

    # -- what a kind says ------------------------------------------------------------------

    @abstractmethod
    def wants(self, job: JobRecord) -> bool:
        """Whether `job` needs this kind of preparation at all."""

    @abstractmethod
    def ready(self, job: JobRecord) -> bool:
        """Whether `job`'s need is met already (quick: the scheduler asks on each pass)."""

    @abstractmethod
    def begin(self, job: JobRecord) -> P:
        """The progress of `job`'s preparation, about to start."""

    @abstractmethod
    def prepare(self, job: JobRecord, progress: P) -> None:
        """Get what `job` needs (in a worker thread). Raises Unmet saying why it cannot,
        Stopped where `check` says so."""

    def forget(self, job_id: str) -> None:
        """The job's preparation ended, however: drop what the kind kept for it."""

    # -- the mechanics ---------------------------------------------------------------------

    def note(self, job: JobRecord) -> str | None:
        """None when `job` may start as far as this kind goes (it needs nothing, or has
        it); else how far its preparation is. Starts the preparation where none runs and
        none finished (an agent restarted meanwhile)."""
        if not self.wants(job):
            return None
        with self._lock:
            progress = self._under_way.get(job.id)
            if progress is None:
                if self.ready(job):
                    return None
                if self._closed:
                    return self.idle_note
                progress = self._under_way[job.id] = self.begin(job)
                self._pool.submit(self._run, job, progress)
        return progress.note()

    def start(self, job: JobRecord) -> None:
        """Start `job`'s preparation now (at submit)."""
        self.note(job)

    def close(self) -> None:
        """Stop taking preparations; those under way stop at their next check."""
        with self._lock:
            self._closed = True
        self._stopping.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def check(self, job_id: str) -> None:
        """Raise Stopped where the job is no longer queued (cancelled) or the agent stops."""
        if self._closed or self.store.get(job_id).state is not JobState.queued:
            raise Stopped

    def _run(self, job: JobRecord, progress: P) -> None:
        try:
            self.prepare(job, progress)
        except Stopped:
            self._forget(job.id)
            return
        except Unmet as e:
            self._fail(job, str(e))
            return
        except Exception as e:  # a bug here must not take the agent down, nor leave the job
            log.exception("job %s: %s", job.id, self.failure)
            self._fail(job, f"{type(e).__name__}: {e}")
            return
        self._forget(job.id)
        self.on_done(job.id, JobState.queued)

    def _fail(self, job: JobRecord, why: str) -> None:
        self._forget(job.id)
        reason = f"{self.failure}: {why}"
        if self.store.fail_queued(job.id, reason, self.end_class):
            log.warning("job %s %s", job.id, reason)
            self.on_done(job.id, JobState.failed)

    def _forget(self, job_id: str) -> None:
        with self._lock:
            self._under_way.pop(job_id, None)
            self.forget(job_id)
