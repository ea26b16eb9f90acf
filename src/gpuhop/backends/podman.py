"""Runs in the agent: which Podman this host's agent uses (agent.toml's `podman` and
`container_runtime`), and what the host offers it (its version, the OCI runtime that works
here, the NVIDIA container toolkit's CDI spec, for `gpuhop doctor`); one choice for the two
that call it: the local backend's run path
(gpuhop.backends.local.podman, for `--image` jobs) and the agent's image store
(gpuhop.agent.host.images: list, pull, remove). Both must name one program, so that a job
runs in the store its image was pulled into.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

INSTALL = "apt-get install podman runc catatonit"
# Where cgroup v1 hosts keep the v2 hierarchy beside it ("hybrid"): crun, Podman's default
# runtime, refuses to run there while a controller is enabled on it; runc does not.
HYBRID_CONTROLLERS = Path("/sys/fs/cgroup/unified/cgroup.controllers")
# The NVIDIA container toolkit's CDI spec, which names the GPUs `--device nvidia.com/gpu=N`.
CDI_SPECS = (Path("/etc/cdi/nvidia.yaml"), Path("/var/run/cdi/nvidia.yaml"))


class PodmanSettings(NamedTuple):
    """agent.toml's `podman` (the program) and `container_runtime` (None: Podman's default,
    or runc on a cgroup v1 hybrid host: see `runtime`)."""

    program: str = "podman"
    runtime: str | None = None


def find(settings: PodmanSettings) -> str | None:
    """The Podman program's path, or None where it is not installed."""
    return shutil.which(settings.program)


def missing(settings: PodmanSettings) -> str:
    """Why an image job cannot run here, and what to install."""
    return (
        f"container images (--image) run through Podman on the agent's host, and"
        f" {settings.program!r} is not installed there: install it ({INSTALL}), or set"
        " agent.toml's podman to its path"
    )


def runtime(settings: PodmanSettings) -> str | None:
    """The OCI runtime to run containers with: the setting; else runc where the host is a
    cgroup v1 hybrid with controllers on its v2 hierarchy (which crun refuses) and runc is
    installed; else None, Podman's own default."""
    if settings.runtime:
        return settings.runtime
    try:
        controllers = HYBRID_CONTROLLERS.read_text().split()
    except OSError:
        return None
    return "runc" if controllers and shutil.which("runc") else None


def version(program: str) -> str | None:
    """`podman --version`'s version, or None where it does not answer."""
    try:
        done = subprocess.run(
            [program, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    words = done.stdout.split()
    return words[-1] if done.returncode == 0 and words else None


def cdi_spec() -> Path | None:
    """The NVIDIA container toolkit's CDI spec, where it was generated."""
    return next((p for p in CDI_SPECS if p.is_file()), None)
