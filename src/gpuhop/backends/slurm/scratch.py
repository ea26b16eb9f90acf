"""Runs on a Slurm compute node, in each task of a job (gpuhop.backends.slurm.task): the
job's node-local scratch dir, one per job attempt and worker, made before the job's command
starts and removed once it has ended.

Where: under `$SLURM_TMPDIR` when the site sets one for each job (its prolog makes it on
the node's local disk, its epilog removes it), else under the path agent.toml's `[slurm]
scratch` names (which must exist on every node), else under the node's own temp dir. The
job gets it as `$GPUHOP_SCRATCH_DIR`, and `$TMPDIR` inside it (unless it sets its own
TMPDIR), so temp files and whatever a script puts there stay off the shared filesystem.
Standard library only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple


class Scratch(NamedTuple):
    root: Path  # removed at the end: the two below are in it
    scratch: Path  # $GPUHOP_SCRATCH_DIR
    tmp: Path  # $TMPDIR
    note: str  # for the job's log, where the configured path could not be used; or ""


def base(configured: str | None, environ: dict[str, str], host: str) -> tuple[Path, str]:
    """The dir to make the scratch dir in, and a note when `configured` could not be used."""
    site = environ.get("SLURM_TMPDIR")
    if site and os.path.isdir(site) and os.access(site, os.W_OK):
        return Path(site), ""
    fallback = Path(tempfile.gettempdir())
    if not configured:
        return fallback, ""
    if os.path.isdir(configured) and os.access(configured, os.W_OK):
        return Path(configured), ""
    why = "does not exist" if not os.path.exists(configured) else "is not a writable dir"
    return fallback, (
        f"the scratch path {configured} ([slurm] scratch in the agent's agent.toml) {why} on"
        f" node {host}, so the job's scratch dir is in {fallback}"
    )


def make(spec: dict[str, Any], index: int | None, host: str) -> Scratch:
    """This task's scratch dir, new and empty. Raises OSError."""
    where, note = base(spec.get("scratch"), dict(os.environ), host)
    worker = "" if index is None else f"-w{index}"
    root = Path(
        tempfile.mkdtemp(prefix=f"gpuhop-{spec['job_id']}-{spec['attempt']}{worker}-", dir=where)
    )
    scratch, tmp = root / "scratch", root / "tmp"
    scratch.mkdir()
    tmp.mkdir()
    return Scratch(root, scratch, tmp, note)


def remove(made: Scratch | None) -> None:
    if made is not None:
        shutil.rmtree(made.root, ignore_errors=True)
