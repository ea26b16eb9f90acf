"""Runs on the user's machine: the agent's job queue: submitting a job (its work dir synced
first, its `JobSpec` made from the SDK's keywords by `spec_of`) and listing jobs.
`Client.submit` and `Client.jobs` say what each argument means."""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote

from gpuhop.api.queue import parse_duration
from gpuhop.api.states import JobState
from gpuhop.client.errors import GpuhopError, UnknownOption
from gpuhop.client.job import Job
from gpuhop.client.session import Session

if TYPE_CHECKING:
    from gpuhop.api import JobInfo
    from gpuhop.api.spec import DataSource, JobSpec, Mount, SecretUse
    from gpuhop.client.sync.upload import Progress, UploadProgress
    from gpuhop.client.sync.workdir import ScanResult


# `Client.submit`'s names for the spec's fields that it takes in another form: each makes
# the field's value from what the SDK has always taken (see `Client.submit`).
SDK_NAMES = {"gpu_memory_mb": "gpu_memory", "time_limit": "timeout"}


def spec_of(
    workdir: str | os.PathLike[str], spec: JobSpec | None, options: Mapping[str, Any]
) -> JobSpec:
    """`spec` (default: none asked) with `options` set: JobSpec's fields, by their names or
    by `Client.submit`'s (`gpu_memory`, `timeout`; `requirements` a file, or True, False or
    None for `workdir`'s requirements.txt). None leaves a field at its default. Without a
    `spec`, the work dir's requirements.txt, if any, is the job's unless `requirements`
    says otherwise; a spec's own `requirements` is a file's text, taken as it is.

    GpuhopError (bad_request) names a value that cannot be made the field's; a keyword that
    is no job option raises UnknownOption (a TypeError too)."""
    from gpuhop.api.spec import JobSpec

    defaults = JobSpec()
    known = set(JobSpec._fields)
    root = Path(workdir).absolute()
    fields: dict[str, Any] = {}
    options = _buckets_apart(options)
    for key, value in options.items():
        field = _SDK_FIELDS.get(key, key)
        if field not in known:
            raise UnknownOption(key)
        if value is None and field != "requirements":
            fields[field] = getattr(defaults, field)
            continue
        try:
            fields[field] = _MAKE[field](value, root) if field in _MAKE else value
        except ValueError as e:
            raise GpuhopError(f"{key}: {e}", code="bad_request") from None
    image = fields.get("image", spec.image if spec is not None else None)
    if spec is None and "requirements" not in options and image is None:
        # An image job has the image's packages: the work dir's requirements.txt is not sent.
        fields["requirements"] = _requirements(None, root)
    return (spec or defaults).replace(**fields)


def check(spec: JobSpec) -> None:
    """GpuhopError (bad_request) saying what is wrong between the spec's fields, if anything is."""
    problems = spec.problems(SDK_NAMES)
    if problems:
        raise GpuhopError("; ".join(problems), code="bad_request")


def _requirements(value: Any, root: Path) -> str | None:
    from gpuhop.client.submitted import requirements_text

    return requirements_text(value, root)


def _items(value: Any) -> Any:
    """A list option's items: one str is one item, not a sequence of its characters."""
    return [value] if isinstance(value, str) else value


def _mounts(value: Any, root: Path) -> tuple[Mount, ...]:
    from gpuhop.api.spec import Mount

    return tuple(m if isinstance(m, Mount) else Mount.parse(m) for m in _items(value))


def _sources(value: Any, root: Path) -> tuple[DataSource, ...]:
    from gpuhop.api.spec import DataSource

    return tuple(d if isinstance(d, DataSource) else DataSource.parse(d) for d in _items(value))


