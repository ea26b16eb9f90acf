"""A job's settings, once, for every layer: `JobSpec`.

Built at the command line's edge (`gpuhop.cli.jobopts`) or by the SDK (`Client.submit`),
sent as flat JSON (`to_wire`; the agent's `SubmitRequest` checks each field and gives the spec
back), kept whole by the agent's store, and handed whole to the scheduler and to the backend
that runs each attempt. What a job runs (its command) and which files it runs in (its tree)
travel beside it: one spec may run many commands (a sweep's runs).

Standard library only, and light: `gpuhop run` builds one before its first byte goes out, so
it is a NamedTuple (immutable, and `dataclasses` would cost the command more than the rest of
its start).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

# Webhooks one job may name (`notify`).
MAX_NOTIFY_URLS = 8

# The names a spec's fields have on the wire where they differ from the spec's own: the
# ones agents have always known (an agent refuses a field it does not know).
WIRE_NAMES = {"time_limit": "timeout"}
# How often a failed attempt is run again (`retry_on`): the machine's fault only, or any.
RETRY_ON = ("infra", "any")


class Mount(NamedTuple):
    """`NAME[:VERSION]=MOUNT`: a dataset, read-only at MOUNT in the job's work dir (VERSION
    None: the latest when the job is queued)."""

    name: str
    version: int | None
    mount: str

    @classmethod
    def parse(cls, text: str) -> Mount:
        """`NAME[:VERSION]=MOUNT`, VERSION as 3 or v3; ValueError says what is malformed."""
        head, sep, mount = text.partition("=")
        name, colon, version = head.partition(":")
        if not sep or not name or not mount:
            raise ValueError(f"takes NAME[:VERSION]=MOUNT, got {text!r}")
        number = version[1:] if version[:1] in ("v", "V") else version
        if colon and (not number.isdigit() or int(number) < 1):
            raise ValueError(f"{text}: the version must be a number like 3 or v3, from 1")
        return cls(name, int(number) if colon else None, mount)

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "mount": self.mount}


class DataSource(NamedTuple):
    """`s3://BUCKET/PREFIX[:NAME]`: the objects under PREFIX in an S3-compatible bucket,
    fetched onto the GPU host by the agent (with the job's user's own credentials, never
    through the client) and seen read-only at `$GPUHOP_DATA/NAME` (NAME: the prefix's last
    part, or the bucket's name). PREFIX is a folder: `train` means the keys under `train/`."""

    bucket: str
    prefix: str  # "" (the whole bucket) or ending in "/"
    name: str

    @classmethod
    def parse(cls, text: str) -> DataSource:
        """`s3://BUCKET[/PREFIX][:NAME]`; ValueError says what is malformed."""
        if not text.startswith(S3_SCHEME):
            raise ValueError(f"takes s3://BUCKET/PREFIX[:NAME], got {text!r}")
        rest = text[len(S3_SCHEME) :]
        head, colon, name = rest.rpartition(":")
        if not colon or "/" in name:  # a colon inside the prefix is the prefix's
            head, name = rest, ""
        bucket, _, prefix = head.partition("/")
        if not BUCKET_RE.match(bucket):
            raise ValueError(
                f"{text}: {bucket!r} is not a bucket name (3-63 characters of lower-case"
                " letters, digits, '.' and '-')"
            )
        prefix = prefix.strip("/")
        if "//" in prefix or any(part in (".", "..") for part in prefix.split("/")):
            raise ValueError(f"{text}: the prefix has an empty, '.' or '..' part")
        name = name or (prefix.rpartition("/")[2] if prefix else bucket)
        if not DATA_NAME_RE.match(name):
            raise ValueError(
                f"{text}: {name!r} cannot name the data (1-64 letters, digits, '.', '_' or"
                " '-', starting with a letter or digit); give one: s3://BUCKET/PREFIX:NAME"
            )
        return cls(bucket, prefix + "/" if prefix else "", name)

    @property
    def url(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}"

    def __str__(self) -> str:
        return f"{self.url}:{self.name}"

    def wire(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "prefix": self.prefix, "name": self.name}


S3_SCHEME = "s3://"
# S3's rule for bucket names (a bucket of another S3-compatible service is named so too).
BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]\Z")
# What names a bucket's data in the job ($GPUHOP_DATA/NAME): a dataset's name.
DATA_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,63}\Z")


