"""Runs in the agent: GPUs with a hardware fault are quarantined, and their jobs stopped.

`watch` runs as a duty every second: it asks the GPU host which GPUs have a fault (XID
errors, uncorrectable ECC errors, retired pages pending, a GPU fallen off the bus; see
`gpuhop.agent.host.health`), quarantines each (kept across restarts, see
`gpuhop.agent.host.quarantine`), and stops every job that runs on a quarantined GPU: it
fails with class `gpu-fault`, and is retried on other GPUs where its retry rule allows
(`--retry-on infra`, the default). The scheduler gives a quarantined GPU to no job until an
admin releases it (`release`, `gpuhop gpus --release N`).
"""

from __future__ import annotations

import logging

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, not_found
from gpuhop.api import CheckStatus, DoctorCheck, EndClass, ErrorCode, GpuInfo, JobState

log = logging.getLogger("gpuhop.agent")

# How long a job on a faulty GPU has to stop after SIGTERM: its GPU may hang in a kernel.
FAULT_GRACE = 10.0


def watch(rt: AgentContext) -> None:
    """Quarantine the GPUs that show a fault now, and stop the jobs on quarantined GPUs."""
    faults = rt.gpu_host.faults()
    rt.quarantine.settle({i: f.detail for i, f in faults.items()})
    for index, fault in sorted(faults.items()):
        if rt.quarantine.add(index, fault.kind, fault.detail):
            log.error("GPU %d quarantined: %s; no job gets it until released", index, fault.detail)
            rt.scheduler.wake()
    held = rt.quarantine.all()
    if not held:
        return
    for job in rt.store.list([JobState.running], limit=100_000):
        bad = [i for i in job.gpu_ids if i in held]
        if not bad or job.pid is None:
            continue
        index = bad[0]
        rt.supervisor.stop(
            job,
            f"GPU {index} failed ({held[index].detail}); it is quarantined",
            grace=FAULT_GRACE,
            end_class=EndClass.gpu_fault,
            retry=True,
        )


def release(rt: AgentContext, caller: Caller, index: int) -> None:
    """Put a quarantined GPU back in service (admins only)."""
    if not caller.admin:
        raise ApiError(403, ErrorCode.forbidden, "only an admin may release a quarantined GPU")
    if all(g.index != index for g in rt.gpus):
        raise not_found(f"this host has no GPU {index}")
    held = rt.quarantine.release(index)
    if held is None:
        raise ApiError(409, ErrorCode.conflict, f"GPU {index} is not quarantined")
    log.warning("GPU %d released by %s (it was quarantined: %s)", index, caller.user, held.detail)
    rt.scheduler.wake()


def doctor_check(gpus: list[GpuInfo], quarantined: dict[int, str]) -> DoctorCheck:
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
