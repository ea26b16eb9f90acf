"""Runs in the agent: what `gpuhop doctor` knows of the host (`Facts`), and its checks of the
host itself rather than of TensorFlow on it: the state dir's free disk, the job sandbox, how
jobs get their work dirs, and the GPUs quarantined for a fault. Pure functions of the facts,
like the rest of `doctor.evaluate`."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from gpuhop.api import CheckStatus, DoctorCheck, GpuInfo, format_mb

EXPIRY_WARNING_DAYS = 14
LOW_DISK = 10 * 2**30
FULL_DISK = 1 * 2**30


@dataclass
class Facts:
    gpu_source: str  # "nvml", "nvidia-smi", "fake" or "none": see agent/gpus.py
    gpus: list[GpuInfo]
    driver_version: str | None
    driver_cuda: str | None  # the newest CUDA the driver supports
    driver_error: str | None
    state_dir: str
    disk_free: int
    # What probe.py reported; {"probe_error": ...} if it could not run.
    probe: dict[str, Any] = field(default_factory=dict)
    # Why jobs cannot have their own view of the host (None: they do), and whether the agent
    # serves a team, which then starts no job.
    isolation: str | None = None
    team: bool = False
    ray: bool = False  # jobs run on a Ray cluster's nodes, not under this host's sandbox
    cluster: str | None = None  # where jobs run, in words, on a cluster ("the Slurm cluster")
    quarantined: dict[int, str] = field(default_factory=dict)  # GPU -> its fault
    # Why each job gets a copy of its files rather than an overlay of the shared checkout.
    work_view: str | None = None
    # Who the jobs run as: the agent's uid, whether it gives a team's users identities of
    # their own (its backend can, and it is root), and how many users have one so far.
    agent_uid: int = 0
    identities: bool = True
    identity_users: int = 0
    uid_base: int = 0
    # Whether a cluster's nodes see the agent's jobs dir (None: not checked), in words; None
    # for a backend whose jobs do not use their files there (see Backend.files_seen).
    files_seen: tuple[bool | None, str] | None = None

    # Podman for jobs in container images (`--image`; the local backend only): its path
    # (None: not installed), version, the OCI runtime chosen, and the NVIDIA container
    # toolkit's CDI spec (None: not generated) and whether nvidia-ctk is installed.
    podman: str | None = None
    podman_version: str | None = None
    container_runtime: str | None = None
    cdi_spec: str | None = None
    nvidia_ctk: bool = False
    # The TLS listener's certificate (None: no TLS listener), and `now` to judge its dates by.
    tls: TlsFacts | None = None

    @property
    def real_gpus(self) -> bool:
        return bool(self.gpus) and self.gpu_source != "fake"


@dataclass(frozen=True)
class TlsFacts:
    """The certificate the agent's TLS listener serves."""

    fingerprint: str
    expires: datetime.datetime
    # The agent's own self-signed certificate's file (None: --tls-cert's, which it was given).
    own: str | None
    now: datetime.datetime


def check(name: str, status: CheckStatus, detail: str, fix: str | None = None) -> DoctorCheck:
    return DoctorCheck(name=name, status=status, detail=detail, fix=fix)


def disk(f: Facts) -> DoctorCheck:
    name = "disk space"
    detail = f"{format_mb(f.disk_free / 2**20)} free in the agent's state dir {f.state_dir}"
    fix = "free space there, or give the agent a state dir on a larger disk (GPUHOP_HOME)"
    if f.disk_free < FULL_DISK:
        return check(name, CheckStatus.failed, detail, fix)
    if f.disk_free < LOW_DISK:
        return check(
            name,
            CheckStatus.warning,
            f"{detail}: under {format_mb(LOW_DISK / 2**20)}, checkpoints may not fit",
            fix,
        )
    return check(name, CheckStatus.passed, detail)


