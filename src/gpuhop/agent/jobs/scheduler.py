"""Runs in the agent: the scheduler, the loop that starts queued jobs (where a job starts).

A pass (`schedule_once`) reads the queue from the store, cancels the jobs whose dependencies
failed them and fails those this host can never run, asks `placement.plan` which of the rest
start on which GPUs, moves each to `starting` with its GPUs in one guarded UPDATE, and hands
it to the supervisor in a worker thread. Passes run in the event loop's task
(`run_scheduler`, woken by `wake` or every `SCHEDULE_INTERVAL` seconds) or, for a submit,
in the request's own thread (`start_now`), never two at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from gpuhop.agent.jobs.after import judge
from gpuhop.agent.jobs.placement import Limits, Pending, could_ever_fit, largest_kind, plan
from gpuhop.agent.jobs.store import JobRecord, JobStore
from gpuhop.agent.jobs.supervisor import Supervisor
from gpuhop.agent.jobs.waits import said
from gpuhop.api import EndClass, JobState, format_mb

if TYPE_CHECKING:
    from gpuhop.api import GpuInfo

log = logging.getLogger("gpuhop.agent")

# The scheduler also runs on this interval when nothing wakes it, as a safety net.
SCHEDULE_INTERVAL = 1.0


class Scheduler:
    def __init__(
        self,
        store: JobStore,
        supervisor: Supervisor,
        gpus: Sequence[GpuInfo],
        *,
        where: str,
        limits: Callable[[], Limits],
        out_of_service: Callable[[], Iterable[int]],
        notify: Callable[[str, str], None],
        held: Callable[[JobRecord], str | None] = lambda job: None,
    ):
        """`supervisor` launches the placed jobs; `gpus` are the host's as found at start;
        `where` names them in a misfit's reason (the backend's "this host"); `limits` and
        `out_of_service` are read on each pass; `notify` tells a job's webhooks of its
        cancel; `held` says why a queued job may not start yet though its GPUs were free
        (its data is still being fetched), or None."""
        self.store = store
        self.supervisor = supervisor
        self.gpus = gpus
        self.where = where
        self.limits = limits
        self.out_of_service = out_of_service
        self.notify = notify
        self.held = held
        # Why each queued job waits, in its owner's words: on a limit (`plan`'s reason), or
        # on busy GPUs, with its place in line and who holds them (`waits.said`); or on its
        # data (`held`: a bucket's fetch).
        self.waiting: dict[str, str] = {}
        # Set once the scheduler has re-attached to the jobs of a previous agent.
        self.reattached = asyncio.Event()
        self._launches = ThreadPoolExecutor(max_workers=4, thread_name_prefix="launch")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        # One scheduler pass at a time, from whichever thread asks (see `_passes`); set
        # once the previous agent's jobs are re-attached, before any pass may run.
        self._pass_lock = threading.Lock()
        self._pass_due = False
        self._passes_open = False

    def wake(self) -> None:
        """Ask the scheduler to look at the queue now. Safe from any thread."""
        loop, event = self._loop, self._event
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def start_now(self) -> None:
        """Start the queued jobs that fit, in the calling thread (a submit's route): the
        job's start waits for no turn of the event loop. Passes never overlap (two at once
        could give one GPU to two jobs): one asked for while another runs is run by that
        one, after it. A pass that raises leaves the job to the scheduler's loop."""
        if not self._passes_open:
            self.wake()
            return
        try:
            self._passes()
        except Exception:
            log.exception("scheduling from a request failed; the scheduler's loop retries")
            self.wake()

    def _passes(self) -> None:
        """Run `schedule_once` until no pass is due, unless another thread is in one: that
        thread then runs the pass due. Never waits for the lock (the event loop calls it)."""
        self._pass_due = True
        # Checked again after the release: a pass asked for between the holder's last
        # check and its release is run here, not lost.
        while self._pass_due:
            if not self._pass_lock.acquire(blocking=False):
                return
            try:
                while self._pass_due:
                    self._pass_due = False
                    self.schedule_once()
            finally:
                self._pass_lock.release()

    def schedule_once(self) -> int:
        """Start every queued job that fits now. Returns how many were started."""
        held: dict[str, str] = {}
        queued = []
        gpuless = not self.gpus
        for job in self.store.queued():
            if not self._dependencies_allow(job):
                continue
            note = self.held(job)
            if gpuless and (job.spec.gpus or job.spec.gpu_memory_mb is not None):
                # Queued before a restart that found no GPU at all: most likely a driver not
                # up yet (a boot) or NVML failing for a moment, not GPUs gone for good. It
                # waits, rather than the whole GPU queue failing (`_fail_misfits`).
                note = (
                    f"{self.where} shows no GPU since the agent started (gpuhop doctor says"
                    " why); the job runs once the agent is restarted with its GPUs, or cancel it"
                )
            if note is None:
                queued.append(job)
            else:  # not pending either: it holds up no job behind it
                held[job.id] = note
        if not queued:
            self.waiting = held
            return 0
        memory = {g.index: g.memory_mb for g in self.gpus}
        # On a cluster (GPUs with a node) the cluster places jobs: every GPU counts as alike.
        kinds = {g.index: g.kind for g in self.gpus if g.node is None}
        pending = [Pending(j.id, j.created_at, j.spec, j.owner) for j in queued]
        self._fail_misfits(pending, memory, kinds)
        started = 0
        waiting: dict[str, str] = {}
        in_line: dict[str, str] = {}
        holdings = self.store.holdings()
        placements = plan(
            pending,
            memory,
            holdings,
            kinds=kinds,
            limits=self.limits(),
            waiting=waiting,
            in_line=in_line,
            out_of_service=self.out_of_service(),
        )
        words = said(pending, placements, holdings, memory, waiting, in_line)
        self.waiting = {**words, **waiting, **held}
        for placement in placements:
            # Allocation and the move to `starting` are one guarded UPDATE.
            if self.store.transition(
                placement.job_id,
                [JobState.queued],
                JobState.starting,
                gpu_ids=list(placement.gpu_ids),
            ):
                self._launches.submit(self._launch, placement.job_id)
                started += 1
        return started

    def _dependencies_allow(self, job: JobRecord) -> bool:
        """Whether the jobs it runs after let it start now; an after-ok job whose dependency
        did not succeed is cancelled here, saying which. A job that waits is not pending, so
        it holds up no GPU job behind it."""
        if not job.spec.after:
            return True
        verdict = judge(job.spec.after, job.spec.after_any, self.store.states(job.spec.after))
        if verdict.cancel_reason is not None and self.store.transition(
            job.id,
            [JobState.queued],
            JobState.cancelled,
            reason=verdict.cancel_reason,
            ended_at=time.time(),
            end_class=EndClass.cancelled.value,
        ):
            log.info("job %s %s", job.id, verdict.cancel_reason)
            self.notify(job.id, JobState.cancelled.value)
            self.wake()  # the jobs that run after this one learn it now
        return verdict.ready

    def _fail_misfits(
        self, pending: list[Pending], memory: dict[int, int], kinds: dict[int, str]
    ) -> None:
        """Fail the queued jobs that this host can never run (it restarted with fewer GPUs)."""
        for job in pending:
            if could_ever_fit(job, memory, kinds):
                continue
            if job.spec.gpu_memory_mb is None and could_ever_fit(job, memory):
                # Enough GPUs, but not enough of one model (or topology group).
                reason = (
                    f"could not start: it asks for {job.spec.gpus} GPUs of one model; {self.where}"
                    f" now has {len(memory)} GPU(s), at most {largest_kind(memory, kinds)} alike:"
                    " submit it again with --mixed-gpus, or for fewer GPUs"
                )
            else:
                asks = (
                    f"{format_mb(job.spec.gpu_memory_mb)} of one GPU's memory"
                    if job.spec.gpu_memory_mb is not None
                    else f"{job.spec.gpus} GPU(s)"
                )
                reason = (
                    f"could not start: it asks for {asks}; {self.where} now has {len(memory)}"
                    f" GPU(s) with up to {format_mb(max(memory.values(), default=0))} each"
                )
            if self.store.fail_queued(job.job_id, reason, EndClass.app_error):
                log.warning("job %s %s", job.job_id, reason)

    def _launch(self, job_id: str) -> None:
        try:
            self.supervisor.launch(job_id)
        except Exception:  # a bug here must not take the agent down
            log.exception("launching job %s failed", job_id)

    async def run_scheduler(self) -> None:
        """The scheduler's task: re-attach to a previous agent's jobs, then pass over the
        queue whenever woken, and every SCHEDULE_INTERVAL seconds."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        await asyncio.to_thread(self.supervisor.reattach)
        self.reattached.set()
        self._passes_open = True
        while True:
            try:
                self._passes()
            except Exception:
                log.exception("scheduling failed; trying again in %.0fs", SCHEDULE_INTERVAL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=SCHEDULE_INTERVAL)
            self._event.clear()

    def close(self) -> None:
        """Wait for the launches under way."""
        self._launches.shutdown(wait=True)
