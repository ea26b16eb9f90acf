"""Runs in the agent: the lock between what a new job will use and what may remove it
(`AgentContext.uses`).

A job's submission resolves what it will use (a model server's source job and its
SavedModel, an environment's id, a dataset's version) and only then writes its row: until
then no queued job names them, and a removal that asks which queued and running jobs use
what (`deps.in_use`: gc's retention, its environments and images; `gpuhop data rm`, `gpuhop
env rm`) would not see them. So a submission holds this lock shared from its first look at
them until its row and its deps file exist, and such a removal holds it exclusive from its
question until it has removed: either the removal sees the new job, or the submission looks
only after the removal is done, and finds it gone (a model server of a pruned job
is refused; an environment or an image removed is built or pulled again for the job).

Submissions take it at once unless a removal holds it or waits for it; a removal waits for
the submissions under way (a few milliseconds each: a job's own interpreter says its version
before its submission takes the lock, and is asked again under it only where it was replaced
meanwhile), and new ones wait behind it, so a stream of submissions never starves a
collection.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

log = logging.getLogger("gpuhop.agent")


class UseLock:
    """Shared for submissions, exclusive for removals (the module's docstring). Not
    re-entrant: a thread holding it must not take it again."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sharing = 0  # submissions holding it now
        self._exclusive = False
        self._waiting = 0  # removals waiting for it
        self._what = ""  # the removal holding it, or the last one to wait for it

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            if self._exclusive or self._waiting:
                log.info("a job submission waits for %s", self._what)
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._sharing += 1
        try:
            yield
        finally:
            with self._cond:
                self._sharing -= 1
                if not self._sharing:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        """Held by the removal `what` (for the log, where it has to wait)."""
        with self._cond:
            if self._sharing:
                log.info("%s waits for %d job submission(s) under way", what, self._sharing)
            self._waiting += 1
            self._what = what
            try:
                while self._sharing or self._exclusive:
                    self._cond.wait()
            except BaseException:
                self._waiting -= 1
                self._cond.notify_all()  # submissions held back by this wait go on
                raise
            self._waiting -= 1
            self._exclusive = True
            self._what = what
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