def sandbox(f: Facts) -> DoctorCheck:
    name = "job sandbox"
    if f.ray:
        return _ray(f)
    if f.isolation is None:
        detail = (
            "every job runs in its own view of this host (private mount and PID namespaces):"
            " it sees its own files, not the agent's socket, tokens, job store or other jobs"
        )
        return check(name, CheckStatus.passed, detail)
    fix = f"allow namespaces: {f.isolation}"
    if f.team:
        detail = "this host allows no namespaces for jobs, and the agent serves a team"
        return check(name, CheckStatus.failed, f"{detail}: no job starts", fix)
    detail = (
        "this host allows no namespaces for jobs, so they run unsandboxed as the agent's"
        " user: a job can reach the agent's socket and state dir, and a setsid child can"
        " outlive it. Fine for your own jobs; a team agent starts none"
    )
    return check(name, CheckStatus.warning, detail, fix)


def containers(f: Facts) -> DoctorCheck:
    """Whether jobs can run in container images here (Podman), and with GPUs (CDI)."""
    name = "container images"
    if f.ray or f.cluster is not None:
        return check(name, CheckStatus.skipped, "container images run on the local backend only")
    if f.podman is None:
        detail = (
            "Podman is not installed: jobs cannot run in container images (--image); venv"
            " jobs are not affected"
        )
        return check(name, CheckStatus.skipped, detail, "apt-get install podman runc catatonit")
    runtime = f.container_runtime or "Podman's default"
    version = f.podman_version or "(version unknown)"
    detail = f"Podman {version} runs --image jobs (OCI runtime: {runtime})"
    if f.cdi_spec is not None:
        return check(name, CheckStatus.passed, f"{detail}; GPUs through CDI ({f.cdi_spec})")
    generate = "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
    fix = generate if f.nvidia_ctk else f"install the NVIDIA container toolkit, then {generate}"
    if f.real_gpus:
        detail += (
            "; but the NVIDIA container toolkit's CDI spec is missing, so a job in an image"
            " gets no GPU"
        )
        return check(name, CheckStatus.warning, detail, fix)
    detail += "; no CDI spec for GPUs (none here to give)"
    return check(name, CheckStatus.passed, detail)


def identity(f: Facts) -> DoctorCheck:
    name = "job identity"
    if f.ray or not f.identities:
        detail = "jobs run as the cluster's user (the agent's on its nodes)"
        if f.team and f.agent_uid == 0:
            detail = f"{detail}, root: a team's jobs would run as root there, so no job starts"
            return check(
                name, CheckStatus.failed, detail, "run the agent as an unprivileged account"
            )
        if f.team:
            detail += "; a team's users' jobs are not kept apart from each other there"
            return check(name, CheckStatus.warning, detail)
        return check(name, CheckStatus.passed, detail)
    if not f.team:
        detail = (
            f"jobs run as the agent's user (uid {f.agent_uid}), whose jobs they are; a team"
            " agent (a TLS listener, or tokens of several users) run as root runs each user's"
            " jobs as an unprivileged uid of their own"
        )
        return check(name, CheckStatus.passed, detail)
    if f.agent_uid != 0:
        detail = (
            f"this agent serves a team as uid {f.agent_uid}, not root, so it cannot run each"
            " user's jobs as an identity of their own: no job starts"
        )
        return check(name, CheckStatus.failed, detail, "run the team agent as root")
    detail = (
        f"each user's jobs run as an unprivileged uid of their own (from {f.uid_base} on;"
        f" {f.identity_users} user(s) so far), never as root or the agent's user, and see the"
        " host read-only but for their own dirs"
    )
    return check(name, CheckStatus.passed, detail)


def _ray(f: Facts) -> DoctorCheck:
    name = "job sandbox"
    if f.isolation is not None:
        status = CheckStatus.failed if f.team else CheckStatus.warning
        return check(name, status, f.isolation + (": no job starts" if f.team else ""))
    detail = (
        "jobs run on the Ray cluster's nodes as Ray's user, unsandboxed: each sees that"
        " user's files and processes on its node (other jobs' there too, and Ray's own), but"
        " not this agent's state dir"
    )
    if f.team:
        # Not a failure: the README says so, and a team may trust each other with a cluster.
        return check(
            name, CheckStatus.warning, f"{detail}; this team's users are not kept apart there"
        )
    return check(name, CheckStatus.passed, detail)


