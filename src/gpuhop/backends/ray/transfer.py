"""Runs on both ends of a Ray job (the leader on the agent's host, the actors on the
nodes): a directory as one tar in memory, and back.

A job's files travel through Ray's object store as one uncompressed tar (the work dir
and the checkpoints out, worker 0's artifacts and checkpoints back). Unpacking uses
tarfile's "data" filter: no absolute paths, no `..`, no links out of the target, no
device files, so a job cannot write outside its dir on the host that receives its files.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path


def pack(root: Path) -> bytes:
    """The tree under `root` (empty if it does not exist) as tar bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if root.is_dir():
            for child in sorted(root.iterdir()):
                tar.add(child, arcname=child.name)
    return buf.getvalue()


def unpack(data: bytes, dest: Path, replace: bool = False) -> None:
    """Unpack tar bytes into `dest` (made if missing). `replace` empties `dest` first."""
    if replace and dest.is_dir():
        for child in dest.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(dest, filter="data")
