"""Runs in the agent: where a job's processes run, behind one interface (`base.Backend`).

- `local` (the default): on the agent's own host, each job under a shim (backends.local).
- `ray`: on the nodes of an existing Ray cluster (backends.ray), each job under a launcher
  on the agent's host that drives Ray actors on the nodes.

The store, the scheduler, logs, metrics, artifacts and the API are the same for all; a
backend starts, watches and stops each attempt, offers the scheduler its GPUs, and refuses
the kinds of job it cannot run. Nothing here imports gpuhop.agent: the agent hands a backend
what it needs as plain data (see `base`). `settings` holds the agent's choice of backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuhop.backends.settings import BACKENDS, BackendSettings, remember, resolve

if TYPE_CHECKING:
    from gpuhop.backends.base import Backend, GpuHost
    from gpuhop.home import AgentPaths

__all__ = ["BACKENDS", "BackendSettings", "open_backend", "remember", "resolve"]


def open_backend(
    settings: BackendSettings, paths: AgentPaths, python: str, gpu_host: GpuHost | None
) -> Backend:
    """The backend of these settings, connected. `gpu_host` is this host's GPUs, for the
    local backend (a cluster has its own). Raises AgentError saying why it cannot be used."""
    if settings.name == "ray":
        from gpuhop.backends.ray.backend import RayBackend

        return RayBackend.connect(settings, python)
    from gpuhop.backends.local.backend import LocalBackend

    assert gpu_host is not None
    return LocalBackend(paths, gpu_host, python)
