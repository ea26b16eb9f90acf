"""Runs in the agent: one watch per followed log, however many clients follow it.

`logs -f` streams (`outputs.follow_log`) wait here for their log to grow or their job to
end. One task per log file polls it (a stat; when it has not grown, the job's state in the
store), backing off from `FAST` to `SLOW` while nothing happens (after its first `EAGER`
seconds, in which a job that has just started prints its first line), and wakes every stream
that follows it. So 36 followers of 6 jobs cost the event loop 6 polls a tick, not 36 reads
and 36 store lookups, and a user who follows one job from many terminals does not slow
the agent for everyone else. Polling, not inotify: on a Slurm or Ray agent the log is on a
shared filesystem, where another host's writes raise no inotify event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from gpuhop.agent.jobs.store import JobStore

log = logging.getLogger("gpuhop.agent")

# Seconds between polls: FAST right after the log grew, doubling to SLOW while it does not.
FAST = 0.005
SLOW = 0.025
# ... and FAST for the first EAGER seconds of a watch: `gpuhop run` follows its job from
# the submit on, and waits for the first line the job prints as it starts (backed off to
# SLOW by then, the poll saw that line up to 25 ms late).
EAGER = 0.25


class WatchedLog:
    """One log file and the streams that follow it."""

    def __init__(self, job_id: str, path: Path):
        self.job_id = job_id
        self.path = path
        # Set once the job is seen to have ended: what is in the file then is all there is.
        self.ended = False
        self.size: int | None = None
        self.waiters: set[asyncio.Event] = set()
        self.task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        for event in self.waiters:
            event.set()


class Follower:
    """One stream's view of a watched log."""

    def __init__(self, watched: WatchedLog):
        self._watched = watched
        self._event = asyncio.Event()

    @property
    def ended(self) -> bool:
        """Whether the job has ended: read the file to its end once more, then stop."""
        return self._watched.ended

    async def changed(self) -> None:
        """Until the log has grown or the job has ended since the last call returned.

        Call it after reading the log to its end: growth after that read wakes it, as the
        watch compares each size with one it saw no later than that read.
        """
        await self._event.wait()
        self._event.clear()


class LogWatch:
    """The agent's watches of followed logs, on its event loop."""

    def __init__(self, store: JobStore):
        self._store = store
        self._logs: dict[Path, WatchedLog] = {}

    @contextlib.contextmanager
    def follow(self, job_id: str, path: Path) -> Iterator[Follower]:
        """Follow the log `path` of job `job_id` for the duration of the block."""
        watched = self._logs.get(path)
        if watched is None:
            watched = self._logs[path] = WatchedLog(job_id, path)
        follower = Follower(watched)
        watched.waiters.add(follower._event)
        if watched.task is None:
            watched.task = asyncio.get_running_loop().create_task(
                self._poll(watched), name=f"log watch {job_id}"
            )
        try:
            yield follower
        finally:
            watched.waiters.discard(follower._event)
            if not watched.waiters:
                # The last one out ends the watch (its task sees no waiters and returns).
                self._logs.pop(path, None)

    async def aclose(self) -> None:
        """End every watch (the agent is stopping)."""
        tasks = [w.task for w in self._logs.values() if w.task is not None]
        self._logs.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def watched(self) -> int:
        """How many logs are being watched now."""
        return len(self._logs)

    async def _poll(self, watched: WatchedLog) -> None:
        delay = FAST
        clock = asyncio.get_running_loop().time
        eager_until = clock() + EAGER
        try:
            while watched.waiters:
                if self._check(watched):
                    delay = FAST
                    watched.wake()
                elif clock() >= eager_until:
                    delay = min(delay * 2, SLOW)
                await asyncio.sleep(delay)
        finally:
            watched.task = None

    def _check(self, watched: WatchedLog) -> bool:
        """Whether the log grew or the job ended since the last check."""
        try:
            size = os.stat(watched.path).st_size
        except OSError:
            size = None
        if size != watched.size:
            watched.size = size
            return True
        if watched.ended:
            return False
        try:
            # The state is recorded after the job's processes ended: once it says so, the
            # file holds all there will be.
            state = self._store.states([watched.job_id]).get(watched.job_id)
        except Exception:
            # A store that fails now (a full disk) must not end the streams: look again.
            log.exception("following job %s: reading its state failed", watched.job_id)
            return False
        # A job no longer in the store (removed with its files) has nothing more to say.
        watched.ended = state is None or state[0].finished
        return watched.ended
