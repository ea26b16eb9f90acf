"""Runs on a Slurm compute node: each worker's own view of a multi-worker job's files.

Worker 0 runs in the job's own dirs on the shared filesystem (work dir, artifacts,
checkpoints, metrics file), and those are what come back (`gpuhop pull`, `--retries`),
as on a Ray cluster. Every other worker gets a copy of them, made by the gang's batch step
(gpuhop.backends.slurm.gang) before any worker starts, under the job's dir: its work dir and
checkpoints as worker 0 starts from them, an empty artifacts dir and a metrics file of its
own. So processes that each save the same path (Keras 3 under keras.distribution, where
every process must call `model.save`) never write one file from several nodes at once.
The copies are removed when the gang ends (and before the next attempt, if a killed gang
left them). Standard library only.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, NamedTuple


class WorkerDirs(NamedTuple):
    work: str
    artifacts: str
    checkpoints: str
    metrics: str


def of(spec: dict[str, Any], index: int | None) -> WorkerDirs:
    """Where worker `index` (None: the job's only process) works and writes."""
    if not index:
        return WorkerDirs(spec["work"], spec["artifacts"], spec["checkpoints"], spec["metrics"])
    root = Path(spec["views"]) / f"worker-{index}"
    return WorkerDirs(
        str(root / "work"),
        str(root / "artifacts"),
        str(root / "checkpoints"),
        str(root / "metrics.jsonl"),
    )


def prepare(spec: dict[str, Any]) -> None:
    """Each worker but worker 0 its copy of the job's files (none has started). Raises OSError."""
    remove(spec)
    for index in range(1, spec["workers"]):
        dirs = of(spec, index)
        shutil.copytree(spec["work"], dirs.work, symlinks=True)
        shutil.copytree(spec["checkpoints"], dirs.checkpoints, symlinks=True)
        Path(dirs.artifacts).mkdir()
        Path(dirs.metrics).touch()


def remove(spec: dict[str, Any]) -> None:
    """The other workers' copies: only worker 0's files come back."""
    if spec.get("views"):
        shutil.rmtree(spec["views"], ignore_errors=True)