def split_data(items: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """`--data` values apart: the datasets' (NAME[:VERSION]=MOUNT), then the buckets'
    (s3://...)."""
    sources = [item for item in items if item.startswith(S3_SCHEME)]
    return [item for item in items if not item.startswith(S3_SCHEME)], sources


class SecretUse(NamedTuple):
    """`NAME[=ENVVAR]`: the job's user's secret NAME, in the job's environment as ENVVAR
    (default: NAME). Only the name travels and is kept; the agent puts the value in the
    job's environment when it starts, and masks it wherever it shows the job's text."""

    name: str
    env: str

    @classmethod
    def parse(cls, text: str) -> SecretUse:
        """`NAME` or `NAME=ENVVAR`; ValueError says what is malformed."""
        name, sep, env = text.partition("=")
        if not name or (sep and not env):
            raise ValueError(f"takes NAME or NAME=ENVVAR, got {text!r}")
        for part in (name, env or name):
            if not ENV_NAME_RE.match(part):
                raise ValueError(f"{part!r} is not a valid environment variable name")
        return cls(name, env or name)

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "env": self.env}


# A container image's reference, as Podman takes it: [REGISTRY[:PORT]/]NAME[:TAG][@DIGEST],
# NAME's parts lower-case. The wire checks it (`check_image`) before anything runs it.
IMAGE_RE = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?/)?"  # registry
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"  # name
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"  # tag
    r"(?:@sha256:[0-9a-f]{64})?\Z"  # digest
)
MAX_IMAGE_LENGTH = 255


def check_image(ref: str) -> str:
    """A container image's reference (`IMAGE_RE`), or ValueError saying what is wrong."""
    if len(ref) > MAX_IMAGE_LENGTH:
        raise ValueError(f"the image reference is longer than {MAX_IMAGE_LENGTH} characters")
    first, slash, _ = ref.partition("/")
    # A first part is a registry only with a dot, a port or as localhost (as Podman reads
    # it); otherwise it is the name's, which is lower-case.
    named = slash and not ("." in first or ":" in first or first == "localhost")
    if not IMAGE_RE.match(ref) or (named and first != first.lower()):
        raise ValueError(
            f"{ref[:80]!r} is not an image reference:"
            " [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST], NAME in lower-case letters, digits"
            " and . _ - /, e.g. nvcr.io/nvidia/tensorflow:24.01-tf2-py3"
        )
    return ref


# What a secret's name (and the variable it is given as) may be: an environment variable's.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")


def check_image_secret(name: str) -> str:
    """The name of the secret an image is pulled with, or ValueError saying what is wrong."""
    if not ENV_NAME_RE.match(name):
        raise ValueError(f"image_secret: {name[:80]!r} is not a secret's name")
    return name


# No variables: a default no one can change in place (every spec without env shares it).
NO_ENV: Mapping[str, str] = MappingProxyType({})