def _buckets_apart(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """`options` with the s3:// entries of `data` (as the command line's --data takes
    them) moved to `data_sources`."""
    from gpuhop.api.spec import S3_SCHEME

    data = options.get("data")
    items = [data] if isinstance(data, str) else data
    if not items or not any(isinstance(d, str) and d.startswith(S3_SCHEME) for d in items):
        return options
    buckets = [d for d in items if isinstance(d, str) and d.startswith(S3_SCHEME)]
    rest = [d for d in items if not (isinstance(d, str) and d.startswith(S3_SCHEME))]
    given = options.get("data_sources") or []
    given = [given] if isinstance(given, str) else list(given)
    return {**options, "data": rest, "data_sources": [*given, *buckets]}


def _secrets(value: Any, root: Path) -> tuple[SecretUse, ...]:
    from gpuhop.api.spec import SecretUse

    return tuple(s if isinstance(s, SecretUse) else SecretUse.parse(s) for s in _items(value))


def _job_ids(value: Any, root: Path) -> tuple[str, ...]:
    items = [value] if isinstance(value, str | Job) else value
    return tuple(d.id if isinstance(d, Job) else d for d in items)


def _whole(value: Any, root: Path) -> int:
    """A count or a priority: an int, or what reads as one ("2", 2.0), as the agent would
    take it; checked here, before the spec's own rules compare it with numbers."""
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    raise ValueError(f"takes a whole number, got {value!r}")


def _env(value: Any, root: Path) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(
            f"takes a dict of variable names to values, e.g. {{'WANDB_MODE': 'offline'}},"
            f" not {value!r}"
        )
    for key, text in value.items():  # said here, not after the work dir's upload
        if not isinstance(key, str) or not isinstance(text, str):
            raise ValueError(f"{key!r}: {text!r}: an environment's names and values are str")
    return dict(value)


def _path_text(value: Any, root: Path) -> str:
    """A path on the host, as a str or a path object."""
    if not isinstance(value, str | os.PathLike):
        raise ValueError(f"takes a path, got {value!r}")
    return os.fspath(value)


def _size(value: Any, root: Path) -> int:
    from gpuhop.api.sizes import parse_mb

    return parse_mb(value)


# How a field's value is made from what `Client.submit` is given (a ValueError says why it
# cannot be); other fields take it as it is.
_MAKE: dict[str, Callable[[Any, Path], Any]] = {
    "gpu_memory_mb": _size,
    "time_limit": lambda value, root: parse_duration(value),
    "requirements": _requirements,
    "data": _mounts,
    "data_sources": _sources,
    "secrets": _secrets,
    "after": _job_ids,
    "notify": lambda value, root: tuple(_items(value)),
    "env": _env,
    "python": _path_text,
    "retry_on": lambda value, root: str(value),
    **dict.fromkeys(
        (
            "gpus",
            "workers",
            "gpus_per_worker",
            "worker_timeout",
            "priority",
            "retries",
            "max_parallel",
        ),
        _whole,
    ),
}
_SDK_FIELDS = {name: field for field, name in SDK_NAMES.items()}

# What a job runs: a command line (split as a shell would split it), a script's path, or
# the program and its arguments, paths among them as `subprocess.run` takes them.
Command = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def argv_of(command: Command) -> list[str]:
    """`command` as the agent takes it; GpuhopError where it names nothing to run."""
    if isinstance(command, str):
        argv = shlex.split(command)
    elif isinstance(command, os.PathLike):
        argv = [os.fspath(command)]
    elif isinstance(command, Sequence):
        argv = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in command]
    else:
        raise GpuhopError(
            f"the command is a str, a path or a list of them (['train.py', '--epochs', '3']),"
            f" not {command!r}",
            code="bad_request",
        )
    if not argv:
        raise GpuhopError("no command given", code="bad_request")
    if not all(isinstance(a, str) for a in argv):
        wrong = next(a for a in argv if not isinstance(a, str))
        raise GpuhopError(
            f"the command's arguments are str (or paths): {wrong!r} is not (str({wrong!r})?)",
            code="bad_request",
        )
    return argv


