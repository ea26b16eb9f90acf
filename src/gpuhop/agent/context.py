"""Runs in the agent: the agent's parts wired together, and the loop that starts queued jobs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from gpuhop.agent.blobs import BlobStore
from gpuhop.agent.scheduler import Pending, plan
from gpuhop.agent.store import JobStore
from gpuhop.agent.supervisor import Supervisor
from gpuhop.agent.trees import TreeStore
from gpuhop.api import GpuInfo, JobState
from gpuhop.home import AgentPaths

log = logging.getLogger("gpuhop.agent")

# The scheduler also runs on this interval when nothing wakes it, as a safety net.
SCHEDULE_INTERVAL = 1.0


class AgentContext:
    def __init__(self, paths: AgentPaths, gpus: list[GpuInfo], fake_gpus: bool = False):
        paths.ensure()
        self.paths = paths
        self.gpus = gpus
        self.fake_gpus = fake_gpus
        self.pid = os.getpid()
        self.store = JobStore(paths.db)
        self.blobs = BlobStore(paths.blobs, paths.tmp)
        self.trees = TreeStore(paths.trees, paths.tmp, self.blobs)
        self.supervisor = Supervisor(paths, self.store, self.blobs, on_change=self.wake)
        self._launcher = ThreadPoolExecutor(max_workers=4, thread_name_prefix="launch")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def wake(self) -> None:
        """Ask the scheduler to look at the queue now. Safe from any thread."""
        loop, event = self._loop, self._event
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def schedule_once(self) -> int:
        """Start every queued job that fits now. Returns how many were started."""
        queued = self.store.list([JobState.queued])
        if not queued:
            return 0
        used = self.store.gpus_in_use()
        free = [g.index for g in self.gpus if g.index not in used]
        pending = [Pending(j.id, j.gpus, j.priority, j.created_at) for j in queued]
        started = 0
        for placement in plan(pending, free):
            # Allocation and the move to `starting` are one guarded UPDATE.
            if self.store.transition(
                placement.job_id,
                [JobState.queued],
                JobState.starting,
                gpu_ids=list(placement.gpu_ids),
            ):
                self._launcher.submit(self._launch, placement.job_id)
                started += 1
        return started

    def _launch(self, job_id: str) -> None:
        try:
            self.supervisor.launch(job_id)
        except Exception:  # a bug here must not take the agent down
            log.exception("launching job %s failed", job_id)

    async def run_scheduler(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        await asyncio.to_thread(self.supervisor.reattach)
        while True:
            try:
                self.schedule_once()
            except Exception:
                log.exception("scheduling failed; trying again in %.0fs", SCHEDULE_INTERVAL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=SCHEDULE_INTERVAL)
            self._event.clear()

    def close(self) -> None:
        self._launcher.shutdown(wait=True)
        self.store.close()
