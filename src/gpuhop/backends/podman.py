"""Runs in the agent: which Podman this host's agent uses (agent.toml's `podman` and
`container_runtime`), one choice for the two that call it: the local backend's run path
(gpuhop.backends.local.podman, for `--image` jobs) and the agent's image store
(gpuhop.agent.host.images: list, pull, remove). Both must name one program, so that a job
runs in the store its image was pulled into.
"""

from __future__ import annotations

import shutil
from typing import NamedTuple

INSTALL = "apt-get install podman runc catatonit"


class PodmanSettings(NamedTuple):
    """agent.toml's `podman` (the program) and `container_runtime` (None: Podman's default,
    or runc on a cgroup v1 hybrid host: see gpuhop.backends.local.podman.runtime)."""

    program: str = "podman"
    runtime: str | None = None


def find(settings: PodmanSettings) -> str | None:
    """The Podman program's path, or None where it is not installed."""
    return shutil.which(settings.program)
