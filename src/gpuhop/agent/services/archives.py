"""Runs in the agent: a directory of a job's artifacts (a SavedModel, a checkpoint dir, or
all of them) as one zip archive, for its owner, streamed while it is written.

A SavedModel is a directory (`saved_model.pb`, `variables/`, `assets/`); a user wants it as
one download, as W&B's artifact page gives it. Zip rather than tar: every OS opens one
without tools. Files are stored, not compressed: a model's weights hardly compress, and
the archive then streams at the disk's speed. Links are neither followed nor sent, as the
artifact listing leaves them out.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.services.jobfileread import LinkOnTheWay, open_file, regular_files
from gpuhop.agent.services.jobs import find
from gpuhop.agent.services.outputs import check_not_pruned
from gpuhop.api import ErrorCode, validate_relpath

CHUNK = 1024 * 1024


class Archive:
    """One directory to send as `name` (the download's file name): `under` (its path's
    parts) in the artifacts dir `base`."""

    def __init__(self, base: Path, under: list[bytes], name: str) -> None:
        self.base = base
        self.under = under
        self.name = name

    def chunks(self) -> Iterator[bytes]:
        """The zip file's bytes, a piece at a time (one file's worth at most CHUNK, so a
        large model never sits whole in memory). A running job may change its artifacts
        meanwhile: each file is listed and opened by its dirs, never through a link
        (jobfileread), and what goes in is the regular file that was opened."""
        out = _Pieces()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
            for rel, _ in regular_files(self.base, self.under):
                try:
                    opened = open_file(self.base, b"/".join([*self.under, rel]))
                except (LinkOnTheWay, FileNotFoundError, PermissionError):
                    continue  # the job removed it, swapped it for a link, or locked it
                with os.fdopen(opened.fd, "rb") as src:
                    # A file dated before 1980 goes in as 1980.
                    info = zipfile.ZipInfo.from_file(
                        f"/proc/self/fd/{opened.fd}", _name(rel), strict_timestamps=False
                    )
                    with zf.open(info, "w", force_zip64=True) as dst:
                        while block := src.read(CHUNK):
                            dst.write(block)
                            if out.held:
                                yield out.take()
        yield out.take()  # the rest, and the directory at the end


class _Pieces(io.RawIOBase):
    """A write-only stream that keeps what was written until `take`: zipfile writes into
    it, the response sends what it took (zipfile handles a stream it cannot seek)."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._parts.append(bytes(data))
        return len(data)

    @property
    def held(self) -> int:
        return len(self._parts)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def _name(rel: bytes) -> str:
    """The file's name in the archive: its path under the directory sent; one that is not
    UTF-8 written as the artifact listing shows it (its odd bytes as \\xNN)."""
    return rel.decode("utf-8", "backslashreplace")


def artifact_dir_of(rt: AgentContext, ref: str, caller: Caller, name: str) -> Archive:
    """The caller's job's artifacts directory `name` ("" for all its artifacts) as an
    Archive; 400 for a name that leads out of it, 404 where there is no such directory."""
    job = find(rt, ref, caller)
    check_not_pruned(rt, job)
    root = rt.supervisor.job_paths(job.id).artifacts.resolve()
    name = name.strip("/")
    if name:
        try:
            validate_relpath(name)
        except ValueError as e:
            raise ApiError(400, ErrorCode.bad_path, str(e)) from None
    full = root / name if name else root
    if full.is_symlink() or not full.resolve().is_relative_to(root):
        raise ApiError(400, ErrorCode.bad_path, f"{name} leads out of the artifacts dir")
    if not full.is_dir():
        what = f"no artifact directory {name}" if name else "no artifacts yet"
        raise not_found(f"job {job.id} has {what}")
    stem = f"{job.id}-{full.name}" if name else f"{job.id}-artifacts"
    under = [os.fsencode(part) for part in name.split("/")] if name else []
    return Archive(root, under, f"{stem}.zip")
