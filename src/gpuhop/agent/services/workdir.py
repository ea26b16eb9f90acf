"""Runs in the agent: the files a job created or changed in its work dir, for its owner.

A job's work dir is made from its synced tree (`Supervisor._materialise`), then the job
writes where it likes: `model.save("my_model.keras")`, `ModelCheckpoint("training_1/...")`.
Those files come back with `gpuhop pull`, the synced sources do not. A file is an output
when the tree has no such path, or when it differs from the tree's entry: another size, or
(same size, touched after the work dir was made) another sha256. A file not touched since
`JobPaths.materialised` is taken as synced without reading it, so a large unchanged tree
costs one `stat` per file.

On a Slurm agent the job's work dir is the same dir, on the shared filesystem its nodes use.
Only a finished job's files are listed and read: no process of it is left to swap a file
for a link between the check and the read. Left out: `__pycache__` dirs (Python's own), a
`.venv` the job made, the datasets' mount points, links (never followed out of the work
dir), and names that are not UTF-8 (logged, as for artifacts).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.storage.treefile import read_entries
from gpuhop.api import ErrorCode, ManifestEntry, WorkdirEntry, validate_relpath
from gpuhop.backends import jobdeps

log = logging.getLogger("gpuhop.agent")

SKIPPED_DIRS = {"__pycache__", ".venv"}


def _check(rt: AgentContext, job: JobRecord) -> None:
    if not job.state.finished:
        # A running job could swap a listed file for a link between the check and the read
        # (jobs are hostile); once it has ended, none of its processes is left to do so.
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"job {job.id} {job.state.said}; its work-dir files come back once it has"
            " ended (its artifacts can be pulled now: gpuhop pull --only artifacts)",
            {"state": job.state.value},
        )
    if not on_this_host(rt):
        # Ray: the job ran in a copy of its files on a node. (Slurm's nodes use the job's own
        # work dir, on the shared filesystem, so its files are here.)
        raise ApiError(
            409,
            ErrorCode.unsupported,
            "this agent runs jobs on a Ray cluster, where each worker's work dir is a temp dir"
            " on its node that is removed with the job: only $GPUHOP_ARTIFACTS_DIR comes back"
            " (gpuhop pull --only artifacts)",
        )


def on_this_host(rt: AgentContext) -> bool:
    """Whether jobs' work dirs are the agent's own `jobs/ID/work` (not so on Ray, where
    each worker runs in a temp dir on its node)."""
    return not (rt.backend.remote and rt.backend.files_seen() is None)


def _synced(jp_tree: Path) -> dict[str, ManifestEntry]:
    """The job's synced files by path, its tree read an entry at a time."""
    try:
        with open(jp_tree, "rb") as f:
            return {e["path"]: ManifestEntry.model_validate(e) for e in read_entries(f)}
    except (OSError, ValueError, KeyError):
        return {}


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def list_outputs(rt: AgentContext, job: JobRecord) -> list[WorkdirEntry]:
    """The job's new and changed work-dir files, sorted by path."""
    _check(rt, job)
    jp = rt.supervisor.job_paths(job.id)
    root = jp.work
    if not root.is_dir():
        return []
    synced = _synced(jp.tree)
    try:
        made_ns = jp.materialised.stat().st_mtime_ns
    except OSError:
        made_ns = 0  # made by an older agent: compare every same-size file's content
    mounts = {m["mount"].strip("/") for m in jobdeps.mounts(jobdeps.read(jp))}
    out: list[WorkdirEntry] = []
    for dirpath, dirs, files in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirs[:] = [
            d for d in dirs if d not in SKIPPED_DIRS and (rel_dir / d).as_posix() not in mounts
        ]
        for name in files:
            full = Path(dirpath) / name
            rel = (rel_dir / name).as_posix()
            try:
                rel.encode()
            except UnicodeEncodeError:
                shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
                log.warning(
                    "job %s: work-dir file %s is not listed: its name is not UTF-8", job.id, shown
                )
                continue
            try:
                st = full.lstat()
                if not full.is_file() or full.is_symlink():
                    continue  # links, sockets, fifos: only regular files come back
                base = synced.get(rel)
                if (
                    base is not None
                    and base.size == st.st_size
                    and (st.st_mtime_ns < made_ns or _sha256(full) == base.digest)
                ):
                    continue  # as synced
            except OSError as e:
                log.warning("job %s: work-dir file %s is not listed: %s", job.id, rel, e)
                continue
            out.append(
                WorkdirEntry(
                    path=rel,
                    size=st.st_size,
                    mtime=st.st_mtime,
                    base=base.digest if base is not None else None,
                )
            )
    out.sort(key=lambda e: e.path)
    return out


def output_path(rt: AgentContext, job: JobRecord, path: str) -> Path:
    """One file of the job's work dir, checked to stay inside it (no link on the way)."""
    _check(rt, job)
    try:
        validate_relpath(path)
    except ValueError as e:
        raise ApiError(400, ErrorCode.bad_path, str(e)) from None
    root = rt.supervisor.job_paths(job.id).work.resolve()
    full = root / path
    if any(p.is_symlink() for p in (full, *full.parents) if p.is_relative_to(root)) or (
        not full.resolve().is_relative_to(root)
    ):
        raise ApiError(400, ErrorCode.bad_path, f"{path} leads out of job {job.id}'s work dir")
    if not full.is_file():
        raise not_found(f"job {job.id} has no file {path} in its work dir")
    return full
