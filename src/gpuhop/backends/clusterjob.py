"""Runs in a cluster job's leader on the agent's host (Slurm's, Ray's), and in the agent: what
the leader knows of an attempt on the cluster, kept beside the job's spec.

- The cluster's own name for the attempt ("Slurm job 812", "Ray job 01000000"), from the
  moment the cluster took it: `show` names it at every state after that, and the agent can
  end what is left of the attempt by that id if the leader dies.
- While the cluster does not run it yet (Slurm keeps it pending, Ray has not placed its
  workers), why, in the cluster's words (`hold`): the agent shows it as the job's `waiting`,
  and the job stays `starting`.
- When the cluster began to run it (`runs`): the agent moves the job to `running` then, and
  its duration and its --timeout count from then (Backend.running_since).

The leader writes them (atomically); a backend removes them before the next attempt starts.
Standard library only: the leaders import it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

NAME = "cluster-job.json"
WAITING = "cluster-waiting"
RUNNING = "cluster-running.json"
# The names a Slurm leader started before these were shared wrote (an agent upgraded while
# its Slurm jobs wait or run reads them too: those leaders outlive the agent).
SLURM_WAITING = "slurm-waiting"
SLURM_RUNNING = "slurm-running.json"


def write(root: Path, job_id: str, said: str) -> None:
    """Record the cluster's id for the attempt led from job dir `root`, and how to say it."""
    write_atomic(root / NAME, {"job_id": job_id, "said": said})


def read(root: Path) -> dict[str, Any] | None:
    """{"job_id": ..., "said": ...}, or None before the cluster took the attempt."""
    try:
        record = json.loads((root / NAME).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("said"), str)
    return record if ok and "job_id" in record else None


def forget(root: Path) -> None:
    """Before a new attempt: the records are of the latest attempt only."""
    for name in (NAME, WAITING, RUNNING, SLURM_WAITING, SLURM_RUNNING):
        (root / name).unlink(missing_ok=True)


def hold(root: Path, why: str) -> None:
    """The cluster does not run the attempt yet, for reason `why` (written on change only)."""
    path = root / WAITING
    try:
        if path.read_text() == why:
            return
    except OSError:
        pass
    path.write_text(why)


def waiting(root: Path) -> str | None:
    """Why the cluster does not run the attempt yet; None when nothing holds it."""
    for name in (WAITING, SLURM_WAITING):
        try:
            return (root / name).read_text() or None
        except OSError:
            continue
    return None


def released(root: Path) -> None:
    """Nothing holds the attempt any more (it runs, or it ended)."""
    (root / WAITING).unlink(missing_ok=True)


def runs(root: Path) -> None:
    """The cluster runs the attempt from now on (recorded once: the first time counts)."""
    released(root)
    if running_since(root) is None:
        write_atomic(root / RUNNING, {"since": time.time()})


def running_since(root: Path) -> float | None:
    """When the cluster began to run the attempt; None while it has not."""
    for name in (RUNNING, SLURM_RUNNING):
        try:
            return float(json.loads((root / name).read_text())["since"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """`data` as JSON at `path`, whole or not at all (flushed, then renamed into place)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
