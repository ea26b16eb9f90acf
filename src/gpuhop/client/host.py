"""Runs on the user's machine: what an agent says of itself and of its GPU host (version,
GPUs, preflight checks, disk use), and garbage collection there."""

from __future__ import annotations

# The models load on first use (gpuhop.api is lazy): not on the paths of `ps` or `run`.
from typing import TYPE_CHECKING, Any

import gpuhop.api as api
from gpuhop.client.session import Session
from gpuhop.client.transport.unixhttp import Timeout

if TYPE_CHECKING:
    from gpuhop.api.agent import ClusterInfo
    from gpuhop.api.upkeep import DiskUsage, GcReport

# `doctor` imports TensorFlow on the host, which can take a while on a cold GPU host.
DOCTOR_TIMEOUT = 240.0


def info(session: Session) -> api.AgentInfo:
    return api.AgentInfo.model_validate(session.request("GET", "/v1/agent").json())


def gpus(session: Session) -> list[api.GpuInfo]:
    """The host's GPUs: memory used and load now, and the jobs holding each."""
    return [api.GpuInfo.model_validate(g) for g in gpus_json(session)]


def gpus_json(session: Session) -> list[dict[str, Any]]:
    """`gpus`, as the agent's JSON."""
    data: list[dict[str, Any]] = session.request("GET", "/v1/agent/gpus").json()
    return data


def cluster(session: Session) -> ClusterInfo:
    """On an agent with a cluster backend (Slurm): its nodes and the user's jobs there."""
    from gpuhop.api.agent import ClusterInfo

    return ClusterInfo.model_validate(session.request("GET", "/v1/agent/cluster").json())


def release_gpu(session: Session, index: int) -> api.GpuInfo:
    """Put a quarantined GPU back in service (admins only)."""
    response = session.request("POST", f"/v1/agent/gpus/{index}/release")
    return api.GpuInfo.model_validate(response.json())


def doctor(session: Session, fresh: bool = False, probe: bool = True) -> list[api.DoctorCheck]:
    """Preflight checks of the GPU host (driver, CUDA, TensorFlow build, disk). The agent
    reuses its TensorFlow probe for a minute; `fresh` (admins only) asks for a new one.
    Without `probe`, only the checks that need no TensorFlow probe (an older agent gives
    them all)."""
    params = {**({"fresh": "true"} if fresh else {}), **({} if probe else {"probe": "false"})}
    response = session.request(
        "GET",
        "/v1/agent/doctor",
        params=params or None,
        timeout=Timeout(DOCTOR_TIMEOUT, connect=5.0),
    )
    return [api.DoctorCheck.model_validate(c) for c in response.json()]


def usage(session: Session) -> DiskUsage:
    """The agent's disk use (storage: blobs, trees, datasets; job dirs) and quotas."""
    from gpuhop.api.upkeep import DiskUsage

    return DiskUsage.model_validate(session.request("GET", "/v1/agent/usage").json())


def gc(session: Session, dry_run: bool = False) -> GcReport:
    """Garbage collection and retention on the agent now (admins only); with `dry_run`,
    only what it would remove. Anything a queued or running job needs stays."""
    response = session.request(
        "POST", "/v1/agent/gc", params={"dry_run": dry_run}, timeout=DOCTOR_TIMEOUT
    )
    from gpuhop.api.upkeep import GcReport

    return GcReport.model_validate(response.json())
