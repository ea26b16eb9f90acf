"""Request and response models of the agent's own resources (version 1): its info, its
GPUs and listeners, tokens, and doctor's checks. Jobs, trees and blobs are in `models`."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field, computed_field, field_validator

from gpuhop.api.base import StrictModel, WireModel
from gpuhop.api.models import USER_RE


class GpuInfo(WireModel):
    """One GPU of the host: what it is, what it is doing now, and which jobs hold it."""

    index: int
    name: str
    memory_mb: int
    # Read live when asked (NVML, else nvidia-smi); None where the reading is unavailable.
    # Fake GPUs report 0.
    memory_used_mb: int | None = None
    utilization: int | None = None  # percent
    # Memory promised to jobs: the sum of the shares on it, or all of it for a whole-GPU job.
    memory_reserved_mb: int = 0
    # The jobs holding it: one whole-GPU job, or any number of share jobs.
    job_ids: list[str] = Field(default_factory=list)
    # The memory each of those jobs' processes hold on it, in MB (read per process through
    # NVML, told apart by the jobs' PID namespaces); None where that cannot be read, and
    # only memory_used_mb, the whole GPU's, is known.
    job_memory_mb: dict[str, int] | None = None
    # The Ray node it is on, for an agent with the Ray backend (None: the agent's host).
    # Its memory is then unknown (0), and jobs hold it in gpuhop's count: Ray places them.
    node: str | None = None
    # Its topology group where known (GPUs of one group share a switch or NVLink): a job
    # asking for several GPUs gets them of one model and one group (unless mixed_gpus).
    group: str | None = None
    # Why it is out of service (a hardware fault: XID, ECC, retired pages, fallen off the
    # bus), and since when; None for a GPU in service. No new job gets a quarantined GPU
    # until an admin releases it (`gpuhop gpus --release N`).
    quarantined: str | None = None
    quarantined_since: float | None = None

    @property
    def kind(self) -> str:
        """What must match for GPUs to be given to one job together: model and group."""
        return f"{self.name}@{self.group or ''}"


class ClusterNode(WireModel):
    """One node of a cluster's partition, as its scheduler lists it (Slurm: `sinfo`)."""

    name: str
    gres: str  # its generic resources, as the scheduler says them ("gpu:4", "(null)")
    gres_used: str  # of them, what jobs (anyone's) hold now ("gpu:1(IDX:0)")
    state: str  # "idle", "mixed", "allocated", "down", "drained"...


class ClusterJob(WireModel):
    """One of the agent's user's jobs on the cluster (Slurm: `squeue --me`): the gpuhop job
    it runs, if any, and what it holds or asks for."""

    cluster_id: str  # the scheduler's job id
    job_id: str | None  # the gpuhop job it runs; None for a job submitted outside gpuhop
    name: str
    state: str  # the scheduler's ("PENDING", "RUNNING"...)
    nodes: str  # where it runs ("" while pending)
    gpus: str  # its GPUs as the scheduler says them ("gpu:1", "gpu:1 per task"; "" for none)
    reason: str | None  # why it is pending, in the scheduler's words


class ClusterInfo(WireModel):
    """What a cluster backend's scheduler says now: its nodes and the user's jobs there."""

    backend: str
    partition: str | None  # None: the cluster's default
    nodes: list[ClusterNode]
    jobs: list[ClusterJob]


class ListenerInfo(WireModel):
    """The agent's TCP listener, as bound (also written to `listen.json` in its state dir)."""

    address: str
    """host:port actually bound (the real port when asked for port 0)."""
    url: str
    tls: bool
    fingerprint: str | None = None
    """SHA-256 of the certificate it presents, as `SHA256:AB:CD:...`; None without TLS."""
    expires: datetime | None = None
    """When that certificate expires (UTC); None without TLS."""


class AgentInfo(WireModel):
    version: str
    pid: int
    home: str
    gpus: list[GpuInfo]
    fake_gpus: bool
    jobs_running: int
    jobs_queued: int
    listener: ListenerInfo | None = None
    # Where jobs run: "local" (this host), "ray" (the cluster at `ray_address`) or "slurm".
    backend: str = "local"
    ray_address: str | None = None
    # Who the agent takes the caller for: the token's user, or the agent's owner on its socket.
    user: str | None = None
    admin: bool = False


class TokenRequest(StrictModel):
    user: str
    admin: bool = False

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not USER_RE.match(v):
            raise ValueError(
                "user must be 1-64 characters of letters, digits, '.', '_', '-' or '@',"
                " starting with a letter or digit"
            )
        return v


class TokenInfo(WireModel):
    """A token as listed: never the token itself, which only its creator saw, once."""

    id: str
    user: str
    admin: bool
    created_at: datetime
    last_used_at: datetime | None = None


class TokenCreated(TokenInfo):
    token: str


class CheckStatus(StrEnum):
    passed = "passed"
    warning = "warning"  # works, but something deserves a look; doctor still exits 0
    failed = "failed"  # jobs will not run as expected; doctor exits 1
    skipped = "skipped"  # does not apply to this host (e.g. the driver check without GPUs)


class DoctorCheck(WireModel):
    """One preflight check of the GPU host, with the fix for a person to run if it failed."""

    name: str
    status: CheckStatus
    detail: str
    fix: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return self.status != CheckStatus.failed
