"""Runs in the agent, as a duty: GPUs with a hardware fault are quarantined, and their jobs
stopped.

`watch` runs as a duty every second: it asks the GPU host which GPUs have a fault (XID
errors, uncorrectable ECC errors, retired pages pending, a GPU fallen off the bus; see
`gpuhop.agent.host.health`), quarantines each (kept across restarts, see
`gpuhop.agent.host.quarantine`), and stops every job that runs on a quarantined GPU: it
fails with class `gpu-fault`, and is retried on other GPUs where its retry rule allows
(`--retry-on infra`, the default). The scheduler gives a quarantined GPU to no job until an
admin releases it (`services.gpus.release`, `gpuhop gpus --release N`).
"""

from __future__ import annotations

import logging

from gpuhop.agent.context import AgentContext
from gpuhop.api import EndClass, JobState

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
