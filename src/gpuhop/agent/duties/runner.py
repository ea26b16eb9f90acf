"""Runs in the agent: its periodic duties (garbage collection, the log cap, time limits, GPU
sampling, GPU health, the idle guard, the TLS certificate's end), and the loop that runs them.

Each duty is a small object with an interval and one `run()` (SkyPilot's `SkyletEvent`);
`run()` runs in a worker thread, so a slow walk of the disk never holds up a request, and
an exception is logged and never takes the agent down. The duties start once the scheduler
has re-attached to the jobs a previous agent left running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from gpuhop.agent.context import AgentContext
from gpuhop.agent.duties import gpuhealth
from gpuhop.agent.duties.idlegpus import IdleGpus
from gpuhop.agent.services import doctor, gc, hostchecks
from gpuhop.agent.storage.usage import format_bytes
from gpuhop.api import CheckStatus, EndClass, JobState, format_seconds

log = logging.getLogger("gpuhop.agent.duties")


class Duty(Protocol):
    interval: float

    def run(self) -> None: ...


class Collect:
    """Garbage collection and retention: at start, then every `gc_every_hours`."""

    def __init__(self, rt: AgentContext):
        self.rt = rt
        self.interval = rt.policy.gc_every_hours * 3600

    def run(self) -> None:
        gc.collect(self.rt, self.rt.policy)


class LogCap:
    """Stops a running job whose log passed `log_cap`: the job fails, saying why. Checked
    every second, so a job writing fast may pass the cap by what it writes in a second."""

    interval = 1.0

    def __init__(self, rt: AgentContext, cap: int):
        self.rt = rt
        self.cap = cap

    def run(self) -> None:
        for job in self.rt.store.list([JobState.running], limit=100_000):
            jp = self.rt.supervisor.job_paths(job.id)
            try:
                size = jp.log.stat().st_size
            except OSError:
                continue
            if size > self.cap and job.pid is not None:
                self.rt.supervisor.stop(
                    job,
                    f"stopped: its log passed the agent's cap of {format_bytes(self.cap)}"
                    " (log_cap in agent.toml)",
                )


class ClusterStarts:
    """Moves to `running` the started jobs a cluster held (Slurm's queue, Ray's placement)
    once it runs them, so that a pending job is never shown as running, and its duration
    counts from the cluster's start (Supervisor.promote)."""

    interval = 1.0

    def __init__(self, rt: AgentContext):
        self.rt = rt

    def run(self) -> None:
        for job in self.rt.store.list([JobState.starting], limit=100_000):
            self.rt.supervisor.promote(job)


class TimeLimits:
    """Stops a running job whose `--timeout` passed: SIGTERM, SIGKILL after the grace
    period, class `timeout`. The limit runs from the attempt's start as the store keeps it
    (or, on a cluster that kept it pending, from when the cluster started it: see
    Backend.running_since), so an agent restarted meanwhile still stops the job on time."""

    interval = 1.0
    grace = 10.0

    def __init__(self, rt: AgentContext):
        self.rt = rt

    def run(self) -> None:
        now = time.time()
        for job in self.rt.store.list([JobState.running], limit=100_000):
            if job.spec.time_limit is None or job.started_at is None or job.pid is None:
                continue
            jp = self.rt.supervisor.job_paths(job.id)
            since = self.rt.backend.running_since(jp, job.started_at)
            if since is not None and now >= since + job.spec.time_limit:
                self.rt.supervisor.stop(
                    job,
                    f"timed out (its time limit is {format_seconds(job.spec.time_limit)})",
                    grace=self.grace,
                    end_class=EndClass.timeout,
                )


class SampleGpus:
    """Records each GPU's memory use and load for the dashboard's GPU page, and the energy
    and GPU time of the jobs running on them (jobs/energy.py)."""

    def __init__(self, rt: AgentContext):
        self.rt = rt
        self.interval = rt.gpu_history.every

    def run(self) -> None:
        now = time.time()
        self.rt.gpu_history.record(now, self.rt.gpu_host.usage())
        self.rt.supervisor.energy.sample(now)


class WatchGpuHealth:
    """Quarantines GPUs with a hardware fault and stops the jobs on them (duties/gpuhealth)."""

    interval = 1.0

    def __init__(self, rt: AgentContext):
        self.rt = rt

    def run(self) -> None:
        gpuhealth.watch(self.rt)


class CertificateExpiry:
    """Warns in the agent's log, at start and daily, while the TLS listener's certificate
    expires within two weeks or has expired (an agent runs for months; the certificate it
    loaded at start does not renew itself), saying how to renew it."""

    interval = 24 * 3600.0

    def __init__(self, rt: AgentContext):
        self.rt = rt

    def run(self) -> None:
        facts = doctor.tls_facts(self.rt)
        if facts is None:
            return
        check = hostchecks.tls_certificate(facts)
        if check.status != CheckStatus.passed:
            log.warning("%s; %s", check.detail, check.fix)


def duties(rt: AgentContext) -> list[Duty]:
    out: list[Duty] = [SampleGpus(rt), WatchGpuHealth(rt)] if rt.gpus else []
    if rt.gpus and rt.policy.idle_gpu_minutes is not None:
        out.append(IdleGpus(rt))
    out.append(TimeLimits(rt))
    if rt.backend.remote:
        out.append(ClusterStarts(rt))
    if rt.policy.gc_every_hours > 0:
        out.append(Collect(rt))
    if rt.policy.log_cap is not None:
        out.append(LogCap(rt, rt.policy.log_cap))
    if rt.listener is not None and rt.listener.tls:
        out.append(CertificateExpiry(rt))
    return out


async def run_duties(rt: AgentContext) -> None:
    """Run each duty at once, then every `interval` seconds, until cancelled."""
    await rt.scheduler.reattached.wait()
    await asyncio.gather(*(_every(duty) for duty in duties(rt)))


async def _every(duty: Duty) -> None:
    while True:
        try:
            await asyncio.to_thread(duty.run)
        except Exception:
            log.exception("%s failed; it runs again in %.0fs", type(duty).__name__, duty.interval)
        await asyncio.sleep(duty.interval)
