"""Runs in the agent: pulls of container images, one at a time per user and reference, and
which images a user's job may run in as they are.

A second caller asking for a pull that is under way (another queued job naming the same
image, `gpuhop images pull` twice) waits for that one and shares its outcome and its
progress, rather than starting Podman again. Pulls are per user: each user's pull is checked
by the registry with their own credentials, so a user never gets a private image through
another's secret (their second pull costs a manifest: the layers are on the host already).
A pull that succeeds is noted in `ImageUses` for its user.

All users share one Podman store (the agent's user's), so an image being there is not
enough for a job on a team agent (`usable`): the job's user must have pulled or run it by
that reference themselves (and that same image: a tag that moved is pulled again), unless
gpuhop never pulled it at all (built on the host, `localhost/...`, or put there by its admin:
for everyone). A single-user agent's user may use whatever its store holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpuhop.agent.host import images
from gpuhop.agent.host.images import ImageError, PullProgress
from gpuhop.agent.storage.imageuses import ImageUses
from gpuhop.backends.podman import PodmanSettings

log = logging.getLogger("gpuhop.agent")

# References of images built on the host: no registry has them.
LOCAL = "localhost/"


def not_built_here(reference: str) -> str:
    """Why a `localhost/` image that is not on the host cannot be had."""
    return (
        f"image {reference} is not on this host: {LOCAL} names an image built there, which no"
        " registry holds (build it on the host, or name an image in a registry)"
    )


class _Pull:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.progress = PullProgress()
        self.image_id: str | None = None
        self.error: ImageError | None = None


class ImagePulls:
    """Thread-safe; one per agent process. `team` says whether the agent serves more than
    its owner now (see the module's docstring)."""

    def __init__(self, uses: ImageUses, podman: PodmanSettings, team: Callable[[], bool]):
        self._uses = uses
        self.podman = podman
        self._team = team
        self._lock = threading.Lock()
        # Held from a look at the store to the pull's record: a pull that ends meanwhile
        # has noted its image, or is still listed (`ensure` starts no second one).
        self._deciding = threading.Lock()
        self._running: dict[tuple[str, str], _Pull] = {}
        self._stopping = threading.Event()

    def progress(self, owner: str, reference: str) -> PullProgress | None:
        """How far `owner`'s pull of `reference` is, while one is under way."""
        with self._lock:
            pull = self._running.get((owner, reference))
        return pull.progress if pull is not None else None

    def usable(self, owner: str, reference: str) -> str | None:
        """The id of the image `reference` names where a job of `owner`'s may run in it as
        the store holds it (see the module's docstring); None where it must be pulled for
        them first. ImageError where Podman cannot say."""
        image_id = images.image_id(self.podman, reference)
        if image_id is None or reference.startswith(LOCAL) or not self._team():
            return image_id
        if self._uses.used_by(owner, reference) == image_id:
            return image_id
        return None if image_id in self._uses.last_used() else image_id

    def ensure(
        self,
        owner: str,
        reference: str,
        credentials: Callable[[], str | None],
        *,
        tls_verify: bool = True,
    ) -> str:
        """The id of the image `reference` names, usable by `owner` (as `usable`), pulled
        for them first where it is not (or the pull of it under way waited for). ImageError
        says why not; an image built on the host is never asked of a registry."""
        with self._deciding:
            with self._lock:
                under_way = (owner, reference) in self._running
            if not under_way:
                found = self.usable(owner, reference)
                if found is not None:
                    return found
                if reference.startswith(LOCAL):
                    raise ImageError(not_built_here(reference))
            pull, mine = self._begin(owner, reference)
        return self._finish(owner, reference, pull, mine, credentials, tls_verify)

    def pull(
        self,
        owner: str,
        reference: str,
        credentials: Callable[[], str | None],
        *,
        tls_verify: bool = True,
        on_progress: Callable[[PullProgress], None] | None = None,
    ) -> str:
        """Pull `reference` for `owner` (or wait for the pull of it under way); the image's
        id. `credentials` is asked only where this call starts the pull. ImageError says why
        not, in the registry's words."""
        pull, mine = self._begin(owner, reference)
        return self._finish(owner, reference, pull, mine, credentials, tls_verify, on_progress)

    def job_started(self, owner: str, reference: str) -> str | None:
        """A job of `owner`'s starts in the image `reference`: the id it runs (the image the
        reference names now), its last use noted now (for `gpuhop images`, for gc, and for
        what `owner` may see and use). None where the image is not (or no longer) on the
        host, or Podman cannot say: the run path then says so."""
        try:
            image_id = images.image_id(self.podman, reference)
        except ImageError:
            return None
        if image_id is not None:
            self._uses.note(image_id, owner, reference)
        return image_id

    def close(self) -> None:
        """Stop the pulls under way (each caller gets an ImageError saying so)."""
        self._stopping.set()

    def _begin(self, owner: str, reference: str) -> tuple[_Pull, bool]:
        """The pull under way of `reference` for `owner`, or a new one; whether it is new
        (and so this caller's to run)."""
        with self._lock:
            pull = self._running.get((owner, reference))
            if pull is not None:
                return pull, False
            pull = self._running[(owner, reference)] = _Pull()
            return pull, True

    def _finish(
        self,
        owner: str,
        reference: str,
        pull: _Pull,
        mine: bool,
        credentials: Callable[[], str | None],
        tls_verify: bool,
        on_progress: Callable[[PullProgress], None] | None = None,
    ) -> str:
        """Run `pull` where it is this caller's (`mine`), else wait for it; its image's id."""
        if not mine:
            pull.done.wait()
        else:
            log.info("pulling image %s for %s", reference, owner)
            try:

                def seen(state: PullProgress) -> None:
                    pull.progress = state
                    if on_progress is not None:
                        on_progress(state)

                pull.image_id = images.pull(
                    self.podman,
                    reference,
                    credentials=credentials(),
                    tls_verify=tls_verify,
                    progress=seen,
                    cancel=self._stopping,
                )
                # Before the pull leaves `_running`: `ensure` then finds it usable.
                self._uses.note(pull.image_id, owner, reference, pulled=True)
            except ImageError as e:
                pull.error = e
            except BaseException as e:  # for those who wait; this caller sees it as it is
                pull.error = ImageError(f"the pull of {reference} failed: {e}")
                raise
            finally:
                with self._lock:
                    del self._running[(owner, reference)]
                pull.done.set()
        if pull.error is not None:
            raise pull.error
        assert pull.image_id is not None
        return pull.image_id
