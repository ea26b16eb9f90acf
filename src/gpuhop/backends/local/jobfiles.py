"""Runs in the agent (local backend): a job's own files on the host, which it may write
wherever it runs (the sandbox binds them back, a container mounts them): made here if
missing, so that each can be bound, and made the job's identity's where it has one."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
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


# How deep `give` goes: a path (PATH_MAX, 4,096 bytes) names no more dirs than this, so
# nothing gpuhop copies lies deeper; what lies deeper the job made, as the identity already.
GIVE_DEPTH = 2048
# How `give` enters a dir: as one, never through a link (nor blocking on a FIFO).
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def give(identity: dict[str, Any], paths: list[Path]) -> None:
    """Make `paths` (and, for dirs, all they hold) the identity's. A file linked from
    elsewhere too stays whose it is: a change to it would reach the other place. (gpuhop
    links none into a job's dirs: a model server's SavedModel is mounted, not linked.)

    The walk holds each dir open and changes its entries relative to it, never following a
    link, and enters a subdir only as a dir (O_NOFOLLOW | O_DIRECTORY: a FIFO put in its place
    cannot block it either): the identity's jobs may change these dirs meanwhile (its home is
    shared by all its running jobs), and a dir swapped for a link to `/etc` between a walk by
    path's look and its chown would hand root's files to the job."""
    uid, gid = identity["uid"], identity["gid"]
    for path in paths:
        os.lchown(path, uid, gid)
        try:
            top = os.open(path, DIR_FLAGS)
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                continue  # a file, or a link: lchown was all
            raise
        _give_tree(top, uid, gid)


def _give_tree(top: int, uid: int, gid: int) -> None:
    """Make all that the open dir `top` holds the identity's, depth first with one open
    dir a level; `top` is closed on the way out."""
    opened = [top]
    try:
        pending = [_give_entries(top, uid, gid)]
        while pending:
            name = next(pending[-1], None)
            if name is None:
                pending.pop()
                os.close(opened.pop())
                continue
            if len(pending) >= GIVE_DEPTH:
                continue
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=opened[-1])
            except OSError:  # removed, or swapped for a non-dir, since it was listed
                continue
            opened.append(sub)
            pending.append(_give_entries(sub, uid, gid))
    finally:
        for fd in opened:
            os.close(fd)


def _give_entries(dir_fd: int, uid: int, gid: int) -> Iterator[str]:
    """Make what the open dir `dir_fd` holds the identity's (a file linked elsewhere too
    excepted); the names of its subdirs, to enter next."""
    subdirs = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(entry.name)
                elif st.st_nlink > 1:
                    continue
                os.chown(entry.name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:  # removed by a job since it was listed
                continue
    return iter(subdirs)
