"""Runs in the agent: its settings (retention, quotas, limits, webhooks, the idle guard, the
identities of jobs), read once at start.

From `agent.toml` in the state dir, then from `python -m gpuhop.agent` options, which win:

    keep_days = 30            # a finished job's files are kept this long ...
    keep_jobs = 100           # ... and the newest this many finished jobs' files whatever their age
    gc_every_hours = 6        # automatic collection: at start, then this often (0: never)
    gc_grace_minutes = 60     # anything stored or asked about this recently is never collected
    env_keep_days = 30        # a cached environment no job used for this long is removed
    object_cache_size = "100GiB"  # bucket objects fetched for jobs (--data s3://...), all
                              # users together; the least recently used go first ("none": no bound)
    object_keep_days = 30     # gc removes a cached bucket prefix no job used for this long
    image_keep_days = 30      # gc removes a container image gpuhop pulled that no
                              # queued or running job needs and none used for this long ...
    image_quota = "200GiB"    # ... and, past this, the least recently used such images
    insecure_registries = ["registry.lab:5000"]  # pulled from over plain HTTP (or unchecked TLS)
    storage_quota = "50GiB"   # blobs, trees, datasets and cached bucket objects together
    jobs_quota = "200GiB"     # job dirs: work dirs, logs, metrics, artifacts, checkpoints
    log_cap = "1GiB"          # one job's log; a job that passes it is stopped and fails
    user_max_gpus = 4         # a user's jobs hold at most this many GPUs at once; more wait
    user_max_queued = 50      # a user may have this many jobs queued; more are refused (429)
    notify = ["https://hooks.slack.com/services/..."]   # every job's start and end go here
    notify_allowed_hosts = ["hooks.slack.com", "ci.example.com:8443"]  # see jobs/notifier
    notify_timeout_seconds = 10   # a webhook that has not answered by then is tried again
    auth_fail_limit = 20      # a client address that sends this many wrong tokens to the TLS
    auth_fail_window_seconds = 60  # listener within this long is refused (429) as long
                              # after, valid tokens too ("none" for the limit: never)
    idle_gpu_minutes = 30     # a job holding whole GPUs at 0 % this long is warned in its log
    idle_action = "warn"      # ... and left alone ("warn"), or cancelled, class idle ("cancel")
    job_uid_base = 2000000000 # a team agent's jobs run as one uid per user from here on ...
    job_env_pass = ["HTTPS_PROXY"]  # ... with these of the agent's variables besides the usual
    [job_accounts]            # ... or as the Unix account an admin maps a user to
    alice = "alice"
    image = "nvcr.io/nvidia/tensorflow:24.01-tf2-py3"  # jobs that name no image, no
                              # --python and no requirements run in this one (Podman)
    podman = "/usr/bin/podman"  # the Podman that runs image jobs (default: podman on PATH)
    container_runtime = "runc"  # its OCI runtime (default: Podman's own, but runc on a
                              # cgroup v1 host with controllers on the v2 hierarchy, which
                              # crun refuses)
    ready_containers = true   # start a container ahead of the next image job like the
                              # last (root agents; one per kind, gone after 10 idle minutes)
    [slurm]                   # the Slurm backend (--backend slurm)
    ports = "20000-32000"     # a multi-worker job's TensorFlow ports on the compute nodes,
                              # which the nodes' firewalls must let them reach each other on
    scratch = "/local/scratch"  # node-local disk on every node for jobs' TMPDIR and
                              # $GPUHOP_SCRATCH_DIR (a site's $SLURM_TMPDIR comes first)

Per-user limits bind users who are not admins. No limit is set by default.
The idle guard is off by default; notebooks (`gpuhop notebook`) are exempt from it: they
end by their own idle rule.

Sizes are bytes, or a number with a binary unit (KiB, MiB, GiB, TiB; K, M, G, T alike).
No quota is set by default.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhop.api.queue import check_webhook_url
from gpuhop.api.spec import check_image

CONFIG_NAME = "agent.toml"
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*\Z", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
SIZE_FIELDS = ("storage_quota", "jobs_quota", "log_cap", "object_cache_size", "image_quota")
LIMIT_FIELDS = ("user_max_gpus", "user_max_queued")
LIST_FIELDS = ("notify", "notify_allowed_hosts", "job_env_pass", "insecure_registries")
IDLE_ACTIONS = ("warn", "cancel")
TABLES = ("slurm",)  # [slurm] ports = ... is the setting slurm_ports
_PORTS_RE = re.compile(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*\Z")
# An entry of notify_allowed_hosts (see gpuhop.agent.jobs.notifier.HostRule): HOST, HOST:PORT,
# *.DOMAIN, or an IPv6 address as a URL writes it, [::1] or [::1]:PORT.
_ALLOWED_HOST_RE = re.compile(r"\*\.[A-Za-z0-9_.-]+\Z|[A-Za-z0-9_-][A-Za-z0-9_.-]*(?::\d{1,5})?\Z")
_ALLOWED_V6_RE = re.compile(r"\[([0-9A-Fa-f:.]+)\](?::\d{1,5})?\Z")


class PolicyError(ValueError):
    """A setting that cannot be read; the message names it."""


@dataclass(frozen=True)
class Policy:
    keep_days: float = 30.0
    keep_jobs: int = 100
    gc_every_hours: float = 6.0
    gc_grace_minutes: float = 60.0
    env_keep_days: float = 30.0
    object_cache_size: int | None = 100 << 30
    object_keep_days: float = 30.0
    image_keep_days: float = 30.0
    image_quota: int | None = None
    insecure_registries: tuple[str, ...] = ()
    storage_quota: int | None = None
    jobs_quota: int | None = None
    log_cap: int | None = None
    user_max_gpus: int | None = None
    user_max_queued: int | None = None
    notify: tuple[str, ...] = ()
    notify_allowed_hosts: tuple[str, ...] = ()
    notify_timeout_seconds: float = 10.0
    auth_fail_limit: int | None = 20
    auth_fail_window_seconds: float = 60.0
    idle_gpu_minutes: float | None = None
    idle_action: str = "warn"
    job_uid_base: int = 2_000_000_000
    job_env_pass: tuple[str, ...] = ()
    job_accounts: tuple[tuple[str, str], ...] = ()
    image: str | None = None  # the default image of jobs that ask for no environment
    podman: str = "podman"
    container_runtime: str | None = None  # None: see gpuhop.backends.local.podman
    ready_containers: bool = True  # see gpuhop.backends.local.ready
    slurm_ports: tuple[int, int] | None = None  # None: the Slurm backend's own default
    slurm_scratch: str | None = None  # None: $SLURM_TMPDIR, else the node's temp dir

    @property
    def grace_seconds(self) -> float:
        return self.gc_grace_minutes * 60

    def with_settings(self, settings: dict[str, Any], source: str) -> Policy:
        """This policy with `settings` (name -> value, as in agent.toml) applied."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for name, value in _flat(settings, source).items():
            if name not in fields:
                known = ", ".join(map(_shown, fields))
                what = _shown(name) if name != _shown(name) else repr(name)
                raise PolicyError(f"{source}: unknown setting {what} (known: {known})")
            changes[name] = _coerce(name, value, source)
        return dataclasses.replace(self, **changes)


