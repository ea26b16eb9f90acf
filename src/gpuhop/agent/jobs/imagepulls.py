"""Runs in the agent: pulls of container images, one at a time per user and reference.

A second caller asking for a pull that is under way (another queued job naming the same
image, `gpuhop images pull` twice) waits for that one and shares its outcome and its
progress, rather than starting Podman again. Pulls are per user: each user's pull is checked
by the registry with their own credentials, so a user never gets a private image through
another's secret (their second pull costs a manifest: the layers are on the host already).
A pull that succeeds is noted in `ImageUses` for its user.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from gpuhop.agent.host import images
from gpuhop.agent.host.images import ImageError, PullProgress
from gpuhop.agent.storage.imageuses import ImageUses


class _Pull:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.progress = PullProgress()
        self.image_id: str | None = None
        self.error: ImageError | None = None


class ImagePulls:
    """Thread-safe; one per agent process."""

    def __init__(self, uses: ImageUses):
        self._uses = uses
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], _Pull] = {}

    def progress(self, owner: str, reference: str) -> PullProgress | None:
        """How far `owner`'s pull of `reference` is, while one is under way."""
        with self._lock:
            pull = self._running.get((owner, reference))
        return pull.progress if pull is not None else None

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
        key = (owner, reference)
        with self._lock:
            pull = self._running.get(key)
            mine = pull is None
            if pull is None:
                pull = self._running[key] = _Pull()
        if not mine:
            pull.done.wait()
        else:
            try:

                def seen(state: PullProgress) -> None:
                    pull.progress = state
                    if on_progress is not None:
                        on_progress(state)

                pull.image_id = images.pull(
                    reference, credentials=credentials(), tls_verify=tls_verify, progress=seen
                )
                self._uses.note(pull.image_id, owner, reference)
            except ImageError as e:
                pull.error = e
            except BaseException as e:  # for those who wait; this caller sees it as it is
                pull.error = ImageError(f"the pull of {reference} failed: {e}")
                raise
            finally:
                with self._lock:
                    del self._running[key]
                pull.done.set()
        if pull.error is not None:
            raise pull.error
        assert pull.image_id is not None
        return pull.image_id