def work_dirs(f: Facts) -> DoctorCheck:
    name = "job work dirs"
    if f.work_view is None:
        detail = (
            "overlay: each tree is materialised once and each job sees it through a writable"
            " overlay of its own, so a job in a large tree starts at once"
        )
        return check(name, CheckStatus.passed, detail)
    if f.cluster:
        # How a cluster's jobs get their files: nothing on the agent's host changes it.
        return check(name, CheckStatus.passed, f"copy: {f.work_view}")
    detail = (
        f"copy: each job gets a copy of every file of its tree ({f.work_view}), so a job in"
        " a large tree waits for the copy; put large data in datasets"
    )
    return check(name, CheckStatus.warning, detail, "allow overlayfs in user namespaces")


def shared_files(f: Facts) -> list[DoctorCheck]:
    """Where a Slurm job's files live, and whether the nodes were seen to share them."""
    if f.files_seen is None:
        return []
    ok, detail = f.files_seen
    name = "shared filesystem"
    if ok:
        return [check(name, CheckStatus.passed, detail)]
    return [
        check(
            name,
            CheckStatus.warning,
            f"jobs' files are under {f.state_dir}/jobs, which the compute nodes must see; {detail}",
            "restart the agent when the partition has a free node, to check again",
        )
    ]


def tls_certificate(t: TlsFacts) -> DoctorCheck:
    """When the listener's certificate expires: a warning `EXPIRY_WARNING_DAYS` before, a
    failure after (clients refuse it), each saying how to renew it. Also the agent's log's
    words, daily (`duties.runner.CertificateExpiry`)."""
    name = "TLS certificate"
    end = f"{t.expires.astimezone(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    left = t.expires - t.now
    repin = (
        "every client pins the new one with `gpuhop remote add NAME URL --replace --fingerprint"
        " NEW` (tokens are kept)"
    )
    if t.own is None:
        renew = (
            "renew it and restart the agent with the new --tls-cert/--tls-key; if the renewed"
            f" certificate has a new key or is self-signed, {repin}"
        )
    else:
        renew = (
            f"stop the agent, remove {t.own} and the key beside it, and start it again: it"
            f" makes a new certificate and prints its fingerprint; {repin}"
        )
    if left <= datetime.timedelta(0):
        if t.own is not None:
            renew = f"restart the agent: it makes a new certificate; {repin}"
        return check(
            name,
            CheckStatus.failed,
            f"the listener's certificate ({t.fingerprint}) expired on {end}: every client"
            " refuses it",
            renew,
        )
    if left <= datetime.timedelta(days=EXPIRY_WARNING_DAYS):
        return check(
            name,
            CheckStatus.warning,
            f"the listener's certificate ({t.fingerprint}) expires on {end}, in {_within(left)}:"
            " clients refuse it from then on",
            renew,
        )
    return check(
        name,
        CheckStatus.passed,
        f"the listener's certificate ({t.fingerprint}) expires on {end}, in {left.days} days",
    )


def _within(left: datetime.timedelta) -> str:
    if left < datetime.timedelta(days=1):
        return f"{max(1, round(left.total_seconds() / 3600))} hour(s)"
    return f"{left.days} day(s)"


def gpu_health(gpus: list[GpuInfo], quarantined: dict[int, str]) -> DoctorCheck:
    """`gpuhop doctor`'s word on GPU health: which GPUs are quarantined and why."""
    name = "GPU health"
    if not gpus:
        return DoctorCheck(name=name, status=CheckStatus.skipped, detail="no GPU to watch")
    if not quarantined:
        return DoctorCheck(
            name=name,
            status=CheckStatus.passed,
            detail=f"no fault seen on {len(gpus)} GPU(s) (XID, ECC, retired pages, bus)",
        )
    words = "; ".join(f"GPU {i}: {detail}" for i, detail in sorted(quarantined.items()))
    some_left = len(quarantined) < len(gpus)
    return DoctorCheck(
        name=name,
        status=CheckStatus.warning if some_left else CheckStatus.failed,
        detail=f"quarantined, so no job gets it: {words}"
        + ("; jobs run on the other GPUs" if some_left else ""),
        fix="have the GPU checked (nvidia-smi -q, the kernel log's Xid lines; a reset or a"
        " reboot clears some faults), then: gpuhop gpus --release N",
    )
