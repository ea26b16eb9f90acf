"""Runs in the agent (local backend): a job's own files on the host, which it may write
wherever it runs (the sandbox binds them back, a container mounts them): made here if
missing, so that each can be bound, and made the job's identity's where it has one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuhop.home import JobPaths

# In a job's dir: the job's /var/tmp, where it has an identity of its own (or an image).
VAR_TMP = "vartmp"


def own_files(jp: JobPaths, workers: int, identity: dict[str, Any] | None) -> list[Path]:
    """The job's own dirs and files: work dir, artifacts, checkpoints, control dir, log,
    metrics, provenance and (for several workers) each worker's log; with an identity, its
    home too, and all of them, its /tmp and /var/tmp made that identity's."""
    for d in (jp.work, jp.artifacts, jp.checkpoints):
        d.mkdir(parents=True, exist_ok=True)
    logs = [jp.worker_log(i) for i in range(workers)] if workers > 1 else []
    files = [jp.log, jp.metrics, jp.provenance, *logs]
    for f in files:
        f.touch()
    own = [jp.work, jp.artifacts, jp.checkpoints, jp.control, *files]
    if identity:
        own.append(Path(identity["home"]))
        give(identity, [*own, jp.tmp, jp.root / VAR_TMP])
    return own


def give(identity: dict[str, Any], paths: list[Path]) -> None:
    """Make `paths` (and, for dirs, all they hold) the identity's. A file linked from
    elsewhere too stays whose it is: a change to it would reach the other place. (gpuhop
    links none into a job's dirs: a model server's SavedModel is mounted, not linked.)"""
    uid, gid = identity["uid"], identity["gid"]
    for path in paths:
        os.lchown(path, uid, gid)
        if path.is_dir() and not path.is_symlink():
            for dirpath, dirs, files in os.walk(path):
                for name in dirs:
                    os.lchown(os.path.join(dirpath, name), uid, gid)
                for name in files:
                    file = os.path.join(dirpath, name)
                    if os.lstat(file).st_nlink == 1:
                        os.lchown(file, uid, gid)
