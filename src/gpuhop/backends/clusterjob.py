"""Runs in a cluster job's leader on the agent's host (Slurm's, Ray's), and in the agent: the
record of the cluster's own name for an attempt ("Slurm job 812", "Ray job 01000000"), kept
beside the job's spec from the moment the cluster took the attempt.

The leader writes it (atomically) as soon as the cluster has an id for the attempt, so
`show` names it at every state after that, and the agent can end what is left of the
attempt by that id if the leader dies. A backend removes it before the next attempt starts.
Standard library only: the leaders import it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

NAME = "cluster-job.json"


def write(root: Path, job_id: str, said: str) -> None:
    """Record the cluster's id for the attempt led from job dir `root`, and how to say it."""
    path = root / NAME
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"job_id": job_id, "said": said}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(root: Path) -> dict[str, Any] | None:
    """{"job_id": ..., "said": ...}, or None before the cluster took the attempt."""
    try:
        record = json.loads((root / NAME).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("said"), str)
    return record if ok and "job_id" in record else None


def forget(root: Path) -> None:
    """Before a new attempt: the record names the latest attempt only."""
    (root / NAME).unlink(missing_ok=True)