def _flat(settings: dict[str, Any], source: str) -> dict[str, Any]:
    """`settings` with each table of TABLES spread into its fields ([slurm] ports: slurm_ports)."""
    out = {}
    for name, value in settings.items():
        if name in TABLES:
            if not isinstance(value, dict):
                raise PolicyError(f"{source}: {name} is a table: write [{name}] and its settings")
            out.update({f"{name}_{key}": v for key, v in value.items()})
        else:
            out[name] = value
    return out


def _shown(name: str) -> str:
    """A setting's name as agent.toml spells it: "[slurm] ports" for slurm_ports."""
    table, _, key = name.partition("_")
    return f"[{table}] {key}" if table in TABLES and key else name


def check_allowed_host(entry: str) -> str:
    """`entry` if notify_allowed_hosts can take it, else ValueError saying what to write.
    An entry that no URL's host can match would refuse every webhook, with no word of why
    at the agent's start: a URL ("https://hooks.slack.com"), and "*", which is not taken to
    allow every host, loopback and the host's private network included (SSRF)."""
    if entry == "*" or entry.startswith("*:"):
        raise ValueError(
            "\"*\" is not taken: it would let users' webhooks reach every host, this one's"
            " loopback and its private network included. Leave notify_allowed_hosts out to"
            ' allow every public host, or list hosts ("HOST", "HOST:PORT", "*.DOMAIN")'
        )
    v6 = _ALLOWED_V6_RE.match(entry)
    with_brackets = v6 is not None and _is_ip(v6.group(1))
    if not (with_brackets or _is_ip(entry) or _ALLOWED_HOST_RE.match(entry)):
        url = " (a host, not a URL: hooks.slack.com, not https://hooks.slack.com/)"
        raise ValueError(
            f"{entry[:80]!r} is not a host: give"
            ' "HOST", "HOST:PORT", "*.DOMAIN" or "[IPv6]:PORT"' + (url if "/" in entry else "")
        )
    return entry


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def parse_ports(text: object) -> tuple[int, int]:
    """(low, high) from "LOW-HIGH", both included. Raises ValueError."""
    match = _PORTS_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError('give a range of ports "LOW-HIGH", e.g. "20000-32000"')
    low, high = int(match.group(1)), int(match.group(2))
    if not 1024 <= low < high <= 65535:
        raise ValueError("give ports from 1024 to 65535, the lower first, at least two of them")
    return low, high


