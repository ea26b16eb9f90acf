"""Request and response models of the agent's HTTP API (version 1)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from gpuhop.api.base import StrictModel, WireModel, check_text
from gpuhop.api.energy import JobEnergy
from gpuhop.api.queue import check_webhook_url
from gpuhop.api.spec import (
    DATA_NAME_RE,
    ENV_NAME_RE,
    MAX_NOTIFY_URLS,
    DataSource,
    JobSpec,
    Mount,
    SecretUse,
    check_image,
    check_image_secret,
)
from gpuhop.api.states import EndClass, JobState, RetryOn
from gpuhop.api.trees import MAX_DELTA_ENTRIES, MAX_INLINE_BYTES

# A container image's reference, and the name of the secret it is pulled with, each checked
# as `check_image` and `check_image_secret` say (jobs' and model servers' alike).
ImageRef = Annotated[str, AfterValidator(check_image)]
ImageSecretName = Annotated[str, AfterValidator(check_image_secret)]

SHA256_RE = re.compile(r"[0-9a-f]{64}\Z")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# A job's name: a sweep names its runs `NAME[lr=0.1,batch=32]`, so brackets, '=', ',' and
# '+' are allowed after the first character (not ':', which ends a job ref in JOB:PATH).
JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+,=\[\]-]{0,127}\Z")
SWEEP_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}\Z")
USER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}\Z")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_MANIFEST_FILES = 200_000
# A path in a work dir: at most this many components, of at most NAME_MAX bytes each, and
# this many bytes in all, so that the job's dir plus the path stays within PATH_MAX (4096)
# and making its directories never nears Python's recursion limit.
MAX_PATH_DEPTH = 128
MAX_PATH_BYTES = 3072
MAX_NAME_BYTES = 255
# GPUHOP_* variables a user may set for a job; gpuhop sets every other one.
# GPUHOP_KERAS: which Keras a multi-worker job uses (`run --keras`; backends/kerasmode.py).
USER_SETTABLE_ENV = frozenset(
    {"GPUHOP_HOOK_VERBOSE", "GPUHOP_ARRAY_INDEX", "GPUHOP_AUTO", "GPUHOP_KERAS"}
)
# Where a job's notifications go: webhook URLs, at most this many per job.
# A memory share larger than any GPU made: a typo, not a request.
MAX_GPU_MEMORY_MB = 16 * 1024 * 1024


def validate_relpath(path: str) -> str:
    """Return `path` if it is a safe relative POSIX path inside a work dir, else raise ValueError.

    Safe means: not empty, not absolute, no `..`, `.` or empty component, no backslash or NUL,
    valid text, and within the bounds above (depth, bytes, bytes per component).
    The agent re-checks every path it materialises; this is the first gate.
    """
    if not path or len(path) > MAX_PATH_BYTES:
        raise ValueError(f"path {path[:80]!r}: empty or longer than {MAX_PATH_BYTES} bytes")
    check_text(path, f"path {path[:80]!r}")
    if len(path.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"path {path[:80]!r}...: longer than {MAX_PATH_BYTES} bytes")
    if "\x00" in path or "\\" in path:
        raise ValueError(f"path {path!r}: contains a NUL or a backslash")
    if path.startswith("/"):
        raise ValueError(f"path {path!r}: absolute paths are not allowed")
    parts = path.split("/")
    if len(parts) > MAX_PATH_DEPTH:
        raise ValueError(
            f"path {path[:80]!r}...: {len(parts)} levels deep; at most {MAX_PATH_DEPTH} are allowed"
        )
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(f"path {path!r}: '..', '.' and empty components are not allowed")
        if len(part.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"path {path[:80]!r}: a name longer than {MAX_NAME_BYTES} bytes")
    return path


class ManifestEntry(StrictModel):
    path: str
    digest: str
    size: int = Field(ge=0)
    executable: bool = False

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return validate_relpath(v)

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        if not SHA256_RE.match(v):
            raise ValueError("digest must be 64 lowercase hex characters (sha256)")
        return v


class Tree(StrictModel):
    """A work dir: every file's path and content digest. Its own id is the sha256 of the
    exact bytes uploaded, so an unchanged project is named, not sent, on its next run."""

    entries: list[ManifestEntry] = Field(max_length=MAX_MANIFEST_FILES)


class TreeStored(WireModel):
    digest: str
    files: int
    bytes: int


class TreeDelta(StrictModel):
    """A tree as its changes from `parent` (one the caller stored): entries added or changed,
    paths removed, and the content of new files (`blobs`: digest -> base64). The agent
    keeps the tree it makes (`api.trees.tree_bytes`) only if it hashes to `digest`."""

    parent: str
    digest: str
    changed: list[ManifestEntry] = Field(default_factory=list, max_length=MAX_DELTA_ENTRIES)
    removed: list[str] = Field(default_factory=list, max_length=MAX_DELTA_ENTRIES)
    blobs: dict[str, str] = Field(default_factory=dict)

    @field_validator("blobs")
    @classmethod
    def _blobs(cls, v: dict[str, str]) -> dict[str, str]:
        for digest in v:
            cls._sha256(digest)
        if sum(map(len, v.values())) * 3 // 4 > MAX_INLINE_BYTES:
            raise ValueError(
                f"more than {MAX_INLINE_BYTES >> 20} MiB of files inline; upload them first"
            )
        return v

    @field_validator("parent", "digest")
    @classmethod
    def _sha256(cls, v: str) -> str:
        if not SHA256_RE.match(v):
            raise ValueError(f"{v[:80]!r} is not a sha256 hex digest")
        return v


DATASET_NAME_RULE = (
    "a dataset name is 1-64 characters of letters, digits, '.', '_' or '-', starting with a"
    " letter or digit"
)


def check_dataset_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ValueError(f"{name!r}: {DATASET_NAME_RULE}")
    return name


class DataMount(StrictModel):
    """`--data NAME[:VERSION]=MOUNT`: a dataset, read-only at MOUNT in the job's work dir.
    Without a version, the latest at submit time (the job's info shows which it got)."""

    name: str
    version: int | None = Field(default=None, ge=1)
    mount: str

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dataset_name(v)

    @field_validator("mount")
    @classmethod
    def _mount(cls, v: str) -> str:
        try:
            return validate_relpath(v.rstrip("/"))
        except ValueError as e:
            raise ValueError(f"the mount point must lie inside the work dir: {e}") from None


class BucketSource(StrictModel):
    """`--data s3://BUCKET/PREFIX[:NAME]`: a bucket's prefix, fetched by the agent's host
    and seen read-only at `$GPUHOP_DATA/NAME` (see `gpuhop.api.spec.DataSource`)."""

    bucket: str
    prefix: str = Field(default="", max_length=1024)
    name: str

    @model_validator(mode="after")
    def _source(self) -> BucketSource:
        # The spec's own parser judges it, so the CLI and the agent refuse the same words.
        text = f"s3://{self.bucket}/{self.prefix}:{self.name}"
        if "\x00" in text:
            raise ValueError("the bucket source contains a NUL byte")
        # Each field named on its own first: parsed back as one text, a bad name would read
        # as part of the prefix.
        if not DATA_NAME_RE.match(self.name):
            raise ValueError(
                f"{self.name!r} cannot name the data (1-64 letters, digits, '.', '_' or '-',"
                " starting with a letter or digit)"
            )
        if self.prefix and (self.prefix.startswith("/") or not self.prefix.endswith("/")):
            raise ValueError(
                f"the prefix {self.prefix!r} must be empty or a folder: not starting with '/',"
                " ending in '/'"
            )
        if DataSource.parse(text) != DataSource(self.bucket, self.prefix, self.name):
            raise ValueError(f"{text}: the prefix must be empty or end in '/'")
        return self


class SecretRef(StrictModel):
    """`--secret NAME[=ENVVAR]`: the user's secret NAME, given to the job as ENVVAR. The
    value never travels with the job: the agent reads it from the user's own secrets when
    the job starts (see gpuhop.agent.storage.secrets)."""

    name: str
    env: str

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_secret_name(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: str) -> str:
        check_env({v: ""})
        return v


def check_secret_name(name: str) -> str:
    """A secret's name (an environment variable's), or ValueError saying what is wrong."""
    if not ENV_NAME_RE.match(name):
        raise ValueError(
            f"secret name {name[:80]!r} is not valid: an environment variable's name (letters,"
            " digits and _, not starting with a digit, at most 128 characters)"
        )
    return name


# SubmitRequest's fields that are not the job's settings (`JobSpec`): what it runs, and in
# which files.
_NOT_SPEC = {"command", "tree", "tree_delta"}


def check_env(env: dict[str, str]) -> dict[str, str]:
    """A job's environment variables as a request gives them, or ValueError naming the
    first that a job may not have."""
    for key, value in env.items():
        if not ENV_KEY_RE.match(key):
            raise ValueError(f"environment variable name {key!r} is not valid")
        reserved = key.startswith("GPUHOP_") or key in ("CUDA_VISIBLE_DEVICES", "TF_CONFIG")
        if reserved and key not in USER_SETTABLE_ENV:
            raise ValueError(f"environment variable {key} is set by gpuhop and cannot be given")
        if "\x00" in value:
            raise ValueError(f"environment variable {key} contains a NUL byte")
    return env


class SubmitRequest(StrictModel):
    """What `gpuhop run` asks for. `command[0]` ending in `.py` runs with the agent's Python."""

    command: list[str] = Field(min_length=1, max_length=4096)
    # The digest of the job's work-dir tree (see `Tree`), or None for an empty work dir.
    tree: str | None = None
    name: str | None = None
    gpus: int = Field(default=0, ge=0, le=1024)
    env: dict[str, str] = Field(default_factory=dict)
    priority: int = Field(default=0, ge=-100, le=100)
    # A failed (or lost) attempt is queued again this many times, its checkpoint dir kept.
    retries: int = Field(default=0, ge=0, le=100)
    # Multi-worker jobs: this many processes, each with `gpus_per_worker` GPUs and a
    # TF_CONFIG made by gpuhop. `gpus` is then the total, filled in from these two.
    workers: int = Field(default=1, ge=1, le=64)
    gpus_per_worker: int = Field(default=0, ge=0, le=64)
    # How long a worker waits for its peers to join before the job fails (seconds).
    worker_timeout: int = Field(default=300, ge=5, le=86_400)
    # A share of one GPU, in MB: the job gets one GPU that other share jobs may use too,
    # and TensorFlow in the job is capped at this much of its memory.
    gpu_memory_mb: int | None = Field(default=None, ge=1, le=MAX_GPU_MEMORY_MB)
    # Datasets mounted read-only in the work dir (see `DataMount`).
    data: list[DataMount] = Field(default_factory=list, max_length=64)
    # Buckets' prefixes fetched on the host (see `BucketSource`). An agent that predates
    # them refuses the field.
    data_sources: list[BucketSource] = Field(default_factory=list, max_length=64)
    # The user's secrets the job is given, by name (see `SecretRef`). An agent that
    # predates secrets refuses the field.
    secrets: list[SecretRef] = Field(default_factory=list, max_length=64)
    # The text of a requirements file: the job runs in a venv with these packages, built
    # once per set and interpreter and reused, that also sees the interpreter's packages.
    requirements: str | None = Field(default=None, max_length=1_000_000)
    # An interpreter on the host to run the job's script with (default: the agent's).
    python: str | None = Field(default=None, min_length=1, max_length=4096)
    # A container image to run the job in, through Podman on the agent's host (see
    # `check_image`); the agent's default (agent.toml `image`) where none is given. An agent
    # that predates images refuses it.
    image: ImageRef | None = None
    # The name of the user's secret holding `user:password` for the registry `image` is
    # pulled from (where the host lacks it). An agent that predates it refuses it.
    image_secret: ImageSecretName | None = None
    # No image at all, not even the agent's default: the host's Python (`--no-image`). An
    # agent that predates it refuses it.
    no_image: bool | None = None
    # Run the job in a private network namespace: none of its ports is reachable from
    # another host or from the host itself; `gpuhop forward` reaches them through the
    # agent. Multi-worker jobs always run in one. An agent that predates this refuses it.
    private_network: bool | None = None
    # On an agent with the Ray or Slurm backend: put the workers on as few nodes as possible
    # instead of spreading them across nodes. An agent that predates this refuses it.
    pack: bool | None = None
    # Jobs (ids, prefixes or names) this one waits for; with `after_any`, it runs however
    # they end, else only if all succeeded (a failed or cancelled one cancels it).
    after: list[str] = Field(default_factory=list, max_length=64)
    after_any: bool = False
    # A time limit in seconds: SIGTERM when it passes, SIGKILL after the grace period.
    timeout: float | None = Field(default=None, gt=0, le=7 * 86400)
    # Which failed attempts `retries` runs again (see `RetryOn`).
    retry_on: RetryOn = RetryOn.infra
    # Webhooks the agent POSTs the job's start and end to (http or https; see
    # gpuhop.agent.services.notify for which hosts an agent lets a job reach).
    notify: list[str] | None = Field(default=None, max_length=MAX_NOTIFY_URLS)
    # A run of a sweep (or array): the sweep's id, and how many of its runs may run at once.
    sweep: str | None = None
    max_parallel: int | None = Field(default=None, ge=1, le=10_000)
    # Several whole GPUs may be of different models (default: all of one model and group).
    mixed_gpus: bool | None = None
    # A re-sync in the job's request: its tree (`tree`) as a delta, kept as by /v1/trees/delta.
    tree_delta: TreeDelta | None = None

    @field_validator("notify", mode="before")
    @classmethod
    def _notify_count(cls, v: object) -> object:
        # Before the field's own max_length, whose words are pydantic's ("List should have
        # at most 8 items after validation, not 9").
        if isinstance(v, list) and len(v) > MAX_NOTIFY_URLS:
            raise ValueError(f"{len(v)} webhooks; a job may have at most {MAX_NOTIFY_URLS}")
        return v

    @field_validator("notify")
    @classmethod
    def _notify(cls, v: list[str] | None) -> list[str] | None:
        for url in v or []:
            check_webhook_url(url)
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: str | None) -> str | None:
        if v is not None and not SWEEP_RE.match(v):
            raise ValueError(
                "sweep must be 1-80 characters of letters, digits, '.', '_' or '-',"
                " starting with a letter or digit"
            )
        return v

    @model_validator(mode="after")
    def _tree_delta(self) -> SubmitRequest:
        if self.tree_delta is not None and self.tree != self.tree_delta.digest:
            raise ValueError("tree_delta makes the job's tree: tree must be its digest")
        return self

    @model_validator(mode="after")
    def _spec(self) -> SubmitRequest:
        # The rules between fields are the spec's, so the command line (which checks them
        # before sending) and the agent refuse the same requests in the same words. They
        # judge the request as sent, before `settled` fills in its GPUs.
        spec = self._asked()
        found = spec.problems()
        if found:
            raise ValueError("; ".join(found))
        self.gpus = spec.settled().gpus
        return self

    def spec(self) -> JobSpec:
        """The job's settings as one `JobSpec`, settled (a multi-worker or share job's
        `gpus` filled in). Its command and tree travel beside it."""
        return self._asked().settled()

    def _asked(self) -> JobSpec:
        fields = self.model_dump(exclude=_NOT_SPEC, exclude_none=True)
        fields["data"] = tuple(Mount(m.name, m.version, m.mount) for m in self.data)
        fields["secrets"] = tuple(SecretUse(s.name, s.env) for s in self.secrets)
        fields["data_sources"] = tuple(
            DataSource(d.bucket, d.prefix, d.name) for d in self.data_sources
        )
        fields["retry_on"] = self.retry_on.value
        return JobSpec.from_json(fields)

    @field_validator("tree")
    @classmethod
    def _tree(cls, v: str | None) -> str | None:
        if v is not None and not SHA256_RE.match(v):
            raise ValueError("tree must be a sha256 hex digest")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not JOB_NAME_RE.match(v):
            raise ValueError(
                "name must be 1-128 characters of letters, digits and . _ - + , = [ ],"
                " starting with a letter or digit"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        if not v[0] or any("\x00" in a for a in v):
            raise ValueError("command must start with a non-empty program and contain no NUL")
        return v


class RequeueRequest(StrictModel):
    """`gpuhop requeue JOB --priority N`: a queued job's new place in the queue."""

    priority: int = Field(ge=-100, le=100)


class AttemptInfo(WireModel):
    """How one earlier attempt of a retried job ended."""

    attempt: int
    state: JobState
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    signal: int | None
    reason: str | None
    end_class: EndClass | None = None
    # Its last metrics record, as `latest_metrics` is the current attempt's.
    metrics: dict[str, object] | None = None


class JobInfo(WireModel):
    id: str
    name: str | None
    state: JobState
    command: list[str]
    gpus: int
    gpu_ids: list[int]
    env: dict[str, str]
    priority: int
    attempt: int
    retries: int = 0
    workers: int = 1
    # Earlier attempts, oldest first; the current one is described by the fields above.
    attempts: list[AttemptInfo] = Field(default_factory=list)
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    signal: int | None
    reason: str | None
    log_size: int = 0
    latest_metrics: dict[str, object] | None = None
    # The latest metrics of each source the job's records name (`fit:MODEL` for a Keras fit,
    # `summary:LOGDIR` for tf.summary scalars), newest first; `latest_metrics` is the first.
    metrics_by_source: dict[str, dict[str, object]] = Field(default_factory=dict)
    # The most GPU memory the job's framework had in use (its own allocator's view, from the
    # metrics file), in MB; None where it reported none (no GPU, or no such framework).
    memory_peak_mb: float | None = None
    # When retention removed the finished job's files (log, artifacts); its record stays.
    pruned_at: datetime | None = None
    # The job's share of its one GPU in MB; None for whole-GPU and CPU jobs.
    gpu_memory_mb: int | None = None
    # The user who submitted it (None for jobs from an agent older than ownership).
    owner: str | None = None
    # Datasets mounted in the job, as NAME:vVERSION=MOUNT.
    data: list[str] = Field(default_factory=list)
    # The secrets it is given, as NAME or NAME=ENVVAR: names only, never a value.
    secrets: list[str] = Field(default_factory=list)
    # The id of the job's Python environment (requirements), and the interpreter it runs.
    python_env: str | None = None
    python: str | None = None
    image: str | None = None  # the container image it runs in (`--image`)
    # The job runs in a private network namespace (multi-worker jobs always do).
    private_network: bool = False
    # Why it ended (None until it has; and for jobs an older agent finished).
    end_class: EndClass | None = None
    # The jobs it waits for (full ids), whether any end will do, and those not ended yet.
    after: list[str] = Field(default_factory=list)
    after_any: bool = False
    waiting_for: list[str] = Field(default_factory=list)
    timeout: float | None = None
    retry_on: RetryOn = RetryOn.infra
    # Why a queued job is not starting yet, as the agent's scheduler says it to the job's
    # owner: its place in line, what it needs and who holds it ("2nd in line; waits for 1
    # GPU; held by live2, hog"), or the limit it waits on (a per-user limit, its sweep's
    # max_parallel, no free GPUs of one model); for a starting job, what its cluster waits on.
    # Every view shows these words as they are.
    waiting: str | None = None
    # The cluster's own name for its latest attempt ("Slurm job 812"); None on one host.
    cluster_job: str | None = None
    # Its sweep (see `SubmitRequest.sweep`) and that sweep's max_parallel.
    sweep: str | None = None
    max_parallel: int | None = None
    mixed_gpus: bool = False
    notify: list[str] = Field(default_factory=list)
    # The GPU energy and GPU time it used, in all and per attempt (see `JobEnergy`); None
    # for a job that has not started.
    energy: JobEnergy | None = None


class BlobCheck(StrictModel):
    digests: list[str] = Field(max_length=MAX_MANIFEST_FILES)

    @field_validator("digests")
    @classmethod
    def _digests(cls, v: list[str]) -> list[str]:
        for d in v:
            if not SHA256_RE.match(d):
                raise ValueError(f"{d!r} is not a sha256 hex digest")
        return v


class BlobCheckResult(WireModel):
    missing: list[str]