class JobSpec(NamedTuple):
    """What a job asks for: resources, environment, place in the queue. Each field's meaning
    is in `Client.submit`'s docstring and in `gpuhop run --help`; its limits are the agent's
    (`SubmitRequest`), its cross-field rules `problems()`."""

    # Resources.
    gpus: int = 0  # whole GPUs; for a multi-worker job, workers * gpus_per_worker
    gpu_memory_mb: int | None = None  # instead of whole GPUs: a share of one (MB)
    mixed_gpus: bool = False  # several GPUs may be of different models
    workers: int = 1
    gpus_per_worker: int = 0
    worker_timeout: int = 300  # seconds a worker waits for its peers
    pack: bool = False  # workers on as few nodes as possible (Ray, Slurm)
    # What the job runs with.
    name: str | None = None
    env: Mapping[str, str] = NO_ENV
    python: str | None = None  # an interpreter on the host
    image: str | None = None  # a container image the job runs in (Podman, the local backend)
    # The user's secret (user:password) the host pulls `image` from its registry with.
    image_secret: str | None = None
    # No image, not even the agent's default (agent.toml `image`): the host's Python.
    no_image: bool = False
    requirements: str | None = None  # a requirements file's text: the job's own venv
    data: tuple[Mount, ...] = ()
    # Buckets' prefixes, fetched onto the host while the job waits, at $GPUHOP_DATA/NAME.
    data_sources: tuple[DataSource, ...] = ()
    secrets: tuple[SecretUse, ...] = ()  # the user's secrets, by name, in its environment
    private_network: bool = False
    # Its place in the queue, and what ends or repeats it.
    priority: int = 0
    after: tuple[str, ...] = ()  # jobs (ids, prefixes or names) it waits for
    after_any: bool = False  # run however they end (default: only if all succeeded)
    time_limit: float | None = None  # seconds: SIGTERM when it passes
    retries: int = 0
    retry_on: str = "infra"
    notify: tuple[str, ...] = ()  # webhooks told of its start and end
    sweep: str | None = None  # the sweep (or array) it is a run of
    max_parallel: int | None = None  # how many of the sweep's runs run at once

    def problems(self, names: Mapping[str, str] | None = None) -> list[str]:
        """What is wrong between the fields, in words, each field named as `names` calls
        it (the command line passes its options: "--gpus"); empty when nothing is."""

        def n(field_name: str) -> str:
            return (names or {}).get(field_name, field_name)

        found = []
        if self.workers == 1 and self.gpus_per_worker:
            found.append(
                f"{n('gpus_per_worker')} is for multi-worker jobs ({n('workers')} N);"
                f" use {n('gpus')}"
            )
        if self.workers > 1 and self.gpus and self.gpus != self.workers * self.gpus_per_worker:
            found.append(f"a multi-worker job takes {n('gpus_per_worker')}, not {n('gpus')}")
        if self.gpu_memory_mb is not None:
            if self.workers > 1:
                found.append(
                    f"{n('gpu_memory_mb')} gives one job a share of one GPU; a multi-worker"
                    f" job takes whole GPUs ({n('gpus_per_worker')})"
                )
            elif self.gpus > 1:
                found.append(
                    f"{n('gpu_memory_mb')} gives the job a share of one GPU; it cannot be"
                    f" combined with {n('gpus')} {self.gpus} (use {n('gpus')} {self.gpus}"
                    " alone for whole GPUs)"
                )
        if self.max_parallel is not None and self.sweep is None:
            found.append(f"{n('max_parallel')} limits the runs of a sweep")
        if self.after_any and not self.after:
            found.append(f"{n('after_any')} says how to wait for {n('after')} jobs; give them too")
        targets = [s.env for s in self.secrets]
        for env in dict.fromkeys(t for t in targets if targets.count(t) > 1):
            found.append(f"{n('secrets')} gives two secrets as {env}")
        for env in dict.fromkeys(t for t in targets if t in self.env):
            found.append(f"{env} is given both by {n('env')} and by {n('secrets')}")
        called = [d.name for d in self.data_sources]
        for name in dict.fromkeys(c for c in called if called.count(c) > 1):
            found.append(f"{n('data_sources')} names two buckets' data {name}; give one :NAME")
        if len(self.notify) > MAX_NOTIFY_URLS:  # said before a sync, not after it
            found.append(
                f"{n('notify')}: {len(self.notify)} webhooks; a job may have at most"
                f" {MAX_NOTIFY_URLS}"
            )
        if self.image_secret is not None and self.image is None:
            found.append(f"{n('image_secret')} is the registry's login for {n('image')}; give both")
        if self.image is not None and self.no_image:
            found.append(
                f"{n('image')} runs the job in that image; {n('no_image')} runs it with the"
                " host's Python: give one of them"
            )
        if self.image is not None and self.python is not None:
            found.append(
                f"{n('image')} runs the job with the image's own python3;"
                f" {n('python')} names an interpreter on the host: give one of them"
            )
        if self.retry_on not in RETRY_ON:
            found.append(f"{n('retry_on')} takes {' or '.join(RETRY_ON)}, got {self.retry_on!r}")
        return found

    def settled(self) -> JobSpec:
        """The spec with what follows from its other fields filled in: a multi-worker job's
        GPUs are workers * gpus_per_worker, a share's is one GPU."""
        if self.workers > 1:
            return self._replace(gpus=self.workers * self.gpus_per_worker)
        if self.gpu_memory_mb is not None:
            return self._replace(gpus=1)
        return self

    def replace(self, **changes: Any) -> JobSpec:
        """The spec with these fields changed."""
        return self._replace(**changes)

    def to_json(self) -> dict[str, Any]:
        """Every field, as JSON (the agent's store keeps this)."""
        out: dict[str, Any] = self._asdict()
        out["env"] = dict(self.env)
        out["data"] = [m.wire() for m in self.data]
        out["data_sources"] = [d.wire() for d in self.data_sources]
        out["secrets"] = [s.wire() for s in self.secrets]
        out["after"] = list(self.after)
        out["notify"] = list(self.notify)
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> JobSpec:
        """A spec from `to_json`'s output (or the wire's: its names are taken too). Fields it
        does not know are left out (a newer agent's), and missing ones take their default."""
        fields = {_FROM_WIRE.get(key, key): item for key, item in value.items() if item is not None}
        if not fields.keys() <= _FIELDS:  # a newer agent's fields
            fields = {name: item for name, item in fields.items() if name in _FIELDS}
        if "data" in fields:
            fields["data"] = tuple(
                Mount(m["name"], m.get("version"), m["mount"]) if isinstance(m, Mapping) else m
                for m in fields["data"]
            )
        if "data_sources" in fields:
            fields["data_sources"] = tuple(
                DataSource(d["bucket"], d["prefix"], d["name"]) if isinstance(d, Mapping) else d
                for d in fields["data_sources"]
            )
        if "secrets" in fields:
            fields["secrets"] = tuple(
                SecretUse(s["name"], s.get("env") or s["name"]) if isinstance(s, Mapping) else s
                for s in fields["secrets"]
            )
        for name in ("after", "notify"):
            if name in fields:
                fields[name] = tuple(fields[name])
        return cls(**fields)

    def non_default(self) -> dict[str, Any]:
        """The fields not at their defaults, as JSON (`to_json`'s values, by the spec's own
        names). What a job asked for, and all that need be said of it: a submit sends these
        (`to_wire`), the store keeps these (`records.stored_spec`), and `from_json` gives the
        rest back at their defaults. A sequence or mapping counts as at its default when it is
        empty, whatever its type (a list of no `after` jobs is the default's empty tuple)."""
        return {name: value for name, value in self.to_json().items() if value != _DEFAULTS[name]}

    def to_wire(self) -> dict[str, Any]:
        """The fields a submit sends: those not at their default, by their wire names, so an
        older agent takes a request that asks nothing new of it."""
        return {WIRE_NAMES.get(name, name): value for name, value in self.non_default().items()}


_FIELDS = frozenset(JobSpec._fields)
# Every field at its default, as `to_json` gives it: what `non_default` compares with.
_DEFAULTS = JobSpec().to_json()
_FROM_WIRE = {wire: name for name, wire in WIRE_NAMES.items()}
