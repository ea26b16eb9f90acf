"""Runs in the agent: what a job leaves behind, for its owner: its log (read or followed),
its metrics, its artifacts; and the word when GC has pruned them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote_from_bytes, unquote_to_bytes

import gpuhop.api.routing  # noqa: F401 (registers {path:anypath}, which the job file routes take)
from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.agent.jobs.masking import mask_records
from gpuhop.agent.jobs.metricstail import parse_records
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import gc
from gpuhop.agent.services.jobfileread import LinkOnTheWay, OpenedFile, open_file, regular_files
from gpuhop.agent.services.jobs import find
from gpuhop.agent.services.logwatch import LogWatch
from gpuhop.api import ArtifactEntry, ErrorCode, validate_relpath
from gpuhop.home import JobPaths

LOG_CHUNK = 256 * 1024
# The most of a metrics file one request reads; a longer line is skipped.
METRICS_READ = 4 * 1024 * 1024
# The largest byte offset a log or metrics read takes (1 TiB): far past any such file, and
# short of the largest file a filesystem keeps (ext4's 16 TiB), past which a read fails.
MAX_OFFSET = 2**40

log = logging.getLogger("gpuhop.agent")


def check_not_pruned(rt: AgentContext, job: JobRecord) -> None:
    """410 for a job whose files retention removed: its log and artifacts are gone."""
    marker = gc.pruned(rt.supervisor.job_paths(job.id))
    if marker is not None:
        when = datetime.fromtimestamp(marker.get("pruned_at", 0), tz=UTC)
        raise ApiError(
            410,
            ErrorCode.pruned,
            f"job {job.id} {job.state.value}, and its log, metrics and artifacts were removed"
            f" on {when:%Y-%m-%d %H:%M} UTC by the agent's retention policy"
            f" ({marker.get('why', 'retention')}); its record stays",
        )


def log_path(rt: AgentContext, job: JobRecord, worker: int | None) -> Path:
    """The job's log, or one worker's own log of a multi-worker job."""
    check_not_pruned(rt, job)
    jp = rt.supervisor.job_paths(job.id)
    if worker is None:
        return jp.log
    if not 0 <= worker < job.spec.workers:
        raise ApiError(
            400,
            ErrorCode.bad_request,
            f"job {job.id} has {job.spec.workers} worker(s), numbered from 0; there is no worker"
            f" {worker}",
        )
    return jp.worker_log(worker)


async def follow_log(
    watch: LogWatch, job_id: str, path: Path, offset: int, follow: bool
) -> AsyncIterator[bytes]:
    """Yield a log from byte `offset`; with `follow`, until the job has ended and all is sent.

    A followed log waits on the agent's one watch of that file (see `logwatch`), not on a
    poll of its own."""
    with contextlib.ExitStack() as stack:
        follower = stack.enter_context(watch.follow(job_id, path)) if follow else None
        f = None
        while True:
            if f is None and path.exists():
                f = stack.enter_context(open(path, "rb"))
                f.seek(offset)
            chunk = f.read(LOG_CHUNK) if f is not None else b""
            if chunk:
                yield chunk
                if len(chunk) == LOG_CHUNK:
                    continue
                # Short: that read reached the end (no read more per chunk to find so).
            if follower is None:
                return
            if follower.ended:
                # The state is recorded after the process ended: one more read gets the rest.
                if f is None and path.exists():
                    continue
                rest = f.read() if f is not None else b""
                if rest:
                    yield rest
                return
            await follower.changed()


def read_metrics(rt: AgentContext, job_id: str, offset: int) -> tuple[list[dict], int]:
    """Complete metric lines from byte `offset`, and the offset after the last one."""
    path = rt.supervisor.job_paths(job_id).metrics
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(METRICS_READ)
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == METRICS_READ:
        # A line longer than a whole read: skip what was read of it and go on; the rest of
        # it is not JSON and is skipped on the next read, up to its end.
        log.warning("job %s: skipped part of a metrics line over %d bytes", job_id, METRICS_READ)
        return [], offset + len(data)
    return parse_records(data[:end].splitlines()), offset + end


def list_artifacts(rt: AgentContext, job_id: str) -> list[ArtifactEntry]:
    return list_files(rt.supervisor.job_paths(job_id).artifacts)


def list_files(root: Path) -> list[ArtifactEntry]:
    """The regular files under `root` (its artifacts, its /tmp), links not followed."""
    out: list[ArtifactEntry] = []
    for rel, st in regular_files(root):
        try:
            entry = ArtifactEntry(path=rel.decode(), size=st.st_size, mtime=st.st_mtime)
        except UnicodeDecodeError:
            # A name that is not UTF-8 travels as its bytes (see ArtifactEntry).
            entry = ArtifactEntry(
                path=rel.decode("utf-8", "backslashreplace"),
                raw=quote_from_bytes(rel, safe="/"),
                size=st.st_size,
                mtime=st.st_mtime,
            )
        out.append(entry)
    out.sort(key=lambda a: a.path)
    return out


def requested_artifact(raw_path: bytes) -> bytes:
    """The artifact's name as the request's URL gave it, byte for byte (the router's own
    `path` is decoded as UTF-8, so a name that is not UTF-8 would come out changed)."""
    _, _, quoted = raw_path.partition(b"/artifacts/")
    return unquote_to_bytes(quoted)


def artifact_file(rt: AgentContext, job_id: str, name: bytes) -> OpenedFile:
    root = JobPaths(rt.paths.job_dir(job_id)).artifacts
    return file_under(root, name, f"job {job_id} has no artifact", "the artifacts dir")


def file_under(root: Path, name: bytes, missing: str, where: str) -> OpenedFile:
    """The regular file `name` (its bytes) under `root`, opened without following a link
    (jobfileread), to be sent (OpenedFileResponse); 400 for a link on the way, 404
    (`missing`, then the name) where there is no such file."""
    shown = name.decode("utf-8", "backslashreplace")
    try:
        # Checked with any bytes that are not UTF-8 replaced: the same slashes and dots.
        validate_relpath(name.decode("utf-8", "replace"))
    except ValueError as e:
        raise ApiError(400, ErrorCode.bad_path, str(e)) from None
    try:
        return open_file(root, name)
    except LinkOnTheWay:
        raise ApiError(400, ErrorCode.bad_path, f"{shown} leads out of {where}") from None
    except FileNotFoundError:
        raise not_found(f"{missing} {shown}") from None


# What a job's routes read, one function each for /v1/jobs and the dashboard's /ui/api.


def log_of(
    rt: AgentContext, ref: str, caller: Caller, worker: int | None
) -> tuple[JobRecord, Path]:
    """The caller's job `ref` and the path of its log (or its worker's)."""
    job = find(rt, ref, caller)
    return job, log_path(rt, job, worker)


def metrics_of(rt: AgentContext, ref: str, caller: Caller, offset: int) -> dict[str, object]:
    """The caller's job's metrics records from byte `offset`, and where the next read starts."""
    job = find(rt, ref, caller)
    check_not_pruned(rt, job)
    records, next_offset = read_metrics(rt, job.id, offset)
    if records:
        records = mask_records(records, rt.secret_values(job))
    return {"records": records, "next_offset": next_offset}


def artifacts_of(rt: AgentContext, ref: str, caller: Caller) -> list[ArtifactEntry]:
    """The caller's job's artifacts."""
    job = find(rt, ref, caller)
    check_not_pruned(rt, job)
    return list_artifacts(rt, job.id)


def artifact_of(rt: AgentContext, ref: str, caller: Caller, raw_path: bytes) -> OpenedFile:
    """One of the caller's job's artifacts, named by the request's raw path
    (`requested_artifact`), opened to be sent."""
    job = find(rt, ref, caller)
    check_not_pruned(rt, job)
    return artifact_file(rt, job.id, requested_artifact(raw_path))


def tmp_files_of(rt: AgentContext, ref: str, caller: Caller) -> list[ArtifactEntry]:
    """The files the caller's ended job left in its /tmp (kept with its files: see
    `JobPaths.tmp`)."""
    job = _ended(rt, ref, caller)
    return list_files(rt.supervisor.job_paths(job.id).tmp)


def tmp_file_of(rt: AgentContext, ref: str, caller: Caller, raw_path: bytes) -> OpenedFile:
    """One file the caller's ended job left in its /tmp, named by the request's raw path
    (`/v1/jobs/REF/tmp/NAME`: NAME's bytes, as `requested_artifact`), opened to be sent."""
    job = _ended(rt, ref, caller)
    root = rt.supervisor.job_paths(job.id).tmp
    name = unquote_to_bytes(raw_path.split(b"/", 5)[-1])
    return file_under(root, name, f"job {job.id} left no file in its /tmp at", "its /tmp")


def _ended(rt: AgentContext, ref: str, caller: Caller) -> JobRecord:
    job = find(rt, ref, caller)
    check_not_pruned(rt, job)
    if not job.state.finished:
        # As for its work dir: no process of it is left to swap a file for a link.
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"job {job.id} {job.state.said}; the files it left in its /tmp come back once"
            " it has ended",
            {"state": job.state.value},
        )
    return job
