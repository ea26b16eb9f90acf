"""Runs on the user's machine: the agent's job queue: submitting a job (its work dir synced
first) and listing jobs. `Client.submit` and `Client.jobs` say what each argument means."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuhop.api.queue import parse_duration
from gpuhop.api.states import JobState, RetryOn
from gpuhop.client.errors import GpuhopError
from gpuhop.client.job import Job
from gpuhop.client.session import Session

if TYPE_CHECKING:
    from gpuhop.api import JobInfo
    from gpuhop.api.models import DataMount
    from gpuhop.client.sync import ScanResult
    from gpuhop.client.upload import Progress, UploadProgress


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
    after: str | Job | Sequence[str | Job] = (),
    after_any: bool = False,
    timeout: str | float | None = None,
    retry_on: str = "infra",
    notify: Sequence[str] = (),
    mixed_gpus: bool = False,
    sweep: str | None = None,
    max_parallel: int | None = None,
    synced: Synced | None = None,
) -> Job:
    """Sync `workdir` and queue `command` there; see `Client.submit`. What the sync did is
    left in `session.last_sync`. With `synced` (from `scan_workdir`), the work dir is not
    scanned again: the runs of a sweep share one tree."""
    # The sync's modules (the scanner, hashing, uploads): loaded by a submit, not by `ps`.
    from gpuhop.client.leftovers import outputs_warning
    from gpuhop.client.submitted import SyncStats, requirements_text, script_in_workdir, share_mb
    from gpuhop.client.trees import LastTree, post_with_tree

    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise GpuhopError("no command given", code="bad_request")
    gpu_memory_mb = share_mb(gpu_memory, gpus)
    root = Path(workdir).absolute()
    argv[0] = script_in_workdir(argv[0], root)
    synced = synced or scan_workdir(session, root, on_hash)
    result, tree = synced.result, synced.tree
    if argv[0].endswith(".py") and argv[0] not in {f.path for f in result.files}:
        raise GpuhopError(
            f"{argv[0]} is excluded from the sync by .gitignore, .gpuhopignore or gpuhop's"
            " defaults; un-ignore it (a '!' line in .gpuhopignore) to run it",
            code="bad_request",
        )
    try:
        seconds = None if timeout is None else parse_duration(timeout)
    except ValueError as e:
        raise GpuhopError(f"timeout: {e}", code="bad_request") from None
    if retry_on not in set(RetryOn):
        raise GpuhopError(
            f"retry_on: {retry_on!r} is not one of {', '.join(RetryOn)}", code="bad_request"
        )
    deps = [after] if isinstance(after, str | Job) else list(after)
    note = outputs_warning(result.files, root, session.cache_dir)
    if note is not None:
        result.warnings.append(note)
    # `SubmitRequest`'s fields, checked by the agent (its 422 names each bad one): no
    # pydantic here, before `gpuhop run`'s first byte. Fields left at None are not sent, so
    # an older agent still takes a plain request.
    fields: dict[str, Any] = dict(
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
        data=[m.model_dump(mode="json") for m in _mounts(data)],
        requirements=requirements_text(requirements, root),
        python=python,
        private_network=private_network or None,
        pack=pack or None,
        after=[d.id if isinstance(d, Job) else d for d in deps],
        after_any=after_any,
        timeout=seconds,
        retry_on=RetryOn(retry_on).value,
        notify=list(notify) or None,
        mixed_gpus=mixed_gpus or None,
        sweep=sweep,
        max_parallel=max_parallel,
    )
    body = {key: value for key, value in fields.items() if value is not None}
    # An older agent takes a request without these when they say nothing new.
    for key, unset in (("data", []), ("after", []), ("after_any", False), ("retry_on", "infra")):
        if body[key] == unset:
            del body[key]
    sent: tuple[int, int, str] = (0, 0, "")
    last = LastTree.digest_of(session.cache_dir, root)

    def post(fields: dict[str, Any]) -> Any:
        return _post_job(session, {**body, **fields})

    if last is not None and last != tree:
        # Changed since this work dir's last sync: the tree is new to the agent as a rule,
        # so it goes with the job (as a delta from the last, or whole and first).
        response, sent = post_with_tree(session, root, result, on_upload, post)
    else:
        try:
            response = post({})
        except GpuhopError as e:
            if e.code != "missing_tree":
                raise
            # New to this agent: the files it lacks, the tree, and the job again. Only the
            # files this scan hashed are new to the agent as a rule; it names any other it
            # lacks when the tree comes.
            response, sent = post_with_tree(session, root, result, on_upload, post)
        else:
            if last != tree:  # the agent had it: the next change can go as a delta from it
                LastTree.save(session.cache_dir, root, tree)
    session.last_sync = SyncStats(result, *sent)
    return Job(session, response.json())


def _post_job(session: Session, body: dict[str, Any]) -> Any:
    try:
        return session.request("POST", "/v1/jobs", json=body)
    except GpuhopError as e:
        if e.status == 422:
            raise GpuhopError(f"the job was not submitted: {e.message}", e.code, 422) from None
        raise


class Synced(NamedTuple):
    """A scanned work dir: its files and its tree, ready to submit jobs in (see `submit`)."""

    result: ScanResult
    tree_bytes: bytes
    tree: str


def scan_workdir(session: Session, root: Path, on_hash: Progress | None = None) -> Synced:
    from gpuhop.client.upload import scan

    result = scan(session, root, on_hash)
    return Synced(result, result.tree, result.digest)


def list_jobs(
    session: Session,
    states: Sequence[JobState | str] | None = None,
    limit: int = 200,
    sweep: str | None = None,
) -> list[JobInfo]:
    """The agent's jobs (at most `limit`), only those in `states` when given; with `sweep`,
    that sweep's runs (a sweep id, or a name for the newest sweep of that name)."""
    from gpuhop.api.models import JobInfo

    return [JobInfo.model_validate(j) for j in list_json(session, states, limit, sweep)]


def list_json(
    session: Session,
    states: Sequence[JobState | str] | None = None,
    limit: int = 200,
    sweep: str | None = None,
    fields: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """`list_jobs`, as the agent's JSON; each job with only those of `fields` (JobInfo's
    names) that are not null, where they are given (an agent older than them sends all:
    read a field that may be null with `.get`)."""
    params: list[tuple[str, str | int]] = [("limit", limit)]
    if sweep is not None:
        params.append(("sweep", sweep))
    if fields is not None:
        params.append(("fields", ",".join(fields)))
    params += [("state", JobState(s).value) for s in states or ()]
    jobs: list[dict[str, Any]] = session.request("GET", "/v1/jobs", params=params).json()
    return jobs


def _mounts(data: Sequence[str]) -> list[DataMount]:
    """The `--data` mounts; the datasets module (gpuhop.api.data with it) only when asked."""
    if not data:
        return []
    from gpuhop.client.data import parse_mount

    return [parse_mount(m) for m in data]