def submit(
    session: Session,
    command: Command,
    spec: JobSpec,
    *,
    workdir: str | os.PathLike[str] = ".",
    on_hash: Progress | None = None,
    on_upload: UploadProgress | None = None,
    synced: Synced | None = None,
) -> Job:
    """Sync `workdir` and queue `command` there as `spec` asks; see `Client.submit`. What
    the sync did is left in `session.last_sync`. With `synced` (from `scan_workdir`), the
    work dir is not scanned again: the runs of a sweep share one tree."""
    # The sync's modules (the scanner, hashing, uploads): loaded by a submit, not by `ps`.
    from gpuhop.client.submitted import SyncStats, script_in_workdir
    from gpuhop.client.sync.leftovers import outputs_warning
    from gpuhop.client.sync.trees import LastTree, post_with_tree

    argv = argv_of(command)
    check(spec)
    root = Path(workdir).absolute()
    if not root.is_dir():  # said before a script is looked for in it
        raise GpuhopError(f"work dir {root} is not a directory", code="bad_request")
    argv[0] = script_in_workdir(argv[0], root)
    synced = synced or scan_workdir(session, root, on_hash)
    result, tree = synced.result, synced.tree
    if argv[0].endswith(".py") and argv[0] not in {f.path for f in result.files}:
        raise GpuhopError(
            f"{argv[0]} is excluded from the sync by .gitignore, .gpuhopignore or gpuhop's"
            " defaults; un-ignore it (a '!' line in .gpuhopignore) to run it",
            code="bad_request",
        )
    note = outputs_warning(result.files, root, session.cache_dir)
    if note is not None:
        result.warnings.append(note)
    # `SubmitRequest`'s fields, checked by the agent (its 422 names each bad one): no
    # pydantic here, before `gpuhop run`'s first byte. Only what the spec asks beyond the
    # defaults is sent, so an older agent still takes a request that asks nothing new.
    body = {"command": argv, "tree": tree, **spec.to_wire()}
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
    from gpuhop.client.sync.upload import scan

    result = scan(session, root, on_hash)
    return Synced(result, result.tree, result.digest)


def _state(value: JobState | str) -> str:
    try:
        return JobState(value).value
    except ValueError:
        raise GpuhopError(
            f"no job state {value!r}; the states are {', '.join(JobState)}", code="bad_request"
        ) from None


def list_jobs(
    session: Session,
    states: Sequence[JobState | str] | JobState | str | None = None,
    limit: int = 200,
    sweep: str | None = None,
) -> list[JobInfo]:
    """The agent's jobs (at most `limit`), only those in `states` when given; with `sweep`,
    that sweep's runs (a sweep id, or a name for the newest sweep of that name)."""
    from gpuhop.api.models import JobInfo

    return [JobInfo.model_validate(j) for j in list_json(session, states, limit, sweep)]


def cancel_sweep(session: Session, sweep: str, grace: float) -> list[JobInfo]:
    """`Client.cancel_sweep`."""
    from gpuhop.api.models import JobInfo

    path = f"/v1/sweeps/{quote(sweep, safe='')}/cancel"
    runs = session.request("POST", path, params={"grace": grace}).json()
    return [JobInfo.model_validate(j) for j in runs]


def list_json(
    session: Session,
    states: Sequence[JobState | str] | JobState | str | None = None,
    limit: int = 200,
    sweep: str | None = None,
    fields: Sequence[str] | str | None = None,
) -> list[dict[str, Any]]:
    """`list_jobs`, as the agent's JSON; each job with only those of `fields` (JobInfo's
    names) that are not null, where they are given (an agent older than them sends all:
    read a field that may be null with `.get`)."""
    params: list[tuple[str, str | int]] = [("limit", limit)]
    if sweep is not None:
        params.append(("sweep", sweep))
    if fields is not None:
        params.append(("fields", ",".join(_items(fields))))
    params += [("state", _state(s)) for s in _items(states or ())]
    jobs: list[dict[str, Any]] = session.request("GET", "/v1/jobs", params=params).json()
    return jobs