def parse_bytes(text: str | int) -> int:
    """Bytes in "50GiB", "512M", "200KiB" or "12345". Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size")
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(text)
        if match is None:
            raise ValueError(f"cannot read {text!r} as a size (e.g. 50GiB, 512M, 4096)")
        value = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    return value


def _coerce(name: str, value: Any, source: str) -> Any:
    try:
        if name in SIZE_FIELDS:
            return None if value in (None, "", "none", 0) else parse_bytes(value)
        if name in LIST_FIELDS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError("give a list of strings")
            if name == "notify":
                for url in value:
                    check_webhook_url(url)
            if name == "notify_allowed_hosts":
                for entry in value:
                    check_allowed_host(entry)
            return tuple(value)
        if name in LIMIT_FIELDS:
            if value in (None, "", "none") or isinstance(value, bool):
                return None
            if int(value) < 0:
                raise ValueError("it is negative")
            return int(value)
        if name == "job_accounts":
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ValueError('give a table of user = "unix account"')
            return tuple(sorted(value.items()))
        if name == "slurm_ports":
            return parse_ports(value)
        if name == "slurm_scratch":
            if not isinstance(value, str) or not value.startswith("/"):
                raise ValueError("give an absolute path on the nodes' local disk")
            return value
        if name == "image":
            if not isinstance(value, str):
                raise ValueError("give an image reference, e.g. docker.io/library/python:3.11")
            return check_image(value)
        if name in ("podman", "container_runtime"):
            if not isinstance(value, str) or not value or "\x00" in value:
                raise ValueError("give a program's name or absolute path")
            return value
        if name == "ready_containers":
            if not isinstance(value, bool):
                raise ValueError("give true or false")
            return value
        if name == "job_uid_base":
            if isinstance(value, bool) or not 1000 <= int(value) <= 2**31 - 200_000:
                raise ValueError("give a uid from 1000 to 2147283647")
            return int(value)
        if name == "idle_action":
            if value not in IDLE_ACTIONS:
                raise ValueError(f"give one of {', '.join(map(repr, IDLE_ACTIONS))}")
            return value
        if name == "idle_gpu_minutes":
            if value in (None, "", "none", 0) or isinstance(value, bool):
                return None
            if float(value) <= 0:
                raise ValueError("give a number of minutes above 0 (fractions allowed)")
            return float(value)
        if name == "auth_fail_limit":
            if value in (None, "", "none"):
                return None
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    'give a whole number of wrong tokens, 1 or more ("none": no limit)'
                )
            return value
        if name in ("notify_timeout_seconds", "auth_fail_window_seconds"):
            # 0 would time every webhook out at once: each notification failed and dropped;
            # or hold no address back at all.
            if isinstance(value, bool) or not 0 < float(value) < math.inf:
                raise ValueError("give a number of seconds above 0")
            return float(value)
        if name == "keep_jobs":
            number: float = int(value)
        else:
            number = float(value)
        if number < 0:
            raise ValueError("it is negative")
        return number
    except (TypeError, ValueError) as e:
        raise PolicyError(f"{source}: {_shown(name)} = {value!r}: {e}") from None


def load(home: Path, overrides: dict[str, Any] | None = None) -> Policy:
    """The policy of the agent of `home`: defaults, then agent.toml, then `overrides`."""
    policy = Policy()
    path = home / CONFIG_NAME
    if path.exists():
        try:
            settings = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise PolicyError(f"{path}: {e}") from None
        policy = policy.with_settings(settings, str(path))
    if overrides:
        policy = policy.with_settings(
            {k: v for k, v in overrides.items() if v is not None}, "agent option"
        )
    return policy
