"""Runs on the user's machine: the agent's job queue: submitting a job (its work dir synced
first) and listing jobs. `Client.submit` and `Client.jobs` say what each argument means."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from gpuhop.api import JobInfo, JobState, SubmitRequest
from gpuhop.client.data import parse_mount
from gpuhop.client.errors import GpuhopError, invalid
from gpuhop.client.job import Job
from gpuhop.client.session import Session
from gpuhop.client.spec import (
    SyncStats,
    requirements_text,
    script_in_workdir,
    share_mb,
    tree_of,
)
from gpuhop.client.upload import Progress, UploadProgress, scan, send_files, send_tree


def submit(
    session: Session,
    command: str | Sequence[str],
    *,
    workdir: str | os.PathLike[str] = ".",
    gpus: int = 0,
    name: str | None = None,
    env: dict[str, str] | None = None,
    priority: int = 0,
    retries: int = 0,
    workers: int = 1,
    gpus_per_worker: int = 0,
    worker_timeout: int = 300,
    gpu_memory: str | int | None = None,
    on_hash: Progress | None = None,
    on_upload: UploadProgress | None = None,
    data: Sequence[str] = (),
    requirements: str | os.PathLike[str] | bool | None = None,
    python: str | None = None,
    private_network: bool = False,
    pack: bool = False,
) -> Job:
    """Sync `workdir` and queue `command` there; see `Client.submit`. What the sync did is
    left in `session.last_sync`."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise GpuhopError("no command given", code="bad_request")
    gpu_memory_mb = share_mb(gpu_memory, gpus)
    root = Path(workdir).absolute()
    argv[0] = script_in_workdir(argv[0], root)
    result = scan(session, root, on_hash)
    if argv[0].endswith(".py") and argv[0] not in {f.path for f in result.files}:
        raise GpuhopError(
            f"{argv[0]} is excluded from the sync by .gitignore, .gpuhopignore or gpuhop's"
            " defaults; un-ignore it (a '!' line in .gpuhopignore) to run it",
            code="bad_request",
        )
    tree_bytes, tree = tree_of(result.files)
    # Fields left at None are not sent, so an older agent still takes a plain request.
    try:
        body = SubmitRequest(
            command=argv,
            tree=tree,
            name=name,
            gpus=gpus,
            env=dict(env or {}),
            priority=priority,
            retries=retries,
            workers=workers,
            gpus_per_worker=gpus_per_worker,
            worker_timeout=worker_timeout,
            gpu_memory_mb=gpu_memory_mb,
            data=[parse_mount(m) for m in data],
            requirements=requirements_text(requirements, root),
            python=python,
            private_network=private_network or None,
            pack=pack or None,
        ).model_dump(mode="json", exclude_none=True)
    except ValidationError as e:
        raise invalid("the job was not submitted", e) from None
    if not body["data"]:
        del body["data"]  # an older agent takes a request without it
    sent = (0, 0)
    try:
        response = session.request("POST", "/v1/jobs", json=body)
    except GpuhopError as e:
        if e.code != "missing_tree":
            raise
        # A new or changed tree: send the files the agent lacks, then the tree, then
        # ask again. An unchanged tree skips all of this. Only the files this scan hashed
        # are new to the agent as a rule; it names any other it lacks when the tree comes.
        count, size = send_files(session, result.changed, on_upload)
        more = send_tree(session, tree_bytes, result.files, on_upload)
        sent = (count + more[0], size + more[1])
        response = session.request("POST", "/v1/jobs", json=body)
    session.last_sync = SyncStats(result, *sent)
    return Job(session, JobInfo.model_validate(response.json()))


def list_jobs(
    session: Session, states: Sequence[JobState | str] | None = None, limit: int = 200
) -> list[JobInfo]:
    """The agent's jobs (at most `limit`), only those in `states` when given."""
    params: list[tuple[str, str | int]] = [("limit", limit)]
    params += [("state", JobState(s).value) for s in states or ()]
    return [
        JobInfo.model_validate(j) for j in session.request("GET", "/v1/jobs", params=params).json()
    ]
