"""Runs in the agent: where a job's processes run, behind one interface (`base.Backend`).

- `local` (the default): on the agent's own host, each job under a leader (backends.local).
- `ray`: on the nodes of an existing Ray cluster (backends.ray), each job under a leader
  on the agent's host that drives Ray actors on the nodes.
- `slurm`: as Slurm jobs of the agent's user (backends.slurm), each followed by a leader on
  the agent's host (sbatch, squeue, scancel) and run on its node by a small task.

The store, the scheduler, logs, metrics, artifacts and the API are the same for all; a
backend starts, watches and stops each attempt, offers the scheduler its GPUs, and refuses
the kinds of job it cannot run. Nothing here imports gpuhop.agent: the agent hands a backend
what it needs as plain data (see `base`). `settings` holds the agent's choice of backend;
the agent opens it (gpuhop.agent.server.daemon), so this package imports none of its backends.
"""

from __future__ import annotations

from gpuhop.backends.settings import BACKENDS, BackendSettings, remember, resolve

__all__ = ["BACKENDS", "BackendSettings", "remember", "resolve"]
