"""Runs in the agent: a queued job's container image (`--image`), pulled onto the host while
the job waits where its user may not run it as the host holds it, and the job held in the
queue until it may.

At submit the agent looks whether the job's user may run the image as it is (see
`ImagePulls.usable`): then the job is placed at once. Else a pull starts, with the job's
`image_secret` (its user's secret holding the registry's user:password) where it names one,
in the preparations' thread (`gpuhop.agent.jobs.preparations`, as a bucket's data is
fetched); queued jobs of one user naming one image share one pull (`ImagePulls.ensure`).
Meanwhile `note` says how far it is (Podman's phase, layers copied), as the job's `waiting`.
A pull that fails ends the job, never started, as `failed` with class `image-error` and the
registry's own words (unauthorized, manifest unknown, connection refused). A cancelled job's
pull goes on for the others that may wait on it; the agent's end stops it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpuhop.agent.host.images import ImageError
from gpuhop.agent.jobs.imagepulls import ImagePulls
from gpuhop.agent.jobs.preparations import Preparations, Unmet
from gpuhop.agent.jobs.store import JobRecord, JobStore
from gpuhop.api import EndClass, JobState

log = logging.getLogger("gpuhop.agent")

# The jobs known to have their image are forgotten, but for the queued ones, past this many.
READY_KEPT = 1000


class Waiting:
    """One job's wait for its image: what `note` reports (the pull's own progress, shared
    by the jobs that wait on it)."""

    def __init__(self, pulls: ImagePulls, owner: str, reference: str):
        self.pulls = pulls
        self.owner = owner
        self.reference = reference

    def note(self) -> str:
        progress = self.pulls.progress(self.owner, self.reference)
        return progress.note() if progress is not None else "pulling image: looking at the host"


class ImageWaits(Preparations[Waiting]):
    """The waits of queued jobs for their images. Thread-safe."""

    end_class = EndClass.image_error
    failure = "could not get its image"
    idle_note = "pulling image"

    def __init__(
        self,
        store: JobStore,
        pulls: ImagePulls,
        credentials: Callable[[JobRecord], str | None],
        owner: Callable[[JobRecord], str],
        tls_verify: Callable[[str], bool],
        on_done: Callable[[str, JobState], None],
    ):
        """`credentials`: the registry login the job names (its user's secret's value), or
        None; raises Unmet where the secret is gone. `tls_verify`: whether a pull of a
        reference checks TLS (agent.toml's `insecure_registries`); `owner`: whose job it is
        (the agent's owner's where it has none)."""
        super().__init__(store, on_done, "image")
        self.pulls = pulls
        self.credentials = credentials
        self.owner = owner
        self.tls_verify = tls_verify
        self._ready: set[str] = set()
        self._ready_lock = threading.Lock()

    def wants(self, job: JobRecord) -> bool:
        return job.spec.image is not None

    def ready(self, job: JobRecord) -> bool:
        with self._ready_lock:
            return job.id in self._ready

    def begin(self, job: JobRecord) -> Waiting:
        return Waiting(self.pulls, self.owner(job), str(job.spec.image))

    def start(self, job: JobRecord) -> None:
        """At submit: the job may start at once where its user may run the image as it is;
        else its pull starts."""
        if job.spec.image is None:
            return
        try:
            usable = self.pulls.usable(self.owner(job), job.spec.image)
        except ImageError:
            usable = None  # the preparation asks again, and says why
        if usable is not None:
            self._note_ready(job.id)
            return
        super().start(job)

    def prepare(self, job: JobRecord, waiting: Waiting) -> None:
        reference = str(job.spec.image)
        login = self.credentials(job)
        try:
            image_id = self.pulls.ensure(
                waiting.owner,
                reference,
                lambda: login,
                tls_verify=self.tls_verify(reference),
            )
        except ImageError as e:
            self.check(job.id)  # a pull stopped for the agent's end fails no job
            raise Unmet(str(e)) from None
        log.info("job %s: its image %s is here (%s)", job.id, reference, image_id[:12])
        self._note_ready(job.id)

    def _note_ready(self, job_id: str) -> None:
        queued = None
        if len(self._ready) > READY_KEPT:
            queued = {job.id for job in self.store.queued()}
        with self._ready_lock:
            if queued is not None:
                self._ready &= queued
            self._ready.add(job_id)

    def close(self) -> None:
        self.pulls.close()  # first: the pulls under way end, and their threads with them
        super().close()
